package otlp_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/otelcol"
)

const wait = 30 * time.Second

const ms = time.Millisecond

// requester builds a requester exchange that ended just now: connect 2 ms,
// send_wait 1 ms, network 20 ms, peer 10 ms, receive 2 ms, local_read 1 ms.
func requester(isnC, isnS, seq uint32) *record.Exchange {
	c := record.Components{
		Handshake: 2 * ms, SendWait: 1 * ms, SendWaitCwnd: 1 * ms,
		Network: 20 * ms, Propagation: 18 * ms, Queueing: 2 * ms,
		Peer: 10 * ms, Receive: 2 * ms, LocalRead: 1 * ms,
	}
	end := record.Now()
	start := end - record.Mono(c.Sum())
	at := func(d time.Duration) record.Mono { return start + record.Mono(d) }
	return &record.Exchange{
		Time:   end,
		Cookie: 42,
		Flow: record.Flow{
			Local:  netip.MustParseAddrPort("10.0.0.1:40000"),
			Remote: netip.MustParseAddrPort("10.0.0.2:8080"),
		},
		Owner:    record.Owner{PID: 1234, TID: 1234, Comm: "curl"},
		Role:     record.Requester,
		ConnRole: record.RoleClient,
		Timeline: record.Timeline{
			Connect: start, Established: at(2 * ms), W0: at(2 * ms), W1: at(2*ms + 100*time.Microsecond),
			X1: at(3 * ms), A1: at(23 * ms), R0: at(33 * ms), R1: at(35 * ms), D1: at(36 * ms),
		},
		Start: start, End: at(c.Sum()), Duration: c.Sum(), Components: c,
		BytesOut: 100, BytesIn: 5000, Retransmits: 1, RTOs: 0, Turns: 2, ExchangeTurns: 2,
		MinRTT: 18 * ms, SRTT: 20 * ms, PathRTT: 20 * ms, PathMinRTT: 18 * ms,
		CwndStart: 10, CwndEnd: 12,
		ISNLocal: isnC, ISNRemote: isnS, OutSeq: seq, InSeq: isnS + 1, First: true,
	}
}

// responder builds the other end of requester(isnC, isnS, seq):
// receive 1 ms, local_read 1 ms, think 7 ms, send_wait 1 ms.
func responder(isnC, isnS, seq uint32) *record.Exchange {
	c := record.Components{Receive: 1 * ms, LocalRead: 1 * ms, Think: 7 * ms, SendWait: 1 * ms, SendWaitOther: 1 * ms}
	end := record.Now()
	start := end - record.Mono(c.Sum())
	at := func(d time.Duration) record.Mono { return start + record.Mono(d) }
	return &record.Exchange{
		Time:   end,
		Cookie: 43,
		Flow: record.Flow{
			Local:  netip.MustParseAddrPort("10.0.0.2:8080"),
			Remote: netip.MustParseAddrPort("10.0.0.1:40000"),
		},
		Owner:    record.Owner{PID: 99, TID: 99, Comm: "nginx"},
		Role:     record.Responder,
		ConnRole: record.RoleServer,
		Timeline: record.Timeline{R0: start, R1: at(1 * ms), D1: at(2 * ms), W0: at(9 * ms), W1: at(9 * ms), X1: at(10 * ms)},
		Start:    start, End: at(c.Sum()), Duration: c.Sum(), Components: c,
		BytesOut: 5000, BytesIn: 100, Turns: 2, ExchangeTurns: 2,
		ISNLocal: isnS, ISNRemote: isnC, OutSeq: isnS + 1, InSeq: seq,
	}
}

func newExporter(t *testing.T, c *otelcol.Collector, cfg otlp.Config) *otlp.Exporter {
	t.Helper()
	cfg.Endpoint = c.GRPCEndpoint()
	cfg.Insecure = true
	cfg.ServiceVersion = "test"
	if cfg.BatchTimeout == 0 {
		cfg.BatchTimeout = 100 * ms
	}
	if cfg.MetricInterval == 0 {
		cfg.MetricInterval = 500 * ms
	}
	x, err := otlp.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = x.Shutdown(ctx)
	})
	return x
}

