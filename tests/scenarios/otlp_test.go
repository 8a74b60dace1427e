package scenarios

import (
	"context"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/otelcol"
	"github.com/lattrace/lattrace/tests/workload"
)

// Both ends of an exchange in one trace, through a real collector: client
// in A, server in B with 15 ms think time over a 20 ms path, one tracer
// seeing both namespaces. Each exchange's trace holds the requester's span
// and, under it, the responder's; the responder's think time sits inside
// the requester's app.peer, and the stage spans equal the records'
// components (what the JSON lines output writes). The collector goes down
// halfway and comes back: nothing within the queue bound is lost.
func TestBothEndsInOneTrace(t *testing.T) {
	col := otelcol.Start(t)
	s := newLab(t, symmetric(10*time.Millisecond))
	x, err := otlp.New(context.Background(), otlp.Config{Endpoint: col.GRPCEndpoint(), Insecure: true, SlowThreshold: 0, MetricInterval: time.Second, BatchTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.also = x
	s.startTracer(tracer.Options{})
	s.server(workload.ServerConfig{})
	rr := workload.ClientConfig{ReqSize: 200, RespSize: 2000, Think: 15 * time.Millisecond, Count: 10, Interval: 40 * time.Millisecond}
	recs := s.client(rr)
	// The backend goes down mid-run (a graceful stop, so that what it had
	// already acknowledged is on disk) and comes back: the spans of the
	// exchanges made meanwhile wait in the bounded queue and all arrive.
	col.Stop()
	recs = append(recs, s.client(rr)...)
	s.settle(recs)
	time.Sleep(time.Second) // exports fail and are retried meanwhile
	col.Restart()
	if err := x.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	pairs := s.match(recs)
	resp := map[[3]uint32]*record.Exchange{}
	for _, e := range s.responders() {
		resp[[3]uint32{e.ISNRemote, e.ISNLocal, e.InSeq}] = e
	}
	spans := col.WaitForSpans(t, 2*len(pairs), 15*time.Second, func(sp otelcol.Span) bool { return sp.Name == otlp.SpanName })
	byID := map[string]otelcol.Span{}
	for _, sp := range spans {
		byID[sp.TraceID+"/"+sp.SpanID] = sp
	}
	all := col.Spans()
	for _, p := range pairs {
		r := resp[[3]uint32{p.ex.ISNLocal, p.ex.ISNRemote, p.ex.OutSeq}]
		if r == nil {
			t.Errorf("exchange %d: no responder record with the same sequence numbers", p.app.ID)
			continue
		}
		// The requester's peer is the gap less an estimated network: it
		// holds the responder's think within the model's 300 us tolerance.
		if r.Components.Think > p.ex.Components.Peer+300*time.Microsecond || r.Components.Think < 15*time.Millisecond {
			t.Errorf("exchange %d: responder think %v, requester app.peer %v: think must fit inside peer", p.app.ID, r.Components.Think, p.ex.Components.Peer)
		}
		traceID, spanID, ok := otlp.TraceIDs(p.ex)
		if !ok {
			t.Fatalf("exchange %d: no derived trace id", p.app.ID)
		}
		reqSpan, found := byID[traceID.String()+"/"+spanID.String()]
		if !found {
			t.Errorf("exchange %d: the requester's span is not in the backend", p.app.ID)
			continue
		}
		var respSpan *otelcol.Span
		stages := map[string]time.Duration{}
		for i, sp := range all {
			if sp.TraceID != reqSpan.TraceID {
				continue
			}
			if sp.Name == otlp.SpanName && sp.ParentSpanID == reqSpan.SpanID {
				respSpan = &all[i]
			}
			if sp.ParentSpanID == reqSpan.SpanID && sp.Name != otlp.SpanName {
				stages[sp.Name] = time.Duration(sp.EndUnixNano - sp.StartUnixNano)
			}
		}
		if respSpan == nil {
			t.Errorf("exchange %d: no responder span under the requester's in trace %s", p.app.ID, reqSpan.TraceID)
		}
		c := p.ex.Components
		for name, want := range map[string]time.Duration{otlp.StageNetwork: c.Network, otlp.StagePeer: c.Peer} {
			if got, ok := stages[name]; !ok || got != want {
				t.Errorf("exchange %d: stage span %s lasts %v, the record says %v (stages %v)", p.app.ID, name, got, want, stages)
			}
		}
	}
	st := x.Stats()
	t.Logf("exporter: %+v", st)
	if st.DroppedQueue() != 0 || st.ExportErrors != 0 || st.DroppedSampling != 0 {
		t.Errorf("spans lost within the queue bound: %+v", st)
	}
	col.WaitForMetric(t, otlp.MetricDuration, 15*time.Second)
	x.Shutdown(context.Background())
}
