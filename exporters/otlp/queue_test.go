package otlp

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// partialServer is an OTLP/gRPC trace receiver that keeps each batch but
// one span (OTLP's partial_success).
type partialServer struct {
	coltracepb.UnimplementedTraceServiceServer
	calls atomic.Int64
}

func (s *partialServer) Export(context.Context, *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.calls.Add(1)
	return &coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{RejectedSpans: 1, ErrorMessage: "one span too old"}}, nil
}

// recEvents records what a queue tells of each exchange's fate.
type recEvents struct {
	mu          sync.Mutex
	exp, failed int
	drops       map[dropReason]int
	lastErr     error
}

func (r *recEvents) exported(e, s int) { r.mu.Lock(); r.exp += e; r.mu.Unlock() }
func (r *recEvents) dropped(w dropReason, e, s int) {
	r.mu.Lock()
	if r.drops == nil {
		r.drops = map[dropReason]int{}
	}
	r.drops[w] += e
	r.mu.Unlock()
}
func (r *recEvents) exportFailed(err error) { r.mu.Lock(); r.failed++; r.lastErr = err; r.mu.Unlock() }

// spansOf is n ended spans.
func spansOf(n int) []sdktrace.ReadOnlySpan {
	stubs := make(tracetest.SpanStubs, n)
	for i := range stubs {
		stubs[i].Name = "x"
	}
	return stubs.Snapshots()
}

// fill queues an exchange of n spans of priority p, as Exporter.spans does.
func fill(q *spanQueue, n int, p priority) bool {
	if !q.begin(n, p) {
		return false
	}
	for _, s := range spansOf(n) {
		q.OnEnd(s)
	}
	return true
}

// A backend that keeps a batch but a span (a partial success) has it: the
// same batch sent again would be stored twice, and, always the next one
// taken, hold every other behind it.
func TestPartialSuccessIsDelivered(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := grpc.NewServer()
	ps := &partialServer{}
	coltracepb.RegisterTraceServiceServer(srv, ps)
	go srv.Serve(ln)
	defer srv.Stop()
	flushFour(t, ProtocolGRPC, ln.Addr().String(), ps.calls.Load)
}

// The same over OTLP/HTTP.
func TestPartialSuccessIsDeliveredHTTP(t *testing.T) {
	var calls atomic.Int64
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		b, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{PartialSuccess: &coltracepb.ExportTracePartialSuccess{RejectedSpans: 1, ErrorMessage: "one span too old"}})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(b)
	})}
	go hs.Serve(ln)
	defer hs.Close()
	flushFour(t, ProtocolHTTP, ln.Addr().String(), calls.Load)
}

// flushFour queues one exchange for the backend at endpoint, flushes four
// times and wants it delivered once: one call to the backend (calls says
// how many it had), counted exported, nothing waiting or dropped, also
// after the queue shut down.
func flushFour(t *testing.T, protocol, endpoint string, calls func() int64) {
	t.Helper()
	cfg := Config{Endpoint: endpoint, Insecure: true}
	cfg.defaults()
	exp, err := newSpanExporter(context.Background(), protocol, cfg.exportOptions())
	if err != nil {
		t.Fatal(err)
	}
	ev := &recEvents{}
	q := newSpanQueue(exp, cfg, ev)
	fill(q, 3, prioSlow)
	for range 4 {
		_ = q.ForceFlush(context.Background())
	}
	ex, sp := q.depth()
	_ = q.Shutdown(context.Background())
	if n := calls(); n != 1 || ev.exp != 1 || ev.failed != 0 || len(ev.drops) != 0 || ex != 0 || sp != 0 {
		t.Errorf("%d calls to the backend; %d exchanges exported, %d failed attempts (%v), drops %v; %d exchanges and %d spans waiting: want the one exchange delivered once",
			n, ev.exp, ev.failed, ev.lastErr, ev.drops, ex, sp)
	}
}

// blockExp holds each export until released, saying how many spans it
// got.
type blockExp struct {
	release chan struct{}
	entered chan int
}