func isExchange(s otelcol.Span) bool { return s.Name == otlp.SpanName }

func num(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case float64:
		return int64(v)
	case int:
		return int64(v)
	}
	return -1
}

func TestSpansBothEnds(t *testing.T) {
	c := otelcol.Start(t)
	x := newExporter(t, c, otlp.Config{})
	req, resp := requester(1000, 2000000, 1001), responder(1000, 2000000, 1001)
	req.Owner.K8s = &record.K8s{Namespace: "shop", Pod: "front-1", Container: "web", WorkloadKind: "Deployment", Workload: "front"}
	req.Peer = &record.K8s{Namespace: "shop", Pod: "cart-2", WorkloadKind: "StatefulSet", Workload: "cart", Service: "cart"}
	req.Diagnoses = []record.Diagnosis{{Name: "loss", Severity: record.SeverityWarning, Share: 0.25,
		Summary: "25 % of the latency is recovering lost segments", Fix: "look for drops"}}
	x.Exchange(req)
	x.Exchange(resp)
	x.Flush()
	now := time.Now()

	all := c.WaitForSpans(t, 2+6+4, wait, nil)
	byID := map[string]otelcol.Span{}
	var rq, rs otelcol.Span
	for _, s := range all {
		byID[s.SpanID] = s
		if isExchange(s) {
			switch s.Attributes["lattrace.role"] {
			case "requester":
				rq = s
			case "responder":
				rs = s
			}
		}
	}
	if rq.Name == "" || rs.Name == "" {
		t.Fatalf("exchange spans missing: %+v", all)
	}
	// Both ends in one trace; the responder's parent is the requester.
	tid, sid, ok := otlp.TraceIDs(req)
	if !ok || rq.TraceID != tid.String() || rq.SpanID != sid.String() || rq.ParentSpanID != "" {
		t.Errorf("requester span ids %s/%s parent %q, want %s/%s", rq.TraceID, rq.SpanID, rq.ParentSpanID, tid, sid)
	}
	if rs.TraceID != rq.TraceID || rs.ParentSpanID != rq.SpanID {
		t.Errorf("responder trace %s parent %s, want %s / %s", rs.TraceID, rs.ParentSpanID, rq.TraceID, rq.SpanID)
	}
	// Kubernetes names of both ends, as the semantic conventions spell them.
	for k, v := range map[string]string{
		"k8s.namespace.name": "shop", "k8s.pod.name": "front-1", "k8s.container.name": "web", "k8s.deployment.name": "front",
		"lattrace.peer.k8s.pod.name": "cart-2", "lattrace.peer.k8s.statefulset.name": "cart", "lattrace.peer.k8s.service.name": "cart", "peer.service": "cart",
	} {
		if rq.Attributes[k] != v {
			t.Errorf("%s = %v, want %q", k, rq.Attributes[k], v)
		}
	}
	if _, ok := rs.Attributes["k8s.pod.name"]; ok {
		t.Errorf("k8s names on a span whose ends have none: %v", rs.Attributes)
	}
	// The diagnosis: a list attribute to search by, an event with its words.
	if d, _ := rq.Attributes["lattrace.diagnoses"].([]any); len(d) != 1 || d[0] != "loss" || rq.Attributes["lattrace.diagnosis.severity"] != "warning" {
		t.Errorf("lattrace.diagnoses = %v, severity %v", rq.Attributes["lattrace.diagnoses"], rq.Attributes["lattrace.diagnosis.severity"])
	}
	if len(rq.Events) != 1 || rq.Events[0].Name != "lattrace.diagnosis" || rq.Events[0].Attributes["lattrace.diagnosis.name"] != "loss" ||
		rq.Events[0].Attributes["lattrace.diagnosis.fix"] != "look for drops" || rq.Events[0].Attributes["lattrace.diagnosis.share"] != 0.25 {
		t.Errorf("diagnosis events %+v", rq.Events)
	}
	if _, ok := rs.Attributes["lattrace.diagnoses"]; ok || len(rs.Events) != 0 {
		t.Errorf("responder without diagnoses has %v / %v", rs.Attributes["lattrace.diagnoses"], rs.Events)
	}
	dm := c.WaitForMetric(t, otlp.MetricDiagnoses, wait)
	if len(dm.DataPoints) != 1 || dm.DataPoints[0].Attributes["lattrace.diagnosis"] != "loss" || dm.DataPoints[0].Attributes["process.executable.name"] != "curl" {
		t.Errorf("%s points %+v", otlp.MetricDiagnoses, dm.DataPoints)
	}
	if rq.Kind != 3 || rs.Kind != 2 {
		t.Errorf("kinds: requester %d responder %d, want 3 (client) and 2 (server)", rq.Kind, rs.Kind)
	}
	// Wall clock and duration.
	start := time.Unix(0, int64(rq.StartUnixNano))
	if d := now.Sub(start); d < 0 || d > time.Second {
		t.Errorf("requester span starts %v before now, want within 1 s", d)
	}
	if got := time.Duration(rq.EndUnixNano - rq.StartUnixNano); got != req.Duration {
		t.Errorf("requester span lasts %v, want %v", got, req.Duration)
	}
	// Attributes.
	want := map[string]any{
		"network.transport": "tcp", "network.type": "ipv4",
		"network.peer.address": "10.0.0.2", "network.peer.port": int64(8080),
		"network.local.address": "10.0.0.1", "network.local.port": int64(40000),
		"server.address": "10.0.0.2", "server.port": int64(8080),
		"client.address": "10.0.0.1", "client.port": int64(40000),
		"process.pid": int64(1234), "process.executable.name": "curl",
		"lattrace.component.network_ns": int64(20 * ms), "lattrace.component.peer_ns": int64(10 * ms),
		"lattrace.turns": int64(2), "lattrace.retransmits": int64(1), "lattrace.min_rtt_ns": int64(18 * ms),
		"lattrace.cwnd_start": int64(10), "lattrace.cwnd_end": int64(12), "lattrace.bytes_in": int64(5000),
		"lattrace.cwnd_restart": false,
	}
	for k, v := range want {
		got := rq.Attributes[k]
		if _, isNum := v.(int64); isNum {
			got = num(got)
		}
		if got != v {
			t.Errorf("requester %s = %v (%T), want %v", k, rq.Attributes[k], rq.Attributes[k], v)
		}
	}
	if rs.Attributes["server.address"] != "10.0.0.2" || num(rs.Attributes["server.port"]) != 8080 ||
		rs.Attributes["client.address"] != "10.0.0.1" || rs.Attributes["process.executable.name"] != "nginx" {
		t.Errorf("responder attributes %v", rs.Attributes)
	}
	if rq.Resource["service.name"] != "lattrace" || rq.Resource["service.version"] != "test" || rq.Resource["host.name"] == nil {
		t.Errorf("resource %v", rq.Resource)
	}

	// Children: stages in order, consecutive, durations = components.
	check := func(parent otelcol.Span, want []string, durs []time.Duration) {
		t.Helper()
		var kids []otelcol.Span
		for _, s := range all {
			if s.ParentSpanID == parent.SpanID && s.TraceID == parent.TraceID && !isExchange(s) {
				kids = append(kids, s)
			}
		}
		if len(kids) != len(want) {
			t.Fatalf("%d children of %s, want %d: %+v", len(kids), parent.Attributes["lattrace.role"], len(want), kids)
		}
		// Sort by start time.
		for i := range kids {
			for j := i + 1; j < len(kids); j++ {
				if kids[j].StartUnixNano < kids[i].StartUnixNano {
					kids[i], kids[j] = kids[j], kids[i]
				}
			}
		}
		at := parent.StartUnixNano
		for i, k := range kids {
			if k.Name != want[i] || time.Duration(k.EndUnixNano-k.StartUnixNano) != durs[i] || k.StartUnixNano != at {
				t.Errorf("child %d: %s %v at +%v, want %s %v at +%v", i, k.Name,
					time.Duration(k.EndUnixNano-k.StartUnixNano), time.Duration(k.StartUnixNano-parent.StartUnixNano),
					want[i], durs[i], time.Duration(at-parent.StartUnixNano))
			}
			at = k.EndUnixNano
		}
		if at != parent.EndUnixNano {
			t.Errorf("children end at %d, parent at %d", at, parent.EndUnixNano)
		}
	}
	check(rq, []string{"handshake", "send_wait", "network", "peer", "receive", "local_read"},
		[]time.Duration{2 * ms, 1 * ms, 20 * ms, 10 * ms, 2 * ms, 1 * ms})
	check(rs, []string{"receive", "local_read", "think", "send_wait"},
		[]time.Duration{1 * ms, 1 * ms, 7 * ms, 1 * ms})

	if err := x.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := x.Stats()
	if st.Exchanges != 2 || st.SampledSlow != 2 || st.SpansExported != 12 || st.DroppedQueue() != 0 || st.ExportErrors != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestNoISNsRandomIDs(t *testing.T) {
	c := otelcol.Start(t)
	// The endpoint from the environment, as the SDK reads it.
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+c.GRPCEndpoint())
	t.Setenv("OTEL_SERVICE_NAME", "lattrace-env")
	x, err := otlp.New(context.Background(), otlp.Config{DisableMetrics: true, BatchTimeout: 100 * ms})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Shutdown(context.Background())
	a, b := requester(0, 0, 0), requester(0, 0, 0)
	x.Exchange(a)
	x.Exchange(b)
	spans := c.WaitForSpans(t, 2, wait, isExchange)
	if spans[0].Resource["service.name"] != "lattrace-env" {
		t.Errorf("OTEL_SERVICE_NAME ignored: resource %v", spans[0].Resource)
	}
	if spans[0].TraceID == spans[1].TraceID {
		t.Errorf("exchanges without ISNs share trace %s", spans[0].TraceID)
	}
}

