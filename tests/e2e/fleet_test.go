package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/tests/gateway"
	"github.com/lattrace/lattrace/tests/jaeger"
	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/prometheus"
	"github.com/lattrace/lattrace/tests/testserver"
	"github.com/lattrace/lattrace/tests/workload"
)

// The fleet test's workload and gateway settings.
const (
	fleetRequests     = 800
	fleetSlowEvery    = 20 // 5 % of the requests...
	fleetSlowThink    = 300 * time.Millisecond
	fleetKeepPercent  = 10
	fleetDecisionWait = 3 * time.Second
	fleetPort         = 7400
)

// TestFleetGateway runs deploy/helm/lattrace-gateway's configs with real
// processes on loopback: two lattrace daemons as two nodes (each traces
// its own cgroup, with its own NODE_NAME), a client on node A and a server
// on node B through the lab's path, each daemon's OTLP into its own
// load-balancing Collector, both routing to two tail-sampling Collectors,
// which send to Jaeger; metrics go to Prometheus. One sampler is killed
// and restarted in the middle. Through Jaeger's query API: every slow
// exchange (the server thinks 300 ms on every 20th request) is kept with
// both halves, node A's requester span and node B's responder span under
// it, although they entered through different load balancers; the fast
// ones only at the configured 10 %. The samplers together saw each trace
// once, which they would not if its halves were split between them.
// Prometheus answers per node. The daemons dropped nothing.
func TestFleetGateway(t *testing.T) {
	jg := jaeger.Start(t)
	prom := prometheus.Start(t)

	// Each Collector gets its own ports: OTLP gRPC, OTLP HTTP, health,
	// its own metrics.
	ports := func(p []int) []string {
		return []string{fmt.Sprintf("ports.otlpGrpc=%d", p[0]), fmt.Sprintf("ports.otlpHttp=%d", p[1]),
			fmt.Sprintf("ports.health=%d", p[2]), fmt.Sprintf("ports.metrics=%d", p[3])}
	}
	type collector struct {
		*testserver.Process
		otlp    int
		metrics string // the Collector's own /metrics, "127.0.0.1:port"
	}
	var samplers, lbs [2]collector
	var hostnames []string
	for i := range samplers {
		p := testserver.FreePorts(t, 4)
		cfg := gateway.Configs(t, append(ports(p), "traces.endpoint="+jg.OTLPEndpoint(),
			"sampler.decisionWait="+fleetDecisionWait.String(), fmt.Sprintf("sampler.keepPercent=%d", fleetKeepPercent))...)
		samplers[i] = collector{gateway.Start(t, fmt.Sprintf("sampler-%d", i), cfg["lattrace-gateway-sampler"], p[2]), p[0], fmt.Sprintf("127.0.0.1:%d", p[3])}
		hostnames = append(hostnames, fmt.Sprintf("127.0.0.1:%d", p[0]))
	}
	for i := range lbs {
		p := testserver.FreePorts(t, 4)
		cfg := gateway.Configs(t, append(ports(p), "loadBalancer.resolver.static.hostnames={"+strings.Join(hostnames, ",")+"}",
			"metrics.endpoint="+prom.OTLPEndpoint())...)
		lbs[i] = collector{gateway.Start(t, fmt.Sprintf("loadbalancer-%d", i), cfg["lattrace-gateway-loadbalancer"], p[2]), p[0], fmt.Sprintf("127.0.0.1:%d", p[3])}
	}

	// Two nodes: each a cgroup and a network namespace of the lab, a
	// daemon each, with the settings docs/fleet.md gives for a gateway:
	// the defaults (slow and diagnosed exchanges), and the rate sample
	// drawn from half the exchanges, the same half at both ends.
	lab := netlab.NewT(t, netlab.Config{AtoB: netlab.Link{Delay: 5 * time.Millisecond}, BtoA: netlab.Link{Delay: 5 * time.Millisecond}})
	type node struct {
		name, cgroup, metrics string
		cmd                   *exec.Cmd
		log                   *syncBuffer
	}
	var nodes [2]node
	for i, name := range []string{"node-a", "node-b"} {
		cg, _ := newCgroup(t, fmt.Sprintf("lattrace-fleet-%s-%d", name, os.Getpid()))
		metrics := freeAddr(t)
		cmd, log := startNode(t, name, "daemon", "--cgroup", cg, "--output", "none", "--metrics-addr", metrics,
			"--otlp-endpoint", fmt.Sprintf("127.0.0.1:%d", lbs[i].otlp), "--otlp-insecure",
			"--span-ratio", "0.5", "--span-rate", "100")
		nodes[i] = node{name, cg, metrics, cmd, log}
	}

	// The workload: its server in node B, its client in node A,
	// each started inside its node's cgroup.
	wl := filepath.Join(t.TempDir(), "workload")
	if out, err := exec.Command("go", "build", "-o", wl, "github.com/lattrace/lattrace/tests/workload/cmd/workload").CombinedOutput(); err != nil {
		t.Fatalf("building the workload: %v\n%s", err, out)
	}
	// `ip netns exec` mounts a /sys of the namespace, without the cgroup
	// hierarchy: the test's own root still has it.
	inNode := func(cg string) []string {
		procs := filepath.Join(fmt.Sprintf("/proc/%d/root", os.Getpid()), cg, "cgroup.procs")
		return []string{"sh", "-c", fmt.Sprintf(`echo $$ > %s && exec "$@"`, procs), "sh"}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srvArgs := append(inNode(nodes[1].cgroup), wl, "server", "--listen", fmt.Sprintf("%s:%d", lab.B.IPv4, fleetPort), "--out", os.DevNull)
	srv := lab.B.Command(ctx, srvArgs[0], srvArgs[1:]...)
	srvErr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	waitLine(t, srvErr, "listening on")

	records := filepath.Join(t.TempDir(), "client.jsonl")
	cliArgs := append(inNode(nodes[0].cgroup), wl, "client", "--addr", fmt.Sprintf("%s:%d", lab.B.IPv4, fleetPort),
		"--count", strconv.Itoa(fleetRequests), "--slow-every", strconv.Itoa(fleetSlowEvery), "--slow-think", fleetSlowThink.String(), "--out", records)
	cli := lab.A.Command(ctx, cliArgs[0], cliArgs[1:]...)
	var cliOut strings.Builder
	cli.Stdout, cli.Stderr = &cliOut, &cliOut
	// The gateway's CPU from here on: what the spans cost, not the start.
	spent := func(c collector) time.Duration {
		u, _, err := c.Usage()
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	startCPU := map[*testserver.Process]time.Duration{}
	for _, c := range append(lbs[:], samplers[:]...) {
		startCPU[c.Process] = spent(c)
	}
	start := workload.MonoNow()
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	// A sampler dies a few seconds in, its traces in memory with it, and
	// comes back: the load balancers hold its share meanwhile.
	time.Sleep(12 * time.Second)
	before := scrape(t, samplers[1].metrics)
	killed := workload.MonoNow()
	samplers[1].Kill()
	time.Sleep(2 * time.Second)
	samplers[1].Restart(t)
	restarted := workload.MonoNow()
	if err := cli.Wait(); err != nil {
		t.Fatalf("workload client: %v\n%s", err, cliOut.String())
	}
	end := workload.MonoNow()
	f, err := os.Open(records)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := workload.ReadJSONL[workload.ClientRecord](f)
	f.Close()
	if err != nil || len(recs) != fleetRequests {
		t.Fatalf("%d client records (%v), want %d", len(recs), err, fleetRequests)
	}

	// The daemons flush their spans and metrics as they stop; what they
	// exported and dropped is on their /metrics first.
	time.Sleep(2 * time.Second)
	var exported [2]float64 // exchanges
	var nodeSpans float64
	for i, n := range nodes {
		m := scrape(t, n.metrics)
		exported[i] = m["lattrace_spans_sampled_slow_total"] + m["lattrace_spans_sampled_diagnosed_total"] + m["lattrace_spans_sampled_rate_total"]
		nodeSpans += m["lattrace_spans_exported_total"]
		for _, c := range []string{`lattrace_exchanges_unexported_total{reason="queue_full"}`, `lattrace_exchanges_unexported_total{reason="slow_budget"}`,
			`lattrace_exchanges_unexported_total{reason="rejected"}`, "lattrace_export_errors_total", "lattrace_ringbuf_full_total"} {
			if v, ok := m[c]; !ok || v != 0 {
				t.Errorf("%s: %s = %v (present %v): the daemon lost spans with the gateway up", n.name, c, v, ok)
			}
		}
		if err := n.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if err := n.cmd.Wait(); err != nil {
			t.Errorf("%s exit: %v\n%s", n.name, err, n.log.String())
		}
		if strings.Contains(n.log.String(), "level=ERROR") {
			t.Errorf("%s logged errors:\n%s", n.name, n.log.String())
		}
	}

	// Traces are decided decisionWait after their first span: wait until
	// Jaeger's count stops growing.
	var traces []jaeger.Trace
	for last, stable, deadline := -1, 0, time.Now().Add(45*time.Second); stable < 3 && time.Now().Before(deadline); time.Sleep(time.Second) {
		if traces, err = jg.Traces("lattrace", 5000); err != nil {
			t.Fatal(err)
		}
		if len(traces) == last {
			stable++
		} else {
			last, stable = len(traces), 0
		}
	}

	// Jaeger's times are wall-clock microseconds; the workload's are
	// CLOCK_MONOTONIC.
	offset := time.Now().UnixNano() - workload.MonoNow()
	wall := func(mono int64) int64 { return (mono + offset) / 1000 }
	// An exchange that ended between decisionWait (plus the daemons'
	// batch timeout and a margin) before the kill and a margin after the
	// restart may have had spans in the killed sampler's memory (lost, as
	// the Collector documents: tail sampling holds traces in memory) or
	// a half on each side of the restart.
	riskFrom, riskTo := wall(killed-int64(fleetDecisionWait+1500*time.Millisecond)), wall(restarted+int64(1500*time.Millisecond))
	type half struct {
		span jaeger.Span
		node any
	}
	byStart := map[int64]*jaeger.Trace{} // the requester's start, µs
	whole, halves := 0, 0
	for i := range traces {
		tr := &traces[i]
		var req, resp *half
		for _, s := range tr.Spans {
			if s.OperationName != otlp.SpanName || jaeger.Tag(s.Tags, "server.port") != float64(fleetPort) {
				continue
			}
			h := &half{s, jaeger.Tag(tr.Processes[s.ProcessID].Tags, "k8s.node.name")}
			switch jaeger.Tag(s.Tags, "lattrace.role") {
			case "requester":
				req = h
			case "responder":
				resp = h
			}
		}
		if req == nil && resp == nil {
			continue
		}
		if req != nil && resp != nil && req.node == "node-a" && resp.node == "node-b" && len(resp.span.References) == 1 &&
			resp.span.References[0].SpanID == req.span.SpanID {
			whole++
			byStart[req.span.StartTime] = tr
			continue
		}
		halves++
		at := int64(0)
		for _, h := range []*half{req, resp} {
			if h != nil {
				at = h.span.StartTime + h.span.Duration
			}
		}
		if at < riskFrom || at > riskTo {
			t.Errorf("trace %s outside the restart's window: requester %+v, responder %+v: want node A's requester span with node B's responder span under it", tr.TraceID, req, resp)
		}
	}
	// Each request's trace, by the requester span's start (the write of
	// the request, w0), within 3 ms of the client's own: requests follow
	// each other a round trip (10 ms) apart.
	find := func(r workload.ClientRecord) *jaeger.Trace {
		w := wall(r.WriteStartNs)
		for s, tr := range byStart {
			if d := s - w; d > -3000 && d < 3000 {
				return tr
			}
		}
		return nil
	}
	var slow, slowKept, slowRisky, fast, fastKept, fastRisky int
	for _, r := range recs {
		risky := wall(r.LastRespByteNs) >= riskFrom && wall(r.WriteStartNs) <= riskTo
		kept := find(r) != nil
		switch {
		case r.ThinkNs == int64(fleetSlowThink) && risky:
			slowRisky++
		case r.ThinkNs == int64(fleetSlowThink):
			slow++
			if kept {
				slowKept++
			} else {
				t.Errorf("slow request %d (%v) not in Jaeger with both halves", r.ID, time.Duration(r.AppRTTNs))
			}
		case risky:
			fastRisky++
		default:
			fast++
			if kept {
				fastKept++
			}
		}
	}
	t.Logf("Jaeger: %d whole traces, %d halves (in the restart's window); slow kept %d of %d (+%d in the window); fast kept %d of %d (+%d in the window); sampler killed %v after the start for %v",
		whole, halves, slowKept, slow, slowRisky, fastKept, fast, fastRisky, time.Duration(killed-start), time.Duration(restarted-killed))
	if slow < fleetRequests/fleetSlowEvery/3 {
		t.Errorf("only %d slow requests outside the restart's window", slow)
	}
	// Half reach the gateway, which keeps 10 % of them: binomial at 5 %
	// of some 500, 1 to 10 % is 4 standard deviations below and 5 above,
	// and tells "sampled" from "all kept" and from "none".
	if share := float64(fastKept) / float64(fast); share < 0.01 || share > 0.10 {
		t.Errorf("fast requests kept: %d of %d (%.1f %%), want about %d %% of half", fastKept, fast, 100*share, fleetKeepPercent)
	}

	// Both nodes chose the same exchanges, and each trace reached one
	// sampler: the samplers' new traces add up to the exchanges exported,
	// not twice as many (the counter of the killed one restarted with
	// it).
	if d := exported[0] - exported[1]; d < -3 || d > 3 {
		t.Errorf("node A exported %v exchanges, node B %v: the nodes did not choose the same ones", exported[0], exported[1])
	}
	var received float64
	for i, s := range samplers {
		m := scrape(t, s.metrics)
		received += m["otelcol_processor_tail_sampling_new_trace_id_received"]
		if i == 1 {
			received += before["otelcol_processor_tail_sampling_new_trace_id_received"]
		}
	}
	if received < 0.9*exported[0] || received > 1.1*exported[0] {
		t.Errorf("the samplers received %v new traces for %v exchanges exported at each end: each trace should reach one sampler whole", received, exported[0])
	}

	// Metrics, per node, through the load balancers.
	for _, n := range nodes {
		q := fmt.Sprintf(`count({k8s_node_name=%q, __name__=~"lattrace_.*"})`, n.name)
		var res []prometheus.Sample
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && len(res) == 0; time.Sleep(time.Second) {
			if res, err = prom.Query(q); err != nil {
				t.Fatal(err)
			}
		}
		if len(res) == 0 {
			t.Errorf("Prometheus has no lattrace series of %s (%s)", n.name, q)
		}
	}

	// Sizing: spans in, and what each tier spent on them.
	secs := time.Duration(end - start).Seconds()
	var spans float64
	for _, lb := range lbs {
		spans += scrape(t, lb.metrics)["otelcol_receiver_accepted_spans"]
	}
	rate := spans / secs
	for _, tier := range []struct {
		name string
		cs   [2]collector
	}{{"load balancer", lbs}, {"sampler", samplers}} {
		var cpu time.Duration
		var peak int64
		for _, c := range tier.cs {
			u, p, err := c.Usage()
			if err != nil {
				t.Fatal(err)
			}
			cpu, peak = cpu+u-startCPU[c.Process], max(peak, p)
		}
		t.Logf("gateway sizing: %s tier: %.1f %% of a core per 1,000 spans/s (2 instances, %v CPU for %.0f spans in %.1f s), peak RSS %.0f MiB per instance",
			tier.name, 100*cpu.Seconds()/secs/(rate/1000), cpu, spans, secs, float64(peak)/(1<<20))
	}
	t.Logf("gateway sizing: %.0f spans/s from 2 nodes at %.0f exchanges/s each, %.0f exported per node (%.1f spans each)",
		rate, float64(fleetRequests)/secs, exported[0], nodeSpans/(exported[0]+exported[1]))
}

// waitLine reads r until a line contains want (10 s at most), then drains
// it in the background.
func waitLine(t *testing.T, r io.Reader, want string) {
	t.Helper()
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.Contains(sc.Text(), want) {
				found <- true
			}
		}
		close(found)
	}()
	select {
	case ok := <-found:
		if !ok {
			t.Fatalf("exited before printing %q", want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no %q within 10 s", want)
	}
}

var sample = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)`)

// scrape reads the Prometheus text page at addr ("host:port", a daemon's
// or a Collector's) and sums each metric's samples over their labels;
// each labelled sample is also there under its name and labels as the
// page writes them (name{label="value"}).
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if m := sample.FindStringSubmatch(sc.Text()); m != nil {
			v, err := strconv.ParseFloat(m[3], 64)
			if err == nil {
				out[m[1]] += v
				if m[2] != "" {
					out[m[1]+m[2]] += v
				}
			}
		}
	}
	return out
}
