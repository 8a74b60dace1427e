package requests

import (
	"cmp"
	"slices"

	"github.com/lattrace/lattrace/record"
)

// verdict is what the linking says of an outbound exchange.
type verdict int

const (
	// root: no inbound exchange of its process could own it.
	root verdict = iota
	// linked: one inbound exchange owns it.
	linked
	// ambiguous: more than one could, and nothing tells which.
	ambiguous
	// waiting: the kernel names the request it served, whose record has
	// not come yet (that request is still being answered).
	waiting
)

// reqKey names an inbound request on the node: its responder's socket and
// the request's first sequence number (record.ServedRequest).
type reqKey struct {
	cookie uint64
	seq    uint32
}

// connKey names one exchange as both ends of its connection see it: the
// requester's initial sequence number, the responder's, and where the
// request starts.
type connKey struct {
	isnReq, isnResp, seq uint32
}

func requesterKey(x *record.Exchange) connKey {
	return connKey{x.ISNLocal, x.ISNRemote, x.OutSeq}
}

func responderKey(r *record.Exchange) connKey {
	return connKey{r.ISNRemote, r.ISNLocal, r.InSeq}
}

// pairable: both initial sequence numbers are known (a connection adopted
// mid-way still has them; a record without a socket has none).
func pairable(k connKey) bool { return k.isnReq != 0 || k.isnResp != 0 }

// childSpan is where an outbound exchange is busy for its parent: from the
// first byte of its request handed to the kernel to its answer read.
func childSpan(x *record.Exchange) (lo, hi record.Mono) {
	lo = x.Timeline.W0
	if lo == 0 {
		lo = x.Start
	}
	hi = firstSet(x.Timeline.D1, x.Timeline.R1, x.End)
	return lo, hi
}

// window is where an inbound exchange can own outbound ones: from its
// request's first byte arriving to its answer's last write returning.
func window(r *record.Exchange) (lo, hi record.Mono) {
	lo = r.Timeline.R0
	if lo == 0 {
		lo = r.Start
	}
	hi = firstSet(r.Timeline.W1, r.End)
	return lo, hi
}

// thinkWindow is the responder's own time to answer: from its request read
// to the first byte of its answer written.
func thinkWindow(r *record.Exchange) (lo, hi record.Mono) {
	lo = firstSet(r.Timeline.D1, r.Timeline.R1, r.Start)
	hi = firstSet(r.Timeline.W0, r.End)
	return lo, hi
}

func firstSet(v ...record.Mono) record.Mono {
	for _, m := range v {
		if m != 0 {
			return m
		}
	}
	return 0
}

func contains(r, x *record.Exchange) bool {
	rlo, rhi := window(r)
	lo, hi := childSpan(x)
	return rlo != 0 && rlo <= lo && hi <= rhi
}

// index is a set of exchanges arranged for linking.
type index struct {
	// inbound holds the responders' exchanges by request; byPID by their
	// process.
	inbound map[reqKey]*record.Exchange
	byPID   map[uint32][]*record.Exchange
	// longest is each process's longest window: a scan back from a call
	// stops there.
	longest map[uint32]record.Mono
	// answered by request: the responder's half of an exchange whose
	// requester's half is here too.
	responders map[connKey]*record.Exchange
	// done says which inbound requests are in trees already: evidence
	// naming one of them is stale, not early.
	done func(reqKey) bool
}

func newIndex(exs []*record.Exchange, done func(reqKey) bool) *index {
	ix := &index{inbound: map[reqKey]*record.Exchange{}, byPID: map[uint32][]*record.Exchange{}, longest: map[uint32]record.Mono{},
		responders: map[connKey]*record.Exchange{}, done: done}
	for _, e := range exs {
		if e.Role != record.Responder {
			continue
		}
		ix.inbound[reqKey{e.Cookie, e.InSeq}] = e
		ix.byPID[e.Owner.PID] = append(ix.byPID[e.Owner.PID], e)
		if lo, hi := window(e); hi > lo {
			ix.longest[e.Owner.PID] = max(ix.longest[e.Owner.PID], hi-lo)
		}
		if k := responderKey(e); pairable(k) {
			ix.responders[k] = e
		}
	}
	for _, rs := range ix.byPID {
		slices.SortFunc(rs, func(a, b *record.Exchange) int {
			alo, _ := window(a)
			blo, _ := window(b)
			return cmp.Compare(alo, blo)
		})
	}
	return ix
}

