// Package otlp exports lattrace's exchanges over OTLP/gRPC with the official
// OpenTelemetry Go SDK: one trace span per sampled exchange (with a child span
// per stage of its timeline) and metrics of every exchange (duration and
// component histograms, TCP counters) per peer pair. It implements
// record.Sink and never blocks the reading goroutine: spans go through the
// SDK's BatchSpanProcessor behind a bounded, counted queue, and metrics are
// aggregated in memory and pushed by a PeriodicReader.
//
// # Clocks
//
// Exchange timestamps are CLOCK_MONOTONIC (bpf_ktime_get_ns); spans need wall
// clock. The exporter measures offset = CLOCK_REALTIME - CLOCK_MONOTONIC by
// reading REALTIME between two MONOTONIC reads (taking their midpoint) when
// it starts, and again whenever an exchange arrives more than
// ClockResyncInterval after the last measurement, so a step of the wall
// clock (NTP, settimeofday) is followed within that interval. A span's start
// and end are shifted by the same offset, so stage durations are exact.
//
// # Both ends in one trace
//
// Both ends of a TCP connection see the same initial sequence numbers and
// the same sequence number where a request starts. The requester names its
// exchange (ISNLocal, ISNRemote, OutSeq), the responder (ISNRemote,
// ISNLocal, InSeq): both are (client ISN, server ISN, request seq). The
// trace ID is SHA-256("lattrace/trace" || those 12 bytes) truncated to 16
// bytes, and the requester's exchange span ID SHA-256("lattrace/span" ||
// ...) truncated to 8. The requester's span gets those IDs from a custom
// sdktrace.IDGenerator (the wanted IDs ride in the context of the root span
// only); the responder starts its span under a remote parent SpanContext
// (trace.ContextWithRemoteSpanContext) with that trace ID and the
// requester's span ID, so two lattrace daemons that never talk to each
// other produce one trace: requester span -> responder span. When both ISNs
// are zero (not known) the IDs are random.
//
// # Sampling
//
// Every exchange is recorded in the metrics. Spans are sampled in one place
// (Exporter.Exchange): an exchange whose Duration is at least
// Config.SlowThreshold is exported within a budget of Config.SlowRatePerSecond
// (a connection storm makes every exchange slow, and a span per exchange
// then costs more than the tracing); the rest go through a token bucket of
// Config.RatePerSecond (burst Config.Burst). The SDK's sampler is
// AlwaysSample. Stats counts the decisions and the fate of exported spans.
package otlp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/lattrace/lattrace/record"
)

// ScopeName is the instrumentation scope of lattrace's spans and metrics.
const ScopeName = "github.com/lattrace/lattrace/exporters/otlp"

