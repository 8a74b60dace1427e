package top

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/record"
)

// The fixture's requests, newest first.
const (
	reqSingle   = "9b9b9b9b-1"
	reqDetached = "5a5a5a5a-77"
	reqFull     = "1f2e3d4c5b6a7980-1a2b3c4d"
)

// detachedText is what a detached request's detail says, spaces folded.
const detachedText = "detached: more than one request of batch could have made its first hop, so whose request this served is not known"

// folded is the view without escapes, its runs of spaces and line ends
// folded to one space: what a sentence wrapped over lines reads as.
func folded(view string) string { return strings.Join(strings.Fields(plain(view)), " ") }

// openRequest moves the requests list's cursor to id and opens it.
func openRequest(t *testing.T, m *model, id string) {
	t.Helper()
	i := slices.Index(rowIDs(m), id)
	if i < 0 {
		t.Fatalf("request %s is not listed: %v", id, rowIDs(m))
	}
	press(t, m, "home")
	for range i {
		press(t, m, "down")
	}
	press(t, m, "enter")
	if d := m.top(); d == nil || d.kind != ViewRequests || d.id != id {
		t.Fatalf("enter on %s opened %+v", id, d)
	}
}

// treeLine is the line of the view that draws hop from -> to, without
// escapes and trailing spaces.
func treeLine(t *testing.T, view, from, to string) string {
	t.Helper()
	for _, l := range strings.Split(plain(view), "\n") {
		if strings.Contains(l, " "+from+" -> "+to+" ") {
			return strings.TrimRight(l, " ")
		}
	}
	t.Fatalf("no line for %s -> %s:\n%s", from, to, plain(view))
	return ""
}

func TestRequestsViewCycle(t *testing.T) {
	m, src := newTestModel(t, Options{}, 120, 24, false)
	for _, want := range []View{ViewPeers, ViewRequests, ViewFlows} {
		press(t, m, "v")
		if m.view != want || !strings.Contains(m.View(), "view: "+string(want)+" ") {
			t.Fatalf("v: view %q, want %q:\n%s", m.view, want, m.View())
		}
	}
	// Backwards: flows, requests, peers.
	for _, want := range []View{ViewRequests, ViewPeers, ViewFlows} {
		update(m, tea.KeyMsg{Type: tea.KeyShiftTab})
		if m.view != want {
			t.Fatalf("shift+tab: view %q, want %q", m.view, want)
		}
	}
	press(t, m, "tab", "tab")
	if m.view != ViewRequests || src.treeAsks == 0 {
		t.Fatalf("tab tab: view %q, %d asks for the requests", m.view, src.treeAsks)
	}
	// The key line names the next view.
	lines := strings.Split(plain(m.View()), "\n")
	if foot := lines[len(lines)-1]; !strings.Contains(foot, "v flows") || !strings.Contains(foot, "enter tree") {
		t.Errorf("requests key line %q", foot)
	}
	press(t, m, "v")
	if lines := strings.Split(plain(m.View()), "\n"); !strings.Contains(lines[len(lines)-1], "v peers") {
		t.Errorf("flows key line %q", lines[len(lines)-1])
	}
	press(t, m, "v")
	if lines := strings.Split(plain(m.View()), "\n"); !strings.Contains(lines[len(lines)-1], "v requests") {
		t.Errorf("peers key line %q", lines[len(lines)-1])
	}
}

