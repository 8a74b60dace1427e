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
		"lattrace_spans_dropped_queue_total", "lattrace_export_errors_total"} {
		srv.Counter(n, "test", func() float64 { return 0 })
	}
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
	metricName := regexp.MustCompile(`lattrace_[a-z_]+\[`) // followed by a range: a metric, not a label
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
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				m = strings.TrimSuffix(m, "[")
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
