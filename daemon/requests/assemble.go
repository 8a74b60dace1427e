package requests

import (
	"fmt"
	"slices"

	"github.com/lattrace/lattrace/record"
)

// DefaultMaxHops bounds a request's tree: a batch job's thousands of
// queries are counted (Request.Truncated), not kept.
const DefaultMaxHops = 1000

// Result is what Assemble makes of a set of exchanges.
type Result struct {
	Requests []*record.Request
	// Ambiguous holds the outbound exchanges more than one inbound
	// exchange of their process could own (each roots a detached
	// request); Waiting those whose parent's record has not come yet.
	Ambiguous []*record.Exchange
	Waiting   []*record.Exchange
	// Members maps every exchange in a request to the request's index
	// in Requests.
	Members map[*record.Exchange]int
}

// Assemble links exs into request trees. A tree keeps at most maxHops hops
// (DefaultMaxHops when 0).
func Assemble(exs []*record.Exchange, maxHops int) *Result {
	return assemble(exs, maxHops, nil, nil, nil)
}

// assemble is Assemble with what a Tracker knows besides exs: done tells
// the inbound requests already in trees made before (evidence naming one
// is stale, not early); partner, the other end of an exchange not held in
// exs (a client or a leaf server of the node, kept apart), by its key;
// later, inbound exchanges too recent to be in a finished tree: a call of
// exs inside one of them waits with it.
func assemble(exs []*record.Exchange, maxHops int, done func(reqKey) bool, partner func(connKey) *record.Exchange, later []*record.Exchange) *Result {
	if maxHops <= 0 {
		maxHops = DefaultMaxHops
	}
	ix := newIndex(slices.Concat(exs, later), done)
	other := func(k connKey) *record.Exchange {
		if partner == nil || !pairable(k) {
			return nil
		}
		return partner(k)
	}
	res := &Result{Members: map[*record.Exchange]int{}}
	// Each exchange's hop: a requester's with its responder's half when
	// the node holds it; a responder's alone when its requester is off
	// the node.
	hopOf := map[*record.Exchange]*record.Hop{}
	var hops []*record.Hop
	paired := map[*record.Exchange]bool{}
	for _, e := range exs {
		if e.Role != record.Requester || !linkable(e) {
			continue
		}
		srv := ix.pair(e)
		if srv == nil {
			srv = other(requesterKey(e))
		}
		h := newHop(e, srv)
		hopOf[e] = h
		if srv != nil {
			hopOf[srv] = h
			paired[srv] = true
		}
		hops = append(hops, h)
	}
	for _, e := range exs {
		if e.Role == record.Responder && linkable(e) && !paired[e] {
			h := newHop(other(responderKey(e)), e)
			hopOf[e] = h
			hops = append(hops, h)
		}
	}
	// Parents: an outbound exchange's hop hangs under the hop whose
	// responder's half it ran inside.
	parent := map[*record.Hop]*record.Hop{}
	children := map[*record.Hop][]*record.Hop{}
	lost := map[*record.Hop]verdict{} // ambiguous or waiting: not a root
	for _, h := range hops {
		if h.Client == nil {
			continue
		}
		p, method, v := ix.link(h.Client)
		switch v {
		case linked:
			ph := hopOf[p]
			if ph == nil {
				// Its parent is among the later ones.
				res.Waiting = append(res.Waiting, h.Client)
				lost[h] = waiting
				continue
			}
			if ph == h {
				continue
			}
			h.Link = method
			parent[h] = ph
			children[ph] = append(children[ph], h)
		case ambiguous:
			res.Ambiguous = append(res.Ambiguous, h.Client)
			lost[h] = v
		case waiting:
			res.Waiting = append(res.Waiting, h.Client)
			lost[h] = v
		}
	}
	for _, h := range hops {
		if _, ok := parent[h]; ok {
			continue
		}
		v, isLost := lost[h]
		if isLost && v == waiting {
			// A waiting hop and those under it wait with it.
			continue
		}
		// An ambiguous hop roots a tree of its own, detached: what was
		// made under it is right, and shown, though whose request it
		// served is not known.
		r := &record.Request{Root: h, Detached: isLost}
		n := 0
		build(h, children, maxHops, &n, r)
		finish(h)
		summarize(r)
		first := h.Client
		if first == nil {
			first = h.Server
		}
		r.ID = fmt.Sprintf("%x-%x", first.Cookie, firstSeq(first))
		r.Endpoint = endpoint(h)
		res.Requests = append(res.Requests, r)
	}
	slices.SortFunc(res.Requests, func(a, b *record.Request) int { return int(int64(a.Root.Start) - int64(b.Root.Start)) })
	for i, r := range res.Requests {
		markMembers(r.Root, res.Members, i)
	}
	return res
}

// linkable: an exchange that is a request and its answer, or a request
// left unanswered; a server's unprompted message and an exchange the
// daemon's stop cut are none.
func linkable(e *record.Exchange) bool { return !e.Push && !e.Unfinished }

// build attaches h's children below it, at most maxHops in all (n counts
// them); the rest are counted on r.
func build(h *record.Hop, children map[*record.Hop][]*record.Hop, maxHops int, n *int, r *record.Request) {
	*n++
	for _, c := range children[h] {
		if *n >= maxHops {
			r.Truncated += count(c, children)
			continue
		}
		h.Children = append(h.Children, c)
		build(c, children, maxHops, n, r)
	}
}

func count(h *record.Hop, children map[*record.Hop][]*record.Hop) int {
	n := 1
	for _, c := range children[h] {
		n += count(c, children)
	}
	return n
}

func markMembers(h *record.Hop, m map[*record.Exchange]int, idx int) {
	for _, e := range []*record.Exchange{h.Client, h.Server} {
		if e != nil {
			m[e] = idx
		}
	}
	for _, c := range h.Children {
		markMembers(c, m, idx)
	}
}

func firstSeq(e *record.Exchange) uint32 {
	if e.Role == record.Requester {
		return e.OutSeq
	}
	return e.InSeq
}

// endpoint names the service a root asked: its responder and port.
func endpoint(h *record.Hop) string {
	if h.Server != nil {
		return fmt.Sprintf("%s:%d", name(h.Server), h.Server.Flow.Local.Port())
	}
	return h.To
}
