package top

import (
	"context"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/record"
)

// model is the screen's whole state. Update changes it, View only reads
// it, and the Source is only called from commands.
type model struct {
	ctx   context.Context
	src   Source
	st    styles
	title string

	interval time.Duration
	sort     string
	view     View
	filter   api.Filter

	// width and height are the terminal's, 0 until the first resize.
	width, height int

	// The last good answers, as received: a failed refresh leaves them.
	flowData    api.FlowList
	peerData    api.PeerList
	reqData     api.RequestList
	flowsLoaded bool
	peersLoaded bool
	reqsLoaded  bool
	// flows and peers are the rows shown: the data filtered and sorted
	// here too, so an answer to an older query never shows rows the
	// current filter excludes. reqs are the recent requests, newest
	// first, filtered here only (the API takes no filter for them).
	flows []api.Flow
	peers []api.Peer
	reqs  []*record.Request
	// Each list keeps its own cursor, so switching views and back lands
	// on the same row.
	flowCur, peerCur, reqCur cursor

	// stack holds the open detail views, innermost last; empty on the list.
	stack []*detail

	// prompting is the filter prompt being open, input its text.
	prompting bool
	input     string
	// draft is a filter that did not parse, offered again at the next
	// "/" so a typo is fixed, not retyped.
	draft string

	// fetchErr is the last refresh's failure, until one succeeds.
	fetchErr string
	// note is a one-off error (a bad filter), cleared by the next key.
	note string
	// seq numbers the refreshes: only the answer to the latest one is
	// used and schedules the next, so one chain of refreshes runs at a
	// time however often keys restart it.
	seq uint64
}

// detail is one open flow, peer pair or request. It starts with the row
// it was opened from, so something is on screen before the first answer.
type detail struct {
	kind View
	id   string

	flow   api.Flow
	recent []history.Sample
	now    record.Mono

	peer  api.Peer
	flows []api.Flow
	// req is a request's tree, from the list: the refresh of the list
	// replaces it with the newest copy, and leaves it, gone set, once the
	// request is no longer among the recent ones.
	req  *record.Request
	gone bool

	// cur moves over a peer pair's flows, or a request's hops.
	cur cursor

	fetched bool
}

// cursor is a selection in a list, held by row id so that it stays on the
// same row when a refresh reorders the list.
type cursor struct {
	id  string
	idx int
	// off is the first row on screen.
	off int
}

// sync finds the selected id in ids whenever the list changes (a refresh,
// a filter, a sort); a row that went away leaves the cursor at the same
// position, on the row that took it.
func (c *cursor) sync(ids []string) {
	for i, id := range ids {
		if id == c.id {
			c.idx = i
			return
		}
	}
	c.idx = min(max(c.idx, 0), max(len(ids)-1, 0))
	c.id = ""
	if len(ids) > 0 {
		c.id = ids[c.idx]
	}
}

// row is the index in ids of the selected row, -1 if there is none. It
// goes by id first, so what is opened is what is highlighted even if
// the list changed since the cursor last looked.
func (c *cursor) row(ids []string) int {
	if len(ids) == 0 {
		return -1
	}
	if c.idx < len(ids) && ids[c.idx] == c.id {
		return c.idx
	}
	for i, id := range ids {
		if id == c.id {
			return i
		}
	}
	return min(max(c.idx, 0), len(ids)-1)
}

// move shifts the cursor by delta rows, stopping at either end.
func (c *cursor) move(delta int, ids []string) {
	if len(ids) == 0 {
		return
	}
	c.idx = min(max(c.idx+delta, 0), len(ids)-1)
	c.id = ids[c.idx]
}

// offset is where a window of vis rows over n starts so that it shows the
// cursor, moving as little as possible from off.
func (c cursor) offset(vis, n int) int {
	off := c.off
	if vis <= 0 {
		return c.idx
	}
	if c.idx < off {
		off = c.idx
	}
	if c.idx >= off+vis {
		off = c.idx - vis + 1
	}
	return min(max(off, 0), max(n-vis, 0))
}

func newModel(ctx context.Context, src Source, opts Options, r *lipgloss.Renderer) *model {
	return &model{
		ctx:      ctx,
		src:      src,
		st:       newStyles(r),
		title:    sanitize(opts.Title),
		interval: opts.Interval,
		sort:     opts.Sort,
		view:     opts.View,
		filter:   opts.Filter,
	}
}

