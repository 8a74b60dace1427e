package top

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/record"
)

// The requests view lists the daemon's recent request trees, newest
// first, and opens one as its tree, a hop a line. The trees come whole
// with the list (GET /v1/requests?trees=1): a detail asks for nothing of
// its own, it keeps the copy the last list had.

// requestsErr is what the status line says when the list of requests
// failed. A daemon without request trees answers 404 with a sentence
// saying how to start it: that sentence alone fits 80 columns.
func requestsErr(err error) error {
	if err != nil && errors.Is(err, api.ErrNotFound) {
		if msg, ok := strings.CutPrefix(err.Error(), api.ErrNotFound.Error()+": "); ok {
			return errors.New(msg)
		}
	}
	return err
}

// requestRows are the recent requests (oldest first, as the API sends
// them) newest first, those the filter keeps.
func requestRows(recent []*record.Request, f api.Filter) []*record.Request {
	out := make([]*record.Request, 0, len(recent))
	for i := len(recent) - 1; i >= 0; i-- {
		if r := recent[i]; r != nil && r.Root != nil && matchRequest(f, r) {
			out = append(out, r)
		}
	}
	return out
}

// matchRequest keeps a request when one of its hops' ends passes the
// filter's fields (comm, pid, port, addr, netns, container; comm also
// matches a hop's service names, which are commands or pods), and each
// free-text word is in its id, its endpoint, a hop's service names or
// what the fields match on a hop's ends.
func matchRequest(f api.Filter, r *record.Request) bool {
	var ends []*api.Flow
	var names []string
	walkHops(r.Root, 0, func(h *record.Hop, _ int) {
		names = append(names, h.From, h.To)
		for _, x := range []*record.Exchange{h.Client, h.Server} {
			if x != nil {
				fl := &api.Flow{ID: strconv.FormatUint(x.Cookie, 10)}
				fl.Flow, fl.Owner = x.Flow, x.Owner
				ends = append(ends, fl)
			}
		}
	})
	fields := f
	fields.Text = ""
	if fields.Comm != "" && slices.ContainsFunc(names, func(n string) bool { return strings.Contains(n, f.Comm) }) {
		fields.Comm = ""
	}
	if !fields.Empty() && !slices.ContainsFunc(ends, fields.MatchFlow) {
		return false
	}
	hay := append([]string{r.ID, r.Endpoint}, names...)
	for _, word := range strings.Fields(f.Text) {
		text := api.Filter{Text: word}
		if !slices.ContainsFunc(hay, func(h string) bool { return strings.Contains(h, word) }) &&
			!slices.ContainsFunc(ends, text.MatchFlow) {
			return false
		}
	}
	return true
}

// findRequest is request id's newest copy in recent, or last, gone, when
// it is no longer there.
func findRequest(recent []*record.Request, id string, last *record.Request) (*record.Request, bool) {
	for _, r := range recent {
		if r != nil && r.ID == id && r.Root != nil {
			return r, false
		}
	}
	return last, true
}

func reqIDs(rs []*record.Request) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}

// requestTable lays out requests, in the order given. The id is never
// narrowed (it is what `lattrace requests ID` takes); the endpoint and
// the dominant hop are cut in their middle when they must be, a detached
// request keeping its mark.
func requestTable(reqs []*record.Request) *table {
	t := &table{cols: []column{
		{name: "id", titles: []string{"ID"}, whole: true},
		{name: "endpoint", titles: []string{"ENDPOINT"}, middle: true, whole: true},
		{name: "dur", titles: []string{"DURATION", "TIME"}, right: true},
		{name: "hops", titles: []string{"HOPS"}, right: true},
		{name: "crit", titles: []string{"CRIT TURNS", "CRIT"}, right: true},
		{name: "dom", titles: []string{"DOMINANT HOP", "DOMINANT"}, middle: true, whole: true},
	}}
	// The titles shorten on screen only: a script reads the same header
	// at any width.
	t.stages = []stage{
		{col: "crit", live: true}, {col: "dur", live: true}, shrinkTo("endpoint", 0),
		cutTo("dom", 24), cutTo("endpoint", 24), cutTo("dom", 16), cutTo("endpoint", 16),
		cutTo("dom", 10), cutTo("endpoint", 10),
	}
	for _, r := range reqs {
		t.rows = append(t.rows, requestRow(r))
	}
	return t
}

func requestRow(r *record.Request) tableRow {
	ep := []string{sanitize(r.Endpoint)}
	if r.Detached {
		// Whose request it served is not known: said on every row.
		ep = []string{ep[0] + " (detached)", ep[0] + " (det)"}
	}
	dom := sanitize(r.Dominant)
	if dom == "" {
		dom = "-"
	}
	return tableRow{id: r.ID, cells: [][]string{
		{sanitize(r.ID)},
		ep,
		{fmtDur(r.Duration)},
		{strconv.Itoa(r.Hops)},
		{strconv.FormatUint(uint64(r.CriticalTurns), 10)},
		{dom},
	}}
}

// hopRow is one line of a tree: a hop, its depth, and whether it is on
// the request's critical path (the root, and each critical child of a
// hop on it).
type hopRow struct {
	h     *record.Hop
	depth int
	path  bool
}

// walkHops visits the tree under h depth-first, parents first.
func walkHops(h *record.Hop, depth int, visit func(*record.Hop, int)) {
	if h == nil {
		return
	}
	visit(h, depth)
	for _, c := range h.Children {
		walkHops(c, depth+1, visit)
	}
}

