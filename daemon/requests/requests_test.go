package requests

import (
	"net/netip"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

// The kernel's side of these rules (what Ctx and Served hold) is proven
// on real servers in daemon/tracer (TestRequestLinks) and tests/apps
// (TestRequestTrees); these tests hold the rules user space applies to
// such records, case by case, with timelines written by hand.

const ms = record.Mono(time.Millisecond)

// base is where the tests' clock starts: a zero timestamp is a point
// that did not happen.
const base = 1000 * ms

var nextCookie uint64 = 100

// inbound is a responder's exchange in process pid, read by ctx: its
// request arrives at r0 and its answer's last write returns at w1.
func inbound(pid uint32, ctx uint64, r0, w1 record.Mono) *record.Exchange {
	r0, w1 = r0+base, w1+base
	nextCookie++
	return &record.Exchange{Role: record.Responder, Cookie: nextCookie, InSeq: uint32(nextCookie * 7), Owner: record.Owner{PID: pid, Comm: "app"}, Ctx: ctx,
		Timeline: record.Timeline{R0: r0, R1: r0, D1: r0 + ms/10, W0: w1 - ms/10, W1: w1}, Start: r0, End: w1, Duration: (w1 - r0).Sub(0),
		Components: record.Components{Think: (w1 - r0 - ms/5).Sub(0)}, Flow: flowTo(8080)}
}

// outbound is a requester's exchange of process pid written by ctx,
// from w0 to its answer read at d1, with the evidence served.
func outbound(pid uint32, ctx uint64, w0, d1 record.Mono, served record.Served) *record.Exchange {
	w0, d1 = w0+base, d1+base
	nextCookie++
	return &record.Exchange{Role: record.Requester, Cookie: nextCookie, OutSeq: 1, Owner: record.Owner{PID: pid, Comm: "app"}, Ctx: ctx, Served: served,
		Timeline: record.Timeline{W0: w0, W1: w0, R0: d1, R1: d1, D1: d1}, Start: w0, End: d1, Duration: (d1 - w0).Sub(0), Flow: flowTo(5432)}
}

func flowTo(port uint16) record.Flow {
	return record.Flow{Local: netip.MustParseAddrPort("10.0.0.1:40000"), Remote: netip.AddrPortFrom(netip.MustParseAddr("10.0.0.2"), port)}
}

func read(r *record.Exchange, m record.LinkMethod) record.ServedRequest {
	return record.ServedRequest{Cookie: r.Cookie, InSeq: r.InSeq, Method: m}
}

func linkOf(t *testing.T, exs []*record.Exchange, x *record.Exchange) (*record.Exchange, record.LinkMethod, verdict) {
	t.Helper()
	return newIndex(exs, nil).link(x)
}

// Two requests open at once in a thread-per-request server: each thread's
// call belongs to the request it read, though both windows hold it.
func TestLinkSameThread(t *testing.T) {
	a := inbound(1, 11, 0, 10*ms)
	b := inbound(1, 12, ms, 11*ms)
	xa := outbound(1, 11, 2*ms, 3*ms, record.Served{Parent: read(a, record.LinkThread)})
	xb := outbound(1, 12, 2*ms, 4*ms, record.Served{Parent: read(b, record.LinkThread), Prev: read(a, record.LinkThread)})
	exs := []*record.Exchange{a, b, xa, xb}
	if p, m, v := linkOf(t, exs, xa); p != a || m != record.LinkThread || v != linked {
		t.Errorf("a's call: %v %q %v", p == a, m, v)
	}
	// b's thread read a before (Prev), but a's reader was another thread
	// and b's window holds the call too: b read it last. Prev is only
	// evidence where its request still holds the call: here both do.
	if _, _, v := linkOf(t, exs, xb); v != ambiguous {
		t.Errorf("b's call, its thread having read both open requests: %v, want ambiguous", v)
	}
}

// An event loop reads two requests before it calls out: ambiguous.
func TestLinkEventLoop(t *testing.T) {
	a := inbound(1, 11, 0, 10*ms)
	b := inbound(1, 11, ms, 11*ms)
	x := outbound(1, 11, 2*ms, 3*ms, record.Served{Parent: read(b, record.LinkThread), Prev: read(a, record.LinkThread)})
	if _, _, v := linkOf(t, []*record.Exchange{a, b, x}, x); v != ambiguous {
		t.Errorf("%v, want ambiguous", v)
	}
}

// A worker woken by the reader serves what it was handed; a thread that
// read a request itself keeps it, whoever woke it since.
func TestLinkHandoff(t *testing.T) {
	a := inbound(1, 11, 0, 10*ms)
	b := inbound(1, 11, ms, 11*ms)
	w := outbound(1, 21, 2*ms, 3*ms, record.Served{Handoff: read(a, record.LinkHandoff)})
	if p, m, v := linkOf(t, []*record.Exchange{a, b, w}, w); p != a || m != record.LinkHandoff || v != linked {
		t.Errorf("worker: %v %q %v", p == a, m, v)
	}
	own := inbound(1, 31, 0, 10*ms)
	x := outbound(1, 31, 2*ms, 3*ms, record.Served{Parent: read(own, record.LinkThread), Handoff: read(b, record.LinkHandoff)})
	if p, m, v := linkOf(t, []*record.Exchange{own, b, x}, x); p != own || m != record.LinkThread || v != linked {
		t.Errorf("reader woken since: %v %q %v", p == own, m, v)
	}
}

// Without evidence: the only window holding the call, else ambiguous;
// no window, a root. Evidence naming a request that holds nothing is
// no licence to use the window.
func TestLinkWindow(t *testing.T) {
	a := inbound(1, 11, 0, 10*ms)
	x := outbound(1, 0, 2*ms, 3*ms, record.Served{})
	if p, m, v := linkOf(t, []*record.Exchange{a, x}, x); p != a || m != record.LinkWindow || v != linked {
		t.Errorf("one window: %v %q %v", p == a, m, v)
	}
	b := inbound(1, 12, ms, 11*ms)
	if _, _, v := linkOf(t, []*record.Exchange{a, b, x}, x); v != ambiguous {
		t.Errorf("two windows: %v, want ambiguous", v)
	}
	late := outbound(1, 0, 20*ms, 21*ms, record.Served{})
	if _, _, v := linkOf(t, []*record.Exchange{a, b, late}, late); v != root {
		t.Errorf("no window: %v, want root", v)
	}
	other := outbound(2, 0, 2*ms, 3*ms, record.Served{})
	if _, _, v := linkOf(t, []*record.Exchange{a, other}, other); v != root {
		t.Errorf("another process's window: %v, want root", v)
	}
	old := inbound(1, 40, 0, ms)
	stale := outbound(1, 40, 2*ms, 3*ms, record.Served{Parent: read(old, record.LinkThread)})
	if _, _, v := linkOf(t, []*record.Exchange{old, a, stale}, stale); v != ambiguous {
		t.Errorf("stale evidence beside one window: %v, want ambiguous", v)
	}
}

// Evidence naming a request whose record has not come waits for it,
// unless that request is in a tree made already.
func TestLinkWaiting(t *testing.T) {
	a := inbound(1, 11, 0, 10*ms)
	x := outbound(1, 11, 2*ms, 3*ms, record.Served{Parent: read(a, record.LinkThread)})
	if _, _, v := linkOf(t, []*record.Exchange{x}, x); v != waiting {
		t.Errorf("%v, want waiting", v)
	}
	done := func(k reqKey) bool { return k == reqKey{a.Cookie, a.InSeq} }
	if _, _, v := newIndex([]*record.Exchange{x}, done).link(x); v != root {
		t.Errorf("parent in a tree already: %v, want root", v)
	}
}

// paired makes the requester's end of r, in process pid (the two ends
// name the exchange by the same sequence numbers).
func paired(r *record.Exchange, pid uint32, comm string) *record.Exchange {
	nextCookie++
	r.ISNLocal, r.ISNRemote = uint32(nextCookie), uint32(nextCookie+1)
	return &record.Exchange{Role: record.Requester, Cookie: nextCookie, Owner: record.Owner{PID: pid, Comm: comm},
		ISNLocal: r.ISNRemote, ISNRemote: r.ISNLocal, OutSeq: r.InSeq,
		Timeline: record.Timeline{W0: r.Start - ms/10, D1: r.End + ms/10}, Start: r.Start - ms/10, End: r.End + ms/10, Duration: (r.End - r.Start + ms/5).Sub(0)}
}

// A request with two sequential calls and two parallel ones: the tree, its
// critical path, turns and the wait on children.
func TestTree(t *testing.T) {
	a := inbound(1, 11, 0, 20*ms)
	client := paired(a, 9, "curl")
	s := record.Served{Parent: read(a, record.LinkThread)}
	c1 := outbound(1, 11, ms, 3*ms, s)
	c2 := outbound(1, 11, 4*ms, 6*ms, s)
	p1 := outbound(1, 11, 7*ms, 12*ms, s)
	p2 := outbound(1, 11, 8*ms, 10*ms, s)
	res := Assemble([]*record.Exchange{client, a, c1, c2, p1, p2}, 0)
	if len(res.Requests) != 1 {
		t.Fatalf("%d requests, want 1", len(res.Requests))
	}
	r := res.Requests[0]
	if r.Hops != 5 || r.Root.Client != client || r.Root.Server != a || r.Root.From != "curl" || r.Root.To != "app" {
		t.Fatalf("tree: %d hops, root %s -> %s", r.Hops, r.Root.From, r.Root.To)
	}
	crit := map[*record.Exchange]bool{}
	par := map[*record.Exchange]bool{}
	for _, h := range r.Root.Children {
		crit[h.Client], par[h.Client] = h.Critical, h.Parallel
	}
	if !crit[c1] || !crit[c2] || !crit[p1] || crit[p2] {
		t.Errorf("critical: c1 %v c2 %v p1 %v p2 %v, want the sequential ones and the longer parallel one", crit[c1], crit[c2], crit[p1], crit[p2])
	}
	if par[c1] || par[c2] || !par[p1] || !par[p2] {
		t.Errorf("parallel: c1 %v c2 %v p1 %v p2 %v", par[c1], par[c2], par[p1], par[p2])
	}
	if r.CriticalTurns != 8 || r.CriticalHops != 4 {
		t.Errorf("critical path: %d turns, %d hops, want 8 and 4", r.CriticalTurns, r.CriticalHops)
	}
	// The children's union: 2 + 2 + 5 ms.
	if r.Root.ChildWait != 9*time.Millisecond {
		t.Errorf("wait on children %v, want 9ms", r.Root.ChildWait)
	}
	// Moving the app: the root's round trip and the three critical
	// calls' (the parallel call's is hidden behind the longer one's).
	if got := WhatIf(r, Move{Service: "app", Extra: 10 * time.Millisecond}); got.RoundTrips != 4 || got.Added != 40*time.Millisecond {
		t.Errorf("what-if app +10ms: %+v", got)
	}
	if got := WhatIf(r, Move{Service: "curl", Extra: 10 * time.Millisecond}); got.RoundTrips != 1 || got.Duration != r.Duration+10*time.Millisecond {
		t.Errorf("what-if curl +10ms: %+v", got)
	}
}

// A batch job's thousands of calls: the tree keeps MaxHops, counts the rest.
func TestTreeBounded(t *testing.T) {
	a := inbound(1, 11, 0, 10000*ms)
	exs := []*record.Exchange{a}
	for i := range 3000 {
		exs = append(exs, outbound(1, 11, record.Mono(i+1)*ms, record.Mono(i+1)*ms+ms/2, record.Served{Parent: read(a, record.LinkThread)}))
	}
	res := Assemble(exs, 100)
	if len(res.Requests) != 1 || res.Requests[0].Hops != 100 || res.Requests[0].Truncated != 2901 {
		t.Fatalf("requests %d, hops %d, truncated %d; want 1, 100, 2901", len(res.Requests), res.Requests[0].Hops, res.Requests[0].Truncated)
	}
}

// The Tracker makes a tree once its root has settled, and holds nothing
// after; a long request's calls wait for it.
func TestTrackerSettles(t *testing.T) {
	tr := New(Config{Settle: time.Second})
	a := inbound(1, 11, 0, 5000*ms)
	x := outbound(1, 11, ms, 2*ms, record.Served{Parent: read(a, record.LinkThread)})
	tr.Exchange(x)
	tr.Pass(base+4000*ms, false)
	if s := tr.Snapshot(false); s.Pending != 1 || s.Stats.Requests != 0 {
		t.Fatalf("before its request's record: %+v", s)
	}
	tr.Exchange(a)
	tr.Pass(base+5500*ms, false)
	if s := tr.Snapshot(false); s.Stats.Requests != 0 {
		t.Fatalf("before the settle: %+v", s)
	}
	tr.Pass(base+6500*ms, false)
	s := tr.Snapshot(true)
	if s.Pending != 0 || s.Stats.Requests != 1 || s.Stats.Linked[record.LinkThread] != 1 || len(s.Recent) != 1 || s.Recent[0].Hops != 2 {
		t.Fatalf("after: %+v", s)
	}
	if _, err := tr.Request(s.Recent[0].ID); err != nil {
		t.Error(err)
	}
	if _, err := tr.Request("nope"); err == nil {
		t.Error("an unknown request id answered")
	}
}

func TestParseMove(t *testing.T) {
	m, err := ParseMove("postgres=+20ms")
	if err != nil || m.Service != "postgres" || m.Extra != 20*time.Millisecond {
		t.Errorf("%+v %v", m, err)
	}
	for _, bad := range []string{"postgres", "=+20ms", "postgres=+20", "postgres=fast"} {
		if _, err := ParseMove(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A long request's calls wait for it no longer than MaxWait, then count
// orphaned; more exchanges than MaxPending drop the oldest, counted: the
// Tracker's memory is bounded however long an inbound stream stays open.
func TestTrackerBounded(t *testing.T) {
	tr := New(Config{Settle: time.Second, MaxWait: 10 * time.Second, MaxPending: 100})
	stream := inbound(1, 11, 0, 3600000*ms) // an hour-long inbound stream, its record not come
	for i := range 250 {
		at := record.Mono(i) * 10 * ms
		tr.Exchange(outbound(1, 11, at, at+ms, record.Served{Parent: read(stream, record.LinkThread)}))
	}
	s := tr.Snapshot(false)
	if s.Pending > 100 || s.Stats.Dropped != 150 {
		t.Errorf("held %d, dropped %d: want at most 100 held and the other 150 counted", s.Pending, s.Stats.Dropped)
	}
	tr.Pass(base+20000*ms, false)
	s = tr.Snapshot(false)
	if s.Pending != 0 || s.Stats.Orphaned != 100 || s.Stats.Requests != 0 {
		t.Errorf("after MaxWait: %+v; want the 100 held counted orphaned", s)
	}
}

// An event loop's call that two of its requests could own roots a
// detached request: the app it called and the app's own calls are shown,
// whose request they served is not, and the call counts ambiguous.
func TestTreeDetached(t *testing.T) {
	a := inbound(1, 11, 0, 10*ms)
	b := inbound(1, 11, ms, 11*ms)
	x := outbound(1, 11, 2*ms, 8*ms, record.Served{Parent: read(b, record.LinkThread), Prev: read(a, record.LinkThread)})
	app := inbound(2, 21, 2*ms+ms/10, 8*ms-ms/10)
	x.ISNLocal, x.ISNRemote, x.OutSeq = 77, 78, app.InSeq
	app.ISNLocal, app.ISNRemote = 78, 77
	y := outbound(2, 21, 3*ms, 4*ms, record.Served{Parent: read(app, record.LinkThread)})
	tr := New(Config{})
	// In the order their records come: each as it ends.
	for _, e := range []*record.Exchange{y, app, x, a, b} {
		tr.Exchange(e)
	}
	tr.Pass(base+record.Mono(time.Minute), false)
	s := tr.Snapshot(true)
	var d *record.Request
	for _, r := range s.Recent {
		if r.Detached {
			d = r
		}
	}
	// The Tracker holds copies: compare by socket.
	if d == nil || d.Root.Client.Cookie != x.Cookie || d.Root.Server.Cookie != app.Cookie || len(d.Root.Children) != 1 || d.Root.Children[0].Client.Cookie != y.Cookie {
		for _, r := range s.Recent {
			t.Logf("%+v root %+v", *r, *r.Root)
		}
		t.Fatal("no detached request rooted at the ambiguous call with the app's call under it")
	}
	if s.Stats.Ambiguous != 1 || len(s.Ambiguous) != 1 || s.Ambiguous[0].PID != 1 || s.Pending != 0 {
		t.Errorf("stats %+v, ambiguous %+v, pending %d", s.Stats, s.Ambiguous, s.Pending)
	}
}

// The Tracker holds what makes trees, and takes the two ends' other sides
// from its side ring: a client's request to a middle tier and a leaf
// server's answer are named in the tree though neither is held. A node
// of single exchanges holds nothing.
func TestTrackerHoldsTrees(t *testing.T) {
	tr := New(Config{})
	leaf := inbound(5, 51, 0, ms)
	tr.Exchange(leaf)
	tr.Exchange(paired(leaf, 6, "redis-benchmark"))
	if s := tr.Snapshot(false); s.Pending != 0 || len(tr.sideAt) != 0 {
		t.Fatalf("single exchanges: %d held, %d aside", s.Pending, len(tr.sideAt))
	}

	a := inbound(1, 11, 10*ms, 20*ms)
	a.Owner.Comm = "front"
	x := outbound(1, 11, 12*ms, 15*ms, record.Served{Parent: read(a, record.LinkThread)})
	x.Owner.Comm = "front"
	db := inbound(2, 21, 12*ms+ms/10, 15*ms-ms/10)
	db.Owner.Comm = "postgres"
	x.ISNLocal, x.ISNRemote, x.OutSeq = 91, 92, db.InSeq
	db.ISNLocal, db.ISNRemote = 92, 91
	curl := paired(a, 9, "curl")
	for _, e := range []*record.Exchange{x, db, a, curl} {
		tr.Exchange(e)
	}
	if s := tr.Snapshot(false); s.Pending != 2 {
		t.Fatalf("%d held, want the front's two", s.Pending)
	}
	tr.Pass(base+record.Mono(time.Minute), false)
	s := tr.Snapshot(true)
	if len(s.Recent) != 1 {
		t.Fatalf("%d requests, want 1", len(s.Recent))
	}
	r := s.Recent[0]
	if r.Root.From != "curl" || r.Root.To != "front" || len(r.Root.Children) != 1 || r.Root.Children[0].To != "postgres" || r.Duration != curl.Duration {
		t.Errorf("tree: %s -> %s (%v, curl's %v), children %d", r.Root.From, r.Root.To, r.Duration, curl.Duration, len(r.Root.Children))
	}
}

// Under memory pressure the held exchanges go, counted, and trees form
// again from the next ones.
func TestTrackerShed(t *testing.T) {
	tr := New(Config{Settle: time.Second})
	a := inbound(1, 11, 0, 5*ms)
	tr.Exchange(outbound(1, 11, ms, 2*ms, record.Served{Parent: read(a, record.LinkThread)}))
	tr.Exchange(a)
	if n := tr.Shed(); n != 2 {
		t.Errorf("shed %d held exchanges, want 2", n)
	}
	tr.Pass(base+10000*ms, false)
	if s := tr.Snapshot(false); s.Pending != 0 || s.Stats.Shed != 2 || s.Stats.Requests != 0 {
		t.Fatalf("after the shed: %+v", s)
	}
	b := inbound(1, 11, 20000*ms, 20005*ms)
	tr.Exchange(outbound(1, 11, 20001*ms, 20002*ms, record.Served{Parent: read(b, record.LinkThread)}))
	tr.Exchange(b)
	tr.Pass(base+30000*ms, false)
	if s := tr.Snapshot(false); s.Stats.Requests != 1 || s.Stats.Linked[record.LinkThread] != 1 {
		t.Fatalf("the next request: %+v", s)
	}
}

// A process that answers and calls itself (a load generator serving its
// own requests) is no middle tier: nothing is held. One whose calls name
// no request and go elsewhere (Go's HTTP client writes them from its own
// goroutine) is one, its calls linked by their windows.
func TestTrackerSelfCallsNotHeld(t *testing.T) {
	tr := New(Config{})
	self := netip.MustParseAddrPort("127.0.0.1:9000")
	for i := range 3 {
		in := inbound(1, 11, record.Mono(i)*10*ms, record.Mono(i)*10*ms+5*ms)
		in.Flow.Local = self
		call := outbound(1, 12, record.Mono(i)*10*ms+ms, record.Mono(i)*10*ms+6*ms, record.Served{})
		call.Flow.Remote = self
		tr.Exchange(call)
		tr.Exchange(in)
	}
	if s := tr.Snapshot(false); s.Pending != 0 {
		t.Errorf("a process calling itself is held: %+v", s)
	}
	for i := range 3 {
		in := inbound(2, 21, record.Mono(i)*10*ms, record.Mono(i)*10*ms+5*ms)
		in.Flow.Local = netip.MustParseAddrPort("10.0.0.2:8080")
		call := outbound(2, 22, record.Mono(i)*10*ms+ms, record.Mono(i)*10*ms+2*ms, record.Served{})
		call.Flow.Remote = netip.MustParseAddrPort("10.0.0.3:8080")
		tr.Exchange(call)
		tr.Exchange(in)
	}
	tr.Pass(base+record.Mono(time.Minute), true)
	if s := tr.Snapshot(false); s.Stats.Linked[record.LinkWindow] != 2 {
		t.Errorf("a proxy's calls naming no request: %+v, want the second and third linked by window", s.Stats)
	}
}

// The daemon's own exchanges (its exports during a /metrics scrape) make
// no trees.
func TestTrackerSelf(t *testing.T) {
	tr := New(Config{Self: 7})
	a := inbound(7, 71, 0, 5*ms)
	tr.Exchange(outbound(7, 71, ms, 2*ms, record.Served{Parent: read(a, record.LinkThread)}))
	tr.Exchange(a)
	tr.Pass(base+record.Mono(time.Minute), true)
	if s := tr.Snapshot(false); s.Stats.Requests != 0 || s.Pending != 0 {
		t.Errorf("the daemon's own exchanges made trees: %+v", s)
	}
}
