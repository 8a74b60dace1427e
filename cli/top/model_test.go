package top

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/lattrace/lattrace/daemon/api"
)

func TestViewFitsTheTerminal(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {200, 50}, {100, 30}} {
		for _, colour := range []bool{false, true} {
			w, h := size[0], size[1]
			t.Run(fmt.Sprintf("%dx%d colour=%v", w, h, colour), func(t *testing.T) {
				m, _ := newTestModel(t, Options{Title: "daemon unix:/run/lattrace/api.sock"}, w, h, colour)
				view := m.View()
				checkFrame(t, view, w, h)
				view = plain(view)
				for _, want := range []string{"101", "202", "303", "app 85%", "lattrace top", "daemon unix:/run/lattrace/api.sock",
					"view: flows", "sort: p99", "filter: none", "refresh: 1s", "rows: 3/3", "P99▼",
					"█ network ▒ transport ░ app", "q quit"} {
					if !strings.Contains(view, want) {
						t.Errorf("view lacks %q:\n%s", want, view)
					}
				}
				// The dominant part reads in full when there is room.
				if w >= 120 {
					for _, want := range []string{"transport 62%", "app_peer"} {
						if !strings.Contains(view, want) {
							t.Errorf("view lacks %q:\n%s", want, view)
						}
					}
				}

				// Every other screen keeps to the terminal too.
				press(t, m, "enter")
				checkFrame(t, m.View(), w, h)
				press(t, m, "esc", "v")
				checkFrame(t, m.View(), w, h)
				press(t, m, "enter")
				checkFrame(t, m.View(), w, h)
				press(t, m, "enter")
				checkFrame(t, m.View(), w, h)
				press(t, m, "esc", "esc", "/")
				typeText(t, m, strings.Repeat("comm:verylongprocessname ", 10))
				checkFrame(t, m.View(), w, h)
			})
		}
	}
}

func TestViewShowsTheRowsAndTheSplit(t *testing.T) {
	m, _ := newTestModel(t, Options{}, 200, 50, false)
	view := m.View()
	for _, want := range []string{
		"curl 4242", "10.0.0.1:45678 -> 10.0.0.2:8080", "[2001:db8::1]:443 -> [2001:db8::99]:51234",
		"20.1ms", "45.0ms", "12", "network 60%", "loss", "EXCH", "10000",
	} {
		if !strings.Contains(view, want) {
			t.Errorf("view lacks %q:\n%s", want, view)
		}
	}
	// 101's split is 10% network, 5% transport, 85% app: its bar says so
	// in glyphs, not only in colour.
	for _, l := range strings.Split(view, "\n") {
		if strings.Contains(l, " 101 ") || strings.HasPrefix(l, "101") {
			if !strings.Contains(l, "░░░░░") || !strings.Contains(l, "█") {
				t.Errorf("row 101 bar does not show an app-heavy split: %q", l)
			}
		}
	}
}

func TestSelectedRowIsReverseVideo(t *testing.T) {
	m, _ := newTestModel(t, Options{}, 80, 24, true)
	var sel string
	for _, l := range strings.Split(m.View(), "\n") {
		if strings.Contains(l, "\x1b[7m") {
			sel = l
		}
	}
	if !strings.Contains(sel, "303") {
		t.Errorf("the first row (303) is not the highlighted one: %q", sel)
	}
}

func TestSortKeys(t *testing.T) {
	m, src := newTestModel(t, Options{}, 80, 24, false)
	if got, want := rowIDs(m), []string{"303", "101", "202"}; !slices.Equal(got, want) {
		t.Fatalf("p99 order %v, want %v", got, want)
	}
	for _, c := range []struct {
		key, sort string
		want      []string
	}{
		{"s", "p50", []string{"101", "202", "303"}},
		{"r", "rate", []string{"202", "101", "303"}},
		{"t", "turns", []string{"303", "202", "101"}},
		{"R", "retrans", []string{"303", "101", "202"}},
		{"P", "p50", []string{"101", "202", "303"}},
		{"e", "exchanges", []string{"202", "101", "303"}},
		{"p", "p99", []string{"303", "101", "202"}},
		{"s", "p50", []string{"101", "202", "303"}},
	} {
		press(t, m, c.key)
		if m.sort != c.sort {
			t.Errorf("%q: sort %q, want %q", c.key, m.sort, c.sort)
		}
		if got := rowIDs(m); !slices.Equal(got, c.want) {
			t.Errorf("%q: order %v, want %v", c.key, got, c.want)
		}
		view := m.View()
		if !strings.Contains(view, "sort: "+c.sort) {
			t.Errorf("%q: header does not say sort %s", c.key, c.sort)
		}
		if !strings.Contains(view, "▼") {
			t.Errorf("%q: no sorted column marked", c.key)
		}
		if q := src.queries[len(src.queries)-1]; q.Sort != c.sort {
			t.Errorf("%q: source asked for sort %q", c.key, q.Sort)
		}
	}
	// s cycles through every key and back.
	seen := map[string]bool{}
	for range api.SortKeys {
		press(t, m, "s")
		seen[m.sort] = true
	}
	if len(seen) != len(api.SortKeys) {
		t.Errorf("s visited %v, want all of %v", seen, api.SortKeys)
	}
}

