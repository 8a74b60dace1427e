package otlp

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/lattrace/lattrace/record"
)

// ScopeName is the instrumentation scope of lattrace's spans and metrics.
const ScopeName = "github.com/lattrace/lattrace/exporters/otlp"

// Exporter is a record.Sink that exports over OTLP.
type Exporter struct {
	cfg     Config
	tp      *sdktrace.TracerProvider // nil with traces off
	tracer  trace.Tracer
	mp      *sdkmetric.MeterProvider // nil with metrics off and no extra readers
	m       *metrics
	clock   clock
	sampler sampler
	syncs   syncState

	// queue batches the spans; spanMu keeps an exchange's spans together
	// in it (spanQueue.begin).
	queue  *spanQueue
	spanMu sync.Mutex
	// sampled: the exchanges recently exported, whose request trees are.
	sampled sampledKeys

	exchanges                                     atomic.Uint64
	spansQueued, spansExported, exchangesExported atomic.Uint64
	exportErrors, metricErrors                    atomic.Uint64
	unexported, spansDropped                      [numDropReasons]atomic.Uint64
	// failing is set by a failed export and cleared by a good one.
	failing atomic.Bool

	shutdownOnce sync.Once
}

// New starts an Exporter. Connections are made lazily: New does not fail
// when the receiver is down.
func New(ctx context.Context, cfg Config) (*Exporter, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("otlp: %w", err)
	}
	if err := cfg.resolveProtocol(); err != nil {
		return nil, fmt.Errorf("otlp: %w", err)
	}
	x := &Exporter{cfg: cfg}
	x.clock.init(cfg.ClockResyncInterval)
	x.sampler.init(cfg)

	res, err := resource.New(ctx,
		resource.WithAttributes(resourceAttrs(cfg)...),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // last: OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("otlp: resource: %w", err)
	}
	if !cfg.DisableTraces {
		if err := x.startTraces(ctx, res); err != nil {
			return nil, err
		}
	}
	if !cfg.DisableMetrics || len(cfg.MetricReaders) > 0 {
		if err := x.startMetrics(ctx, res); err != nil {
			_ = x.Shutdown(ctx)
			return nil, err
		}
	}
	return x, nil
}

// startTraces builds the TracerProvider: the span queue behind the
// counting exporter, every span sampled (the sampler has decided before a
// span starts), and lattrace's IDs.
func (x *Exporter) startTraces(ctx context.Context, res *resource.Resource) error {
	cfg := x.cfg
	exp, err := newSpanExporter(ctx, cfg.Protocol, cfg.exportOptions())
	if err != nil {
		return fmt.Errorf("otlp: trace exporter: %w", err)
	}
	x.queue = newSpanQueue(exp, cfg, queueCounts{x})
	x.tp = sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(x.queue),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithIDGenerator(idGenerator{}),
	)
	x.tracer = x.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(cfg.ServiceVersion))
	x.startSync()
	return nil
}

// startMetrics builds the MeterProvider: lattrace's latency metrics as a
// producer of the OTLP reader (unless metrics are off) and of the extra
// readers, which are given it by their owner.
func (x *Exporter) startMetrics(ctx context.Context, res *resource.Resource) error {
	cfg := x.cfg
	x.m = newMetrics(instrumentation.Scope{Name: ScopeName, Version: cfg.ServiceVersion}, cfg.MaxPeerPairs)
	opts := []sdkmetric.Option{
		sdkmetric.WithResource(res),
		sdkmetric.WithCardinalityLimit(cfg.MaxPeerPairs*16 + 100),
	}
	if !cfg.DisableMetrics {
		exp, err := newMetricExporter(ctx, cfg.Protocol, cfg.exportOptions())
		if err != nil {
			return fmt.Errorf("otlp: metric exporter: %w", err)
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(
			&countingMetricExporter{Exporter: exp, x: x}, sdkmetric.WithInterval(cfg.MetricInterval),
			sdkmetric.WithProducer(x.m))))
	}
	for _, r := range cfg.MetricReaders {
		opts = append(opts, sdkmetric.WithReader(r))
	}
	x.mp = sdkmetric.NewMeterProvider(opts...)
	return nil
}

