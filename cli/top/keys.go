package top

import (
	"slices"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/lattrace/lattrace/daemon/api"
)

// key handles a key press; the command it returns is a refresh, a quit or
// nothing, never a wait.
func (m *model) key(k tea.KeyMsg) tea.Cmd {
	if k.Type == tea.KeyCtrlC {
		return tea.Quit
	}
	if m.prompting {
		return m.promptKey(k)
	}
	m.note = ""
	if k.Paste {
		// Pasted text is never a command.
		return nil
	}
	switch k.String() {
	case "+", "=":
		return m.stepInterval(+1)
	case "-", "_":
		return m.stepInterval(-1)
	}
	if d := m.top(); d != nil {
		return m.detailKey(d, k)
	}
	return m.listKey(k)
}

// moveKey moves c over ids for the movement keys, page rows at a time for
// the paging ones; it reports whether key was one.
func moveKey(c *cursor, ids []string, key string, page int) bool {
	page = max(page-1, 1) // a page keeps one row of context
	switch key {
	case "up", "k":
		c.move(-1, ids)
	case "down", "j":
		c.move(+1, ids)
	case "pgup", "ctrl+b":
		c.move(-page, ids)
	case "pgdown", "ctrl+f", " ":
		c.move(+page, ids)
	case "home", "g":
		c.move(-len(ids), ids)
	case "end", "G":
		c.move(+len(ids), ids)
	default:
		return false
	}
	return true
}

func (m *model) listKey(k tea.KeyMsg) tea.Cmd {
	c, ids := m.list()
	if moveKey(c, ids, k.String(), m.listRows()) {
		return nil
	}
	switch k.String() {
	case "q":
		return tea.Quit
	case "enter":
		return m.open()
	case "v", "tab":
		m.view = nextView(m.view, +1)
		return m.refresh()
	case "V", "shift+tab":
		m.view = nextView(m.view, -1)
		return m.refresh()
	}
	if m.view == ViewRequests {
		// The requests are newest first: the sort keys are about
		// connections, and do nothing here.
		return m.filterKey(k)
	}
	switch k.String() {
	case "s":
		i := slices.Index(api.SortKeys, m.sort)
		return m.setSort(api.SortKeys[(i+1)%len(api.SortKeys)])
	case "p":
		return m.setSort("p99")
	case "P", "5":
		return m.setSort("p50")
	case "r":
		return m.setSort("rate")
	case "R":
		return m.setSort("retrans")
	case "t":
		return m.setSort("turns")
	case "e":
		return m.setSort("exchanges")
	}
	return m.filterKey(k)
}

// filterKey opens the filter prompt, or clears the filter.
func (m *model) filterKey(k tea.KeyMsg) tea.Cmd {
	switch k.String() {
	case "/":
		m.prompting = true
		m.input = m.draft
		if m.input == "" {
			m.input = m.filter.String()
		}
	case "c", "esc":
		if !m.filter.Empty() {
			m.filter, m.draft = api.Filter{}, ""
			m.rebuild()
			return m.refresh()
		}
	}
	return nil
}

// open shows the detail of the row the cursor is on, the one drawn
// highlighted.
func (m *model) open() tea.Cmd {
	c, ids := m.list()
	i := c.row(ids)
	if i < 0 {
		return nil
	}
	d := &detail{kind: m.view, id: ids[i]}
	switch m.view {
	case ViewPeers:
		d.peer = m.peers[i]
	case ViewRequests:
		// Its tree is here already: nothing to wait for.
		d.req, d.fetched = m.reqs[i], true
		d.cur.sync(hopIDs(treeRows(d.req)))
	default:
		d.flow = m.flows[i]
	}
	m.stack = append(m.stack, d)
	return m.refresh()
}

// detailKey handles a key in a detail: q quits from here as from the
// list (the README promises it), the keys that mean "back" go back.
func (m *model) detailKey(d *detail, k tea.KeyMsg) tea.Cmd {
	ids, page := flowIDs(d.flows), m.peerFlowRows(d)
	if d.kind == ViewRequests {
		ids, page = hopIDs(treeRows(d.req)), m.hopRows(d)
	}
	if moveKey(&d.cur, ids, k.String(), page) {
		return nil
	}
	switch k.String() {
	case "q":
		return tea.Quit
	case "esc", "backspace", "left", "h":
		m.stack = m.stack[:len(m.stack)-1]
		return m.refresh()
	case "enter":
		// From a peer pair into one of its flows; esc comes back.
		if i := d.cur.row(ids); d.kind == ViewPeers && i >= 0 {
			m.stack = append(m.stack, &detail{kind: ViewFlows, id: ids[i], flow: d.flows[i]})
			return m.refresh()
		}
	}
	return nil
}

// nextView is the list after v (dir +1) or before it (-1).
func nextView(v View, dir int) View {
	i := slices.Index(views, v)
	return views[(i+dir+len(views))%len(views)]
}

// promptKey edits the filter being typed.
func (m *model) promptKey(k tea.KeyMsg) tea.Cmd {
	switch k.Type {
	case tea.KeyEnter:
		m.prompting = false
		f, err := api.ParseFilter(m.input)
		if err != nil {
			m.note = "bad filter: " + oneLine(err.Error())
			m.draft = m.input
			return nil
		}
		m.filter, m.draft = f, ""
		m.rebuild()
		return m.refresh()
	case tea.KeyEsc:
		m.prompting = false
	case tea.KeyBackspace, tea.KeyCtrlH:
		if r := []rune(m.input); len(r) > 0 {
			m.input = string(r[:len(r)-1])
		}
	case tea.KeyCtrlU:
		m.input = ""
	case tea.KeyCtrlW:
		t := strings.TrimRight(m.input, " ")
		m.input = t[:strings.LastIndex(t, " ")+1]
	case tea.KeySpace:
		m.input += " "
	case tea.KeyRunes:
		m.input += sanitize(string(k.Runes))
	}
	return nil
}

func (m *model) setSort(key string) tea.Cmd {
	m.sort = key
	m.rebuild()
	return m.refresh()
}

// stepInterval moves the refresh interval to the next step up or down;
// an interval between steps (from Options) goes to the neighbouring one.
func (m *model) stepInterval(dir int) tea.Cmd {
	steps := []time.Duration{
		250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute,
	}
	next := m.interval
	if dir > 0 {
		if i := slices.IndexFunc(steps, func(s time.Duration) bool { return s > m.interval }); i >= 0 {
			next = steps[i]
		}
	} else {
		for _, s := range steps {
			if s < m.interval {
				next = s
			}
		}
	}
	if next == m.interval {
		return nil
	}
	m.interval = next
	return m.refresh()
}
