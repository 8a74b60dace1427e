package otlp

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/lattrace/lattrace/record"
)

// Span names of a request tree's trace (Exporter.Request).
const (
	// HopSpanName is each hop's span, the requester's end of its exchange
	// (kind client, with the requester's stages), the root hop's included.
	HopSpanName = "request hop"
	// ServedSpanName is the responder's end of a hop's exchange where the
	// responder is on this node (kind server, with its stages), a child of
	// the hop's span; the hops made while serving it are its children.
	ServedSpanName = "request served"
)

// sampledKeys remembers the exchanges recently exported as spans, so that a
// request tree is exported when its root exchange was: the trees cost no
// more spans than the sample already chose, and every tree exported has
// its root's own trace to link to.
type sampledKeys struct {
	mu   sync.Mutex
	set  map[key]struct{}
	ring []key
	next int
}

const sampledKeysMax = 1 << 16

func (s *sampledKeys) add(k key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set == nil {
		s.set, s.ring = map[key]struct{}{}, make([]key, sampledKeysMax)
	}
	if _, ok := s.set[k]; ok {
		return
	}
	delete(s.set, s.ring[s.next])
	s.ring[s.next] = k
	s.next = (s.next + 1) % sampledKeysMax
	s.set[k] = struct{}{}
}

func (s *sampledKeys) has(k key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.set[k]
	return ok
}

// hopKey names a hop's exchange at both ends.
func hopKey(h *record.Hop) (key, bool) {
	if h.Client != nil {
		return exchangeKey(h.Client)
	}
	if h.Server != nil {
		return exchangeKey(h.Server)
	}
	return key{}, false
}

// requestIDs are the trace and root span IDs of the request tree whose root
// hop is the exchange k. A node that holds only the requester's end of that
// exchange (its tree's leaf: the server is on another node) derives the
// same IDs, and links to the other node's tree with them.
func (k key) requestIDs() (trace.TraceID, trace.SpanID) {
	return k.derive("lattrace/request\x00", "lattrace/request-span\x00")
}

// Request exports a request tree (daemon/requests) as a trace of its own,
// when its root exchange was exported as spans: each hop is a span of the
// requester's end of its exchange and, where the responder is on this
// node, a child span of the responder's end, both with their stages, and
// the hops made while serving it nest under the responder's span, as in
// a trace the apps had propagated themselves. Each hop's span carries its
// network, transport and think time and the part spent waiting on its
// children, and links to its exchange's own trace (where the two ends of
// one exchange meet across nodes). A hop whose server is on another node
// also links to the tree that node makes of it, and a root whose client
// is on another node is that tree: both derive its IDs from the exchange
// (requestIDs). A request of one exchange whose both ends are on this node
// is not exported again: its exchange's trace is the whole of it.
func (x *Exporter) Request(r *record.Request) {
	if x.tracer == nil || r.Root == nil {
		return
	}
	if h := r.Root; len(h.Children) == 0 && h.Client != nil && h.Server != nil {
		// Both ends on this node and nothing made under it: the
		// exchange's own trace is the whole request.
		return
	}
	rk, ok := hopKey(r.Root)
	if !ok || !x.sampled.has(rk) {
		return
	}
	n := treeSpans(r.Root)
	x.spanMu.Lock()
	defer x.spanMu.Unlock()
	x.spansQueued.Add(uint64(n))
	if !x.queue.beginRequest(n, prioSlow) {
		x.spansDropped[dropQueueFull].Add(uint64(n))
		return
	}
	off := x.clock.offset(r.Root.End)
	wall := func(m record.Mono) time.Time { return time.Unix(0, int64(m)+off) }
	tid, sid := rk.requestIDs()
	ctx := context.WithValue(context.Background(), idKey{}, forcedIDs{tid, sid})
	x.hopSpan(ctx, r.Root, wall, attribute.String("lattrace.request.id", r.ID), attribute.String("lattrace.request.endpoint", r.Endpoint),
		attribute.Int("lattrace.request.hops", r.Hops), attribute.Int("lattrace.request.truncated", r.Truncated),
		attribute.Int("lattrace.request.critical_turns", int(r.CriticalTurns)), attribute.String("lattrace.request.dominant_hop", r.Dominant))
}

// treeSpans is the number of spans hopSpan makes of h and its children.
func treeSpans(h *record.Hop) int {
	n := 1
	if h.Client != nil {
		n += len(stages(h.Client))
	}
	if h.Server != nil {
		n += 1 + len(stages(h.Server))
	}
	for _, c := range h.Children {
		n += treeSpans(c)
	}
	return n
}

// hopSpan exports h's span, its responder's span under it, and under that
// its children.
func (x *Exporter) hopSpan(ctx context.Context, h *record.Hop, wall func(record.Mono) time.Time, extra ...attribute.KeyValue) {
	var links []trace.Link
	if k, ok := hopKey(h); ok {
		links = append(links, remoteLink(k.ids, "exchange"))
		if h.Server == nil && h.Client != nil {
			links = append(links, remoteLink(k.requestIDs, "request_on_server_node"))
		}
	}
	attrs := append([]attribute.KeyValue{
		attribute.String("lattrace.hop.from", h.From), attribute.String("lattrace.hop.to", h.To),
		attribute.Int64("lattrace.hop.network_ns", int64(h.Network)), attribute.Int64("lattrace.hop.transport_ns", int64(h.Transport)),
		attribute.Int64("lattrace.hop.think_ns", int64(h.Think)), attribute.Int64("lattrace.hop.child_wait_ns", int64(h.ChildWait)),
		attribute.Int("lattrace.hop.turns", int(h.Turns)), attribute.Int("lattrace.hop.critical_turns", int(h.CriticalTurns)),
		attribute.Bool("lattrace.hop.critical", h.Critical), attribute.Bool("lattrace.hop.parallel", h.Parallel),
	}, extra...)
	if h.Link != "" {
		attrs = append(attrs, attribute.String("lattrace.hop.link", string(h.Link)))
	}
	var hop trace.Span
	if h.Client != nil {
		hop = x.exchangeSpan(ctx, HopSpanName, h.Client, stages(h.Client), wall, append(attrs, exchangeAttrs(h.Client)...), trace.WithLinks(links...))
	} else {
		// The requester is off the node: the hop's span bounds the
		// responder's, from the responder's view.
		_, hop = x.tracer.Start(ctx, HopSpanName, trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(wall(h.Start)),
			trace.WithAttributes(attrs...), trace.WithLinks(links...))
	}
	// The IDs below are the SDK's own: only the root's are forced.
	under := trace.ContextWithSpan(context.Background(), hop)
	if h.Server != nil {
		served := x.exchangeSpan(under, ServedSpanName, h.Server, stages(h.Server), wall, exchangeAttrs(h.Server))
		under = trace.ContextWithSpan(context.Background(), served)
		defer served.End(trace.WithTimestamp(wall(h.Server.End)))
	}
	for _, c := range h.Children {
		x.hopSpan(under, c, wall)
	}
	hop.End(trace.WithTimestamp(wall(h.End)))
}

// remoteLink is a link, of kind lattrace.link, to the span ids names.
func remoteLink(ids func() (trace.TraceID, trace.SpanID), kind string) trace.Link {
	t, s := ids()
	return trace.Link{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: t, SpanID: s, TraceFlags: trace.FlagsSampled, Remote: true}),
		Attributes: []attribute.KeyValue{attribute.String("lattrace.link", kind)}}
}
