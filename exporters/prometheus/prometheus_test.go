package prometheus

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/record"
)

// TestDashboardMatchesMetrics feeds exchanges through the real metric
// instruments, scrapes /metrics, and checks that the Grafana dashboard in
// deploy/ is well-formed and that every metric and label its queries use is
// one lattrace really serves.
func TestDashboardMatchesMetrics(t *testing.T) {
	srv, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go srv.Serve()
	for _, n := range []string{"lattrace_ringbuf_full_total", "lattrace_storage_fail_total", "lattrace_decode_errors_total",
		"lattrace_export_errors_total"} {
		srv.Counter(n, "test", func() float64 { return 0 })
	}
	srv.Counters("lattrace_exchanges_unexported_total", "test", "reason", otlp.DropReasons[:], func() []float64 { return make([]float64, len(otlp.DropReasons)) })
	x, err := otlp.New(context.Background(), otlp.Config{DisableTraces: true, DisableMetrics: true, MetricReaders: []sdkmetric.Reader{srv.Reader()}})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Shutdown(context.Background())
	srv.SetProducer(x.MetricsProducer())
	now := record.Now()
	e := &record.Exchange{Role: record.Requester, Owner: record.Owner{Comm: "curl"}, Retransmits: 2, RTOs: 1, Turns: 2, ExchangeTurns: 2, BytesOut: 100, BytesIn: 1000,
		Start: now, End: now + record.Mono(20*time.Millisecond), Duration: 20 * time.Millisecond,
		Components: record.Components{Network: 15 * time.Millisecond, Peer: 5 * time.Millisecond}}
	x.Exchange(e)
	x.ConnOpen(record.ConnOpen{Role: record.RoleClient})

	resp, err := http.Get("http://" + srv.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	raw, err := os.ReadFile("../../deploy/grafana/lattrace.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		UID    string
		Panels []struct {
			Title   string
			Type    string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) < 4 {
		t.Fatalf("dashboard %q (%q) has %d panels", dash.Title, dash.UID, len(dash.Panels))
	}
	// Followed by a range, with label matchers or not: a metric, not a label.
	metricName := regexp.MustCompile(`(lattrace_[a-z_]+)(\{[^}]*\})?\[`)
	label := regexp.MustCompile(`by \(([a-z_, ]+)\)|\{\{([a-z_]+)\}\}`)
	for _, p := range dash.Panels {
		if p.Title == "" || p.Type == "" || len(p.Targets) == 0 {
			t.Errorf("panel %+v incomplete", p)
		}
		for _, tg := range p.Targets {
			if !metricName.MatchString(tg.Expr) {
				t.Errorf("panel %q: no lattrace metric in %s", p.Title, tg.Expr)
			}
			if strings.Count(tg.Expr, "(") != strings.Count(tg.Expr, ")") {
				t.Errorf("panel %q: unbalanced parentheses in %s", p.Title, tg.Expr)
			}
			for _, sub := range metricName.FindAllStringSubmatch(tg.Expr, -1) {
				m := sub[1]
				if !strings.Contains(string(page), "\n"+m) {
					t.Errorf("panel %q uses %s, which /metrics does not serve", p.Title, m)
				}
			}
			for _, g := range label.FindAllStringSubmatch(tg.Expr, -1) {
				for _, l := range strings.Split(g[1]+g[2], ",") {
					if l = strings.TrimSpace(l); l != "" && l != "le" && !strings.Contains(string(page), l+"=") {
						t.Errorf("panel %q groups by %s, a label no lattrace metric has", p.Title, l)
					}
				}
			}
		}
	}
}

// TestReadOnly: on every path, every method but GET and HEAD gets 405 and
// reaches no handler; paths not served get 404, and nothing beyond
// /metrics and what the daemon adds is served (no pprof, no API).
func TestReadOnly(t *testing.T) {
	srv, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	calls := 0
	srv.Handle("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { calls++ }))
	go srv.Serve()
	base := "http://" + srv.Addr().String()
	status := func(method, path string) int {
		req, _ := http.NewRequest(method, base+path, strings.NewReader("x=1"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	paths := []string{"/metrics", "/healthz", "/", "/debug/pprof/", "/v1/flows", "/metrics/x"}
	for _, p := range paths {
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, "OPTIONS", "TRACE"} {
			if got := status(m, p); got != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, p, got)
			}
		}
	}
	if calls != 0 {
		t.Errorf("a refused method reached the /healthz handler %d times", calls)
	}
	for _, p := range paths[2:] {
		if got := status(http.MethodGet, p); got != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, got)
		}
	}
	if status(http.MethodGet, "/metrics") != http.StatusOK || status(http.MethodHead, "/metrics") != http.StatusOK || status(http.MethodGet, "/healthz") != http.StatusOK || calls != 1 {
		t.Errorf("GET or HEAD /metrics, GET /healthz not served (healthz handler ran %d times)", calls)
	}
}