func (b *blockExp) ExportSpans(ctx context.Context, s []sdktrace.ReadOnlySpan) error {
	b.entered <- len(s)
	<-b.release
	return nil
}
func (b *blockExp) Shutdown(context.Context) error { return nil }

// The batch being sent is in the queue's depth, each of its exchanges:
// Stats' sum holds during a send too.
func TestDepthDuringSend(t *testing.T) {
	b := &blockExp{release: make(chan struct{}), entered: make(chan int, 1)}
	cfg := Config{MaxQueueSize: 1000, MaxExportBatchSize: 100, BatchTimeout: time.Hour, ExportTimeout: time.Minute}
	ev := &recEvents{}
	q := newSpanQueue(b, cfg, ev)
	for range 10 {
		fill(q, 10, prioRate) // 10 exchanges of 10 spans: a batch
	}
	n := <-b.entered
	ex, sp := q.depth()
	if n != 100 || ex != 10 || sp != 100 {
		t.Errorf("sending %d spans, the depth says %d exchanges and %d spans: want the 10 exchanges of 100 spans", n, ex, sp)
	}
	close(b.release)
	_ = q.Shutdown(context.Background())
}

// failExp fails every export as a backend that does not answer.
type failExp struct{}

func (failExp) ExportSpans(ctx context.Context, s []sdktrace.ReadOnlySpan) error {
	return context.DeadlineExceeded
}
func (failExp) Shutdown(context.Context) error { return nil }

// An exchange that would not fit even with every one it outranks gone is
// refused alone: nothing is dropped for it.
func TestRefusedAloneWhenRoomCannotBeMade(t *testing.T) {
	cfg := Config{MaxQueueSize: 20, MaxExportBatchSize: 100, BatchTimeout: time.Hour, ExportTimeout: time.Minute}
	ev := &recEvents{}
	q := newSpanQueue(failExp{}, cfg, ev)
	fill(q, 2, prioRate)
	fill(q, 2, prioRate)
	fill(q, 16, prioSlow) // full: 20
	ok := fill(q, 6, prioRate)
	ex, sp := q.depth()
	if ok || len(ev.drops) != 0 || ex != 3 || sp != 20 {
		t.Errorf("a 6-span rate exchange beside 4 spans of rate and 16 of slow ones in 20: admitted %v, drops %v, %d exchanges and %d spans waiting; want it refused and the 3 kept",
			ok, ev.drops, ex, sp)
	}
	_ = q.Shutdown(context.Background())
}

// invalidServer refuses every batch's content.
type invalidServer struct {
	coltracepb.UnimplementedTraceServiceServer
}

func (s *invalidServer) Export(context.Context, *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	return nil, status.Error(codes.InvalidArgument, "bad")
}

// A backend's refusal of the content is told from its other failures:
// gRPC INVALID_ARGUMENT, HTTP 400 and 413 are dropped for good, the rest
// (404 here) retried.
func TestRejectedTold(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, &invalidServer{})
	go srv.Serve(ln)
	defer srv.Stop()
	cfg := Config{Endpoint: ln.Addr().String(), Insecure: true}
	cfg.defaults()
	exp, _ := newSpanExporter(context.Background(), ProtocolGRPC, cfg.exportOptions())
	if err := exp.ExportSpans(context.Background(), spansOf(1)); err == nil || !rejected(err) {
		t.Errorf("gRPC INVALID_ARGUMENT: %v, not told rejected", err)
	}
	for _, code := range []int{400, 413, 404} {
		ln2, _ := net.Listen("tcp", "127.0.0.1:0")
		hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "no", code) })}
		go hs.Serve(ln2)
		c2 := Config{Endpoint: ln2.Addr().String(), Insecure: true}
		c2.defaults()
		e2, _ := newSpanExporter(context.Background(), ProtocolHTTP, c2.exportOptions())
		err := e2.ExportSpans(context.Background(), spansOf(1))
		if err == nil || rejected(err) != (code != 404) {
			t.Errorf("HTTP %d: %v, told rejected %v", code, err, err != nil && rejected(err))
		}
		hs.Close()
	}
}