// candidates are the inbound exchanges of x's process whose windows hold
// x: those that opened before it did, back to the longest window's length
// (the process's windows by their opening).
func (ix *index) candidates(x *record.Exchange) []*record.Exchange {
	rs := ix.byPID[x.Owner.PID]
	lo, _ := childSpan(x)
	i, _ := slices.BinarySearchFunc(rs, lo, func(r *record.Exchange, t record.Mono) int {
		rlo, _ := window(r)
		if rlo <= t {
			return -1
		}
		return 1
	})
	var out []*record.Exchange
	longest := ix.longest[x.Owner.PID]
	for j := i - 1; j >= 0; j-- {
		r := rs[j]
		rlo, _ := window(r)
		if rlo+longest < lo {
			break
		}
		if r.Cookie != x.Cookie && contains(r, x) {
			out = append(out, r)
		}
	}
	return out
}

// pair is the responder's half of requester x's exchange, when the node
// holds both ends.
func (ix *index) pair(x *record.Exchange) *record.Exchange {
	if k := requesterKey(x); pairable(k) {
		return ix.responders[k]
	}
	return nil
}

// link finds the inbound exchange that outbound exchange x ran inside.
//
// The kernel's evidence first: the requests x's writing context read
// (x.Served) and the inbound exchanges of its process read by that same
// context (Ctx), each kept only if its window holds x; where none is, the
// request last handed to the context by a wake-up, if its window holds x.
// One left: x is its child, by the evidence's method. More than one: ambiguous (an event loop
// reading several requests before it calls out). None: where the context
// served no request at all (no evidence), x is the child of the only
// inbound exchange of its process whose window holds it, ambiguous where
// several do; where the evidence names a request that does not hold x, x
// is a root only if no inbound exchange of its process could own it.
func (ix *index) link(x *record.Exchange) (*record.Exchange, record.LinkMethod, verdict) {
	cands := ix.candidates(x)
	var found *record.Exchange
	var method record.LinkMethod
	n := 0
	add := func(r *record.Exchange, m record.LinkMethod) {
		if r == found {
			return
		}
		if found == nil {
			found, method = r, m
		}
		n++
	}
	missing := false
	evidence := func(s record.ServedRequest) {
		if s.Cookie == 0 {
			return
		}
		k := reqKey{s.Cookie, s.InSeq}
		r := ix.inbound[k]
		switch {
		case r != nil && r.Owner.PID == x.Owner.PID && contains(r, x):
			add(r, s.Method)
		case r == nil && s != x.Served.Prev && (ix.done == nil || !ix.done(k)):
			missing = true
		}
	}
	// What the writing context read itself, first.
	evidence(x.Served.Parent)
	evidence(x.Served.Prev)
	if x.Ctx != 0 {
		m := record.LinkThread
		if x.Ctx&record.CtxGoroutine != 0 {
			m = record.LinkGoroutine
		}
		for _, r := range cands {
			if r.Ctx == x.Ctx {
				add(r, m)
			}
		}
	}
	// A hand-off only where the context's own reads name none: a thread
	// that read a request and calls out inside it serves that one,
	// whoever woke it since (a runtime's threads wake each other for
	// their own reasons).
	if n == 0 {
		evidence(x.Served.Handoff)
	}
	switch {
	case n == 1:
		return found, method, linked
	case n > 1:
		return nil, "", ambiguous
	case missing:
		return nil, "", waiting
	case len(cands) == 0:
		return nil, "", root
	case len(cands) == 1 && !x.Served.Any():
		return cands[0], record.LinkWindow, linked
	}
	return nil, "", ambiguous
}