func TestRequestsList(t *testing.T) {
	m, _ := newTestModel(t, Options{View: ViewRequests}, 120, 40, false)
	if got, want := rowIDs(m), []string{reqSingle, reqDetached, reqFull}; !slices.Equal(got, want) {
		t.Fatalf("requests %v, want newest first %v", got, want)
	}
	view := m.View()
	checkFrame(t, view, 120, 40)
	view = plain(view)
	for _, want := range []string{"view: requests", "sort: newest first", "rows: 3/3"} {
		if !strings.Contains(view, want) {
			t.Errorf("header lacks %q:\n%s", want, view)
		}
	}
	var head string
	for _, l := range strings.Split(view, "\n") {
		if strings.HasPrefix(l, "ID ") {
			head = l
		}
	}
	titles := []string{"ID", "ENDPOINT", "DURATION", "HOPS", "CRIT TURNS", "DOMINANT HOP"}
	last := -1
	for _, title := range titles {
		i := strings.Index(head, title)
		if i <= last {
			t.Errorf("column %q missing or out of order in %q", title, head)
		}
		last = i
	}
	rows := screenRows(view, rowIDs(m))
	for id, want := range map[string]string{
		reqSingle:   reqSingle + " front:8080 6.00ms 1 2 curl -> front",
		reqDetached: reqDetached + " api:8081 (detached) 9.00ms 2 4 api -> postgres",
		reqFull:     reqFull + " front:8080 14.5ms 6 6 api -> postgres",
	} {
		if got := strings.Join(strings.Fields(rows[id]), " "); got != want {
			t.Errorf("row %s reads %q, want %q", id, got, want)
		}
	}
	if m.reqCur.id != reqSingle {
		t.Errorf("the cursor is on %q, want the newest", m.reqCur.id)
	}

	// The sort keys are inert here: the order and the flows' sort stay.
	for _, k := range []string{"s", "p", "P", "r", "R", "t", "e"} {
		press(t, m, k)
	}
	if m.sort != api.DefaultSort || !slices.Equal(rowIDs(m), []string{reqSingle, reqDetached, reqFull}) {
		t.Errorf("sort keys changed the requests view: sort %q, rows %v", m.sort, rowIDs(m))
	}
	if lines := strings.Split(plain(m.View()), "\n"); strings.Contains(lines[len(lines)-1], "sort") {
		t.Errorf("the key line offers sort keys that do nothing here: %q", lines[len(lines)-1])
	}

	// The next answer brings a newer request on top, the cursor staying
	// on its request.
	press(t, m, "down")
	src := m.src.(*fakeSource)
	newest := *src.requests.Recent[2]
	newest.ID = "cccc-2"
	src.requests.Recent = append(src.requests.Recent, &newest)
	press(t, m, "+")
	if got := rowIDs(m); len(got) != 4 || got[0] != "cccc-2" {
		t.Errorf("the newer request is not on top: %v", got)
	}
	if m.reqCur.id != reqDetached {
		t.Errorf("the cursor moved to %q with the new row", m.reqCur.id)
	}
}

func TestRequestsFilter(t *testing.T) {
	m, _ := newTestModel(t, Options{View: ViewRequests}, 120, 40, false)
	for _, c := range []struct {
		filter string
		want   []string
	}{
		{"ldap", []string{reqFull}}, // a hop's name
		{"postgres", []string{reqDetached, reqFull}},
		{"8081", []string{reqDetached}},       // the endpoint
		{"9b9b", []string{reqSingle}},         // the id
		{"comm:batch", []string{reqDetached}}, // comm matches the service names
		{"port:8080", []string{reqFull}},      // a hop's end
		{"pid:500 curl", []string{reqFull}},   // fields and text together
		{"10.0.0.5", []string{reqFull}},       // text on a hop's end
		{"nothing-like-it", nil},
	} {
		f, err := api.ParseFilter(c.filter)
		if err != nil {
			t.Fatal(err)
		}
		m.filter = f
		m.rebuild()
		if got := rowIDs(m); !slices.Equal(got, c.want) {
			t.Errorf("filter %q keeps %v, want %v", c.filter, got, c.want)
		}
	}
	if v := m.View(); !strings.Contains(v, "no requests match the filter") {
		t.Errorf("an empty filtered list says nothing:\n%s", plain(v))
	}
	// Typed, and cleared, as in the other lists.
	press(t, m, "c", "/")
	typeText(t, m, "ldap")
	press(t, m, "enter")
	if got := rowIDs(m); !slices.Equal(got, []string{reqFull}) {
		t.Errorf("typed filter keeps %v", got)
	}
	press(t, m, "c")
	if len(rowIDs(m)) != 3 {
		t.Errorf("c left %v", rowIDs(m))
	}
}

