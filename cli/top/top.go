// Package top is `lattrace top`: a full-screen live view of the flows,
// peer pairs or requests a daemon (or an in-process tracer) sees, like top
// or k9s. Each
// row says how fast the connection is and where its time goes (the
// network / transport / app split of docs/latency-model.md, drawn as a bar
// that reads without colour) and names the finding that explains most of
// it; enter opens one flow or pair with its diagnoses, its component means
// and its last exchanges. The requests view lists the recent request
// trees (a daemon's unless started with --request-trees=false), enter draws one, a hop a
// line.
//
// The screen is a bubbletea program. It only reads through Source, on a
// timer, in commands that never block drawing: when the source fails the
// last good data stays up with the error on one line, and it keeps asking.
// WriteFlows, WritePeers and WriteRequests print the same table plain, for
// pipes and for `lattrace flows`.
package top

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/lipgloss"

	"github.com/lattrace/lattrace/daemon/api"
)

// Source is where the screen's data comes from; *api.Client implements it.
// Its methods run in the program's command goroutines, and a key that
// restarts the refresh may overlap two calls: they must be safe to call
// concurrently.
type Source interface {
	Flows(ctx context.Context, q api.Query) (api.FlowList, error)
	Peers(ctx context.Context, q api.Query) (api.PeerList, error)
	Flow(ctx context.Context, id string) (api.FlowDetail, error)
	Peer(ctx context.Context, id string) (api.PeerDetail, error)
	// Requests answers api.ErrNotFound from a daemon that makes no
	// request trees; the requests view says so and the others work on.
	Requests(ctx context.Context, trees bool) (api.RequestList, error)
}

// View is which list the screen shows.
type View string

// The three lists, in the order v steps through them.
const (
	ViewFlows    View = "flows"
	ViewPeers    View = "peers"
	ViewRequests View = "requests"
)

// views are the lists in the order v (tab) steps through them.
var views = []View{ViewFlows, ViewPeers, ViewRequests}

// Options set the screen up as it starts; the user changes all of them
// with keys.
type Options struct {
	// Interval is the refresh interval (1s if zero), kept within
	// 250ms..60s.
	Interval time.Duration
	// Sort is one of api.SortKeys ("" is api.DefaultSort).
	Sort string
	// View is ViewFlows if empty.
	View   View
	Filter api.Filter
	// Title says where the data comes from, e.g. "daemon
	// unix:/run/lattrace/api.sock" or "in-process tracer".
	Title string
}

// Bounds and default of the refresh interval.
const (
	minInterval     = 250 * time.Millisecond
	maxInterval     = 60 * time.Second
	defaultInterval = time.Second
)

// check fills in the defaults and refuses what no key could reach.
func (o Options) check() (Options, error) {
	if o.Interval == 0 {
		o.Interval = defaultInterval
	}
	o.Interval = min(max(o.Interval, minInterval), maxInterval)
	if o.Sort == "" {
		o.Sort = api.DefaultSort
	}
	if !slices.Contains(api.SortKeys, o.Sort) {
		return o, fmt.Errorf("sort %q is not one of %s", o.Sort, strings.Join(api.SortKeys, ", "))
	}
	switch o.View {
	case "":
		o.View = ViewFlows
	case ViewFlows, ViewPeers, ViewRequests:
	default:
		return o, fmt.Errorf("view %q is not one of %s, %s, %s", o.View, ViewFlows, ViewPeers, ViewRequests)
	}
	return o, nil
}

// Run shows the full-screen UI on out (alternate screen), reading keys
// from in, until the user quits (q or ctrl+c) or ctx ends; both are a
// normal end and return nil.
func Run(ctx context.Context, src Source, opts Options, in io.Reader, out io.Writer) error {
	opts, err := opts.check()
	if err != nil {
		return err
	}
	m := newModel(ctx, src, opts, lipgloss.NewRenderer(out))
	p := tea.NewProgram(m, tea.WithAltScreen(), tea.WithInput(in), tea.WithOutput(out), tea.WithContext(ctx))
	_, err = p.Run()
	if err != nil && errors.Is(err, tea.ErrProgramKilled) && ctx.Err() != nil {
		// The caller ended it (a signal, a test): that is how it stops.
		return nil
	}
	return err
}