// An exchange with a warning or critical diagnosis is exported however
// short, as a gateway's tail sampling keeps its trace; an info one is not
// singled out.
func TestSamplingKeepsDiagnosed(t *testing.T) {
	c := otelcol.Start(t)
	x := newExporter(t, c, otlp.Config{SlowThreshold: 30 * ms, RatePerSecond: 0.001, Burst: 1})
	severity := map[int]record.Severity{3: record.SeverityWarning, 5: record.SeverityInfo, 7: record.SeverityCritical}
	const fast = 10
	want := map[string]bool{}
	for i := range fast {
		e := responder(5, 6, uint32(100+i)) // 10 ms
		if sev, ok := severity[i]; ok {
			e.Diagnoses = []record.Diagnosis{{Name: "test", Severity: sev}}
		}
		if i == 0 || i == 3 || i == 7 { // the rate sample's one token, then the flagged ones
			tid, _, ok := otlp.TraceIDs(e)
			if !ok {
				t.Fatal("no trace id")
			}
			want[tid.String()] = true
		}
		x.Exchange(e)
	}
	spans := flushedSpans(t, c, x, len(want))
	got := map[string]bool{}
	for _, sp := range spans {
		got[sp.TraceID] = true
	}
	if len(spans) != len(want) || len(got) != len(want) {
		t.Errorf("%d exchange spans in %d traces exported, want %d", len(spans), len(got), len(want))
	}
	for tid := range want {
		if !got[tid] {
			t.Errorf("trace %s not exported", tid)
		}
	}
	st := x.Stats()
	if st.Exchanges != fast || st.SampledDiagnosed != 2 || st.SampledRate != 1 || st.SampledSlow != 0 || st.DroppedSampling != fast-3 {
		t.Errorf("stats %+v", st)
	}
}

