package otlp_test

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/otelcol"
)

func isHop(s otelcol.Span) bool { return s.Name == otlp.HopSpanName }

// A request tree becomes a trace of its own in a real Collector: a span
// per hop (the requester's end, with its stages), the responder's end on
// this node under it, and the hops made while serving under that, each
// hop linked to its exchange's own trace;
// the hop whose server is on another node links to the tree that node
// makes of that exchange, whose root span has exactly the IDs linked to.
// A tree whose root exchange was not exported is not either.
func TestRequestTrace(t *testing.T) {
	c := otelcol.Start(t)
	x := newExporter(t, c, otlp.Config{})
	req, resp := requester(1000, 2000000, 1001), responder(1000, 2000000, 1001)
	call := requester(3000, 4000000, 3001) // nginx to a database on another node
	call.Owner.Comm = "nginx"
	x.Exchange(req)
	x.Exchange(resp)
	root := &record.Hop{Client: req, Server: resp, From: "curl", To: "nginx", Start: req.Start, End: req.End, Duration: req.Duration,
		Network: req.Components.Network, Think: 3 * ms, ChildWait: 4 * ms, Turns: 2, CriticalTurns: 4}
	leaf := &record.Hop{Client: call, From: "nginx", To: "10.0.0.3:5432", Link: record.LinkThread, Start: resp.Start + record.Mono(2*ms),
		End: resp.Start + record.Mono(6*ms), Duration: 4 * ms, Turns: 2, CriticalTurns: 2, Critical: true}
	root.Children = []*record.Hop{leaf}
	x.Request(&record.Request{ID: "2a-3e9", Endpoint: "nginx:8080", Root: root, Duration: req.Duration, Hops: 2, CriticalTurns: 4, Dominant: "curl -> nginx"})
	// Not exported: its root exchange was not.
	lone := requester(5000, 6000000, 5001)
	x.Request(&record.Request{ID: "lone", Endpoint: "x:1", Root: &record.Hop{Client: lone, From: "curl", To: "x", Start: lone.Start, End: lone.End}, Hops: 1})
	x.ForceFlush(t.Context())

	hops := c.WaitForSpans(t, 2, wait, isHop)
	var r, l otelcol.Span
	for _, s := range hops {
		switch s.Attributes["lattrace.hop.to"] {
		case "nginx":
			r = s
		case "10.0.0.3:5432":
			l = s
		case "x":
			t.Errorf("a tree whose root exchange was not exported: %+v", s)
		}
	}
	if r.SpanID == "" || l.SpanID == "" {
		t.Fatalf("hop spans: %+v", hops)
	}
	all := c.WaitForSpans(t, 0, 0, func(s otelcol.Span) bool { return s.TraceID == r.TraceID })
	under := func(parent otelcol.Span) map[string][]otelcol.Span {
		m := map[string][]otelcol.Span{}
		for _, s := range all {
			if s.ParentSpanID == parent.SpanID {
				m[s.Name] = append(m[s.Name], s)
			}
		}
		return m
	}
	served := under(r)[otlp.ServedSpanName]
	if r.ParentSpanID != "" || len(served) != 1 || l.ParentSpanID != served[0].SpanID || l.TraceID != r.TraceID {
		t.Fatalf("nesting: root parent %q, served under root %v, leaf parent %q, traces %s %s", r.ParentSpanID, served, l.ParentSpanID, r.TraceID, l.TraceID)
	}
	if r.Kind != 3 || served[0].Kind != 2 || l.Kind != 3 {
		t.Errorf("kinds: hop %d, served %d, leaf %d (3 client, 2 server)", r.Kind, served[0].Kind, l.Kind)
	}
	// Both ends carry their own stages: the requester's network, the
	// responder's think.
	if len(under(r)[otlp.StageNetwork]) != 1 || len(under(served[0])[otlp.StageThink]) != 1 || len(under(l)[otlp.StageNetwork]) != 1 {
		t.Errorf("stages: root %v, served %v, leaf %v", under(r), under(served[0]), under(l))
	}
	if r.Attributes["lattrace.request.id"] != "2a-3e9" || num(r.Attributes["lattrace.request.critical_turns"]) != 4 ||
		num(r.Attributes["lattrace.hop.child_wait_ns"]) != int64(4*ms) || l.Attributes["lattrace.hop.link"] != "thread" {
		t.Errorf("attributes: root %v leaf %v", r.Attributes, l.Attributes)
	}
	linkTo := func(s otelcol.Span, kind string) otelcol.Link {
		for _, k := range s.Links {
			if k.Attributes["lattrace.link"] == kind {
				return k
			}
		}
		t.Errorf("%s: no %s link in %+v", s.Attributes["lattrace.hop.to"], kind, s.Links)
		return otelcol.Link{}
	}
	for _, p := range []struct {
		s otelcol.Span
		e *record.Exchange
	}{{r, req}, {l, call}} {
		tid, sid, _ := otlp.TraceIDs(p.e)
		if k := linkTo(p.s, "exchange"); k.TraceID != hex.EncodeToString(tid[:]) || k.SpanID != hex.EncodeToString(sid[:]) {
			t.Errorf("%s links to %s/%s, not its exchange's span %s/%s", p.s.Attributes["lattrace.hop.to"], k.TraceID, k.SpanID, tid, sid)
		}
	}
	remote := linkTo(l, "request_on_server_node")

	// The database's node: its tree of the same exchange, rooted at the
	// server's end, has the IDs the leaf links to.
	c2 := otelcol.Start(t)
	x2 := newExporter(t, c2, otlp.Config{})
	callResp := responder(3000, 4000000, 3001)
	callResp.Owner.Comm = "postgres"
	x2.Exchange(callResp)
	x2.Request(&record.Request{ID: "db", Endpoint: "postgres:5432", Hops: 1,
		Root: &record.Hop{Server: callResp, From: "10.0.0.2", To: "postgres", Start: callResp.Start, End: callResp.End}})
	x2.ForceFlush(t.Context())
	db := c2.WaitForSpans(t, 1, wait, isHop)[0]
	if db.TraceID != remote.TraceID || db.SpanID != remote.SpanID {
		t.Errorf("the server node's tree is %s/%s; the client node links to %s/%s", db.TraceID, db.SpanID, remote.TraceID, remote.SpanID)
	}
	time.Sleep(300 * time.Millisecond)
	if n := len(c.WaitForSpans(t, 0, 0, isHop)); n != 2 {
		t.Errorf("%d hop spans, want 2", n)
	}
}