func TestRequestDetail(t *testing.T) {
	m, src := newTestModel(t, Options{View: ViewRequests}, 120, 40, false)
	asks := src.treeAsks
	// The tree is on screen as enter is pressed, before any answer: it
	// came with the list.
	i := slices.Index(rowIDs(m), reqFull)
	for range i {
		press(t, m, "down")
	}
	update(m, keyMsg("enter"))
	d := m.top()
	if d == nil || d.kind != ViewRequests || d.id != reqFull || d.req == nil {
		t.Fatalf("enter on %s opened %+v", reqFull, d)
	}
	view := m.View()
	checkFrame(t, view, 120, 40)
	text := folded(view)
	for _, want := range []string{
		"view: requests › request " + reqFull,
		"request " + reqFull, "to front:8080", "14.5ms", "6 hops", "6 turns on the critical path", "dominant api -> postgres",
		"* critical path",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("detail lacks %q:\n%s", want, plain(view))
		}
	}
	if strings.Contains(text, "detached") {
		t.Errorf("a request with a known caller says detached:\n%s", plain(view))
	}
	// One hop a line, indented by depth, the critical path marked: the
	// root, front -> api, api -> postgres. auth -> ldap is critical to
	// auth, which is not on the path: not marked.
	for _, c := range []struct {
		from, to, prefix string
		has              []string
	}{
		{"curl", "front", "* curl -> front", []string{"14.5ms", "2.00ms", "1.00ms", "3.00ms", "8.50ms", " 2 -"}},
		{"front", "api", "*   front -> api", []string{"8.50ms", "0.50ms", "5.00ms", "thread", "yes"}},
		{"api", "postgres", "*     api -> postgres", []string{"5.00ms", "4.00ms", "goroutine"}},
		{"api", "redis", "      api -> redis", []string{"0.50ms", "0.30ms", "0.20ms", "window", "yes"}},
		{"front", "auth", "    front -> auth", []string{"3.00ms", "2.00ms", "handoff", "yes"}},
		{"auth", "ldap", "      auth -> ldap", []string{"2.00ms", "handoff"}},
	} {
		l := treeLine(t, view, c.from, c.to)
		if !strings.HasPrefix(l, c.prefix+" ") {
			t.Errorf("%s -> %s: line %q does not start %q", c.from, c.to, l, c.prefix)
		}
		for _, want := range c.has {
			if !strings.Contains(l, want) {
				t.Errorf("%s -> %s: line %q lacks %q", c.from, c.to, l, want)
			}
		}
		if slices.Contains(c.has, "yes") != strings.HasSuffix(l, " yes") {
			t.Errorf("%s -> %s: parallel mark wrong: %q", c.from, c.to, l)
		}
	}
	// The tree's lines come in the tree's order.
	var order []string
	for _, l := range strings.Split(plain(view), "\n") {
		if f := strings.Fields(strings.TrimPrefix(l, "*")); len(f) >= 3 && f[1] == "->" {
			order = append(order, f[0]+">"+f[2])
		}
	}
	if want := []string{"curl>front", "front>api", "api>postgres", "api>redis", "front>auth", "auth>ldap"}; !slices.Equal(order, want) {
		t.Errorf("tree order %v, want %v", order, want)
	}
	lines := strings.Split(plain(view), "\n")
	if foot := lines[len(lines)-1]; !strings.Contains(foot, "esc back") || !strings.Contains(foot, "q quit") {
		t.Errorf("detail key line %q", foot)
	}
	// The refresh asks the list, not the request.
	run(t, m, m.refresh())
	if src.treeAsks <= asks {
		t.Error("the detail's refresh did not ask for the list")
	}

	// esc goes back to the list, on the same request.
	press(t, m, "esc")
	if m.top() != nil || m.view != ViewRequests || m.reqCur.id != reqFull {
		t.Fatalf("esc: detail %+v, view %q, cursor on %q", m.top(), m.view, m.reqCur.id)
	}

	// A detached request says whose request it served is not known.
	openRequest(t, m, reqDetached)
	view = m.View()
	checkFrame(t, view, 120, 40)
	if text := folded(view); !strings.Contains(text, detachedText) || !strings.Contains(text, "request "+reqDetached) {
		t.Errorf("the detached request's detail lacks %q:\n%s", detachedText, plain(view))
	}
	if l := treeLine(t, view, "api", "postgres"); !strings.HasPrefix(l, "*   api -> postgres") || !strings.Contains(l, "go_parent") {
		t.Errorf("detached tree line %q", l)
	}
	press(t, m, "esc")

	// A hop that opened its connection says so in its turns.
	openRequest(t, m, reqSingle)
	if l := treeLine(t, m.View(), "curl", "front"); !strings.Contains(l, "2+hs") {
		t.Errorf("the handshake does not show: %q", l)
	}
}