// Diagnosed exchanges share the slow budget: a storm of them is bounded
// and counted like one of slow exchanges.
func TestSamplingDiagnosedWithinBudget(t *testing.T) {
	c := otelcol.Start(t)
	x := newExporter(t, c, otlp.Config{SlowThreshold: 30 * ms, SlowRatePerSecond: 2})
	const n = 10
	for i := range n {
		e := responder(5, 6, uint32(200+i))
		e.Diagnoses = []record.Diagnosis{{Name: "test", Severity: record.SeverityWarning}}
		x.Exchange(e)
	}
	flushedSpans(t, c, x, 2)
	if st := x.Stats(); st.SampledDiagnosed != 2 || st.SlowOverBudget != n-2 {
		t.Errorf("stats %+v", st)
	}
}

func TestSampling(t *testing.T) {
	c := otelcol.Start(t)
	x := newExporter(t, c, otlp.Config{SlowThreshold: 30 * ms, RatePerSecond: 0.001, Burst: 2})
	slow := requester(1, 2, 3) // 36 ms
	x.Exchange(slow)
	const fast = 20
	for i := range fast {
		e := responder(5, 6, uint32(7+i)) // 10 ms
		x.Exchange(e)
	}
	spans := flushedSpans(t, c, x, 3)
	if len(spans) != 3 {
		t.Errorf("%d exchange spans exported, want 3 (1 slow + burst 2)", len(spans))
	}
	st := x.Stats()
	if st.Exchanges != 1+fast || st.SampledSlow != 1 || st.SampledRate != 2 || st.DroppedSampling != fast-2 {
		t.Errorf("stats %+v", st)
	}

	// Metrics see every exchange, sampled or not.
	var count uint64
	deadline := time.Now().Add(wait)
	for count != 1+fast && time.Now().Before(deadline) {
		time.Sleep(200 * ms)
		count = 0
		var last *otelcol.Metric
		for _, m := range c.Metrics() {
			if m.Name == otlp.MetricDuration {
				m := m
				last = &m
			}
		}
		if last != nil {
			for _, dp := range last.DataPoints {
				count += dp.Count
			}
		}
	}
	if count != 1+fast {
		t.Fatalf("%s count = %d, want %d", otlp.MetricDuration, count, 1+fast)
	}
	seen := map[string]bool{}
	for _, m := range c.Metrics() {
		seen[m.Name] = true
		if m.Name == otlp.MetricComponentDuration {
			for _, dp := range m.DataPoints {
				if dp.Attributes["lattrace.component"] == nil || dp.Attributes["process.executable.name"] == nil {
					t.Errorf("component point attributes %v", dp.Attributes)
				}
			}
		}
	}
	for _, n := range []string{otlp.MetricComponentDuration, otlp.MetricExchanges, otlp.MetricBytes, otlp.MetricRetransmits, otlp.MetricTurns} {
		if !seen[n] {
			t.Errorf("metric %s not received", n)
		}
	}
}

