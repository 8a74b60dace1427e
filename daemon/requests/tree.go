package requests

import (
	"fmt"
	"slices"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Hop is one exchange of a request: both ends of it where the node holds
// both, else the one it holds.
type Hop struct {
	// Client is the requester's end, Server the responder's.
	Client *record.Exchange `json:"client,omitempty"`
	Server *record.Exchange `json:"server,omitempty"`
	// From and To name the services at each end: the pod, else the
	// command; an end off the node by its address.
	From string `json:"from"`
	To   string `json:"to"`
	// Link is how the hop was found to serve its parent's request (empty
	// on the root).
	Link record.LinkMethod `json:"link,omitempty"`
	// Start and End bound the hop as its requester saw it (the responder,
	// where the requester is off the node).
	Start    record.Mono   `json:"start_mono_ns"`
	End      record.Mono   `json:"end_mono_ns"`
	Duration time.Duration `json:"duration_ns"`
	// Network is the hop's time on the path (propagation and queueing),
	// Transport its time in the kernels' queues, loss recovery and
	// handshake, as the requester measured them (record.Components).
	Network   time.Duration `json:"network_ns"`
	Transport time.Duration `json:"transport_ns"`
	// Think is the responder's own time answering: its think time less
	// ChildWait, the part of it spent waiting on its children (the union
	// of their spans inside it).
	Think     time.Duration `json:"think_ns"`
	ChildWait time.Duration `json:"child_wait_ns"`
	// Turns are the hop's changes of direction (2 for a request and its
	// answer); CriticalTurns adds those of its children on its critical
	// path, recursively.
	Turns         uint32 `json:"turns"`
	CriticalTurns uint32 `json:"critical_turns"`
	// Handshake: the hop opened its connection (one more round trip).
	Handshake bool `json:"handshake,omitempty"`
	// Critical: on its parent's critical path (the children whose ends
	// the parent waited for in turn); Parallel: it overlaps a sibling.
	Critical bool   `json:"critical,omitempty"`
	Parallel bool   `json:"parallel,omitempty"`
	Children []*Hop `json:"children,omitempty"`
}

// Request is one root exchange and every hop made to answer it.
type Request struct {
	// ID names the request: its root's socket cookie and first sequence
	// number, in hex.
	ID string `json:"id"`
	// Endpoint is the service the root asked: its name and port.
	Endpoint string `json:"endpoint"`
	Root     *Hop   `json:"root"`
	// Duration is the root's, as its requester saw it.
	Duration time.Duration `json:"duration_ns"`
	// Hops counts the hops in the tree, the root's included; Truncated
	// those left out beyond the bound (Config.MaxHops).
	Hops      int `json:"hops"`
	Truncated int `json:"truncated,omitempty"`
	// CriticalTurns are the turns on the critical path; CriticalHops its
	// hops.
	CriticalTurns uint32 `json:"critical_turns"`
	CriticalHops  int    `json:"critical_hops"`
	// Dominant names the hop on the critical path with the most time of
	// its own (its duration less its critical children's).
	Dominant string `json:"dominant"`
	// Edges counts the request's exchanges and turns per service edge.
	Edges []EdgeCount `json:"edges"`
}

// EdgeCount is what one request made on one service edge.
type EdgeCount struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Exchanges int    `json:"exchanges"`
	Turns     uint32 `json:"turns"`
}

// name is the service of an exchange's own end.
func name(e *record.Exchange) string {
	if k := e.Owner.K8s; k != nil && k.Pod != "" {
		return k.Pod
	}
	if e.Owner.Comm != "" {
		return e.Owner.Comm
	}
	return fmt.Sprintf("pid %d", e.Owner.PID)
}

