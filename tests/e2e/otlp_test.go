package e2e

import (
	"io"
	"net"
	"net/http"
	"net/netip"
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
		"--span-slow-threshold", "0s", "--metrics-addr", metrics)
	local := loopbackSends(t, 5)
	time.Sleep(300 * time.Millisecond)
	// The same instruments on /metrics, under Prometheus names, beside the
	// daemon's own health counters.
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"lattrace_exchange_duration_seconds_count", "lattrace_records_decoded_total", "lattrace_ringbuf_full_total 0", "lattrace_flows "} {
		if !strings.Contains(string(page), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemon exit: %v\n%s", err, log.String())
	}
	spans := col.WaitForSpans(t, 1, 10*time.Second, func(s otelcol.Span) bool {
		return s.Name == "tcp exchange" && s.Attributes["network.local.port"] != nil &&
			s.Attributes["network.local.address"] == "127.0.0.1" && portOf(local) == s.Attributes["network.local.port"]
	})
	ex := spans[0]
	if ex.Attributes["network.transport"] != "tcp" || ex.Attributes["lattrace.role"] != "requester" || ex.Resource["service.name"] != "lattrace" {
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