func TestPeerPairCap(t *testing.T) {
	c := otelcol.Start(t)
	x := newExporter(t, c, otlp.Config{MaxPeerPairs: 3, DisableTraces: true})
	for i := range 10 {
		e := requester(1, 2, 3)
		e.Flow.Remote = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 1, byte(i)}), 80)
		x.Exchange(e)
	}
	if err := x.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := x.Stats()
	if st.PeerPairs != 3 || st.PeerOverflow != 7 {
		t.Errorf("stats %+v", st)
	}
	m := c.WaitForMetric(t, otlp.MetricDuration, wait)
	addrs := map[any]uint64{}
	for _, dp := range m.DataPoints {
		addrs[dp.Attributes["network.peer.address"]] += dp.Count
	}
	if len(addrs) != 4 || addrs[otlp.Other] != 7 {
		t.Errorf("duration points by peer address %v, want 3 + other=7", addrs)
	}
}

func TestCollectorRestart(t *testing.T) {
	c := otelcol.Start(t)
	x := newExporter(t, c, otlp.Config{DisableMetrics: true, MaxQueueSize: 100})
	x.Exchange(requester(0, 0, 0))
	c.WaitForSpans(t, 1, wait, isExchange)

	c.Kill()
	for range 5 {
		x.Exchange(requester(0, 0, 0)) // 7 spans each
	}
	// Beyond the bound while the collector is down: at most one batch (<=
	// the queue) is in the exporter's retry loop and the queue holds 100
	// spans, so 40 more exchanges (280 spans) cannot all fit.
	for range 40 {
		x.Exchange(requester(0, 0, 0))
	}
	time.Sleep(time.Second)
	c.Restart()
	spans := c.WaitForSpans(t, 1+5, wait, isExchange)
	spans = flushedSpans(t, c, x, 1)
	st := x.Stats()
	t.Logf("after restart: %d exchange spans, stats %+v", len(spans), st)
	if st.DroppedQueue() == 0 {
		t.Errorf("no exchange dropped for a full queue: %+v", st)
	}
	if got := uint64(len(spans)); got != 1+45-st.DroppedQueue() {
		t.Errorf("%d exchange spans arrived, want %d (46 - %d dropped)", got, 1+45-st.DroppedQueue(), st.DroppedQueue())
	}
}