func TestFilter(t *testing.T) {
	m, src := newTestModel(t, Options{}, 80, 24, false)
	press(t, m, "/")
	if !strings.Contains(m.View(), "filter: ▏") {
		t.Fatalf("no prompt after /:\n%s", m.View())
	}
	typeText(t, m, "port:80800")
	press(t, m, "backspace", "enter")
	if got := rowIDs(m); !slices.Equal(got, []string{"101"}) {
		t.Fatalf("port:8080 keeps %v, want [101]", got)
	}
	if q := src.queries[len(src.queries)-1]; q.Filter.Port != 8080 {
		t.Errorf("the source was not asked for port 8080: %+v", q.Filter)
	}
	// The source ignores the filter, as an old daemon would: the next
	// answer must not bring the other rows back.
	press(t, m, "+")
	if got := rowIDs(m); !slices.Equal(got, []string{"101"}) {
		t.Errorf("after a refresh the filter keeps %v, want [101]", got)
	}
	view := m.View()
	if !strings.Contains(view, "filter: port:8080") || strings.Contains(view, "202") {
		t.Errorf("view does not show the filter or shows filtered rows:\n%s", view)
	}

	// A bad filter is one error line; the rows and the old filter stay.
	press(t, m, "/")
	update(m, tea.KeyMsg{Type: tea.KeyCtrlU})
	typeText(t, m, "port:99999")
	press(t, m, "enter")
	view = m.View()
	if got := rowIDs(m); !slices.Equal(got, []string{"101"}) {
		t.Errorf("a bad filter changed the rows to %v", got)
	}
	if m.filter.Port != 8080 {
		t.Errorf("a bad filter replaced the old one: %+v", m.filter)
	}
	var errLines int
	for _, l := range strings.Split(view, "\n") {
		if strings.Contains(l, "bad filter") {
			errLines++
			if !strings.Contains(l, "99999") {
				t.Errorf("the error line does not say what is wrong: %q", l)
			}
		}
	}
	if errLines != 1 {
		t.Errorf("%d error lines, want 1:\n%s", errLines, view)
	}
	// The bad text comes back at the next / to be fixed.
	press(t, m, "/")
	if m.input != "port:99999" {
		t.Errorf("prompt reopened with %q", m.input)
	}
	press(t, m, "esc")
	if m.prompting || m.filter.Port != 8080 {
		t.Errorf("esc did not cancel the prompt: prompting=%v filter=%+v", m.prompting, m.filter)
	}

	// c clears it.
	press(t, m, "c")
	if got := rowIDs(m); len(got) != 3 || !m.filter.Empty() {
		t.Errorf("c left %v with filter %+v", got, m.filter)
	}

	// Free text, and esc on the list clears too.
	press(t, m, "/")
	typeText(t, m, "redis")
	press(t, m, "enter")
	if got := rowIDs(m); !slices.Equal(got, []string{"303"}) {
		t.Errorf("text filter redis keeps %v", got)
	}
	press(t, m, "esc")
	if !m.filter.Empty() {
		t.Errorf("esc on the list did not clear the filter")
	}

	// A filter nothing matches says so.
	press(t, m, "/")
	typeText(t, m, "comm:nothing")
	press(t, m, "enter")
	if v := m.View(); !strings.Contains(v, "no flows match") {
		t.Errorf("empty filtered list says nothing:\n%s", v)
	}
}

