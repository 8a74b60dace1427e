package requests

import (
	"fmt"
	"slices"
	"time"

	"github.com/lattrace/lattrace/record"
)

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

func newHop(client, server *record.Exchange) *record.Hop {
	h := &record.Hop{Client: client, Server: server}
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
func finish(h *record.Hop) {
	for _, c := range h.Children {
		finish(c)
	}
	h.CriticalTurns = h.Turns
	if len(h.Children) == 0 || h.Server == nil {
		return
	}
	kids := h.Children
	slices.SortFunc(kids, func(a, b *record.Hop) int { return int(int64(spanLo(a)) - int64(spanLo(b))) })
	// Overlaps: each child against the latest end before it.
	var last *record.Hop
	for _, c := range kids {
		if last != nil && spanLo(c) < spanHi(last) {
			c.Parallel, last.Parallel = true, true
		}
		if last == nil || spanHi(c) > spanHi(last) {
			last = c
		}
	}
	// The critical path, backwards from the answer: the child that ended
	// last before it, then the one that ended last before that one began.
	_, t := thinkWindow(h.Server)
	for {
		var best *record.Hop
		for _, c := range kids {
			if !c.Critical && spanHi(c) <= t && (best == nil || spanHi(c) > spanHi(best)) {
				best = c
			}
		}
		if best == nil {
			break
		}
		best.Critical = true
		h.CriticalTurns += best.CriticalTurns
		t = spanLo(best)
	}
	// The union of the children's spans inside the think window.
	lo, hi := thinkWindow(h.Server)
	var wait time.Duration
	cur := lo
	for _, c := range kids {
		a, b := max(spanLo(c), cur), min(spanHi(c), hi)
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
func spanLo(h *record.Hop) record.Mono {
	if h.Client != nil {
		lo, _ := childSpan(h.Client)
		return lo
	}
	return h.Start
}

func spanHi(h *record.Hop) record.Mono {
	if h.Client != nil {
		_, hi := childSpan(h.Client)
		return hi
	}
	return h.End
}

// summarize fills a request's counts from its finished tree.
func summarize(r *record.Request) {
	edges := map[[2]string]*record.EdgeCount{}
	var order [][2]string
	var walk func(h *record.Hop)
	walk = func(h *record.Hop) {
		r.Hops++
		k := [2]string{h.From, h.To}
		e := edges[k]
		if e == nil {
			e = &record.EdgeCount{From: h.From, To: h.To}
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
	var crit func(h *record.Hop)
	crit = func(h *record.Hop) {
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