// A full queue drops the oldest exchanges, each with all its spans: the
// newest are exported whole.
func TestFullQueueDropsOldest(t *testing.T) {
	c := otelcol.Start(t)
	// Ten exchanges of seven spans fit; nothing leaves before the flush.
	x := newExporter(t, c, otlp.Config{DisableMetrics: true, MaxQueueSize: 70, BatchTimeout: time.Hour})
	const n, fit = 25, 10
	newest := map[string]bool{}
	for i := range n {
		e := requester(1, 2, uint32(1000+i))
		if i >= n-fit {
			tid, _, _ := otlp.TraceIDs(e)
			newest[tid.String()] = true
		}
		x.Exchange(e)
	}
	if st := x.Stats(); st.DroppedQueue() != n-fit || st.QueueDepth != 7*fit {
		t.Errorf("before the flush: stats %+v, want %d dropped and %d spans queued", st, n-fit, 7*fit)
	}
	flushedSpans(t, c, x, fit)
	perTrace := map[string]int{}
	for _, sp := range c.Spans() {
		perTrace[sp.TraceID]++
	}
	if len(perTrace) != fit {
		t.Errorf("%d traces exported, want the newest %d", len(perTrace), fit)
	}
	for tid, k := range perTrace {
		if !newest[tid] {
			t.Errorf("trace %s exported: not among the newest %d", tid, fit)
		}
		if k != 7 {
			t.Errorf("trace %s has %d spans, want its 7", tid, k)
		}
	}
	if st := x.Stats(); st.SpansExported != 7*fit || st.QueueDepth != 0 {
		t.Errorf("after the flush: stats %+v", st)
	}
}