// The detail keeps the list's newest copy, and its last one once the
// request is no longer among the recent ones.
func TestRequestDetailFollowsTheList(t *testing.T) {
	m, src := newTestModel(t, Options{View: ViewRequests}, 120, 40, false)
	openRequest(t, m, reqFull)

	// A newer copy of the same request (its tree grew a late hop).
	l := testRequests()
	full := l.Recent[0]
	late := hop("front", "cache", record.LinkThread, ms, 0, ms, 0, 2)
	full.Root.Children = append(full.Root.Children, late)
	full.Hops = 7
	src.requests = l
	press(t, m, "+")
	if v := folded(m.View()); !strings.Contains(v, "7 hops") || !strings.Contains(v, "front -> cache") {
		t.Errorf("the detail did not take the newer copy:\n%s", plain(m.View()))
	}

	// It drops out of the recent list: its last copy stays.
	src.requests.Recent = src.requests.Recent[1:]
	press(t, m, "+")
	d := m.top()
	if d == nil || d.id != reqFull || !d.gone {
		t.Fatalf("after the request went the detail is %+v", d)
	}
	view := m.View()
	checkFrame(t, view, 120, 40)
	text := folded(view)
	for _, want := range []string{"request " + reqFull, "7 hops", "front -> cache", "auth -> ldap", "no longer among the recent requests"} {
		if !strings.Contains(text, want) {
			t.Errorf("the gone request's detail lacks %q:\n%s", want, plain(view))
		}
	}
	// The list behind it is current.
	press(t, m, "esc")
	if got := rowIDs(m); !slices.Equal(got, []string{reqSingle, reqDetached}) {
		t.Errorf("the list is %v after the request went", got)
	}
}

// deepRequest is a request of n hops: a chain of depth deep under the
// root, the rest its siblings, with names long enough to be cut.
func deepRequest(n, deep int) *record.Request {
	root := hop("frontend-with-a-rather-long-deployment-name-7d9f6c5b4-x2x2x", "api-gateway-with-a-long-name-5c4b3a2-z9z9", "", ms, ms, ms, 20*ms, 2)
	parent := root
	for i := range deep {
		c := hop(fmt.Sprintf("svc-%02d-with-a-long-pod-name-abcdef", i), fmt.Sprintf("svc-%02d-with-a-long-pod-name-abcdef", i+1), record.LinkGoParent, ms, ms, ms, ms, 2)
		c.Critical = true
		parent.Children = append(parent.Children, c)
		parent = c
	}
	for i := 1 + deep; i < n; i++ {
		c := hop("frontend-with-a-rather-long-deployment-name-7d9f6c5b4-x2x2x", fmt.Sprintf("leaf-%02d", i), record.LinkWindow, ms, 0, ms, 0, 2)
		c.Parallel = true
		root.Children = append(root.Children, c)
	}
	return &record.Request{
		ID: "ffffffffffffffff-ffffffff", Endpoint: "frontend-with-a-rather-long-deployment-name-7d9f6c5b4-x2x2x:8443",
		Root: root, Duration: root.Duration, Hops: n, Truncated: 3, CriticalTurns: uint32(2 * (deep + 1)),
		Dominant: "svc-07-with-a-long-pod-name-abcdef -> svc-08-with-a-long-pod-name-abcdef", Detached: true,
	}
}