func TestViewToggle(t *testing.T) {
	m, src := newTestModel(t, Options{}, 120, 24, false)
	press(t, m, "v")
	if m.view != ViewPeers {
		t.Fatalf("v: view %q", m.view)
	}
	view := m.View()
	for _, want := range []string{"view: peers", "SIDE REMOTE", "10.0.0.2:8080", ":443 <- 2001:db8::99"} {
		if !strings.Contains(view, want) {
			t.Errorf("peers view lacks %q:\n%s", want, view)
		}
	}
	if len(src.queries) == 0 {
		t.Fatal("no query")
	}
	press(t, m, "tab")
	if m.view != ViewRequests || !strings.Contains(m.View(), "view: requests") {
		t.Errorf("tab did not go on to requests")
	}
	press(t, m, "tab")
	if m.view != ViewFlows || !strings.Contains(m.View(), "view: flows") {
		t.Errorf("tab did not go back to flows")
	}
}

func TestDetail(t *testing.T) {
	m, _ := newTestModel(t, Options{}, 120, 40, false)
	press(t, m, "down") // 101
	press(t, m, "enter")
	d := m.top()
	if d == nil || d.id != "101" || !d.fetched {
		t.Fatalf("enter on 101 opened %+v", d)
	}
	view := m.View()
	for _, want := range []string{
		"flow 101", "curl pid", "10.0.0.1:45678 -> 10.0.0.2:8080", "split ", "app 85%",
		"propagation 1.00ms + queueing 1.00ms", "send wait", "local read", "think",
		"warning 60% app_peer", "fix: do the thing", "duration", "srtt", "cwnd", "min 10 max 14",
		"AGE", "DURATION", "NETWORK", "TRANSPORT", "APP", "49.0ms", "view: flows › flow 101",
	} {
		if !strings.Contains(view, want) {
			t.Errorf("detail lacks %q:\n%s", want, view)
		}
	}
	if !strings.ContainsAny(view, "▁▂▃▄▅▆▇") {
		t.Errorf("no sparkline:\n%s", view)
	}
	press(t, m, "esc")
	if m.top() != nil {
		t.Fatal("esc did not go back")
	}
	if got := m.flowCur.id; got != "101" {
		t.Errorf("back on the list the cursor is on %q, want 101", got)
	}
	for _, back := range []string{"backspace", "left", "h"} {
		press(t, m, "enter", back)
		if m.top() != nil {
			t.Fatalf("%s in a detail did not go back", back)
		}
	}
}

func TestPeerDetail(t *testing.T) {
	m, _ := newTestModel(t, Options{View: ViewPeers}, 80, 24, false)
	press(t, m, "enter")
	d := m.top()
	if d == nil || d.kind != ViewPeers || !d.fetched {
		t.Fatalf("enter on a pair opened %+v", d)
	}
	view := m.View()
	for _, want := range []string{"peer p0000000000a1", "client -> 10.0.0.2:8080", "4 connections", "101", "202", "ID"} {
		if !strings.Contains(view, want) {
			t.Errorf("pair detail lacks %q:\n%s", want, view)
		}
	}
	press(t, m, "down", "enter")
	if d := m.top(); d == nil || d.kind != ViewFlows || d.id != "202" {
		t.Fatalf("enter on the pair's second flow opened %+v", d)
	}
	press(t, m, "esc")
	if d := m.top(); d == nil || d.kind != ViewPeers {
		t.Fatal("esc from a pair's flow did not go back to the pair")
	}
	press(t, m, "esc")
	if m.top() != nil || m.view != ViewPeers {
		t.Fatal("esc from the pair did not go back to the list")
	}
}

func TestQuit(t *testing.T) {
	for _, k := range []string{"q", "ctrl+c"} {
		m, _ := newTestModel(t, Options{}, 80, 24, false)
		if _, ok := press(t, m, k).(tea.QuitMsg); !ok {
			t.Errorf("%s did not quit", k)
		}
	}
	// q quits from every detail too, as the README promises, and the
	// footer says so.
	for _, c := range []struct {
		view View
		keys []string
	}{
		{ViewFlows, []string{"enter"}},
		{ViewPeers, []string{"enter"}},
		{ViewPeers, []string{"enter", "enter"}},
		{ViewRequests, []string{"enter"}},
	} {
		m, _ := newTestModel(t, Options{View: c.view}, 80, 24, false)
		press(t, m, c.keys...)
		if m.top() == nil {
			t.Fatalf("%s %v opened nothing", c.view, c.keys)
		}
		lines := strings.Split(m.View(), "\n")
		if foot := lines[len(lines)-1]; !strings.Contains(foot, "q quit") || !strings.Contains(foot, "esc back") {
			t.Errorf("%s %v: footer %q", c.view, c.keys, foot)
		}
		if _, ok := press(t, m, "q").(tea.QuitMsg); !ok {
			t.Errorf("%s %v: q did not quit", c.view, c.keys)
		}
	}
	// ctrl+c quits from the prompt and from a detail too.
	m, _ := newTestModel(t, Options{}, 80, 24, false)
	press(t, m, "/")
	if _, ok := press(t, m, "ctrl+c").(tea.QuitMsg); !ok {
		t.Error("ctrl+c in the prompt did not quit")
	}
	// q typed in the prompt is text.
	m, _ = newTestModel(t, Options{}, 80, 24, false)
	press(t, m, "/")
	if msg := press(t, m, "q"); msg != nil {
		t.Errorf("q in the prompt sent %T", msg)
	}
}

