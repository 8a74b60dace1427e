package otelcol

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"testing"
	"time"
)

// Span is one span as the collector received it.
type Span struct {
	TraceID       string // 32 lowercase hex digits
	SpanID        string // 16 lowercase hex digits
	ParentSpanID  string // "" for a root span
	Name          string
	Kind          int // OTLP SpanKind: 1 internal, 2 server, 3 client, 4 producer, 5 consumer
	StartUnixNano uint64
	EndUnixNano   uint64
	Attributes    map[string]any
	Events        []Event
	Links         []Link
	StatusCode    int // 0 unset, 1 ok, 2 error
	StatusMessage string
	Resource      map[string]any // resource attributes (service.name, ...)
	Scope         string         // instrumentation scope name
	ScopeVersion  string
}

// Link is a span link: another span, in this trace or another.
type Link struct {
	TraceID, SpanID string
	Attributes      map[string]any
}

// Event is a span event.
type Event struct {
	Name         string
	TimeUnixNano uint64
	Attributes   map[string]any
}

// Metric types, as in Metric.Type.
const (
	Gauge                = "gauge"
	Sum                  = "sum"
	Histogram            = "histogram"
	ExponentialHistogram = "exponential_histogram"
	Summary              = "summary"
)

// Metric is one metric of one export request as the collector received it. A cumulative
// instrument exported several times appears several times: the last one is the latest.
type Metric struct {
	Name         string
	Description  string
	Unit         string
	Type         string // Gauge, Sum, Histogram, ExponentialHistogram or Summary
	Monotonic    bool   // sums only
	Temporality  int    // 1 delta, 2 cumulative (sums and histograms)
	DataPoints   []DataPoint
	Resource     map[string]any
	Scope        string
	ScopeVersion string
}

// DataPoint is one data point. Gauges and sums set Value (and IntValue/IsInt for integer
// points); histograms set Count, Sum, BucketCounts and ExplicitBounds (and Min/Max when sent);
// exponential histograms and summaries set Count and Sum.
type DataPoint struct {
	Attributes     map[string]any
	StartUnixNano  uint64
	TimeUnixNano   uint64
	Value          float64
	IntValue       int64
	IsInt          bool
	Count          uint64
	Sum            float64
	Min, Max       *float64
	BucketCounts   []uint64
	ExplicitBounds []float64
}

// Spans parses every span the collector has written so far (across restarts), in arrival order.
// Errors (unreadable file, malformed line) are reported with t.Errorf. The file exporter flushes
// every 100 ms: use WaitForSpan/WaitForSpans to wait for data.
func (c *Collector) Spans() []Span {
	spans, err := ReadSpans(c.TracesFile())
	if err != nil {
		c.tb.Errorf("otelcol: %v", err)
	}
	return spans
}

// Metrics parses every metric the collector has written so far (across restarts), in arrival order.
func (c *Collector) Metrics() []Metric {
	metrics, err := ReadMetrics(c.MetricsFile())
	if err != nil {
		c.tb.Errorf("otelcol: %v", err)
	}
	return metrics
}