func TestRequestViewsFitTheTerminal(t *testing.T) {
	for _, size := range [][2]int{{80, 24}, {120, 40}} {
		for _, colour := range []bool{false, true} {
			w, h := size[0], size[1]
			t.Run(fmt.Sprintf("%dx%d colour=%v", w, h, colour), func(t *testing.T) {
				m, src := newTestModel(t, Options{View: ViewRequests}, w, h, colour)
				view := m.View()
				checkFrame(t, view, w, h)
				if rows := screenRows(view, rowIDs(m)); len(rows) != 3 {
					t.Errorf("the ids are not whole:\n%s", plain(view))
				}
				if !strings.Contains(plain(view), "(detached)") {
					t.Errorf("the detached mark does not show:\n%s", plain(view))
				}
				for _, id := range []string{reqFull, reqDetached} {
					openRequest(t, m, id)
					view = m.View()
					checkFrame(t, view, w, h)
					if id == reqDetached && !strings.Contains(folded(view), detachedText) {
						t.Errorf("the detached line does not show:\n%s", plain(view))
					}
					press(t, m, "esc")
				}

				// Long names, deep and tall: cut, never wider, and the
				// tree scrolls.
				deep := deepRequest(60, 12)
				src.requests.Recent = append(src.requests.Recent, deep)
				press(t, m, "+")
				view = m.View()
				checkFrame(t, view, w, h)
				if rows := screenRows(view, []string{deep.ID}); len(rows) != 1 {
					t.Errorf("a long request's id is cut:\n%s", plain(view))
				}
				if !strings.Contains(plain(view), "(det") {
					t.Errorf("a long detached endpoint lost its mark:\n%s", plain(view))
				}
				openRequest(t, m, deep.ID)
				view = m.View()
				lines := checkFrame(t, view, w, h)
				text := plain(view)
				if !strings.Contains(text, "* frontend") {
					t.Errorf("the root is not on the first screen:\n%s", text)
				}
				if strings.Contains(text, "leaf-59") {
					t.Errorf("60 hops fit %d lines?\n%s", h, text)
				}
				if !strings.Contains(folded(view), "detached: more than one request of frontend") {
					t.Errorf("the detached line is missing:\n%s", text)
				}
				vis := m.hopRows(m.top())
				if !strings.Contains(text, fmt.Sprintf("rows: 1-%d/60", vis)) {
					t.Errorf("the header does not say which hops show (%d):\n%s", vis, text)
				}
				// The indent shows even cut: the deepest chain hop starts
				// further right than its parent.
				var indents []int
				for _, l := range lines {
					l = plain(l)
					if i := strings.Index(l, "svc-"); i > 0 && strings.HasPrefix(strings.TrimLeft(l, " "), "*") {
						indents = append(indents, i)
					}
				}
				for i := 1; i < len(indents); i++ {
					if indents[i] <= indents[i-1] {
						t.Errorf("the tree's indent does not grow: %v\n%s", indents, text)
						break
					}
				}
				press(t, m, "end")
				view = m.View()
				checkFrame(t, view, w, h)
				if text := plain(view); !strings.Contains(text, "leaf-59") || !strings.Contains(text, "rows: ") || !strings.Contains(text, "-60/60") || strings.Contains(text, "* frontend") {
					t.Errorf("end does not show the last hop:\n%s", text)
				}
				press(t, m, "pgup")
				if m.top().cur.idx != 59-max(vis-1, 1) {
					t.Errorf("pgup from the end went to hop %d (page %d)", m.top().cur.idx, vis)
				}
				press(t, m, "home", "down")
				if m.top().cur.idx != 1 || !strings.Contains(plain(m.View()), "* frontend") {
					t.Errorf("home, down: on hop %d", m.top().cur.idx)
				}
				press(t, m, "pgdown")
				if m.top().cur.idx != 1+max(vis-1, 1) {
					t.Errorf("pgdown went to hop %d (page %d)", m.top().cur.idx, vis)
				}
				checkFrame(t, m.View(), w, h)
			})
		}
	}
}

func TestRequestsNotServed(t *testing.T) {
	m, src := newTestModel(t, Options{}, 80, 24, true)
	src.reqErr = noTrees
	// A daemon without trees: a fresh screen opened on the requests.
	opts, err := Options{View: ViewRequests}.check()
	if err != nil {
		t.Fatal(err)
	}
	m2 := newModel(context.Background(), src, opts, m.st.r)
	update(m2, tea.WindowSizeMsg{Width: 80, Height: 24})
	run(t, m2, m2.Init())
	for _, m := range []*model{m, m2} {
		if m.view != ViewRequests {
			press(t, m, "v", "v")
		}
		view := m.View()
		lines := checkFrame(t, view, 80, 24)
		status := lines[len(lines)-2]
		if !strings.Contains(plain(status), "error: this daemon makes no request trees: it runs with --request-trees=false") {
			t.Errorf("status line %q does not say why", plain(status))
		}
		if !strings.Contains(status, "\x1b[") {
			t.Errorf("the error line is not coloured: %q", status)
		}
		if m == m2 && !strings.Contains(plain(view), "no data yet: see the error below") {
			t.Errorf("the empty list does not point at the error:\n%s", plain(view))
		}
		// It keeps asking, and the other views work.
		if cmd := update(m, tickMsg{m.seq}); cmd == nil {
			t.Fatal("no refresh after the error")
		} else {
			run(t, m, cmd)
		}
		press(t, m, "v")
		if m.view != ViewFlows || m.fetchErr != "" || !strings.Contains(m.View(), "303") {
			t.Errorf("back on the flows: view %q, error %q:\n%s", m.view, m.fetchErr, plain(m.View()))
		}
	}
}