// Config configures an Exporter. The zero value exports every exchange as a
// span to the endpoint named by the OTEL_EXPORTER_OTLP_* environment
// variables (default localhost:4317, TLS unless the endpoint says http://).
type Config struct {
	// Endpoint is host:port of an OTLP/gRPC receiver; empty leaves it to
	// OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]ENDPOINT, read by the SDK.
	Endpoint string
	// Protocol is ProtocolGRPC (default) or ProtocolHTTP.
	Protocol string
	// Insecure disables TLS (with Endpoint).
	Insecure bool
	// Headers are sent with every export (also OTEL_EXPORTER_OTLP_HEADERS).
	Headers map[string]string

	// ServiceVersion is the resource's service.version; HostName its
	// host.name (default os.Hostname). service.name is "lattrace".
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override them.
	ServiceVersion string
	HostName       string
	// NodeName is the resource's k8s.node.name (default: $NODE_NAME, which
	// the DaemonSet sets from the downward API); omitted when empty.
	NodeName string

	// SlowThreshold: every exchange at least this long is exported as a
	// span, within SlowRatePerSecond; zero makes every exchange slow, a
	// negative value turns the rule off (only the rate sample is
	// exported).
	SlowThreshold time.Duration
	// SlowRatePerSecond bounds those spans per second, with as deep a
	// burst (default DefaultSlowRate; negative: no bound). Slow exchanges
	// beyond it are counted in Stats.SlowOverBudget.
	SlowRatePerSecond float64
	// RatePerSecond is the token bucket's rate for the other exchanges;
	// zero exports none of them. Burst is its depth (default
	// max(1, RatePerSecond)).
	RatePerSecond float64
	Burst         int

	// MaxQueueSize bounds the spans waiting for export (default 8192).
	// When it is full, sampled exchanges are dropped whole and counted.
	MaxQueueSize int
	// BatchTimeout is the longest a span waits before a batch is sent
	// (default 1 s); MaxExportBatchSize the largest batch (default 512).
	BatchTimeout       time.Duration
	MaxExportBatchSize int
	// ExportTimeout bounds one export call with its retries (default 30 s).
	ExportTimeout time.Duration
	// SyncTimeout bounds how long Sync waits for the backend to
	// acknowledge a drain's spans (default 1 s); a backend that takes
	// longer counts as failing until an export succeeds.
	SyncTimeout time.Duration
	// RetryMaxElapsed is how long a failing batch is retried before it is
	// dropped (default 1 min); retries back off from 500 ms to 5 s.
	RetryMaxElapsed time.Duration

	// MetricInterval is the PeriodicReader's push interval (default 15 s).
	MetricInterval time.Duration
	// MetricReaders are extra readers of the same MeterProvider (e.g. a
	// Prometheus exporter). They read the SDK's instruments; lattrace's
	// latency metrics come from MetricsProducer, which such a reader must
	// be given as a producer too.
	MetricReaders []sdkmetric.Reader
	// MaxPeerPairs caps the distinct peer pairs (comm, remote address,
	// server port, role) in the metrics; further pairs are folded into
	// one "other" pair (default 2000). The SDK's cardinality limit is set
	// above it as a second bound.
	MaxPeerPairs int

	// DisableTraces and DisableMetrics turn either signal off.
	DisableTraces  bool
	DisableMetrics bool

	// ClockResyncInterval is how often the monotonic-to-wall offset is
	// re-measured (default 1 s).
	ClockResyncInterval time.Duration
}

