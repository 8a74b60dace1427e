// Package prometheus runs Prometheus 3 (module ./server, built once by
// build.sh) for a test: its OTLP receiver in, PromQL out.
//
//	LATTRACE_PROMETHEUS_BIN=/path   use this binary instead of running build.sh
package prometheus

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/lattrace/lattrace/tests/buildonce"
	"github.com/lattrace/lattrace/tests/testserver"
)

//go:embed config.yaml
var configYAML []byte

var binary = buildonce.New("prometheus", "build.sh", "LATTRACE_PROMETHEUS_BIN")

// Prometheus is one running Prometheus.
type Prometheus struct {
	*testserver.Process
	port int
}

// Start builds Prometheus (once per process) and starts it on a free
// loopback port until the test ends.
func Start(tb testing.TB) *Prometheus {
	tb.Helper()
	bin, err := binary.Path()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	config := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(config, configYAML, 0o644); err != nil {
		tb.Fatal(err)
	}
	p := &Prometheus{port: testserver.FreePorts(tb, 1)[0]}
	p.Process = testserver.Start(tb, "prometheus", dir, bin, []string{
		"--config.file=" + config, "--storage.tsdb.path=" + filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", p.port), "--web.enable-otlp-receiver",
	}, nil, testserver.HTTPReady(p.url("/-/ready")))
	return p
}

func (p *Prometheus) url(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", p.port, path)
}

// OTLPEndpoint is the OTLP/HTTP base URL an exporter appends /v1/metrics to.
func (p *Prometheus) OTLPEndpoint() string { return p.url("/api/v1/otlp") }

// Sample is one series of an instant query's result.
type Sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"` // [unix time, "value"]
}

// Query runs an instant PromQL query.
func (p *Prometheus) Query(q string) ([]Sample, error) {
	resp, err := http.Get(p.url("/api/v1/query?" + url.Values{"query": {q}}.Encode()))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []Sample `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("prometheus query %q: %w", q, err)
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("prometheus query %q: %s", q, out.Error)
	}
	return out.Data.Result, nil
}
