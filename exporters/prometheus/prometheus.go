// Package prometheus serves lattrace's metrics on /metrics for Prometheus to
// scrape. The latency metrics are the same OpenTelemetry instruments the
// OTLP exporter pushes, read through the OpenTelemetry Prometheus exporter,
// so both backends see one set of names (converted to Prometheus
// conventions: lattrace.exchange.duration in seconds becomes
// lattrace_exchange_duration_seconds). The daemon's own health counters are
// registered beside them.
package prometheus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server is a /metrics endpoint with its own registry.
type Server struct {
	reg      *prometheus.Registry
	reader   sdkmetric.Reader
	producer *lateProducer
	ln       net.Listener
	srv      *http.Server
	mux      *http.ServeMux
}

// Listen opens addr (host:port) and prepares the registry; Serve answers.
func Listen(addr string) (*Server, error) {
	reg := prometheus.NewRegistry()
	lp := &lateProducer{}
	reader, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithProducer(lp))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return &Server{reg: reg, reader: reader, producer: lp, ln: ln, mux: mux,
		srv: &http.Server{Handler: readOnly(mux), ReadHeaderTimeout: 5 * time.Second}}, nil
}

// readOnly answers every method but GET and HEAD with 405, on every path:
// a scrape and a probe are GETs, and nothing served here changes the
// daemon.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method "+r.Method+" not allowed: /metrics and /healthz are read-only", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Handle serves h at pattern beside /metrics (the orchestrator's probes
// use the port Prometheus scrapes), for GET and HEAD only. Call it before
// Serve.
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Reader is the OpenTelemetry metric reader to add to the MeterProvider.
func (s *Server) Reader() sdkmetric.Reader { return s.reader }

// SetProducer has each scrape also read p (the OTLP exporter's
// MetricsProducer: lattrace's latency metrics).
func (s *Server) SetProducer(p sdkmetric.Producer) {
	s.producer.mu.Lock()
	defer s.producer.mu.Unlock()
	s.producer.p = p
}

// lateProducer is the producer a scrape reads besides the SDK's
// instruments: the reader exists before it does.
type lateProducer struct {
	mu sync.Mutex
	p  sdkmetric.Producer
}

func (l *lateProducer) Produce(ctx context.Context) ([]metricdata.ScopeMetrics, error) {
	l.mu.Lock()
	p := l.p
	l.mu.Unlock()
	if p == nil {
		return nil, nil
	}
	return p.Produce(ctx)
}

// Addr is where the server listens.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Counter registers a monotonic counter read from f at each scrape.
func (s *Server) Counter(name, help string, f func() float64) {
	s.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, f))
}

// Counters registers a counter with one label, a series per value in
// values, read together from f at each scrape (f returns one number per
// value, in their order).
func (s *Server) Counters(name, help, label string, values []string, f func() []float64) {
	s.reg.MustRegister(&labelledCounters{desc: prometheus.NewDesc(name, help, []string{label}, nil), values: values, read: f})
}

// labelledCounters is a counter whose series are read from one function:
// client_golang's CounterFunc takes no labels.
type labelledCounters struct {
	desc   *prometheus.Desc
	values []string
	read   func() []float64
}

func (c *labelledCounters) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *labelledCounters) Collect(ch chan<- prometheus.Metric) {
	for i, v := range c.read() {
		if i < len(c.values) {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, v, c.values[i])
		}
	}
}

// Series is one series of a metric whose labels are read at each scrape:
// its label values, in the metric's order, and its value.
type Series struct {
	Labels []string
	Value  float64
}

// Dynamic registers a metric (counter when counter is set, else gauge)
// whose series, labels included, f lists at each scrape: rows that come
// and go (request trees' service edges). f bounds how many it lists.
func (s *Server) Dynamic(name, help string, counter bool, labels []string, f func() []Series) {
	t := prometheus.GaugeValue
	if counter {
		t = prometheus.CounterValue
	}
	s.reg.MustRegister(&dynamic{desc: prometheus.NewDesc(name, help, labels, nil), typ: t, read: f})
}

type dynamic struct {
	desc *prometheus.Desc
	typ  prometheus.ValueType
	read func() []Series
}

func (d *dynamic) Describe(ch chan<- *prometheus.Desc) { ch <- d.desc }

func (d *dynamic) Collect(ch chan<- prometheus.Metric) {
	for _, r := range d.read() {
		if m, err := prometheus.NewConstMetric(d.desc, d.typ, r.Value, r.Labels...); err == nil {
			ch <- m
		}
	}
}

// Gauge registers a gauge read from f at each scrape.
func (s *Server) Gauge(name, help string, f func() float64) {
	s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f))
}

// Serve answers until Close.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Close stops the server, and its listener when Serve never ran.
func (s *Server) Close() error {
	err := s.srv.Close() // first: Serve then returns ErrServerClosed
	s.ln.Close()
	return err
}
