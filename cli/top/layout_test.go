package top

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/record"
)

// wideFlows are flows with the longest ids and addresses that occur:
// 20-digit cookies, a full IPv6 address, a long process name.
func wideFlows() api.FlowList {
	l := testFlows()
	l.Flows = append(l.Flows,
		flow("18446744073709551615", "postgres-writer-with-long-name", 1234567, "[2001:db8:85a3::8a2e:370:7334]:5432", "[2001:db8:85a3::8a2e:370:7335]:49152", 3,
			metrics(3*ms, 8*ms, 1, 2.0, 77, 1*ms, 1*ms, 1*ms), diagnose.Bufferbloat),
		flow("12345678901234", "java", 31337, "192.168.100.200:55555", "192.168.100.201:65535", 99,
			metrics(9*ms, 99*ms, 12, 3.0, 4242, 5*ms, 1*ms, 3*ms), diagnose.SlowStartAfterIdle),
	)
	l.Total = len(l.Flows)
	return l
}

// cutNumber finds an ellipsis that cut a number: a digit right before it.
var cutNumber = regexp.MustCompile(`[0-9]…|…[0-9]`)

// screenRows are the lines of the view that start with one of ids.
func screenRows(view string, ids []string) map[string]string {
	out := map[string]string{}
	for _, l := range strings.Split(plain(view), "\n") {
		for _, id := range ids {
			if strings.HasPrefix(l, id+" ") {
				out[id] = l
			}
		}
	}
	return out
}

func TestIDsAndRemotesAreNeverCut(t *testing.T) {
	for _, w := range []int{80, 90, 100, 120, 160} {
		m, src := newTestModel(t, Options{}, w, 30, false)
		src.flows = wideFlows()
		press(t, m, "+")
		view := m.View()
		checkFrame(t, view, w, 30)
		ids := rowIDs(m)
		rows := screenRows(view, ids)
		if len(rows) != len(ids) {
			t.Fatalf("width %d: %d of %d rows start with their whole id:\n%s", w, len(rows), len(ids), plain(view))
		}
		withLocal := 0
		for _, f := range src.flows.Flows {
			row := rows[f.ID]
			if remote := fmtAddrPort(f.Flow.Remote); !strings.Contains(row, remote) {
				t.Errorf("width %d: flow %s lacks its remote %s: %q", w, f.ID, remote, row)
			}
			if strings.Contains(row, fmtAddrPort(f.Flow.Local)) {
				withLocal++
			}
			if cutNumber.MatchString(row) {
				t.Errorf("width %d: a number is cut: %q", w, row)
			}
		}
		// One screen shows one form of address.
		if withLocal != 0 && withLocal != len(ids) {
			t.Errorf("width %d: %d of %d rows show the local address:\n%s", w, withLocal, len(ids), plain(view))
		}
	}
}

func TestPeerIDsNetnsAndSide(t *testing.T) {
	for _, w := range []int{80, 100, 120, 160} {
		m, _ := newTestModel(t, Options{View: ViewPeers}, w, 24, false)
		view := plain(m.View())
		rows := screenRows(view, rowIDs(m))
		if len(rows) != 2 {
			t.Fatalf("width %d: peer ids are not whole:\n%s", w, view)
		}
		for _, want := range []string{"client -> 10.0.0.2:8080", "server :443 <- 2001:db8::99"} {
			if !strings.Contains(view, want) {
				t.Errorf("width %d: lacks %q:\n%s", w, want, view)
			}
		}
		if w >= 100 {
			for _, want := range []string{"NETNS", "4026531840", "4026532001"} {
				if !strings.Contains(view, want) {
					t.Errorf("width %d: lacks %q:\n%s", w, want, view)
				}
			}
		}
	}
}

func TestLayoutFits(t *testing.T) {
	for _, tb := range []*table{flowTable(testFlows().Flows, "p99"), flowTable(wideFlows().Flows, "exchanges"), peerTable(testPeers().Peers, "rate")} {
		for w := 70; w <= 250; w++ {
			ws := tb.layout(w, false)
			for i := range tb.rows {
				if lw := width(tb.line(&tb.rows[i], ws, nil)); lw > w {
					t.Errorf("width %d: row %d is %d wide", w, i, lw)
				}
			}
			if hw := width(tb.header(ws)); hw > w {
				t.Errorf("width %d: header is %d wide", w, hw)
			}
			// The column the rows are sorted by never goes.
			if ws[tb.index(tb.sortCol)] == 0 {
				t.Errorf("width %d: the sorted column %s is hidden", w, tb.sortCol)
			}
		}
	}
}

