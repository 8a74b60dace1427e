package top

import (
	"context"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/lattrace/lattrace/daemon/api"
)

// answerMsg is the Source's answer T, tagged with the refresh that asked.
type answerMsg[T any] struct {
	seq  uint64
	data T
	err  error
}

// The answers of the Source, one type for each of its methods.
type (
	flowsMsg      = answerMsg[api.FlowList]
	peersMsg      = answerMsg[api.PeerList]
	flowDetailMsg = answerMsg[api.FlowDetail]
	peerDetailMsg = answerMsg[api.PeerDetail]
	requestsMsg   = answerMsg[api.RequestList]
)

// tickMsg is the time for the refresh after seq.
type tickMsg struct{ seq uint64 }

// timeout bounds one call to the Source: a daemon that hangs must not
// stop the refreshes, and a slow one still gets time to answer.
func (m *model) timeout() time.Duration {
	return min(max(2*m.interval, 2*time.Second), 10*time.Second)
}

// refresh asks the Source for what the screen shows now. It starts a new
// chain of refreshes: answers to the ones before are dropped.
// listLimit is how many rows of a list top asks for: the first ones by
// its sort, which a person scrolls through. A node's tens of thousands of
// flows would be hundreds of megabytes a refresh; the rows line says how
// many there are in all.
const listLimit = 1000

func (m *model) refresh() tea.Cmd {
	m.seq++
	if d := m.top(); d != nil {
		switch d.kind {
		case ViewPeers:
			return ask(m, m.src.Peer, d.id)
		case ViewRequests:
			// A request's tree came with the list: the list is what
			// is kept current, the detail takes its copy from it.
			return ask(m, m.src.Requests, true)
		}
		return ask(m, m.src.Flow, d.id)
	}
	// The source filters and sorts too, so a large host does not send
	// rows the screen would drop; the rows are filtered and sorted again
	// on arrival all the same.
	q := m.query()
	q.Limit = listLimit
	switch m.view {
	case ViewPeers:
		return ask(m, m.src.Peers, q)
	case ViewRequests:
		return ask(m, m.src.Requests, true)
	}
	return ask(m, m.src.Flows, q)
}

// ask is the command that calls get(arg), within the timeout, and answers
// for the current refresh. What it needs of m is read now: the command
// runs on another goroutine.
func ask[A, T any](m *model, get func(context.Context, A) (T, error), arg A) tea.Cmd {
	seq, ctx, timeout := m.seq, m.ctx, m.timeout()
	return func() tea.Msg {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		data, err := get(ctx, arg)
		return answerMsg[T]{seq, data, err}
	}
}

// tick waits one interval before the refresh after seq.
func (m *model) tick(seq uint64) tea.Cmd {
	return tea.Tick(m.interval, func(time.Time) tea.Msg { return tickMsg{seq} })
}