func TestTooSmall(t *testing.T) {
	for _, size := range [][2]int{{79, 24}, {80, 23}, {60, 10}, {20, 5}} {
		m, _ := newTestModel(t, Options{}, size[0], size[1], true)
		want := fmt.Sprintf("terminal is %dx%d; lattrace top needs at least 80x24", size[0], size[1])
		want = truncate(want, size[0])
		if got := m.View(); got != want {
			t.Errorf("%v: view %q, want %q", size, got, want)
		}
	}
	// Growing the terminal brings the screen back.
	m, _ := newTestModel(t, Options{}, 60, 10, false)
	update(m, tea.WindowSizeMsg{Width: 80, Height: 24})
	checkFrame(t, m.View(), 80, 24)
	if !strings.Contains(m.View(), "303") {
		t.Error("the rows did not come back after the resize")
	}
}

func TestSourceErrorKeepsTheData(t *testing.T) {
	m, src := newTestModel(t, Options{}, 80, 24, true)
	src.err = errors.New("no lattrace daemon at unix:/run/lattrace/api.sock")
	press(t, m, "+") // a refresh
	view := m.View()
	if !strings.Contains(view, "303") {
		t.Errorf("the last good rows went away on an error:\n%s", view)
	}
	var errLines int
	for _, l := range strings.Split(view, "\n") {
		if strings.Contains(l, "no lattrace daemon") {
			errLines++
			if !strings.Contains(l, "\x1b[") {
				t.Errorf("the error line is not coloured: %q", l)
			}
		}
	}
	if errLines != 1 {
		t.Errorf("%d error lines, want 1", errLines)
	}
	// It keeps asking, and the error goes once it answers.
	src.err = nil
	if cmd := update(m, tickMsg{m.seq}); cmd == nil {
		t.Fatal("a tick after an error asked nothing")
	} else {
		run(t, m, cmd)
	}
	if strings.Contains(m.View(), "no lattrace daemon") {
		t.Error("the error stayed after a good answer")
	}
}

func TestStaleAnswersAreDropped(t *testing.T) {
	m, src := newTestModel(t, Options{}, 80, 24, false)
	old := m.refresh()
	press(t, m, "v") // a newer refresh, of the peers
	src.flows.Flows = src.flows.Flows[:1]
	if cmd := update(m, old()); cmd != nil {
		t.Error("a stale answer scheduled a refresh: two chains would run")
	}
	if len(m.flowData.Flows) != 3 {
		t.Error("a stale answer replaced the data")
	}
	// A tick from an old chain does nothing either.
	if cmd := update(m, tickMsg{m.seq - 1}); cmd != nil {
		t.Error("a stale tick refreshed")
	}
}

func TestCursorFollowsTheRow(t *testing.T) {
	m, src := newTestModel(t, Options{}, 80, 24, false)
	press(t, m, "down") // 101, second by p99
	// 101 becomes the slowest: it moves to the top, the cursor with it.
	src.flows.Flows[0].Duration.P99 = time.Second
	press(t, m, "+")
	if m.flowCur.id != "101" || m.flowCur.idx != 0 {
		t.Errorf("cursor on %q at %d, want 101 at 0", m.flowCur.id, m.flowCur.idx)
	}
	// The row went away: the cursor stays where it was.
	src.flows.Flows = src.flows.Flows[1:]
	press(t, m, "-")
	if m.flowCur.idx != 0 || m.flowCur.id != rowIDs(m)[0] {
		t.Errorf("cursor %+v after its row went", m.flowCur)
	}
}