func (c *Config) defaults() {
	if c.SyncTimeout <= 0 {
		c.SyncTimeout = time.Second
	}
	if c.Protocol == "" {
		c.Protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if c.Protocol == "" {
		c.Protocol = ProtocolGRPC
	}
	if c.MaxQueueSize <= 0 {
		c.MaxQueueSize = 8192
	}
	if c.BatchTimeout <= 0 {
		c.BatchTimeout = time.Second
	}
	if c.MaxExportBatchSize <= 0 {
		c.MaxExportBatchSize = 512
	}
	if c.ExportTimeout <= 0 {
		c.ExportTimeout = 30 * time.Second
	}
	if c.RetryMaxElapsed <= 0 {
		c.RetryMaxElapsed = time.Minute
	}
	if c.MetricInterval <= 0 {
		c.MetricInterval = 15 * time.Second
	}
	if c.MaxPeerPairs <= 0 {
		c.MaxPeerPairs = 2000
	}
	if c.Burst <= 0 {
		c.Burst = max(1, int(c.RatePerSecond))
	}
	if c.SlowRatePerSecond == 0 {
		c.SlowRatePerSecond = DefaultSlowRate
	}
	if c.ClockResyncInterval <= 0 {
		c.ClockResyncInterval = time.Second
	}
	if c.NodeName == "" {
		c.NodeName = os.Getenv("NODE_NAME")
	}
	if c.HostName == "" {
		c.HostName, _ = os.Hostname()
	}
}

// DefaultSlowRate is the default budget of slow spans per second. A slow
// exchange is a trace of up to eight spans (the exchange and its stages),
// so 100 a second is 800 spans a second from one node, more than a person
// reads and within what a collector takes from every node of a cluster;
// the metrics still count every exchange. At 1000 a second a connection
// storm, where every exchange is slow, filled the span queue within a
// second and the daemon held some 20 MiB of spans waiting for export.
const DefaultSlowRate = 100

// Stats are the exporter's counters since New.
type Stats struct {
	Exchanges       uint64 // exchanges received
	SampledSlow     uint64 // exported because at or above SlowThreshold
	SlowOverBudget  uint64 // at or above SlowThreshold, beyond SlowRatePerSecond: not exported
	SampledRate     uint64 // exported by the rate sample
	DroppedSampling uint64 // not sampled
	DroppedQueue    uint64 // sampled but dropped: the span queue was full
	SpansQueued     uint64 // spans handed to the batch processor
	SpansExported   uint64 // spans the receiver accepted
	SpansFailed     uint64 // spans in failed exports (after retries)
	ExportErrors    uint64 // failed span export calls
	MetricErrors    uint64 // failed metric export calls
	PeerPairs       uint64 // distinct peer pairs in the metrics
	PeerOverflow    uint64 // exchanges folded into the "other" pair
	QueueDepth      uint64 // spans waiting for export now
}

// Exporter is a record.Sink that exports over OTLP.
type Exporter struct {
	cfg    Config
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	mp     *sdkmetric.MeterProvider
	m      *metrics
	clock  clock
	bucket bucket // the random sample
	slow   bucket // the budget of slow spans

	// pending counts spans ended and not yet handed to the exporter: it
	// bounds the batch processor's queue so that it never drops silently.
	pending atomic.Int64

	exchanges, sampledSlow, slowOverBudget, sampledRate, droppedSampling, droppedQueue atomic.Uint64
	spansQueued, spansExported, spansFailed, exportErrors, metricErrors                atomic.Uint64
	// synced is spansQueued at the last sync that saw them exported (the
	// sync goroutine's); failing is set by a failed export and cleared by
	// a good one.
	synced  uint64
	failing atomic.Bool
	// Syncs waiting for syncLoop; syncKick wakes it. Both, and the
	// closing of syncKick at shutdown, are under syncMu.
	syncMu      sync.Mutex
	syncWaiters []syncWaiter
	syncClosed  bool
	syncKick    chan struct{}
	syncDone    chan struct{}

	shutdownOnce sync.Once
}

// New starts an Exporter. Connections are made lazily: New does not fail
// when the receiver is down.
func New(ctx context.Context, cfg Config) (*Exporter, error) {
	cfg.defaults()
	if cfg.Protocol != ProtocolGRPC && cfg.Protocol != ProtocolHTTP {
		return nil, fmt.Errorf("otlp: protocol %q: want %s or %s", cfg.Protocol, ProtocolGRPC, ProtocolHTTP)
	}
	x := &Exporter{cfg: cfg}
	x.clock.init(cfg.ClockResyncInterval)
	x.bucket.init(cfg.RatePerSecond, cfg.Burst)
	x.slow.init(cfg.SlowRatePerSecond, max(1, int(cfg.SlowRatePerSecond)))

	res, err := resource.New(ctx,
		resource.WithAttributes(resourceAttrs(cfg)...),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // last: OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("otlp: resource: %w", err)
	}

	if !cfg.DisableTraces {
		exp, err := newSpanExporter(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("otlp: trace exporter: %w", err)
		}
		bsp := sdktrace.NewBatchSpanProcessor(&countingSpanExporter{SpanExporter: exp, x: x},
			// Margin above our own bound: the gate in Exchange keeps the
			// queue below MaxQueueSize, so the SDK never drops uncounted.
			sdktrace.WithMaxQueueSize(cfg.MaxQueueSize+64),
			sdktrace.WithMaxExportBatchSize(cfg.MaxExportBatchSize),
			sdktrace.WithBatchTimeout(cfg.BatchTimeout),
			sdktrace.WithExportTimeout(cfg.ExportTimeout),
		)
		x.tp = sdktrace.NewTracerProvider(
			sdktrace.WithSpanProcessor(bsp),
			sdktrace.WithResource(res),
			sdktrace.WithSampler(sdktrace.AlwaysSample()),
			sdktrace.WithIDGenerator(idGenerator{}),
		)
		x.tracer = x.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(cfg.ServiceVersion))
		x.syncKick, x.syncDone = make(chan struct{}, 1), make(chan struct{})
		go x.syncLoop()
	}

	if !cfg.DisableMetrics || len(cfg.MetricReaders) > 0 {
		x.m = newMetrics(instrumentation.Scope{Name: ScopeName, Version: cfg.ServiceVersion}, cfg.MaxPeerPairs)
		mopts := []sdkmetric.Option{
			sdkmetric.WithResource(res),
			sdkmetric.WithCardinalityLimit(cfg.MaxPeerPairs*16 + 100),
		}
		if !cfg.DisableMetrics {
			mexp, err := newMetricExporter(ctx, cfg)
			if err != nil {
				_ = x.Shutdown(ctx)
				return nil, fmt.Errorf("otlp: metric exporter: %w", err)
			}
			mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(
				&countingMetricExporter{Exporter: mexp, x: x}, sdkmetric.WithInterval(cfg.MetricInterval),
				sdkmetric.WithProducer(x.m))))
		}
		for _, r := range cfg.MetricReaders {
			mopts = append(mopts, sdkmetric.WithReader(r))
		}
		x.mp = sdkmetric.NewMeterProvider(mopts...)
	}
	return x, nil
}