func newHop(client, server *record.Exchange) *Hop {
	h := &Hop{Client: client, Server: server}
	measured := client
	if measured == nil {
		measured = server
	}
	h.Start, h.End, h.Duration = measured.Start, measured.End, measured.Duration
	c := measured.Components
	h.Network = c.Network
	h.Transport = c.SendWait + c.LossRecovery + c.Handshake + c.Receive
	// A request and its answer are two turns, one; an exchange is one
	// message each way, however its connection's turns were counted
	// (a record the idle sweep wrote counts the next turn later).
	h.Turns = 2
	if measured.Unanswered {
		h.Turns = 1
	}
	h.Handshake = measured.Timeline.Connect != 0
	switch {
	case client != nil && server != nil:
		h.From, h.To = name(client), name(server)
	case client != nil:
		h.From, h.To = name(client), client.Flow.Remote.String()
	default:
		h.From, h.To = server.Flow.Remote.Addr().String(), name(server)
	}
	if server != nil {
		h.Think = server.Components.Think
	}
	return h
}

// finish works out, below h, the critical path, which children overlap,
// and how much of each responder's think time waited on its children.
func finish(h *Hop) {
	for _, c := range h.Children {
		finish(c)
	}
	h.CriticalTurns = h.Turns
	if len(h.Children) == 0 || h.Server == nil {
		return
	}
	kids := h.Children
	slices.SortFunc(kids, func(a, b *Hop) int { return int(int64(a.spanLo()) - int64(b.spanLo())) })
	// Overlaps: each child against the latest end before it.
	var last *Hop
	for _, c := range kids {
		if last != nil && c.spanLo() < last.spanHi() {
			c.Parallel, last.Parallel = true, true
		}
		if last == nil || c.spanHi() > last.spanHi() {
			last = c
		}
	}
	// The critical path, backwards from the answer: the child that ended
	// last before it, then the one that ended last before that one began.
	_, t := thinkWindow(h.Server)
	for {
		var best *Hop
		for _, c := range kids {
			if !c.Critical && c.spanHi() <= t && (best == nil || c.spanHi() > best.spanHi()) {
				best = c
			}
		}
		if best == nil {
			break
		}
		best.Critical = true
		h.CriticalTurns += best.CriticalTurns
		t = best.spanLo()
	}
	// The union of the children's spans inside the think window.
	lo, hi := thinkWindow(h.Server)
	var wait time.Duration
	cur := lo
	for _, c := range kids {
		a, b := max(c.spanLo(), cur), min(c.spanHi(), hi)
		if b > a {
			wait += b.Sub(a)
			cur = b
		}
	}
	h.ChildWait = min(wait, h.Think)
	h.Think -= h.ChildWait
}

// spanLo and spanHi are the hop's span in its parent: its requester's
// from the first write to the answer read.
func (h *Hop) spanLo() record.Mono {
	if h.Client != nil {
		lo, _ := childSpan(h.Client)
		return lo
	}
	return h.Start
}

func (h *Hop) spanHi() record.Mono {
	if h.Client != nil {
		_, hi := childSpan(h.Client)
		return hi
	}
	return h.End
}

// summarize fills a request's counts from its finished tree.
func summarize(r *Request) {
	edges := map[[2]string]*EdgeCount{}
	var order [][2]string
	var walk func(h *Hop)
	walk = func(h *Hop) {
		r.Hops++
		k := [2]string{h.From, h.To}
		e := edges[k]
		if e == nil {
			e = &EdgeCount{From: h.From, To: h.To}
			edges[k] = e
			order = append(order, k)
		}
		e.Exchanges++
		e.Turns += h.Turns
		for _, c := range h.Children {
			walk(c)
		}
	}
	walk(r.Root)
	for _, k := range order {
		r.Edges = append(r.Edges, *edges[k])
	}
	r.CriticalTurns = r.Root.CriticalTurns
	var best time.Duration = -1
	var crit func(h *Hop)
	crit = func(h *Hop) {
		r.CriticalHops++
		own := h.Duration
		for _, c := range h.Children {
			if c.Critical {
				own -= c.Duration
				crit(c)
			}
		}
		if own > best {
			best, r.Dominant = own, h.From+" -> "+h.To
		}
	}
	crit(r.Root)
	r.Duration = r.Root.Duration
}
