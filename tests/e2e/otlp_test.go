package e2e

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/otelcol"
)

// TestDaemonExportsOTLP runs the daemon against a real OpenTelemetry
// Collector: the exchanges of a loopback connection arrive as spans with
// their stage children, and the metrics arrive too.
func TestDaemonExportsOTLP(t *testing.T) {
	col := otelcol.Start(t)
	metrics := freeAddr(t)
	cmd, log := startDaemon(t, "daemon", "--output", "none", "--otlp-endpoint", col.GRPCEndpoint(), "--otlp-insecure",
		"--span-slow-threshold", "0s", "--span-slow-rate", "-1", "--metrics-addr", metrics)
	// The traffic comes from a cgroup named the way containerd names a
	// container's, so the span must carry that container's id.
	container := strings.Repeat("c0ffee", 10) + "beef"
	local := inCgroup(t, "cri-containerd-"+container+".scope", func() string { return loopbackSends(t, 5) })
	// The same instruments on /metrics, under Prometheus names, beside the
	// daemon's own health counters.
	// The orchestrator's probe, on the same port.
	hz, err := http.Get("http://" + metrics + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(hz.Body)
	hz.Body.Close()
	if hz.StatusCode != 200 || !strings.Contains(string(body), `"status":"ok"`) || !strings.Contains(string(body), `"hooks"`) {
		t.Errorf("/healthz: %d %s", hz.StatusCode, body)
	}
	// The exchanges reach the metrics at the next drain (the default
	// interval, 250 ms, or later on a busy machine).
	wants := []string{"lattrace_exchange_duration_seconds_count", "lattrace_records_decoded_total", "lattrace_ringbuf_full_total 0", "lattrace_flows{", "lattrace_export_queue_spans"}
	var lacks []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + metrics + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lacks = lacks[:0]
		for _, want := range wants {
			if !strings.Contains(string(page), want) {
				lacks = append(lacks, want)
			}
		}
		if len(lacks) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range lacks {
		t.Errorf("/metrics lacks %q", want)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemon exit: %v\n%s", err, log.String())
	}
	if strings.Contains(log.String(), "level=ERROR") {
		t.Errorf("errors logged on a clean run:\n%s", log.String())
	}
	spans := col.WaitForSpans(t, 1, 10*time.Second, func(s otelcol.Span) bool {
		return s.Name == "tcp exchange" && s.Attributes["network.local.port"] != nil &&
			s.Attributes["network.local.address"] == "127.0.0.1" && portOf(local) == s.Attributes["network.local.port"]
	})
	ex := spans[0]
	if ex.Attributes["network.transport"] != "tcp" || ex.Attributes["lattrace.role"] != "requester" || ex.Resource["service.name"] != "lattrace" ||
		ex.Resource["k8s.node.name"] != "node-e2e" || ex.Attributes["container.id"] != container {
		t.Errorf("span attributes %v, resource %v", ex.Attributes, ex.Resource)
	}
	children := 0
	for _, s := range col.Spans() {
		if s.ParentSpanID == ex.SpanID && s.TraceID == ex.TraceID {
			children++
		}
	}
	if children == 0 {
		t.Errorf("the exchange span has no stage children")
	}
	col.WaitForMetric(t, "lattrace.exchange.duration", 10*time.Second)
}

// portOf returns the port of "ip:port" as the collector's JSON decodes an
// integer attribute.
func portOf(addr string) int64 {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return -1
	}
	return int64(ap.Port())
}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// inCgroup runs fn with this process moved into a new cgroup v2 directory
// of that name, and moves it back.
func inCgroup(t *testing.T, name string, fn func() string) string {
	t.Helper()
	dir, home := newCgroup(t, name)
	move := func(to string) {
		if err := os.WriteFile(filepath.Join(to, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0); err != nil {
			t.Fatalf("moving into %s: %v", to, err)
		}
	}
	move(dir)
	defer move(home)
	return fn()
}

// newCgroup makes a cgroup v2 directory of that name at the hierarchy's
// root, removed when the test ends, and returns it with this process's own
// cgroup.
func newCgroup(t *testing.T, name string) (dir, home string) {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	var root string
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[2] == "cgroup2" {
			root = f[1]
		}
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil || root == "" {
		t.Fatalf("no cgroup v2: %v", err)
	}
	home = root
	for _, l := range strings.Split(string(self), "\n") {
		if strings.HasPrefix(l, "0::") {
			home = filepath.Join(root, strings.TrimPrefix(l, "0::"))
		}
	}
	dir = filepath.Join(root, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Kept until the test ends: the daemon resolves the cgroup when it
	// drains the record, after the traffic.
	t.Cleanup(func() { os.Remove(dir) })
	return dir, home
}