// treeRows are r's hops in the order the tree is drawn.
func treeRows(r *record.Request) []hopRow {
	if r == nil {
		return nil
	}
	var rows []hopRow
	var walk func(h *record.Hop, depth int, path bool)
	walk = func(h *record.Hop, depth int, path bool) {
		if h == nil {
			return
		}
		rows = append(rows, hopRow{h, depth, path})
		for _, c := range h.Children {
			walk(c, depth+1, path && c.Critical)
		}
	}
	walk(r.Root, 0, true)
	return rows
}

// hopIDs name a tree's lines by their place: a request's tree does not
// change once made.
func hopIDs(rows []hopRow) []string {
	ids := make([]string, len(rows))
	for i := range rows {
		ids[i] = strconv.Itoa(i)
	}
	return ids
}

// Marks of a tree's line: on the critical path, and overlapping a
// sibling.
const (
	criticalMark = "*"
	parallelMark = "yes"
)

// hopTable lays a tree out, a hop a line: the hop indented by its depth
// under its parent, then where its time went and how it was linked.
func hopTable(rows []hopRow) *table {
	t := &table{cols: []column{
		{name: "hop", titles: []string{"  HOP (FROM -> TO)", "  HOP"}, middle: true},
		{name: "dur", titles: []string{"DURATION", "TIME"}, right: true},
		{name: "net", titles: []string{"NETWORK", "NET"}, right: true},
		{name: "trans", titles: []string{"TRANSPORT", "TRANS"}, right: true},
		{name: "think", titles: []string{"THINK"}, right: true},
		{name: "wait", titles: []string{"ON CHILDREN", "CHILDREN", "WAIT"}, right: true},
		{name: "turns", titles: []string{"TURNS"}, right: true},
		{name: "link", titles: []string{"LINK"}},
		{name: "par", titles: []string{"PARALLEL", "PAR"}},
	}}
	t.stages = []stage{
		shrinkTo("hop", 0), cutTo("hop", 40), shrinkTo("wait", 0), shrinkTo("trans", 0),
		shrinkTo("dur", 0), shrinkTo("net", 0), shrinkTo("par", 0),
		cutTo("hop", 24), cutTo("hop", 12),
	}
	for i := range rows {
		t.rows = append(t.rows, hopLine(&rows[i], i))
	}
	return t
}

func hopLine(r *hopRow, i int) tableRow {
	h := r.h
	mark := " "
	if r.path {
		mark = criticalMark
	}
	name := mark + " " + strings.Repeat("  ", r.depth) + sanitize(h.From) + " -> " + sanitize(h.To)
	link := sanitize(string(h.Link))
	if link == "" {
		link = "-"
	}
	turns := strconv.FormatUint(uint64(h.Turns), 10)
	if h.Handshake {
		// Its connection opened: one more round trip than its turns.
		turns += "+hs"
	}
	par := ""
	if h.Parallel {
		par = parallelMark
	}
	return tableRow{id: strconv.Itoa(i), cells: [][]string{
		{name},
		{fmtDur(h.Duration)},
		{fmtDur(h.Network)},
		{fmtDur(h.Transport)},
		{fmtDur(h.Think)},
		{fmtDur(h.ChildWait)},
		{turns},
		{link},
		{par},
	}}
}

// requestBody is a request's title, what is known of whom it served, and
// its tree in the lines left, scrolled to the cursor.
func (m *model) requestBody(d *detail, h int) []string {
	head := m.requestHead(d)
	rows := treeRows(d.req)
	return append(head, m.tableLines(hopTable(rows), &d.cur, h-len(head), "no hops")...)
}

// requestHead are the lines above a request's tree: what it is, then
// what it is not known to be, then how to read the tree.
func (m *model) requestHead(d *detail) []string {
	r, w := d.req, m.width
	if r == nil {
		return []string{"request " + sanitize(d.id) + ": no tree"}
	}
	items := []string{
		"request " + sanitize(r.ID),
		"to " + sanitize(r.Endpoint),
		fmtDur(r.Duration),
		count(r.Hops, "hop"),
		count(r.CriticalTurns, "turn") + " on the critical path",
	}
	if r.Dominant != "" {
		items = append(items, "dominant "+sanitize(r.Dominant))
	}
	// Three lines at most: a long endpoint or hop name must not push
	// the numbers off.
	lines := wrapItems(items, " · ", w)
	lines = lines[:min(len(lines), 3)]
	for i := range lines {
		lines[i] = m.st.title.Render(lines[i])
	}
	if r.Detached {
		from := "its first hop's client"
		if r.Root != nil && r.Root.From != "" {
			from = sanitize(r.Root.From)
		}
		text := fmt.Sprintf("detached: more than one request of %s could have made its first hop, so whose request this served is not known", from)
		det := wrap(text, w)
		if len(det) > 2 {
			det[1] = truncate(strings.Join(det[1:], " "), w)
			det = det[:2]
		}
		for _, l := range det {
			lines = append(lines, m.st.severity[record.SeverityWarning].Render(l))
		}
	}
	var notes []string
	if r.Truncated > 0 {
		notes = append(notes, fmt.Sprintf("%d more hops not kept", r.Truncated))
	}
	if d.gone {
		notes = append(notes, "no longer among the recent requests: its last copy")
	}
	notes = append(notes, criticalMark+" critical path", "LINK: how a hop was tied to its parent's request", "PARALLEL: overlaps a sibling")
	for _, l := range wrapItems(notes, " · ", w)[:1] {
		lines = append(lines, m.st.dim.Render(l))
	}
	return lines
}

// hopRows is how many lines of a request's tree fit on screen.
func (m *model) hopRows(d *detail) int {
	if m.width < minWidth || m.height < minHeight {
		return 1
	}
	return max(m.bodyHeight()-len(m.requestHead(d))-1, 1)
}