// A full queue keeps the important exchanges first, as tail sampling
// would: the rate sample's make room for slow ones, and those for the
// diagnosed ones; a rate-sampled exchange finding only more important
// ones waiting is itself dropped.
func TestFullQueueKeepsImportant(t *testing.T) {
	c := otelcol.Start(t)
	// Ten exchanges of seven spans fit; nothing leaves before the flush.
	x := newExporter(t, c, otlp.Config{DisableMetrics: true, MaxQueueSize: 70, BatchTimeout: time.Hour,
		SlowThreshold: 30 * ms, RatePerSecond: 1e6, Burst: 1000})
	kept := map[string]string{}
	seq := uint32(1000)
	add := func(kind string, n int) {
		for range n {
			e := requester(1, 2, seq)
			seq++
			switch kind {
			case "rate":
				e.Duration = ms // below the slow threshold
			case "diagnosed":
				e.Duration = ms
				e.Diagnoses = []record.Diagnosis{{Name: "bufferbloat", Severity: record.SeverityWarning}}
			}
			if kind != "rate" {
				tid, _, _ := otlp.TraceIDs(e)
				kept[tid.String()] = kind
			}
			x.Exchange(e)
		}
	}
	add("rate", 8)
	add("slow", 5)
	add("rate", 4)
	add("diagnosed", 5)
	add("rate", 6)
	st := x.Stats()
	if st.SampledRate != 18 || st.SampledSlow != 5 || st.SampledDiagnosed != 5 || st.DroppedQueue() != 18 || st.QueueExchanges != 10 {
		t.Errorf("before the flush: %+v, want the 18 rate-sampled exchanges dropped and the 10 others waiting", st)
	}
	flushedSpans(t, c, x, 10)
	got := map[string]bool{}
	for _, sp := range c.Spans() {
		got[sp.TraceID] = true
	}
	for tid, kind := range kept {
		if !got[tid] {
			t.Errorf("a %s exchange (trace %s) was dropped from the full queue", kind, tid)
		}
	}
	if len(got) != len(kept) {
		t.Errorf("%d traces exported, want the %d slow and diagnosed ones", len(got), len(kept))
	}
}