func TestWriteRequests(t *testing.T) {
	l := testRequests()
	for _, w := range []int{80, 160} {
		var b bytes.Buffer
		if err := WriteRequests(&b, l, api.Filter{}, w); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if strings.ContainsRune(out, '\x1b') || strings.Contains(out, "…") {
			t.Errorf("width %d: not plain and whole:\n%q", w, out)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if len(lines) != 4 {
			t.Fatalf("width %d: %d lines, want a header and 3 rows:\n%s", w, len(lines), out)
		}
		for _, title := range []string{"ID", "ENDPOINT", "DURATION", "HOPS", "CRIT TURNS", "DOMINANT HOP"} {
			if !strings.Contains(lines[0], title) {
				t.Errorf("width %d: header %q lacks %q", w, lines[0], title)
			}
		}
		for i, id := range []string{reqSingle, reqDetached, reqFull} {
			if !strings.HasPrefix(lines[1+i], id+" ") {
				t.Errorf("width %d: line %d is %q, want %s (newest first)", w, 1+i, lines[1+i], id)
			}
		}
		if !strings.Contains(lines[2], "api:8081 (detached)") {
			t.Errorf("width %d: the detached request is not marked: %q", w, lines[2])
		}
	}
	// The filter applies; no trees print (none).
	var b bytes.Buffer
	f, _ := api.ParseFilter("ldap")
	if err := WriteRequests(&b, l, f, 80); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], reqFull) {
		t.Errorf("filtered:\n%s", b.String())
	}
	b.Reset()
	if err := WriteRequests(&b, api.RequestList{}, api.Filter{}, 80); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(b.String(), "\n(none)\n") {
		t.Errorf("no trees:\n%s", b.String())
	}
}

// The source's error on the requests does not stop the refreshes of the
// other lists (a tick is still scheduled).
func TestRequestsErrorSchedulesRefresh(t *testing.T) {
	m, src := newTestModel(t, Options{View: ViewRequests}, 80, 24, false)
	src.reqErr = noTrees
	msg := m.refresh()()
	if cmd := update(m, msg); cmd == nil {
		t.Error("an error answer scheduled no refresh")
	}
	if m.fetchErr == "" || !m.reqsLoaded || len(m.reqs) != 3 {
		t.Errorf("error %q; the last good requests %d", m.fetchErr, len(m.reqs))
	}
}

// Against a real API without request trees, the requests view says what
// the daemon said, and the flows still come.
func TestRequestsNotServedByARealAPI(t *testing.T) {
	srv := api.NewServer(aggregate.New(aggregate.Config{}), history.New(history.Config{}),
		func() api.Health { return api.Health{Status: "ok"} }, nil, nil)
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	c, err := api.NewClient(hs.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	opts, err := Options{View: ViewRequests}.check()
	if err != nil {
		t.Fatal(err)
	}
	m := newModel(context.Background(), c, opts, lipgloss.NewRenderer(io.Discard))
	update(m, tea.WindowSizeMsg{Width: 80, Height: 24})
	run(t, m, m.Init())
	lines := checkFrame(t, m.View(), 80, 24)
	if status := plain(lines[len(lines)-2]); status != "error: this daemon makes no request trees: it runs with --request-trees=false" {
		t.Errorf("status line %q", status)
	}
	press(t, m, "v")
	if m.view != ViewFlows || m.fetchErr != "" || !m.flowsLoaded {
		t.Errorf("the flows after the requests' error: view %q, error %q", m.view, m.fetchErr)
	}
}