// MetricsProducer hands lattrace's latency metrics to a metric reader
// (nil with metrics off and no extra readers). The OTLP reader has it
// already; a reader in Config.MetricReaders needs it as a producer
// (prometheus.Server.SetProducer).
func (x *Exporter) MetricsProducer() sdkmetric.Producer {
	if x.m == nil {
		return nil
	}
	return x.m
}

// MeterProvider is the exporter's MeterProvider (nil with metrics off and
// no extra readers), for other instruments to share.
func (x *Exporter) MeterProvider() *sdkmetric.MeterProvider { return x.mp }

// TracerProvider is the exporter's TracerProvider (nil with traces off).
func (x *Exporter) TracerProvider() *sdktrace.TracerProvider { return x.tp }

// Exchange records e in the metrics and, when sampled, exports it as spans.
func (x *Exporter) Exchange(e *record.Exchange) {
	x.exchanges.Add(1)
	if x.m != nil {
		x.m.exchange(e)
	}
	if x.tracer == nil {
		return
	}
	switch {
	case x.cfg.SlowThreshold >= 0 && e.Duration >= x.cfg.SlowThreshold:
		if x.cfg.SlowRatePerSecond > 0 && !x.slow.take(e.Time) {
			x.slowOverBudget.Add(1)
			return
		}
		x.sampledSlow.Add(1)
	case x.bucket.take(e.Time):
		x.sampledRate.Add(1)
	default:
		x.droppedSampling.Add(1)
		return
	}
	x.spans(e)
}

// ConnOpen counts the connection.
func (x *Exporter) ConnOpen(c record.ConnOpen) {
	if x.m != nil {
		x.m.connOpen(c)
	}
}

// ConnClose counts the connection and forgets its turn count.
func (x *Exporter) ConnClose(c record.ConnClose) {
	if x.m != nil {
		x.m.connClose(c)
	}
}

// Flush does nothing: the batch processor and the periodic reader batch.
func (x *Exporter) Flush() {}

// errBackendFailing: a sync does not wait for a backend whose last export
// failed; its spans wait in the bounded queue (drops counted) and the
// batch processor goes on retrying.
var errBackendFailing = errors.New("otlp: the backend's last export failed; spans wait in the queue")

// errShutdown answers the syncs still waiting when the exporter shuts down.
var errShutdown = errors.New("otlp: the exporter shut down")

// Sync asks that the spans queued so far be acknowledged by the backend and
// returns at once; done is called once they are, or with the reason they
// are not: the backend did not answer within SyncTimeout, or its last
// export failed (then it is not waited for again until an export gets
// through). A pinned daemon releases a drain's records only after that
// (tracer.Resume); the wait happens on the exporter's own goroutine, so the
// ring buffer's reader never waits for the network. Syncs asked while one
// is in progress are answered together by the next.
func (x *Exporter) Sync(done func(error)) {
	if x.tp == nil {
		done(nil)
		return
	}
	x.syncMu.Lock()
	if x.syncClosed {
		x.syncMu.Unlock()
		done(errShutdown)
		return
	}
	x.syncWaiters = append(x.syncWaiters, syncWaiter{queued: x.spansQueued.Load(), done: done})
	select {
	case x.syncKick <- struct{}{}:
	default: // a kick is pending: it will see this waiter
	}
	x.syncMu.Unlock()
}

// syncWaiter is a Sync to answer once the spans queued before it are out.
type syncWaiter struct {
	queued uint64
	done   func(error)
}

