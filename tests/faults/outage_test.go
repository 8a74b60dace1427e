package faults

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/backendfault"
	"github.com/lattrace/lattrace/tests/bench"
	"github.com/lattrace/lattrace/tests/otelcol"
)

// slowThreshold is the daemon's --span-slow-threshold in the outage tests;
// the slow load's server thinks longer than that before each answer.
const (
	slowThreshold = 20 * time.Millisecond
	slowThink     = 30 * time.Millisecond
)

// TestBackendOutage: the tracing backend fails for a while under a load of
// 5,000 exchanges a second (and a few slow ones), then comes back. Spans
// and metrics resume by themselves; every exchange the daemon traced is
// exported or counted as not exported on /metrics, by reason; the
// Collector's own count of what it received is the truth; and when the
// queue was full, the slow exchanges were kept and the rate sample's made
// room. The backend fails each way it does: down (connections refused),
// a black hole (accepts, never answers), and answering errors (gRPC
// UNAVAILABLE, HTTP 429 and 503).
func TestBackendOutage(t *testing.T) {
	for _, f := range []struct {
		mode     backendfault.Mode
		protocol string
		last     time.Duration
	}{
		{backendfault.Down, otlp.ProtocolGRPC, length(60*time.Second, 10*time.Minute)},
		{backendfault.BlackHole, otlp.ProtocolGRPC, length(20*time.Second, 3*time.Minute)},
		{backendfault.Unavailable, otlp.ProtocolGRPC, length(15*time.Second, 3*time.Minute)},
		{backendfault.TooManyRequests, otlp.ProtocolHTTP, length(15*time.Second, 3*time.Minute)},
		{backendfault.ServiceUnavailable, otlp.ProtocolHTTP, length(15*time.Second, 3*time.Minute)},
	} {
		t.Run(strings.ReplaceAll(f.mode.String(), " ", "_"), func(t *testing.T) { outage(t, f.mode, f.protocol, f.last) })
	}
}