// WaitForSpans polls Spans until match accepts at least n spans, and returns those, or fails the
// test after timeout. A nil match accepts every span.
func (c *Collector) WaitForSpans(tb testing.TB, n int, timeout time.Duration, match func(Span) bool) []Span {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var got []Span
		for _, s := range c.Spans() {
			if match == nil || match(s) {
				got = append(got, s)
			}
		}
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			tb.Fatalf("otelcol: %d matching span(s) after %v, want %d; all spans: %+v", len(got), timeout, n, c.Spans())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitForSpan waits for the first span called name.
func (c *Collector) WaitForSpan(tb testing.TB, name string, timeout time.Duration) Span {
	tb.Helper()
	return c.WaitForSpans(tb, 1, timeout, func(s Span) bool { return s.Name == name })[0]
}

// WaitForMetric waits until a metric called name has arrived and returns the latest one.
func (c *Collector) WaitForMetric(tb testing.TB, name string, timeout time.Duration) Metric {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var last *Metric
		ms := c.Metrics()
		for i := range ms {
			if ms[i].Name == name {
				last = &ms[i]
			}
		}
		if last != nil {
			return *last
		}
		if time.Now().After(deadline) {
			names := []string{}
			for _, m := range ms {
				names = append(names, m.Name)
			}
			tb.Fatalf("otelcol: no metric %q after %v; got %q", name, timeout, names)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ReadSpans parses a file exporter traces file (OTLP JSON, one ExportTraceServiceRequest per
// line). A missing file is no spans; an unterminated last line (being written) is ignored.
func ReadSpans(path string) ([]Span, error) {
	var spans []Span
	err := eachLine(path, func(line []byte) error {
		var req struct {
			ResourceSpans []struct {
				Resource   jResource `json:"resource"`
				ScopeSpans []struct {
					Scope jScope `json:"scope"`
					Spans []struct {
						TraceID           string      `json:"traceId"`
						SpanID            string      `json:"spanId"`
						ParentSpanID      string      `json:"parentSpanId"`
						Name              string      `json:"name"`
						Kind              jInt        `json:"kind"`
						StartTimeUnixNano jUint       `json:"startTimeUnixNano"`
						EndTimeUnixNano   jUint       `json:"endTimeUnixNano"`
						Attributes        []jKeyValue `json:"attributes"`
						Events            []struct {
							Name         string      `json:"name"`
							TimeUnixNano jUint       `json:"timeUnixNano"`
							Attributes   []jKeyValue `json:"attributes"`
						} `json:"events"`
						Links []struct {
							TraceID    string      `json:"traceId"`
							SpanID     string      `json:"spanId"`
							Attributes []jKeyValue `json:"attributes"`
						} `json:"links"`
						Status struct {
							Code    jInt   `json:"code"`
							Message string `json:"message"`
						} `json:"status"`
					} `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			return err
		}
		for _, rs := range req.ResourceSpans {
			res := attrs(rs.Resource.Attributes)
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					sp := Span{
						TraceID:       s.TraceID,
						SpanID:        s.SpanID,
						ParentSpanID:  s.ParentSpanID,
						Name:          s.Name,
						Kind:          int(s.Kind),
						StartUnixNano: uint64(s.StartTimeUnixNano),
						EndUnixNano:   uint64(s.EndTimeUnixNano),
						Attributes:    attrs(s.Attributes),
						StatusCode:    int(s.Status.Code),
						StatusMessage: s.Status.Message,
						Resource:      res,
						Scope:         ss.Scope.Name,
						ScopeVersion:  ss.Scope.Version,
					}
					for _, e := range s.Events {
						sp.Events = append(sp.Events, Event{Name: e.Name, TimeUnixNano: uint64(e.TimeUnixNano), Attributes: attrs(e.Attributes)})
					}
					for _, l := range s.Links {
						sp.Links = append(sp.Links, Link{TraceID: l.TraceID, SpanID: l.SpanID, Attributes: attrs(l.Attributes)})
					}
					spans = append(spans, sp)
				}
			}
		}
		return nil
	})
	return spans, err
}

// ReadMetrics parses a file exporter metrics file (OTLP JSON, one ExportMetricsServiceRequest per
// line).
func ReadMetrics(path string) ([]Metric, error) {
	var metrics []Metric
	err := eachLine(path, func(line []byte) error {
		var req struct {
			ResourceMetrics []struct {
				Resource     jResource `json:"resource"`
				ScopeMetrics []struct {
					Scope   jScope `json:"scope"`
					Metrics []struct {
						Name                 string `json:"name"`
						Description          string `json:"description"`
						Unit                 string `json:"unit"`
						Gauge                *jData `json:"gauge"`
						Sum                  *jData `json:"sum"`
						Histogram            *jData `json:"histogram"`
						ExponentialHistogram *jData `json:"exponentialHistogram"`
						Summary              *jData `json:"summary"`
					} `json:"metrics"`
				} `json:"scopeMetrics"`
			} `json:"resourceMetrics"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			return err
		}
		for _, rm := range req.ResourceMetrics {
			res := attrs(rm.Resource.Attributes)
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					out := Metric{
						Name:         m.Name,
						Description:  m.Description,
						Unit:         m.Unit,
						Resource:     res,
						Scope:        sm.Scope.Name,
						ScopeVersion: sm.Scope.Version,
					}
					var d *jData
					switch {
					case m.Gauge != nil:
						out.Type, d = Gauge, m.Gauge
					case m.Sum != nil:
						out.Type, d = Sum, m.Sum
					case m.Histogram != nil:
						out.Type, d = Histogram, m.Histogram
					case m.ExponentialHistogram != nil:
						out.Type, d = ExponentialHistogram, m.ExponentialHistogram
					case m.Summary != nil:
						out.Type, d = Summary, m.Summary
					default:
						d = &jData{}
					}
					out.Monotonic = d.IsMonotonic
					out.Temporality = int(d.AggregationTemporality)
					for _, p := range d.DataPoints {
						dp := DataPoint{
							Attributes:     attrs(p.Attributes),
							StartUnixNano:  uint64(p.StartTimeUnixNano),
							TimeUnixNano:   uint64(p.TimeUnixNano),
							Count:          uint64(p.Count),
							Min:            p.Min,
							Max:            p.Max,
							ExplicitBounds: p.ExplicitBounds,
						}
						if p.Sum != nil {
							dp.Sum = *p.Sum
						}
						switch {
						case p.AsInt != nil:
							dp.IsInt, dp.IntValue, dp.Value = true, int64(*p.AsInt), float64(*p.AsInt)
						case p.AsDouble != nil:
							dp.Value = *p.AsDouble
						}
						for _, b := range p.BucketCounts {
							dp.BucketCounts = append(dp.BucketCounts, uint64(b))
						}
						out.DataPoints = append(out.DataPoints, dp)
					}
					metrics = append(metrics, out)
				}
			}
		}
		return nil
	})
	return metrics, err
}

func eachLine(path string, fn func([]byte) error) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// The file exporter writes whole lines; an unterminated last line is still being written.
	b = b[:bytes.LastIndexByte(b, '\n')+1]
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<30)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if err := fn(line); err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	return sc.Err()
}

// OTLP/JSON building blocks (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding):
// 64-bit integers are decimal strings (numbers accepted too), enums are integers.

type jResource struct {
	Attributes []jKeyValue `json:"attributes"`
}

type jScope struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

type jKeyValue struct {
	Key   string    `json:"key"`
	Value jAnyValue `json:"value"`
}

type jAnyValue struct {
	StringValue *string  `json:"stringValue"`
	BoolValue   *bool    `json:"boolValue"`
	IntValue    *jInt    `json:"intValue"`
	DoubleValue *float64 `json:"doubleValue"`
	BytesValue  *string  `json:"bytesValue"`
	ArrayValue  *struct {
		Values []jAnyValue `json:"values"`
	} `json:"arrayValue"`
	KvlistValue *struct {
		Values []jKeyValue `json:"values"`
	} `json:"kvlistValue"`
}

type jData struct {
	DataPoints []struct {
		Attributes        []jKeyValue `json:"attributes"`
		StartTimeUnixNano jUint       `json:"startTimeUnixNano"`
		TimeUnixNano      jUint       `json:"timeUnixNano"`
		AsInt             *jInt       `json:"asInt"`
		AsDouble          *float64    `json:"asDouble"`
		Count             jUint       `json:"count"`
		Sum               *float64    `json:"sum"`
		Min               *float64    `json:"min"`
		Max               *float64    `json:"max"`
		BucketCounts      []jUint     `json:"bucketCounts"`
		ExplicitBounds    []float64   `json:"explicitBounds"`
	} `json:"dataPoints"`
	AggregationTemporality jInt `json:"aggregationTemporality"`
	IsMonotonic            bool `json:"isMonotonic"`
}

// jInt and jUint accept a JSON number or a decimal string.
type jInt int64
type jUint uint64

func (v *jInt) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseInt(unquote(b), 10, 64)
	*v = jInt(n)
	return err
}

func (v *jUint) UnmarshalJSON(b []byte) error {
	n, err := strconv.ParseUint(unquote(b), 10, 64)
	*v = jUint(n)
	return err
}

func unquote(b []byte) string {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		s = s[1 : len(s)-1]
	}
	return s
}

func attrs(kvs []jKeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.value()
	}
	return m
}

// value converts to string, bool, int64, float64, []byte, []any or map[string]any (nil if empty).
func (v jAnyValue) value() any {
	switch {
	case v.StringValue != nil:
		return *v.StringValue
	case v.BoolValue != nil:
		return *v.BoolValue
	case v.IntValue != nil:
		return int64(*v.IntValue)
	case v.DoubleValue != nil:
		return *v.DoubleValue
	case v.BytesValue != nil:
		b, err := base64.StdEncoding.DecodeString(*v.BytesValue)
		if err != nil {
			return *v.BytesValue
		}
		return b
	case v.ArrayValue != nil:
		out := make([]any, 0, len(v.ArrayValue.Values))
		for _, e := range v.ArrayValue.Values {
			out = append(out, e.value())
		}
		return out
	case v.KvlistValue != nil:
		return attrs(v.KvlistValue.Values)
	}
	return nil
}