// syncLoop answers Syncs, one backend round trip for all those waiting.
// A round trip exports whatever is queued when it starts, so the Syncs
// asked during it whose spans it covered are answered with it rather than
// after one more: a daemon killed in between would send those spans again.
func (x *Exporter) syncLoop() {
	defer close(x.syncDone)
	for range x.syncKick {
		waiters := x.takeWaiters(math.MaxUint64)
		if len(waiters) == 0 {
			continue
		}
		err := x.syncNow()
		if err == nil {
			waiters = append(waiters, x.takeWaiters(x.synced)...)
		}
		for _, w := range waiters {
			w.done(err)
		}
	}
	for _, w := range x.takeWaiters(math.MaxUint64) {
		w.done(errShutdown)
	}
}

// takeWaiters removes the waiting Syncs whose spans were queued by the
// time upTo spans were, and returns them.
func (x *Exporter) takeWaiters(upTo uint64) []syncWaiter {
	x.syncMu.Lock()
	defer x.syncMu.Unlock()
	var taken, left []syncWaiter
	for _, w := range x.syncWaiters {
		if w.queued <= upTo {
			taken = append(taken, w)
		} else {
			left = append(left, w)
		}
	}
	x.syncWaiters = left
	return taken
}

// syncNow waits, at most SyncTimeout, until the spans queued so far are
// exported.
func (x *Exporter) syncNow() error {
	queued := x.spansQueued.Load()
	if queued == x.synced {
		return nil
	}
	if x.failing.Load() {
		return errBackendFailing
	}
	ctx, cancel := context.WithTimeout(context.Background(), x.cfg.SyncTimeout)
	defer cancel()
	errs := x.exportErrors.Load()
	if err := x.tp.ForceFlush(ctx); err != nil {
		// A backend that does not answer in time is failing until an
		// export gets through: the next syncs do not wait for it.
		x.failing.Store(true)
		return fmt.Errorf("otlp: waiting for the backend: %w", err)
	}
	if x.exportErrors.Load() != errs {
		return errBackendFailing
	}
	x.synced = queued
	return nil
}

// ForceFlush exports what is queued and collects the metrics now.
func (x *Exporter) ForceFlush(ctx context.Context) error {
	var errs []error
	if x.tp != nil {
		errs = append(errs, x.tp.ForceFlush(ctx))
	}
	if x.mp != nil {
		errs = append(errs, x.mp.ForceFlush(ctx))
	}
	return errors.Join(errs...)
}

// Shutdown flushes and stops both providers.
func (x *Exporter) Shutdown(ctx context.Context) error {
	var errs []error
	x.shutdownOnce.Do(func() {
		if x.tp != nil {
			x.syncMu.Lock()
			x.syncClosed = true
			close(x.syncKick)
			x.syncMu.Unlock()
			<-x.syncDone
			errs = append(errs, x.tp.Shutdown(ctx))
		}
		if x.mp != nil {
			errs = append(errs, x.mp.Shutdown(ctx))
		}
	})
	return errors.Join(errs...)
}

// Stats returns the counters.
func (x *Exporter) Stats() Stats {
	s := Stats{
		Exchanges:       x.exchanges.Load(),
		SampledSlow:     x.sampledSlow.Load(),
		SlowOverBudget:  x.slowOverBudget.Load(),
		SampledRate:     x.sampledRate.Load(),
		DroppedSampling: x.droppedSampling.Load(),
		DroppedQueue:    x.droppedQueue.Load(),
		SpansQueued:     x.spansQueued.Load(),
		SpansExported:   x.spansExported.Load(),
		SpansFailed:     x.spansFailed.Load(),
		ExportErrors:    x.exportErrors.Load(),
		MetricErrors:    x.metricErrors.Load(),
		QueueDepth:      uint64(max(x.pending.Load(), 0)),
	}
	if x.m != nil {
		s.PeerPairs, s.PeerOverflow = x.m.pairStats()
	}
	return s
}

// countingSpanExporter counts what the batch processor hands over.
type countingSpanExporter struct {
	sdktrace.SpanExporter
	x *Exporter
}