func outage(t *testing.T, mode backendfault.Mode, protocol string, last time.Duration) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	col := otelcol.Start(t)
	target := col.GRPCEndpoint()
	if protocol == otlp.ProtocolHTTP {
		target = col.HTTPEndpoint()
	}
	backend, err := backendfault.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	cg, removeCg, err := bench.Cgroup(fmt.Sprintf("lattrace-faults-outage-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	defer removeCg()
	dm, err := bench.StartDaemon(bench.DaemonConfig{Bin: lattrace, Dir: t.TempDir(), OTLP: backend.Addr(), Cgroup: cg,
		// No request trees: the fault backend forwards the daemon's exports
		// to the Collector, a real middle tier whose trees' spans would
		// come outside this test's count of exchanges and spans.
		Args: []string{"--otlp-protocol", protocol, "--span-rate", "200", "--span-slow-threshold", slowThreshold.String(), "--log-level", "info",
			"--request-trees=false"}})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			dm.Stop()
		}
	}()

	// Before and after the fault the backend relays to the Collector.
	const before, after = 5 * time.Second, 10 * time.Second
	whole := before + last + after
	fast, err := bench.StartLoad(self, bench.LoadConfig{Mode: "rr", Conns: 8, Rate: 2500, Duration: whole, Size: 100}, cg)
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()
	slow, err := bench.StartLoad(self, bench.LoadConfig{Mode: "rr", Conns: 2, Rate: 8, Duration: whole, Size: 100, Think: slowThink}, cg)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	time.Sleep(before)
	if err := backend.Set(mode); err != nil {
		t.Fatal(err)
	}
	faultStart := time.Now()
	time.Sleep(last)
	during, err := dm.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if err := backend.Set(backendfault.Relay); err != nil {
		t.Fatal(err)
	}
	faultEnd := time.Now()

	ctx, cancel := context.WithTimeout(context.Background(), whole+time.Minute)
	defer cancel()
	rf, err := fast.Result(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := slow.Result(ctx)
	if err != nil {
		t.Fatal(err)
	}
	made := 2 * (rf.RoundTrips + rs.RoundTrips) // an exchange at each end
	m := drained(t, dm)
	if err := dm.Stop(); err != nil { // its last metrics go out as it stops
		t.Error(err)
	}
	stopped = true

	unexported := func(reason string) float64 {
		return m[fmt.Sprintf("lattrace_exchanges_unexported_total{reason=%q}", reason)]
	}
	sampled := m["lattrace_spans_sampled_slow_total"] + m["lattrace_spans_sampled_diagnosed_total"] + m["lattrace_spans_sampled_rate_total"]
	seen := sampled + unexported("not_sampled") + unexported("slow_budget")
	exported := m["lattrace_exchanges_exported_total"]
	lost := unexported("no_timeline") + unexported("queue_full") + unexported("rejected") + unexported("shutdown")
	t.Logf("%v for %v: clients made %d exchanges; the daemon saw %.0f, sampled %.0f, exported %.0f (%.0f spans), not exported: %.0f queue full, %.0f rejected, %.0f no timeline; %.0f failed export attempts; the backend took %d connections in that mode",
		mode, last, made, seen, sampled, exported, m["lattrace_spans_exported_total"], unexported("queue_full"), unexported("rejected"),
		unexported("no_timeline"), m["lattrace_export_errors_total"], backend.Accepted(mode))

	// Every exchange reached the exporter, and every sampled one left it
	// by one counted door.
	if seen != float64(made) {
		t.Errorf("the exporter was given %.0f exchanges, the clients made %d", seen, made)
	}
	if sampled != exported+lost || m["lattrace_export_queue_exchanges"] != 0 {
		t.Errorf("%.0f sampled = %.0f exported + %.0f not exported + %.0f queued does not hold", sampled, exported, lost, m["lattrace_export_queue_exchanges"])
	}
	// What the stop lost is in the daemon's last line only.
	atStop := regexp.MustCompile(`unexported_shutdown=(\d+)`).FindStringSubmatch(dm.Log())
	if unexported("rejected") != 0 || atStop == nil || atStop[1] != "0" {
		t.Errorf("%.0f exchanges rejected, lost at shutdown %v: want none (the backend refused no content, the queue was empty at the stop)\n%s", unexported("rejected"), atStop, dm.Log())
	}
	// The fault was real: exports failed, and the queue overflowed.
	if during[`lattrace_export_errors_total{signal="spans"}`] == 0 {
		t.Errorf("no failed export of spans during %v of %v", last, mode)
	}
	if mode != backendfault.Down && backend.Accepted(mode) == 0 {
		t.Errorf("the exporter never connected to the backend while it was %v", mode)
	}
	if unexported("queue_full") == 0 {
		t.Errorf("the queue never overflowed in %v: the test did not test which exchanges are kept", last)
	}
	// The control of the memory tests: without a memory limit nothing is
	// shed.
	if m["lattrace_memory_shed_step"] != 0 || m["lattrace_flows_shed_total"] != 0 || m["lattrace_history_shed_total"] != 0 || m["lattrace_sockets_unfollowed_total"] != 0 {
		t.Errorf("shedding for memory without a limit: step %.0f, %.0f flows, %.0f history exchanges, %.0f ends not followed",
			m["lattrace_memory_shed_step"], m["lattrace_flows_shed_total"], m["lattrace_history_shed_total"], m["lattrace_sockets_unfollowed_total"])
	}
	// Spans resumed by themselves, after the fault.
	if exported <= during["lattrace_exchanges_exported_total"] {
		t.Errorf("%.0f exchanges exported by the fault's end, %.0f at the end: the export did not resume", during["lattrace_exchanges_exported_total"], exported)
	}

	// The Collector's own count, of distinct spans: a batch it took while
	// the backend's mode changed under the connection was sent again,
	// the daemon having had no answer.
	spans := waitSpans(t, col, int(m["lattrace_spans_exported_total"]))
	seenSpan := map[string]bool{}
	var exchanges, slowSpans, twice int
	// Exchanges of neither priority (not slow, not diagnosed) that began
	// in the fault, past the first attempt's batch (sampled before the
	// queue filled and held by the exporter while it tried).
	var plainInFault int
	settled := uint64(faultStart.Add(15 * time.Second).UnixNano())
	for _, s := range spans {
		if seenSpan[s.TraceID+s.SpanID] {
			twice++
			continue
		}
		seenSpan[s.TraceID+s.SpanID] = true
		if s.Name != otlp.SpanName {
			continue
		}
		exchanges++
		slow := time.Duration(s.EndUnixNano-s.StartUnixNano) >= slowThreshold
		if slow {
			slowSpans++
		}
		sev, _ := s.Attributes["lattrace.diagnosis.severity"].(string)
		diagnosed := sev == string(record.SeverityWarning) || sev == string(record.SeverityCritical)
		if !slow && !diagnosed && s.StartUnixNano > settled && s.StartUnixNano < uint64(faultEnd.UnixNano()) {
			plainInFault++
		}
	}
	if float64(len(seenSpan)) != m["lattrace_spans_exported_total"] || float64(exchanges) != exported {
		t.Errorf("the Collector received %d distinct spans (%d twice) of %d exchanges; the daemon counts %.0f spans of %.0f exchanges exported",
			len(seenSpan), twice, exchanges, m["lattrace_spans_exported_total"], exported)
	}
	// The queue kept the slow exchanges. Where the fault's slow ones fit
	// in the queue (make test), every one sampled reached the Collector,
	// and they are all the slow load made, at least. Where they do not (a
	// soak's minutes), slow ones were dropped, and then none of the rate
	// sample's from the fault may have reached it: they make room first.
	t.Logf("slow exchanges: %d in the Collector, %.0f sampled as slow, %d made by the slow clients; %d exchanges neither slow nor diagnosed from within the fault in the Collector",
		slowSpans, m["lattrace_spans_sampled_slow_total"], 2*rs.RoundTrips, plainInFault)
	if uint64(m["lattrace_spans_sampled_slow_total"]) < 2*rs.RoundTrips {
		t.Errorf("%.0f exchanges sampled as slow, the slow clients made %d", m["lattrace_spans_sampled_slow_total"], 2*rs.RoundTrips)
	}
	switch {
	case soak() && float64(slowSpans) < m["lattrace_spans_sampled_slow_total"]:
		if plainInFault != 0 {
			t.Errorf("%d slow exchanges reached the Collector of %.0f sampled, and %d of the rate sample's from within the fault: those should have made room",
				slowSpans, m["lattrace_spans_sampled_slow_total"], plainInFault)
		}
	case float64(slowSpans) != m["lattrace_spans_sampled_slow_total"]:
		t.Errorf("%d slow exchanges reached the Collector, %.0f were sampled as slow, the slow clients made %d: slow exchanges were dropped for the rate sample's",
			slowSpans, m["lattrace_spans_sampled_slow_total"], 2*rs.RoundTrips)
	}

	// The metrics resumed: the Collector's last cumulative count is every
	// exchange the daemon saw.
	counted := lastSum(waitMetric(t, col, otlp.MetricExchanges, seen))
	if counted != seen {
		t.Errorf("the Collector's last %s sums to %.0f, the daemon saw %.0f exchanges", otlp.MetricExchanges, counted, seen)
	}
}

