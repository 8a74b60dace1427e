package top

import (
	"context"
	"time"

	tea "github.com/charmbracelet/bubbletea"

	"github.com/lattrace/lattrace/daemon/api"
)

// Answers of the Source, each tagged with the refresh that asked.
type (
	flowsMsg struct {
		seq  uint64
		list api.FlowList
		err  error
	}
	peersMsg struct {
		seq  uint64
		list api.PeerList
		err  error
	}
	flowDetailMsg struct {
		seq uint64
		d   api.FlowDetail
		err error
	}
	peerDetailMsg struct {
		seq uint64
		d   api.PeerDetail
		err error
	}
	// tickMsg is the time for the refresh after seq.
	tickMsg struct{ seq uint64 }
)

// timeout bounds one call to the Source: a daemon that hangs must not
// stop the refreshes, and a slow one still gets time to answer.
func (m *model) timeout() time.Duration {
	return min(max(2*m.interval, 2*time.Second), 10*time.Second)
}

// refresh asks the Source for what the screen shows now. It starts a new
// chain of refreshes: answers to the ones before are dropped.
func (m *model) refresh() tea.Cmd {
	m.seq++
	seq, ctx, src, timeout := m.seq, m.ctx, m.src, m.timeout()
	call := func(f func(ctx context.Context) tea.Msg) tea.Cmd {
		return func() tea.Msg {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return f(ctx)
		}
	}
	if d := m.top(); d != nil {
		id := d.id
		if d.kind == ViewPeers {
			return call(func(ctx context.Context) tea.Msg {
				r, err := src.Peer(ctx, id)
				return peerDetailMsg{seq, r, err}
			})
		}
		return call(func(ctx context.Context) tea.Msg {
			r, err := src.Flow(ctx, id)
			return flowDetailMsg{seq, r, err}
		})
	}
	// The source filters and sorts too, so a large host does not send
	// rows the screen would drop; the rows are filtered and sorted again
	// on arrival all the same.
	q := m.query()
	if m.view == ViewPeers {
		return call(func(ctx context.Context) tea.Msg {
			r, err := src.Peers(ctx, q)
			return peersMsg{seq, r, err}
		})
	}
	return call(func(ctx context.Context) tea.Msg {
		r, err := src.Flows(ctx, q)
		return flowsMsg{seq, r, err}
	})
}

// tick waits one interval before the refresh after seq.
func (m *model) tick(seq uint64) tea.Cmd {
	return tea.Tick(m.interval, func(time.Time) tea.Msg { return tickMsg{seq} })
}
