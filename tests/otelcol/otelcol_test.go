package otelcol_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/lattrace/lattrace/tests/otelcol"
)

const wait = 15 * time.Second

func testResource() *resource.Resource {
	return resource.NewSchemaless(
		attribute.String("service.name", "lattrace-test"),
		attribute.String("host.name", "otelcol-test-host"),
	)
}

func newTracerProvider(t *testing.T, c *otelcol.Collector) *sdktrace.TracerProvider {
	t.Helper()
	exp, err := otlptracegrpc.New(context.Background(),
		otlptracegrpc.WithEndpoint(c.GRPCEndpoint()),
		otlptracegrpc.WithInsecure(),
		otlptracegrpc.WithTimeout(20*time.Second),
		otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{
			Enabled: true, InitialInterval: 100 * time.Millisecond, MaxInterval: 500 * time.Millisecond, MaxElapsedTime: 20 * time.Second,
		}),
	)
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithResource(testResource()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

func TestSpansAndMetricsReachCollector(t *testing.T) {
	c := otelcol.Start(t)
	ctx := context.Background()

	// Traces: a parent and a child span, sent synchronously over OTLP/gRPC.
	tracer := newTracerProvider(t, c).Tracer("lattrace/otelcol-test", trace.WithInstrumentationVersion("0.0.1"))
	start := time.Now()
	pctx, parent := tracer.Start(ctx, "tcp.connect", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("net.peer.name", "example.test"),
			attribute.Int("net.peer.port", 443),
			attribute.Bool("tcp.retransmit", true),
			attribute.Float64("tcp.srtt_ms", 1.5),
			attribute.StringSlice("tcp.flags", []string{"SYN", "ACK"}),
		))
	_, child := tracer.Start(pctx, "tcp.handshake")
	child.AddEvent("syn-ack", trace.WithAttributes(attribute.Int("rtt_us", 120)))
	child.End()
	parent.End()

	spans := c.WaitForSpans(t, 2, wait, nil)
	byName := map[string]otelcol.Span{}
	for _, s := range spans {
		byName[s.Name] = s
	}
	p, ch := byName["tcp.connect"], byName["tcp.handshake"]
	if p.TraceID != parent.SpanContext().TraceID().String() || p.SpanID != parent.SpanContext().SpanID().String() {
		t.Errorf("parent ids = %s/%s, want %s/%s", p.TraceID, p.SpanID, parent.SpanContext().TraceID(), parent.SpanContext().SpanID())
	}
	if p.ParentSpanID != "" {
		t.Errorf("root span has parent %q", p.ParentSpanID)
	}
	if ch.TraceID != p.TraceID || ch.ParentSpanID != p.SpanID {
		t.Errorf("child trace/parent = %s/%s, want %s/%s", ch.TraceID, ch.ParentSpanID, p.TraceID, p.SpanID)
	}
	if p.Kind != 3 {
		t.Errorf("kind = %d, want 3 (client)", p.Kind)
	}
	if p.StartUnixNano < uint64(start.Add(-time.Second).UnixNano()) || p.EndUnixNano < p.StartUnixNano {
		t.Errorf("bad times start=%d end=%d", p.StartUnixNano, p.EndUnixNano)
	}
	wantAttrs := map[string]any{
		"net.peer.name":  "example.test",
		"net.peer.port":  int64(443),
		"tcp.retransmit": true,
		"tcp.srtt_ms":    1.5,
	}
	for k, v := range wantAttrs {
		if p.Attributes[k] != v {
			t.Errorf("attribute %s = %#v, want %#v", k, p.Attributes[k], v)
		}
	}
	if fl, _ := p.Attributes["tcp.flags"].([]any); len(fl) != 2 || fl[0] != "SYN" || fl[1] != "ACK" {
		t.Errorf("tcp.flags = %#v", p.Attributes["tcp.flags"])
	}
	if p.Resource["service.name"] != "lattrace-test" || p.Resource["host.name"] != "otelcol-test-host" {
		t.Errorf("resource = %v", p.Resource)
	}
	if p.Scope != "lattrace/otelcol-test" || p.ScopeVersion != "0.0.1" {
		t.Errorf("scope = %q %q", p.Scope, p.ScopeVersion)
	}
	if len(ch.Events) != 1 || ch.Events[0].Name != "syn-ack" || ch.Events[0].Attributes["rtt_us"] != int64(120) {
		t.Errorf("events = %+v", ch.Events)
	}

	// Metrics: a counter and a histogram, flushed explicitly over OTLP/gRPC.
	mexp, err := otlpmetricgrpc.New(ctx, otlpmetricgrpc.WithEndpoint(c.GRPCEndpoint()), otlpmetricgrpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(
		sdkmetric.WithReader(sdkmetric.NewPeriodicReader(mexp, sdkmetric.WithInterval(time.Hour))),
		sdkmetric.WithResource(testResource()),
	)
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	meter := mp.Meter("lattrace/otelcol-test")
	conns, err := meter.Int64Counter("lattrace.tcp.connections", metric.WithUnit("{connection}"))
	if err != nil {
		t.Fatal(err)
	}
	rtt, err := meter.Float64Histogram("lattrace.tcp.rtt", metric.WithUnit("ms"),
		metric.WithExplicitBucketBoundaries(1, 10, 100))
	if err != nil {
		t.Fatal(err)
	}
	dst := metric.WithAttributes(attribute.String("dst", "10.0.0.1"), attribute.Int("port", 80))
	conns.Add(ctx, 3, dst)
	for _, v := range []float64{0.5, 5, 50} {
		rtt.Record(ctx, v, dst)
	}
	if err := mp.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}

	m := c.WaitForMetric(t, "lattrace.tcp.connections", wait)
	if m.Type != otelcol.Sum || !m.Monotonic || m.Temporality != 2 || m.Unit != "{connection}" || len(m.DataPoints) != 1 {
		t.Fatalf("counter = %+v", m)
	}
	if dp := m.DataPoints[0]; !dp.IsInt || dp.IntValue != 3 || dp.Attributes["dst"] != "10.0.0.1" || dp.Attributes["port"] != int64(80) {
		t.Errorf("counter point = %+v", dp)
	}
	if m.Resource["service.name"] != "lattrace-test" {
		t.Errorf("metric resource = %v", m.Resource)
	}
	h := c.WaitForMetric(t, "lattrace.tcp.rtt", wait)
	if h.Type != otelcol.Histogram || len(h.DataPoints) != 1 {
		t.Fatalf("histogram = %+v", h)
	}
	hp := h.DataPoints[0]
	if hp.Count != 3 || hp.Sum != 55.5 || hp.Attributes["dst"] != "10.0.0.1" {
		t.Errorf("histogram point = %+v", hp)
	}
	if want := []uint64{1, 1, 1, 0}; len(hp.BucketCounts) != 4 || hp.BucketCounts[0] != want[0] || hp.BucketCounts[1] != want[1] || hp.BucketCounts[2] != want[2] || hp.BucketCounts[3] != want[3] {
		t.Errorf("bucket counts = %v, want %v (bounds %v)", hp.BucketCounts, want, hp.ExplicitBounds)
	}
	if hp.Min == nil || *hp.Min != 0.5 || hp.Max == nil || *hp.Max != 50 {
		t.Errorf("min/max = %v/%v", hp.Min, hp.Max)
	}
}