// Exchange records e in the metrics and, when sampled, exports it as spans.
func (x *Exporter) Exchange(e *record.Exchange) {
	x.exchanges.Add(1)
	if x.m != nil {
		x.m.exchange(e)
	}
	if x.tracer == nil {
		return
	}
	if p, ok := x.sampler.sample(e); ok {
		x.spans(e, p)
	}
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

// Flush does nothing: the span queue and the periodic reader batch.
func (x *Exporter) Flush() {}

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

// Shutdown answers the waiting Syncs, then flushes and stops both
// providers.
func (x *Exporter) Shutdown(ctx context.Context) error {
	var errs []error
	x.shutdownOnce.Do(func() {
		if x.tp != nil {
			x.stopSync()
			// The queue first, whatever ctx: the provider skips its
			// processors once ctx is done, and what waits must still be
			// counted as lost at shutdown.
			errs = append(errs, x.queue.Shutdown(ctx))
			errs = append(errs, x.tp.Shutdown(ctx))
		}
		if x.mp != nil {
			errs = append(errs, x.mp.Shutdown(ctx))
		}
	})
	return errors.Join(errs...)
}

// Stats are the exporter's counters since New. With traces on, every
// exchange it is given ends in one of them: not sampled, over the slow
// budget, or sampled, and every sampled one is exported, dropped for a
// reason, or still queued:
//
//	Exchanges = DroppedSampling + SlowOverBudget + SampledSlow + SampledDiagnosed + SampledRate
//	SampledSlow + SampledDiagnosed + SampledRate = ExchangesExported + QueueExchanges
//	    + Unexported[no_timeline, queue_full, rejected, shutdown]
type Stats struct {
	Exchanges   uint64 // exchanges received
	SampledSlow uint64 // sampled for being at or above SlowThreshold
	// SampledDiagnosed counts exchanges below SlowThreshold sampled
	// because a diagnosis of theirs is a warning or critical.
	SampledDiagnosed uint64
	SlowOverBudget   uint64 // slow or diagnosed, beyond SlowRatePerSecond: not exported
	SampledRate      uint64 // sampled by the rate sample
	DroppedSampling  uint64 // not sampled
	// ExchangesExported counts the sampled exchanges whose spans the
	// backend accepted; SpansExported those spans.
	ExchangesExported uint64
	SpansExported     uint64
	// Unexported counts exchanges not exported, by reason (DropReasons);
	// SpansDropped the spans of the sampled ones among them. The first
	// two are the sampler's (DroppedSampling, SlowOverBudget).
	Unexported   [numDropReasons]uint64
	SpansDropped uint64
	SpansQueued  uint64 // spans offered to the queue: exported, dropped or waiting
	ExportErrors uint64 // failed span export attempts (each batch is tried again)
	MetricErrors uint64 // failed metric export calls
	PeerPairs    uint64 // distinct peer pairs in the metrics
	PeerOverflow uint64 // exchanges folded into the "other" pair
	// QueueExchanges and QueueDepth are the exchanges and spans waiting
	// for export now.
	QueueExchanges uint64
	QueueDepth     uint64
}

// DroppedQueue is the sampled exchanges dropped to make room in a full
// queue.
func (s Stats) DroppedQueue() uint64 { return s.Unexported[dropQueueFull] }

// UnexportedFor is Unexported of the reason named so in DropReasons.
func (s Stats) UnexportedFor(reason string) uint64 {
	for r, name := range DropReasons {
		if name == reason {
			return s.Unexported[r]
		}
	}
	return 0
}

// Stats returns the counters.
func (x *Exporter) Stats() Stats {
	s := Stats{
		Exchanges:         x.exchanges.Load(),
		SampledSlow:       x.sampler.sampledSlow.Load(),
		SampledDiagnosed:  x.sampler.sampledDiagnosed.Load(),
		SlowOverBudget:    x.sampler.slowOverBudget.Load(),
		SampledRate:       x.sampler.sampledRate.Load(),
		DroppedSampling:   x.sampler.dropped.Load(),
		ExchangesExported: x.exchangesExported.Load(),
		SpansExported:     x.spansExported.Load(),
		SpansQueued:       x.spansQueued.Load(),
		ExportErrors:      x.exportErrors.Load(),
		MetricErrors:      x.metricErrors.Load(),
	}
	for r := range s.Unexported {
		s.Unexported[r] = x.unexported[r].Load()
		s.SpansDropped += x.spansDropped[r].Load()
	}
	s.Unexported[dropNotSampled] = s.DroppedSampling
	s.Unexported[dropSlowBudget] = s.SlowOverBudget
	if x.queue != nil {
		e, n := x.queue.depth()
		s.QueueExchanges, s.QueueDepth = uint64(e), uint64(n)
	}
	if x.m != nil {
		s.PeerPairs, s.PeerOverflow = x.m.pairStats()
	}
	return s
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