func TestScrolling(t *testing.T) {
	m, src := newTestModel(t, Options{}, 80, 24, false)
	base := src.flows.Flows[0]
	src.flows.Flows = nil
	for i := range 100 {
		f := base
		f.ID = fmt.Sprintf("%d", 1000+i)
		f.Duration.P99 = time.Duration(100-i) * ms
		src.flows.Flows = append(src.flows.Flows, f)
	}
	press(t, m, "+")
	press(t, m, "end")
	view := checkFrame(t, m.View(), 80, 24)
	if !strings.Contains(strings.Join(view, "\n"), "1099") {
		t.Errorf("end does not show the last row:\n%s", strings.Join(view, "\n"))
	}
	if !strings.Contains(view[1], "rows: 82-100/100") {
		t.Errorf("header line %q does not say which rows show", view[1])
	}
	press(t, m, "home")
	if !strings.Contains(m.View(), "1000") || m.flowCur.idx != 0 {
		t.Error("home does not go back to the first row")
	}
	press(t, m, "pgdown")
	if m.flowCur.idx == 0 {
		t.Error("pgdown did not move")
	}
	for range 30 {
		press(t, m, "j")
	}
	if id := m.flowCur.id; !strings.Contains(m.View(), id) {
		t.Errorf("the cursor's row %s is off screen", id)
	}
}

func TestEmptyList(t *testing.T) {
	m, src := newTestModel(t, Options{}, 80, 24, false)
	src.flows = api.FlowList{}
	press(t, m, "+")
	if v := m.View(); !strings.Contains(v, "no flows yet") {
		t.Errorf("empty list says nothing:\n%s", v)
	}
	press(t, m, "enter", "j", "k") // nothing to open or move over
	if m.top() != nil {
		t.Error("enter on an empty list opened something")
	}
}

func TestInterval(t *testing.T) {
	m, _ := newTestModel(t, Options{Interval: 3 * time.Second}, 80, 24, false)
	press(t, m, "+")
	if m.interval != 5*time.Second {
		t.Errorf("+ from 3s gave %s", m.interval)
	}
	press(t, m, "-", "-")
	if m.interval != time.Second {
		t.Errorf("- - from 5s gave %s", m.interval)
	}
	for range 10 {
		press(t, m, "-")
	}
	if m.interval != minInterval || !strings.Contains(m.View(), "refresh: 250ms") {
		t.Errorf("the interval went to %s, below its bound", m.interval)
	}
	for range 20 {
		press(t, m, "+")
	}
	if m.interval != maxInterval || !strings.Contains(m.View(), "refresh: 1m ") {
		t.Errorf("the interval went to %s, above its bound", m.interval)
	}
}

func TestOptions(t *testing.T) {
	o, err := Options{}.check()
	if err != nil || o.Interval != time.Second || o.Sort != api.DefaultSort || o.View != ViewFlows {
		t.Errorf("defaults %+v %v", o, err)
	}
	if o, _ := (Options{Interval: time.Millisecond}).check(); o.Interval != minInterval {
		t.Errorf("1ms became %s", o.Interval)
	}
	if _, err := (Options{Sort: "fastest"}).check(); err == nil {
		t.Error("a bad sort was taken")
	}
	if _, err := (Options{View: "sockets"}).check(); err == nil || !strings.Contains(err.Error(), "requests") {
		t.Errorf("a bad view was taken, or its error does not name the views: %v", err)
	}
	if o, err := (Options{View: "requests"}).check(); err != nil || o.View != ViewRequests {
		t.Errorf("the requests view was refused: %+v %v", o, err)
	}
}

func TestRunEnds(t *testing.T) {
	src := &fakeSource{flows: testFlows(), peers: testPeers()}
	// q on the input ends it normally.
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := Run(ctx, src, Options{}, strings.NewReader("q"), &out); err != nil {
		t.Errorf("Run after q: %v", err)
	}
	// So does the context's end.
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	if err := Run(ctx, src, Options{}, pr, &out); err != nil {
		t.Errorf("Run after the context ended: %v", err)
	}
}

// top asks for the first listLimit rows by its sort, and says how many
// there are in all when the daemon has more.
func TestListLimited(t *testing.T) {
	m, src := newTestModel(t, Options{}, 120, 24, false)
	if q := src.queries[len(src.queries)-1]; q.Limit != listLimit {
		t.Errorf("top asked for %d rows, want %d", q.Limit, listLimit)
	}
	if strings.Contains(m.View(), "first") {
		t.Errorf("a whole list says it is cut:\n%s", m.View())
	}
	src.flows.Total = 40000
	press(t, m, "+")
	if v := m.View(); !strings.Contains(v, "rows: 3/3 (first 3 of 40000)") {
		t.Errorf("the rows line does not say the list is cut:\n%s", v)
	}
}