// drained waits until the daemon has read every record and its export
// queue is empty, and returns its metrics then.
func drained(t *testing.T, dm *bench.Daemon) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		m, err := dm.Settled(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if m["lattrace_export_queue_exchanges"] == 0 {
			return m
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the export queue still holds %.0f exchanges two minutes after the backend came back", m["lattrace_export_queue_exchanges"])
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitSpans waits until the Collector has written n distinct spans (its
// file exporter flushes on its own schedule), at most a minute, and
// returns what it has.
func waitSpans(t *testing.T, col *otelcol.Collector, n int) []otelcol.Span {
	t.Helper()
	var spans []otelcol.Span
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		spans = col.Spans()
		distinct := map[string]bool{}
		for _, s := range spans {
			distinct[s.TraceID+s.SpanID] = true
		}
		if len(distinct) >= n {
			break
		}
	}
	return spans
}

// waitMetric waits until the last points of the Collector's metric name
// sum to want, at most a minute, and returns the metric's points.
func waitMetric(t *testing.T, col *otelcol.Collector, name string, want float64) []otelcol.Metric {
	t.Helper()
	var ms []otelcol.Metric
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		ms = ms[:0]
		for _, m := range col.Metrics() {
			if m.Name == name {
				ms = append(ms, m)
			}
		}
		if lastSum(ms) >= want {
			break
		}
	}
	return ms
}

// lastSum adds up the last point of each series of a cumulative counter.
func lastSum(ms []otelcol.Metric) float64 {
	type point struct {
		at uint64
		v  float64
	}
	last := map[string]point{}
	for _, m := range ms {
		for _, dp := range m.DataPoints {
			k := fmt.Sprint(dp.Attributes)
			if p, ok := last[k]; !ok || dp.TimeUnixNano > p.at {
				last[k] = point{dp.TimeUnixNano, dp.Value}
			}
		}
	}
	var sum float64
	for _, p := range last {
		sum += p.v
	}
	return sum
}
