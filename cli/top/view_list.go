package top

import (
	"fmt"
	"strings"
)

// The frame: header lines above the body (two to five, see header), a
// status line and a key line below it.
const footerHeight = 2

// View draws exactly the terminal's height in lines, none wider than it.
func (m *model) View() string {
	if m.width <= 0 || m.height <= 0 {
		return ""
	}
	if m.width < minWidth || m.height < minHeight {
		return truncate(fmt.Sprintf("terminal is %dx%d; lattrace top needs at least %dx%d",
			m.width, m.height, minWidth, minHeight), m.width)
	}
	head := m.header()
	bodyH := m.height - len(head) - footerHeight
	var body []string
	if d := m.top(); d != nil {
		body = m.detailBody(d, bodyH)
	} else {
		body = m.listBody(bodyH)
	}
	lines := make([]string, 0, m.height)
	lines = append(lines, head...)
	lines = append(lines, body[:min(len(body), bodyH)]...)
	for len(lines) < m.height-footerHeight {
		lines = append(lines, "")
	}
	lines = append(lines, m.status(), m.keyLine())
	for i := range lines {
		lines[i] = m.st.clip(lines[i], m.width)
	}
	return strings.Join(lines, "\n")
}

// bodyHeight is the lines between the header and the footer.
func (m *model) bodyHeight() int {
	return m.height - m.headerHeight() - footerHeight
}

// listRows is how many rows of the list fit under its column titles.
func (m *model) listRows() int { return m.bodyHeight() - 1 }

// headerHeight is how many lines the header takes. It depends on the
// rows text, which depends on how many rows fit below the header: it is
// measured with the widest rows text the list could have, and the header
// drawn is padded to it.
func (m *model) headerHeight() int {
	n := m.listLen()
	return len(m.headerLines(fmt.Sprintf("%d-%d/%d", n, n, n)))
}

// header is the title line (with the legend of the bar) and the state
// lines: view, sort, filter, interval, rows.
func (m *model) header() []string {
	lines, n := m.headerLines(m.rowsText()), m.headerHeight()
	for len(lines) < n {
		lines = append(lines, "")
	}
	return lines[:n]
}

func (m *model) headerLines(rows string) []string {
	return append([]string{m.titleLine()}, m.stateLines(rows)...)
}

// titleLine names the program and the source, with the legend of the
// bar on the right when both fit.
func (m *model) titleLine() string {
	const name = "lattrace top"
	left := name
	if m.title != "" {
		left += " · " + m.title
	}
	legend, lw := m.st.legend(), width(plainLegend())
	if width(left)+2+lw > m.width {
		// Where the data comes from matters more than the legend.
		legend, lw = "", 0
	}
	left = truncate(left, m.width-lw)
	styled := left
	if rest, ok := strings.CutPrefix(left, name); ok {
		styled = m.st.title.Render(name) + rest
	}
	if legend == "" {
		return styled
	}
	return styled + strings.Repeat(" ", max(m.width-width(left)-lw, 1)) + legend
}

// stateLines say what is shown and how. They give up the refresh
// interval before anything else, then put the filter on a line (or two)
// of its own: cut, it would not say what it keeps.
func (m *model) stateLines(rows string) []string {
	view, sort := "view: "+m.viewPath(), "sort: "+m.sort
	if m.view == ViewRequests {
		// The sort keys are the connections': requests come newest
		// first.
		sort = "sort: newest first"
	}
	refresh := "refresh: " + fmtInterval(m.interval)
	if rows != "" {
		rows = "rows: " + rows
	}
	filter := "filter: none"
	if !m.filter.Empty() {
		filter = "filter: " + sanitize(m.filter.String())
	}
	const sep = "  "
	for _, items := range [][]string{
		{view, sort, filter, refresh, rows},
		{view, sort, filter, rows},
	} {
		if l := wrapItems(items, sep, m.width); len(l) == 1 {
			return l
		}
	}
	lines := wrapItems([]string{view, sort, refresh, rows}, sep, m.width)
	if len(lines) > 1 {
		lines = wrapItems([]string{view, sort, rows}, sep, m.width)
	}
	f := wrap(filter, m.width)
	if len(f) > 2 {
		f[1] = truncate(strings.Join(f[1:], " "), m.width)
		f = f[:2]
	}
	return append(lines, f...)
}

// listLen is how many rows the list, the open pair or request has.
func (m *model) listLen() int {
	if d := m.top(); d != nil {
		if d.kind == ViewRequests {
			return len(treeRows(d.req))
		}
		return len(d.flows)
	}
	_, ids := m.list()
	return len(ids)
}

// viewPath says what is on screen: the list, and the details opened from
// it.
func (m *model) viewPath() string {
	p := string(m.view)
	for _, d := range m.stack {
		noun := "flow"
		switch d.kind {
		case ViewPeers:
			noun = "peer"
		case ViewRequests:
			noun = "request"
		}
		p += " › " + noun + " " + sanitize(d.id)
	}
	return p
}