func TestLayoutGivesBack(t *testing.T) {
	// Hiding a column frees more than needed: the rest goes back to
	// what was cut before it, so nothing is cut beside spare room.
	tb := flowTable(testFlows().Flows, "p99")
	for w := 80; w <= 200; w++ {
		ws := tb.layout(w, false)
		used := -1
		for _, x := range ws {
			if x > 0 {
				used += x + 1
			}
		}
		if used < w && ws[tb.index("bar")] < 40 {
			for i := range tb.cols {
				if ws[i] > 0 && !tb.cols[i].bar && ws[i] < tb.natural(i) && tb.pick(i, ws[i]) == len(tb.altWidths(i))-1 && ws[i] < minOf(tb.altWidths(i)) {
					t.Errorf("width %d: %s is cut to %d with %d cells spare", w, tb.cols[i].name, ws[i], w-used)
				}
			}
		}
	}
}

func TestPartialFlowShowsNoTiming(t *testing.T) {
	l := testFlows()
	f := &l.Flows[0]
	f.Partial = f.Exchanges
	f.Duration = aggregate.Summary{}
	row := flowRow(f)
	tb := flowTable([]api.Flow{*f}, "p99")
	for _, name := range []string{"p50", "p99", "turns"} {
		if got := row.cells[tb.index(name)][0]; got != "-" {
			t.Errorf("%s of an all-partial flow is %q, want -", name, got)
		}
	}
	if got := row.cells[tb.index("rate")][0]; got != fmtRate(f.Rate) {
		t.Errorf("rate of an all-partial flow is %q", got)
	}
	m, src := newTestModel(t, Options{}, 120, 40, false)
	src.flows = l
	press(t, m, "+")
	for _, id := range rowIDs(m) {
		if id == f.ID {
			break
		}
		press(t, m, "down")
	}
	press(t, m, "enter")
	if v := plain(m.View()); strings.Contains(v, "turns/exchange") || !strings.Contains(v, "p50 -") {
		t.Errorf("detail of an all-partial flow shows timing:\n%s", v)
	}
}

func TestSelectionFollowsTheID(t *testing.T) {
	m, _ := newTestModel(t, Options{}, 100, 24, true)
	press(t, m, "down") // 101 under p99: 303 101 202
	want := "101"
	check := func(what string) {
		t.Helper()
		if m.flowCur.id != want || rowIDs(m)[m.flowCur.idx] != want {
			t.Errorf("after %s the cursor is on %q at %d, want %s in %v", what, m.flowCur.id, m.flowCur.idx, want, rowIDs(m))
		}
		if got := highlighted(m); got != want {
			t.Errorf("after %s row %q is highlighted, want %s", what, got, want)
		}
	}
	for _, k := range []string{"r", "t", "P", "e"} {
		press(t, m, k)
		check("sort " + k)
	}
	press(t, m, "/")
	typeText(t, m, "comm:c")
	press(t, m, "enter") // keeps curl and redis-cli
	check("a narrower filter")
	press(t, m, "v", "v", "v")
	check("switching views")

	// The row goes: the cursor keeps its place.
	press(t, m, "p") // 303 101
	press(t, m, "/")
	update(m, tea.KeyMsg{Type: tea.KeyCtrlU})
	typeText(t, m, "comm:redis")
	press(t, m, "enter")
	want = "303"
	check("its row filtered out")

	// Enter opens what is highlighted, in either list.
	press(t, m, "c", "end")
	want = highlighted(m)
	press(t, m, "enter")
	if d := m.top(); d == nil || d.id != want {
		t.Errorf("enter opened %+v, %s is highlighted", d, want)
	}
	press(t, m, "esc", "v", "down")
	want = highlighted(m)
	press(t, m, "/")
	typeText(t, m, "nginx")
	press(t, m, "enter")
	if got := highlighted(m); got != want {
		t.Errorf("the filter moved the highlight from %s to %s", want, got)
	}
	press(t, m, "enter")
	if d := m.top(); d == nil || d.id != want {
		t.Errorf("enter opened %+v, %s is highlighted", d, want)
	}
}

// highlighted is the id of the row drawn in reverse video.
func highlighted(m *model) string {
	for _, l := range strings.Split(m.View(), "\n") {
		if strings.Contains(l, "\x1b[7m") {
			if f := strings.Fields(plain(l)); len(f) > 0 {
				return f[0]
			}
		}
	}
	return ""
}