func (c *countingSpanExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	c.x.pending.Add(-int64(len(spans)))
	err := c.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		c.x.exportErrors.Add(1)
		c.x.spansFailed.Add(uint64(len(spans)))
		c.x.failing.Store(true)
	} else {
		c.x.spansExported.Add(uint64(len(spans)))
		c.x.failing.Store(false)
	}
	return err
}

// countingMetricExporter counts failed metric exports.
type countingMetricExporter struct {
	sdkmetric.Exporter
	x *Exporter
}

func (c *countingMetricExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	err := c.Exporter.Export(ctx, rm)
	if err != nil {
		c.x.metricErrors.Add(1)
	}
	return err
}

// Protocols the exporter speaks (OTEL_EXPORTER_OTLP_PROTOCOL's values).
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// grpcConnect caps gRPC's reconnect backoff so a backend that comes back is
// found within seconds.
var grpcConnect = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
	MinConnectTimeout: 5 * time.Second,
})

func newSpanExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, error) {
	if cfg.Protocol == ProtocolHTTP {
		o := []otlptracehttp.Option{otlptracehttp.WithRetry(otlptracehttp.RetryConfig{
			Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 5 * time.Second, MaxElapsedTime: cfg.RetryMaxElapsed})}
		if cfg.Endpoint != "" {
			o = append(o, otlptracehttp.WithEndpoint(cfg.Endpoint))
			if cfg.Insecure {
				o = append(o, otlptracehttp.WithInsecure())
			}
		}
		if len(cfg.Headers) > 0 {
			o = append(o, otlptracehttp.WithHeaders(cfg.Headers))
		}
		return otlptracehttp.New(ctx, o...)
	}
	o := []otlptracegrpc.Option{otlptracegrpc.WithDialOption(grpcConnect), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{
		Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 5 * time.Second, MaxElapsedTime: cfg.RetryMaxElapsed})}
	if cfg.Endpoint != "" {
		o = append(o, otlptracegrpc.WithEndpoint(cfg.Endpoint))
		if cfg.Insecure {
			o = append(o, otlptracegrpc.WithInsecure())
		}
	}
	if len(cfg.Headers) > 0 {
		o = append(o, otlptracegrpc.WithHeaders(cfg.Headers))
	}
	return otlptracegrpc.New(ctx, o...)
}

func newMetricExporter(ctx context.Context, cfg Config) (sdkmetric.Exporter, error) {
	if cfg.Protocol == ProtocolHTTP {
		o := []otlpmetrichttp.Option{otlpmetrichttp.WithRetry(otlpmetrichttp.RetryConfig{
			Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 5 * time.Second, MaxElapsedTime: cfg.RetryMaxElapsed})}
		if cfg.Endpoint != "" {
			o = append(o, otlpmetrichttp.WithEndpoint(cfg.Endpoint))
			if cfg.Insecure {
				o = append(o, otlpmetrichttp.WithInsecure())
			}
		}
		if len(cfg.Headers) > 0 {
			o = append(o, otlpmetrichttp.WithHeaders(cfg.Headers))
		}
		return otlpmetrichttp.New(ctx, o...)
	}
	o := []otlpmetricgrpc.Option{otlpmetricgrpc.WithDialOption(grpcConnect), otlpmetricgrpc.WithRetry(otlpmetricgrpc.RetryConfig{
		Enabled: true, InitialInterval: 500 * time.Millisecond, MaxInterval: 5 * time.Second, MaxElapsedTime: cfg.RetryMaxElapsed})}
	if cfg.Endpoint != "" {
		o = append(o, otlpmetricgrpc.WithEndpoint(cfg.Endpoint))
		if cfg.Insecure {
			o = append(o, otlpmetricgrpc.WithInsecure())
		}
	}
	if len(cfg.Headers) > 0 {
		o = append(o, otlpmetricgrpc.WithHeaders(cfg.Headers))
	}
	return otlpmetricgrpc.New(ctx, o...)
}

func resourceAttrs(cfg Config) []attribute.KeyValue {
	kv := []attribute.KeyValue{
		attribute.String("service.name", "lattrace"),
		attribute.String("service.version", cfg.ServiceVersion),
		attribute.String("host.name", cfg.HostName),
	}
	if cfg.NodeName != "" {
		kv = append(kv, attribute.String("k8s.node.name", cfg.NodeName))
	}
	return kv
}