// rowsText is "shown/total", with the range shown when the list scrolls.
func (m *model) rowsText() string {
	var c cursor
	var n, vis int
	if d := m.top(); d != nil {
		switch d.kind {
		case ViewPeers:
			c, n, vis = d.cur, len(d.flows), m.peerFlowRows(d)
		case ViewRequests:
			c, n, vis = d.cur, len(treeRows(d.req)), m.hopRows(d)
		default:
			return ""
		}
	} else {
		cp, ids := m.list()
		c, n, vis = *cp, len(ids), m.listRows()
	}
	more := ""
	if m.top() == nil && m.view != ViewRequests {
		// The rows asked for are the first listLimit by the sort.
		total, got := m.flowData.Total, len(m.flowData.Flows)
		if m.view == ViewPeers {
			total, got = m.peerData.Total, len(m.peerData.Peers)
		}
		if total > got {
			more = fmt.Sprintf(" (first %d of %d)", got, total)
		}
	}
	if n <= vis {
		return fmt.Sprintf("%d/%d%s", n, n, more)
	}
	off := c.offset(vis, n)
	return fmt.Sprintf("%d-%d/%d%s", off+1, min(off+vis, n), n, more)
}

// status is the line above the keys: the filter being typed, or the last
// error, in red.
func (m *model) status() string {
	switch {
	case m.prompting:
		const hint = "  enter apply · esc cancel · e.g. comm:curl port:8080 addr:10.0.0.0/8 pid:42"
		line := "filter: " + m.input + "▏"
		if width(line) > m.width-1 {
			// Keep the end in view: that is where the typing is.
			r := []rune(m.input + "▏")
			for width("filter: …"+string(r)) > m.width-1 {
				r = r[1:]
			}
			line = "filter: …" + string(r)
		}
		return line + m.st.dim.Render(truncate(hint, m.width-width(line)))
	case m.note != "":
		return m.st.err.Render(truncate(m.note, m.width))
	case m.fetchErr != "":
		line := fmt.Sprintf("error: %s (retrying every %s)", m.fetchErr, fmtInterval(m.interval))
		if width(line) > m.width {
			// The error matters more than the retries.
			line = "error: " + m.fetchErr
		}
		return m.st.err.Render(truncate(line, m.width))
	}
	return ""
}

// keyLine lists the keys that work here, as many as fit.
func (m *model) keyLine() string {
	var keys [][2]string
	if d := m.top(); d != nil {
		keys = append(keys, [2]string{"q", "quit"}, [2]string{"esc", "back"})
		switch d.kind {
		case ViewPeers:
			keys = append(keys, [2]string{"↑↓", "move"}, [2]string{"enter", "flow"})
		case ViewRequests:
			keys = append(keys, [2]string{"↑↓ pgup/pgdn", "scroll"})
		}
		keys = append(keys, [2]string{"+/-", "refresh"})
	} else if m.view == ViewRequests {
		// No sort keys: the requests come newest first.
		keys = append(keys,
			[2]string{"q", "quit"}, [2]string{"↑↓", "move"}, [2]string{"enter", "tree"},
			[2]string{"v", string(nextView(m.view, +1))}, [2]string{"/", "filter"}, [2]string{"c", "clear"},
			[2]string{"+/-", "refresh"},
		)
	} else {
		other := nextView(m.view, +1)
		keys = append(keys,
			[2]string{"q", "quit"}, [2]string{"↑↓", "move"}, [2]string{"enter", "detail"},
			[2]string{"v", string(other)}, [2]string{"/", "filter"}, [2]string{"c", "clear"},
			[2]string{"s", "sort"}, [2]string{"+/-", "refresh"}, [2]string{"p P r R t e", "sort by"},
		)
	}
	var b strings.Builder
	used := 0
	for i, k := range keys {
		w := width(k[0]) + 1 + width(k[1])
		if i > 0 {
			w += 2
		}
		if used+w > m.width {
			break
		}
		if i > 0 {
			b.WriteString("  ")
		}
		b.WriteString(m.st.key.Render(k[0]) + " " + m.st.dim.Render(k[1]))
		used += w
	}
	return b.String()
}

// listBody is the column titles and the rows that fit, scrolled to the
// cursor.
func (m *model) listBody(h int) []string {
	var t *table
	switch m.view {
	case ViewPeers:
		t = peerTable(m.peers, m.sort)
	case ViewRequests:
		t = requestTable(m.reqs)
	default:
		t = flowTable(m.flows, m.sort)
	}
	c, _ := m.list()
	return m.tableLines(t, c, h, m.emptyText())
}

// tableLines draws t in h lines with the cursor's row in reverse video.
func (m *model) tableLines(t *table, c *cursor, h int, empty string) []string {
	ws := t.layout(m.width, false)
	lines := []string{m.st.colHead.Render(truncate(t.header(ws), m.width))}
	if len(t.rows) == 0 {
		return append(lines, empty)
	}
	vis := h - 1
	off := c.offset(vis, len(t.rows))
	ids := make([]string, len(t.rows))
	for i := range t.rows {
		ids[i] = t.rows[i].id
	}
	sel := c.row(ids)
	for i := off; i < min(off+vis, len(t.rows)); i++ {
		if i == sel {
			plain := truncate(t.line(&t.rows[i], ws, nil), m.width)
			lines = append(lines, m.st.selected.Render(pad(plain, m.width, false)))
			continue
		}
		lines = append(lines, t.line(&t.rows[i], ws, m.st.paint))
	}
	return lines
}

func (m *model) emptyText() string {
	noun, loaded := "flows", m.flowsLoaded
	switch m.view {
	case ViewPeers:
		noun, loaded = "peer pairs", m.peersLoaded
	case ViewRequests:
		noun, loaded = "requests", m.reqsLoaded
	}
	switch {
	case !loaded && m.fetchErr != "":
		return "no data yet: see the error below"
	case !loaded:
		return "loading…"
	case !m.filter.Empty():
		return fmt.Sprintf("no %s match the filter (c clears it)", noun)
	}
	return "no " + noun + " yet"
}
