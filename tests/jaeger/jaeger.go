// Package jaeger runs Jaeger v2 (module ./server, built once by build.sh)
// for a test: OTLP/gRPC in, traces in memory, read back through its HTTP
// query API, as a person's UI would.
//
//	LATTRACE_JAEGER_BIN=/path   use this binary instead of running build.sh
package jaeger

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

var binary = buildonce.New("jaeger", "build.sh", "LATTRACE_JAEGER_BIN")

// Jaeger is one running Jaeger.
type Jaeger struct {
	*testserver.Process
	otlp, query int
}

// Start builds Jaeger (once per process) and starts it on free loopback
// ports until the test ends.
func Start(tb testing.TB) *Jaeger {
	tb.Helper()
	bin, err := binary.Path()
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	config := filepath.Join(dir, "jaeger.yaml")
	if err := os.WriteFile(config, configYAML, 0o644); err != nil {
		tb.Fatal(err)
	}
	p := testserver.FreePorts(tb, 3)
	j := &Jaeger{otlp: p[0], query: p[1]}
	j.Process = testserver.Start(tb, "jaeger", dir, bin, []string{"--config", "file:" + config},
		[]string{fmt.Sprint("JAEGER_OTLP_PORT=", p[0]), fmt.Sprint("JAEGER_QUERY_PORT=", p[1]), fmt.Sprint("JAEGER_QUERY_GRPC_PORT=", p[2])},
		testserver.HTTPReady(j.api("/api/services")))
	return j
}

// OTLPEndpoint is the OTLP/gRPC receiver, "127.0.0.1:port".
func (j *Jaeger) OTLPEndpoint() string { return fmt.Sprintf("127.0.0.1:%d", j.otlp) }

func (j *Jaeger) api(path string) string { return fmt.Sprintf("http://127.0.0.1:%d%s", j.query, path) }

// Trace is a trace as the query API gives it.
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
}

// Span is one span of a Trace; times in microseconds.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     int64       `json:"startTime"`
	Duration      int64       `json:"duration"`
	Tags          []KeyValue  `json:"tags"`
	ProcessID     string      `json:"processID"`
}

// Reference links a span to its parent (CHILD_OF).
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// Process is what sent a span: its service and resource attributes.
type Process struct {
	ServiceName string     `json:"serviceName"`
	Tags        []KeyValue `json:"tags"`
}

// KeyValue is an attribute.
type KeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// Tag returns the value of key among kvs, nil when absent.
func Tag(kvs []KeyValue, key string) any {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

// Traces returns up to limit traces of service from the last hour.
func (j *Jaeger) Traces(service string, limit int) ([]Trace, error) {
	q := url.Values{"service": {service}, "limit": {fmt.Sprint(limit)}, "lookback": {"1h"}}
	resp, err := http.Get(j.api("/api/traces?" + q.Encode()))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jaeger query: %s", resp.Status)
	}
	var out struct {
		Data   []Trace `json:"data"`
		Errors any     `json:"errors"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("jaeger query: %w", err)
	}
	return out.Data, nil
}