func TestHeaderKeepsTheFilterWhole(t *testing.T) {
	long := "comm:postgres port:5432 addr:10.20.0.0/16 netns:4026531840"
	f, err := api.ParseFilter(long)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []int{80, 100} {
		m, src := newTestModel(t, Options{Filter: f, Interval: time.Minute}, w, 24, false)
		src.flows.Flows = nil
		press(t, m, "+")
		view := plain(m.View())
		lines := checkFrame(t, view, w, 24)
		if !strings.Contains(view, "filter: "+long) {
			t.Errorf("width %d: the filter is not whole:\n%s", w, view)
		}
		if !strings.Contains(view, "view: flows") || !strings.Contains(view, "sort: p99") {
			t.Errorf("width %d: the header lost the view or the sort:\n%s", w, view)
		}
		if strings.Contains(lines[1]+lines[2], "…") {
			t.Errorf("width %d: the header cut something:\n%s", w, view)
		}
	}
	// Many rows under a three-line header still scroll right.
	m, src := newTestModel(t, Options{Filter: f}, 80, 24, false)
	base := testFlows().Flows[0]
	src.flows.Flows = nil
	for i := range 50 {
		fl := base
		fl.ID = fmt.Sprint(1000 + i)
		fl.Owner.Comm, fl.Flow.Remote = "postgres", netip.MustParseAddrPort("10.20.0.9:5432")
		fl.Duration.P99 = time.Duration(100-i) * ms
		src.flows.Flows = append(src.flows.Flows, fl)
	}
	press(t, m, "+", "end")
	view := plain(strings.Join(checkFrame(t, m.View(), 80, 24), "\n"))
	if !strings.Contains(view, "1049") {
		t.Errorf("end does not show the last row:\n%s", view)
	}
	if rows := m.listRows(); !strings.Contains(view, fmt.Sprintf("rows: %d-50/50", 50-rows+1)) {
		t.Errorf("the rows text does not match the %d rows shown:\n%s", rows, view)
	}
}

func TestDetailShowsRelatedBurstsAndTransfers(t *testing.T) {
	l := testFlows()
	f := &l.Flows[1] // 202
	f.Diagnoses = testFlows().Flows[0].Diagnoses
	f.Diagnoses[0].Related = []string{"flow 777: iperf3 pid 9 10.0.0.1:5201 -> 10.0.0.9:40000 moved 123456789 bytes", "flow 778: rsync pid 10"}
	f.Turns.Bursts, f.Turns.ExchangesPerBurstMean, f.Turns.PerBurstMean = 12, 3.0, 5.94
	f.Out.Transfers, f.Out.TransferRate = 2, 0.5e6
	f.In.Transfers, f.In.TransferRate = 7, 4.8e6
	f.Exchanges, f.Retransmits, f.RTOs = 1, 1, 1
	f.Duration.Count = 1
	m, src := newTestModel(t, Options{Sort: "rate"}, 120, 40, false)
	src.flows = l
	press(t, m, "+", "enter")
	if d := m.top(); d == nil || d.id != "202" {
		t.Fatalf("opened %+v", d)
	}
	view := plain(m.View())
	for _, want := range []string{
		"related: flow 777: iperf3 pid 9", "flow 778: rsync pid 10",
		"3.0 exchanges / 5.9 turns per burst", "transfers out 0.5 MB/s, in 4.8 MB/s",
		"1 exchange ·", "1 retransmit ·", "1 timeout",
	} {
		if !strings.Contains(view, want) {
			t.Errorf("detail lacks %q:\n%s", want, view)
		}
	}
	if strings.Contains(view, "1 timeouts") {
		t.Errorf("detail says 1 timeouts:\n%s", view)
	}
	// Without bursts of several exchanges or transfers, neither shows.
	m, _ = newTestModel(t, Options{}, 120, 40, false)
	press(t, m, "enter")
	if v := plain(m.View()); strings.Contains(v, "per burst") || strings.Contains(v, "transfers") || strings.Contains(v, "related") {
		t.Errorf("detail shows what is not there:\n%s", v)
	}
	// Plurals in a pair's identity: b2 has one connection.
	m, _ = newTestModel(t, Options{View: ViewPeers, Sort: "rate"}, 120, 40, false)
	press(t, m, "enter")
	if d := m.top(); d == nil || d.id != "p0000000000b2" {
		t.Fatalf("opened %+v", d)
	}
	if v := plain(m.View()); !strings.Contains(v, "· 1 connection") || strings.Contains(v, "1 connections") {
		t.Errorf("pair b2 does not say 1 connection:\n%s", v)
	}
}

// A connection open before lattrace says in its detail how its role was
// told and how its HTTP/2 framing was found.
func TestDetailSaysAdopted(t *testing.T) {
	l := testFlows()
	f := &l.Flows[0]
	f.ConnRole, f.RoleSource, f.HTTP2Framing = record.RoleServer, record.RoleFromListener, aggregate.HTTP2FoundMidway
	m, src := newTestModel(t, Options{}, 160, 50, false)
	src.flows = l
	for _, id := range rowIDs(m) {
		if id == f.ID {
			break
		}
		press(t, m, "down")
	}
	press(t, m, "enter")
	v := strings.Join(strings.Fields(plain(m.View())), " ")
	for _, want := range []string{"role server (open before lattrace: from the listening sockets)", "HTTP/2 framing found mid-way (open before lattrace)"} {
		if !strings.Contains(v, want) {
			t.Errorf("detail lacks %q:\n%s", want, plain(m.View()))
		}
	}
}