func (m *model) Init() tea.Cmd { return m.refresh() }

func (m *model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	var cmd tea.Cmd
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
	case tea.KeyMsg:
		cmd = m.key(msg)
	case tickMsg:
		if msg.seq == m.seq {
			cmd = m.refresh()
		}
	case flowsMsg:
		cmd = m.answer(msg.seq, msg.err, func() {
			m.flowData, m.flowsLoaded = msg.data, true
			m.rebuild()
		})
	case peersMsg:
		cmd = m.answer(msg.seq, msg.err, func() {
			m.peerData, m.peersLoaded = msg.data, true
			m.rebuild()
		})
	case requestsMsg:
		cmd = m.answer(msg.seq, requestsErr(msg.err), func() {
			m.reqData, m.reqsLoaded = msg.data, true
			m.rebuild()
			if d := m.top(); d != nil && d.kind == ViewRequests {
				d.req, d.gone = findRequest(m.reqData.Recent, d.id, d.req)
				d.cur.sync(hopIDs(treeRows(d.req)))
			}
		})
	case flowDetailMsg:
		cmd = m.answer(msg.seq, msg.err, func() {
			if d := m.top(); d != nil {
				d.flow, d.recent, d.now, d.fetched = msg.data.Flow, msg.data.Recent, msg.data.Now, true
			}
		})
	case peerDetailMsg:
		cmd = m.answer(msg.seq, msg.err, func() {
			if d := m.top(); d != nil {
				d.peer, d.flows, d.now, d.fetched = msg.data.Peer, msg.data.Flows, msg.data.Now, true
				// Drawn with the p99 column marked: make it true whatever
				// order the source used.
				api.SortFlows(d.flows, api.DefaultSort)
				d.cur.sync(flowIDs(d.flows))
			}
		})
	}
	m.keepCursorVisible()
	return m, cmd
}

// answer applies the answer to refresh seq unless a newer one was asked
// for, and schedules the next refresh.
func (m *model) answer(seq uint64, err error, apply func()) tea.Cmd {
	if seq != m.seq {
		return nil
	}
	if err != nil {
		m.fetchErr = oneLine(err.Error())
	} else {
		m.fetchErr = ""
		apply()
	}
	return m.tick(seq)
}

// top is the innermost open detail, nil on the list.
func (m *model) top() *detail {
	if len(m.stack) == 0 {
		return nil
	}
	return m.stack[len(m.stack)-1]
}

// rebuild derives the rows shown from the data, the filter and the sort.
func (m *model) rebuild() {
	q := m.query()
	m.flows = q.Flows(m.flowData.Flows)
	m.flowCur.sync(flowIDs(m.flows))
	m.peers = q.Peers(m.peerData.Peers)
	m.peerCur.sync(peerIDs(m.peers))
	m.reqs = requestRows(m.reqData.Recent, m.filter)
	m.reqCur.sync(reqIDs(m.reqs))
}

// query is the filter and the sort the user chose.
func (m *model) query() api.Query { return api.Query{Sort: m.sort, Filter: m.filter} }

// list returns the current list's cursor and row ids.
func (m *model) list() (*cursor, []string) {
	switch m.view {
	case ViewPeers:
		return &m.peerCur, peerIDs(m.peers)
	case ViewRequests:
		return &m.reqCur, reqIDs(m.reqs)
	}
	return &m.flowCur, flowIDs(m.flows)
}

// keepCursorVisible moves the stored scroll offsets so the next frame
// shows the cursor; View recomputes the same window, it never stores it.
func (m *model) keepCursorVisible() {
	if d := m.top(); d != nil {
		switch d.kind {
		case ViewPeers:
			d.cur.off = d.cur.offset(m.peerFlowRows(d), len(d.flows))
		case ViewRequests:
			d.cur.off = d.cur.offset(m.hopRows(d), len(treeRows(d.req)))
		}
		return
	}
	c, ids := m.list()
	c.off = c.offset(m.listRows(), len(ids))
}

func flowIDs(fs []api.Flow) []string {
	ids := make([]string, len(fs))
	for i := range fs {
		ids[i] = fs[i].ID
	}
	return ids
}

func peerIDs(ps []api.Peer) []string {
	ids := make([]string, len(ps))
	for i := range ps {
		ids[i] = ps[i].ID
	}
	return ids
}