// A batch the backend does not take waits in the queue: the failed
// attempt is counted, nothing is lost, and what still waits when the
// exporter shuts down is counted as lost at shutdown.
func TestExportErrorsCounted(t *testing.T) {
	c := otelcol.Start(t)
	c.Kill()
	x := newExporter(t, c, otlp.Config{DisableMetrics: true, ExportTimeout: 300 * ms})
	x.Exchange(requester(1, 2, 3))
	_ = x.ForceFlush(context.Background())
	st := x.Stats()
	if st.ExportErrors == 0 || st.SpansExported != 0 || st.QueueDepth != 7 || st.QueueExchanges != 1 || st.SpansDropped != 0 {
		t.Errorf("stats %+v, want a failed attempt and the exchange's 7 spans waiting", st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = x.Shutdown(ctx)
	st = x.Stats()
	if st.UnexportedFor("shutdown") != 1 || st.SpansDropped != 7 || st.QueueDepth != 0 {
		t.Errorf("after shutdown: stats %+v, want the exchange counted as lost at shutdown", st)
	}
}

// OTLP over HTTP reaches the collector's HTTP receiver, spans and metrics.
func TestHTTPProtocol(t *testing.T) {
	c := otelcol.Start(t)
	x, err := otlp.New(context.Background(), otlp.Config{Protocol: otlp.ProtocolHTTP, Endpoint: c.HTTPEndpoint(), Insecure: true,
		BatchTimeout: 100 * ms, MetricInterval: 200 * ms})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Shutdown(context.Background())
	x.Exchange(requester(11, 12, 13))
	c.WaitForSpans(t, 1, wait, isExchange)
	c.WaitForMetric(t, otlp.MetricDuration, wait)
	if _, err := otlp.New(context.Background(), otlp.Config{Protocol: "carrier-pigeon"}); err == nil {
		t.Error("an unknown protocol was accepted")
	}
}

// Sync is what lets a pinned daemon release a drain's records only once
// their spans are out: it answers when the collector has them, never holds
// its caller (the ring buffer's reader) while the collector is slow or
// down, does not wait for a failing backend again, and works again once an
// export gets through.
func TestSync(t *testing.T) {
	c := otelcol.Start(t)
	// A batch timeout far beyond the test: only Sync sends.
	x := newExporter(t, c, otlp.Config{DisableMetrics: true, BatchTimeout: time.Hour, SyncTimeout: 500 * ms, ExportTimeout: 200 * ms})
	for range 3 {
		x.Exchange(requester(0, 0, 0))
	}
	if err := syncWait(t, x); err != nil {
		t.Fatalf("Sync with the collector up: %v", err)
	}
	if st := x.Stats(); st.SpansExported != st.SpansQueued || st.SpansQueued != 21 {
		t.Errorf("after Sync: %+v, want all 21 spans exported", st)
	}
	c.WaitForSpans(t, 3, wait, isExchange)

	c.Kill()
	x.Exchange(requester(0, 0, 0))
	// Three syncs asked while the backend does not answer: each returns at
	// once, and all are answered together, after SyncTimeout.
	start := time.Now()
	answers := make(chan error, 3)
	for range 3 {
		x.Sync(func(err error) { answers <- err })
	}
	if d := time.Since(start); d > 100*ms {
		t.Errorf("Sync held its caller %v with the collector down", d)
	}
	for range 3 {
		if err := <-answers; err == nil {
			t.Fatal("Sync said the spans were out with the collector down")
		}
	}
	t.Logf("syncs with the collector down answered after %v", time.Since(start))
	x.Exchange(requester(0, 0, 0))
	start = time.Now()
	err := syncWait(t, x)
	if err == nil || !strings.Contains(err.Error(), "last export failed") {
		t.Fatalf("Sync while the backend is failing: %v", err)
	}
	t.Logf("Sync while the backend is failing answered in %v", time.Since(start))

	c.Restart()
	// Once an export gets through, Sync waits for the backend again. The
	// spans queued during the outage wait in the queue and go out first.
	exported := x.Stats().SpansExported
	for deadline := time.Now().Add(wait); x.Stats().SpansExported == exported; {
		if time.Now().After(deadline) {
			t.Fatalf("nothing exported after the collector came back: %+v", x.Stats())
		}
		x.Exchange(requester(0, 0, 0))
		ctx, cancel := context.WithTimeout(context.Background(), 500*ms)
		_ = x.ForceFlush(ctx)
		cancel()
	}
	x.Exchange(requester(0, 0, 0))
	if err := syncWait(t, x); err != nil {
		t.Fatalf("Sync after the collector came back: %v (stats %+v)", err, x.Stats())
	}
	// Nothing lost: every span queued during the outage was exported.
	if st := x.Stats(); st.SpansQueued != st.SpansExported || st.SpansDropped != 0 || st.QueueDepth != 0 {
		t.Errorf("after the outage: %+v, want every span queued exported and an empty queue", st)
	}
	// A sync asked after shutdown is answered, with an error.
	if err := x.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := syncWait(t, x); err == nil {
		t.Error("Sync after shutdown said the spans were out")
	}
}

// syncWait asks x to sync and waits for the answer.
func syncWait(t *testing.T, x *otlp.Exporter) error {
	t.Helper()
	answer := make(chan error, 1)
	x.Sync(func(err error) { answer <- err })
	select {
	case err := <-answer:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Sync never answered")
		return nil
	}
}

// TestSlowSpanBudget: slow exchanges are exported up to the budget, the
// rest counted; a storm of them must not become a storm of spans.
func TestSlowSpanBudget(t *testing.T) {
	c := otelcol.Start(t)
	x := newExporter(t, c, otlp.Config{SlowThreshold: 0, SlowRatePerSecond: 3})
	const n = 10
	for i := range n {
		x.Exchange(responder(5, 6, uint32(7+i)))
	}
	spans := flushedSpans(t, c, x, 3)
	if len(spans) != 3 {
		t.Errorf("%d exchange spans exported, want the budget's 3", len(spans))
	}
	st := x.Stats()
	if st.Exchanges != n || st.SampledSlow != 3 || st.SlowOverBudget != n-3 || st.SampledRate != 0 {
		t.Errorf("stats %+v: want 3 slow spans and %d over budget", st, n-3)
	}
}

// flushedSpans flushes x and returns the exchange spans the collector holds
// once it has at least n, or whatever it has after the wait.
func flushedSpans(t *testing.T, c *otelcol.Collector, x *otlp.Exporter, n int) []otelcol.Span {
	t.Helper()
	if err := x.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * ms) // the file exporter flushes every 100 ms
	return c.WaitForSpans(t, n, wait, isExchange)
}