// TestRestart: Stop closes the ports; a span ended while the collector is down is retried by the
// SDK exporter and arrives once Restart brings the collector back on the same port; what was
// received before the restart is still returned.
func TestRestart(t *testing.T) {
	c := otelcol.Start(t)
	tracer := newTracerProvider(t, c).Tracer("restart-test")
	_, s := tracer.Start(context.Background(), "before")
	s.End()
	c.WaitForSpan(t, "before", wait)

	endpoint := c.GRPCEndpoint()
	c.Stop()
	if c.Running() {
		t.Fatal("running after Stop")
	}
	if conn, err := net.DialTimeout("tcp", endpoint, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still accepts connections after Stop", endpoint)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		_, s := tracer.Start(context.Background(), "during-outage")
		s.End() // WithSyncer: blocks in the exporter's retry loop until the collector is back
	}()
	time.Sleep(time.Second)
	c.Restart()
	if c.GRPCEndpoint() != endpoint || !c.Running() {
		t.Fatalf("after Restart: endpoint %s (was %s), running %v", c.GRPCEndpoint(), endpoint, c.Running())
	}
	c.WaitForSpan(t, "during-outage", wait)
	<-done

	// Kill (no graceful shutdown) and Restart also work.
	c.Kill()
	c.Restart()
	_, s = tracer.Start(context.Background(), "after-kill")
	s.End()
	c.WaitForSpan(t, "after-kill", wait)

	names := map[string]int{}
	for _, s := range c.Spans() {
		names[s.Name]++
	}
	if names["before"] != 1 || names["during-outage"] != 1 || names["after-kill"] != 1 {
		t.Errorf("spans by name = %v", names)
	}
}

// TestHTTPReceiver posts OTLP/JSON to the HTTP receiver, with array, map, bytes and int attributes.
func TestHTTPReceiver(t *testing.T) {
	c := otelcol.Start(t)
	body := `{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"curl"}}]},
	 "scopeSpans":[{"scope":{"name":"manual"},"spans":[{"traceId":"5b8efff798038103d269b633813fc60c",
	 "spanId":"eee19b7ec3c1b174","parentSpanId":"eee19b7ec3c1b173","name":"http-span","kind":2,
	 "startTimeUnixNano":"1544712660000000000","endTimeUnixNano":"1544712661000000000",
	 "attributes":[{"key":"i","value":{"intValue":"42"}},{"key":"b","value":{"bytesValue":"aGk="}},
	 {"key":"arr","value":{"arrayValue":{"values":[{"intValue":"1"},{"stringValue":"x"}]}}},
	 {"key":"kv","value":{"kvlistValue":{"values":[{"key":"k","value":{"boolValue":false}}]}}}]}]}]}]}`
	resp, err := http.Post("http://"+c.HTTPEndpoint()+"/v1/traces", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /v1/traces: %s", resp.Status)
	}
	s := c.WaitForSpan(t, "http-span", wait)
	if s.TraceID != "5b8efff798038103d269b633813fc60c" || s.SpanID != "eee19b7ec3c1b174" || s.ParentSpanID != "eee19b7ec3c1b173" ||
		s.Kind != 2 || s.StartUnixNano != 1544712660000000000 || s.EndUnixNano != 1544712661000000000 || s.Resource["service.name"] != "curl" {
		t.Errorf("span = %+v", s)
	}
	if s.Attributes["i"] != int64(42) || !bytesEq(s.Attributes["b"], "hi") {
		t.Errorf("attributes = %#v", s.Attributes)
	}
	if arr, _ := s.Attributes["arr"].([]any); len(arr) != 2 || arr[0] != int64(1) || arr[1] != "x" {
		t.Errorf("arr = %#v", s.Attributes["arr"])
	}
	if kv, _ := s.Attributes["kv"].(map[string]any); kv["k"] != false {
		t.Errorf("kv = %#v", s.Attributes["kv"])
	}
}

func bytesEq(v any, want string) bool {
	b, ok := v.([]byte)
	return ok && string(b) == want
}
