// Package daemon runs lattrace on a node: it opens the tracer, fans the
// decoded records out to the aggregator and the configured outputs, and
// reports its own health (hooks attached, records read, drops) so that
// nothing is lost silently.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/containers"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/daemon/kube"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/jsonl"
	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/exporters/prometheus"
	"github.com/lattrace/lattrace/record"
)

// Config is what `lattrace daemon` is told.
type Config struct {
	// Output is "jsonl" (one JSON object per record) or "none".
	Output string
	// OutputPath is the JSON lines file; "-" or empty means stdout.
	OutputPath string
	Tracer     tracer.Options
	Aggregate  aggregate.Config
	// OTLP, when set, exports spans and metrics to an OpenTelemetry backend.
	OTLP *otlp.Config
	// MetricsAddr is where /metrics is served for Prometheus; empty: off.
	MetricsAddr string
	// MaxPeerPairs bounds the metrics' peer-pair series (0: the default).
	MaxPeerPairs int
	// APISocket is the local API's Unix socket (empty: none); APIAddr a
	// loopback host:port to serve it on as well (empty: none).
	APISocket string
	APIAddr   string
	// Version is the build's version, reported by the API's health.
	Version string
}

// DefaultPinPath is where a cluster deployment pins (the chart sets it);
// --cleanup looks there when no --pin-path is given.
const DefaultPinPath = "/sys/fs/bpf/lattrace"

// Outputs the daemon knows.
var Outputs = []string{"jsonl", "none"}

// Validate checks the configuration before anything is loaded.
func (c Config) Validate() error {
	switch c.Output {
	case "jsonl", "none":
	default:
		return fmt.Errorf("unknown output %q (want one of %v)", c.Output, Outputs)
	}
	if c.Tracer.DrainInterval != 0 && (c.Tracer.DrainInterval < time.Millisecond || c.Tracer.DrainInterval > 10*time.Second) {
		return fmt.Errorf("drain interval %v outside 1ms..10s", c.Tracer.DrainInterval)
	}
	if c.Tracer.RingBufferBytes != 0 {
		if err := tracer.CheckRingBufferBytes(uint64(c.Tracer.RingBufferBytes)); err != nil {
			return err
		}
	}
	if c.Output == "none" && c.OutputPath != "" && c.OutputPath != "-" {
		return fmt.Errorf("--output-file %s given with --output none", c.OutputPath)
	}
	if c.Tracer.CgroupPath != "" {
		if err := tracer.CheckCgroup2(c.Tracer.CgroupPath); err != nil {
			return err
		}
	}
	return nil
}

// Daemon is a running tracer with its aggregator and outputs.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	tracer *tracer.Tracer
	agg    *aggregate.Aggregator
	jsonl  *jsonl.Writer
	otlp   *otlp.Exporter
	prom   *prometheus.Server
	hist   *history.History
	api    *api.Server
	apiLs  []net.Listener
	start  time.Time
	// containers names each owner's container before any sink sees it,
	// and kube (in a cluster) its pod and the peer's.
	containers *containers.Resolver
	kube       *kube.Resolver
	sinks      fanout
	// outputs are the sinks whose output outlives the daemon; each goes
	// behind the tracer's Resume once the tracer is open.
	outputs  []output
	closeOut func()
}

type output struct {
	name string
	tracer.Durable
}

// New loads the tracer and opens the outputs; Run then traces.
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, agg: aggregate.New(cfg.Aggregate), closeOut: func() {}, start: time.Now()}
	d.hist = history.New(history.Config{Flows: d.agg.Config().MaxFlows})
	d.sinks = fanout{aggregatorSink{d.agg, d.hist}}
	if root, err := tracer.Cgroup2Root(); err == nil {
		d.containers = containers.New(root)
	}
	if cfg.Output == "jsonl" {
		var out io.Writer = os.Stdout
		if cfg.OutputPath != "" && cfg.OutputPath != "-" {
			f, err := os.OpenFile(cfg.OutputPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
			if err != nil {
				return nil, fmt.Errorf("opening output: %w", err)
			}
			out, d.closeOut = f, func() { f.Close() }
		}
		d.jsonl = jsonl.New(out)
		d.jsonl.OnError = func(err error) {
			log.Error("JSON lines output failed; records are dropped and counted from now on", "err", err)
		}
		d.outputs = append(d.outputs, output{"jsonl", d.jsonl})
	}
	// The latency metrics are OpenTelemetry instruments: pushed over OTLP,
	// read by /metrics, or both.
	ocfg := cfg.OTLP
	if cfg.MetricsAddr != "" {
		prom, err := prometheus.Listen(cfg.MetricsAddr)
		if err != nil {
			d.closeOut()
			return nil, err
		}
		d.prom = prom
		prev := d.closeOut
		d.closeOut = func() { prom.Close(); prev() }
		if ocfg == nil {
			ocfg = &otlp.Config{DisableTraces: true, DisableMetrics: true}
		}
		ocfg.MetricReaders = append(ocfg.MetricReaders, prom.Reader())
	}
	if ocfg != nil {
		ocfg.MaxPeerPairs = cfg.MaxPeerPairs
		x, err := otlp.New(context.Background(), *ocfg)
		if err != nil {
			d.closeOut()
			return nil, fmt.Errorf("OTLP exporter: %w", err)
		}
		d.otlp = x
		d.outputs = append(d.outputs, output{"otlp", x})
		if d.prom != nil {
			d.prom.SetProducer(x.MetricsProducer())
		}
		if mp := x.MeterProvider(); mp != nil {
			_, err := mp.Meter("github.com/lattrace/lattrace/daemon").Int64ObservableGauge("lattrace.flows",
				metric.WithDescription("TCP flows lattrace holds statistics for"),
				metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
					o.Observe(int64(d.agg.Stats().Flows))
					return nil
				}))
			if err != nil {
				log.Warn("flows gauge", "err", err)
			}
		}
		prev := d.closeOut
		d.closeOut = func() {
			// The backend may be down: bounded, and what is lost is counted.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := x.Shutdown(ctx); err != nil {
				log.Warn("OTLP exporter shutdown", "err", err)
			}
			prev()
		}
	}
	// In a pod, names from the API server; elsewhere, none and no noise.
	if kube.InCluster() {
		if err := d.startKube(); err != nil {
			log.Warn("Kubernetes names are off; container ids still come from cgroups", "err", err)
		}
	}
	cfg.Tracer.Logger = log
	tr, err := tracer.Open(cfg.Tracer)
	if err != nil {
		d.closeOut()
		return nil, err
	}
	d.tracer = tr
	// Loading decoded the kernel's BTF (tens of MB of Go objects), now
	// garbage: hand it back now rather than when the scavenger gets to it,
	// so the daemon's resident memory is what it uses to trace.
	debug.FreeOSMemory()
	for _, o := range d.outputs {
		d.sinks = append(d.sinks, tr.Resume(o.name, o.Durable))
	}
	if cfg.APISocket != "" || cfg.APIAddr != "" {
		// After the tracer loaded: without privilege, the line to give is
		// the tracer's, which names what is missing.
		ls, err := api.Listen(cfg.APISocket, cfg.APIAddr)
		if err != nil {
			tr.Close()
			d.closeOut()
			return nil, err
		}
		d.apiLs = ls
		d.api = api.NewServer(d.agg, d.hist, d.health, d.inFlight, log)
		prev := d.closeOut
		d.closeOut = func() {
			d.api.Close()
			// Listeners Serve never took are not closed by the server.
			for _, l := range ls {
				l.Close()
			}
			prev()
		}
	}
	if d.prom != nil {
		d.registerHealth()
		// The probes: the daemon answers while it traces (its required
		// hooks are attached, or New would have failed); the body is the
		// API's health, problems included.
		d.prom.Handle("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			h := d.health()
			h.APIVersion = api.Version
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(h)
		}))
	}
	return d, nil
}

// registerHealth puts the daemon's own counters on /metrics: drops in the
// kernel, decoding, the aggregator's bounds and the exporter's queue.
func (d *Daemon) registerHealth() {
	kernel := func(f func(tracer.Counters) uint64) func() float64 {
		return func() float64 {
			c, _ := d.tracer.Counters()
			return float64(f(c))
		}
	}
	p := d.prom
	p.Counter("lattrace_ringbuf_full_total", "records lost in the kernel: the ring buffer was full", kernel(func(c tracer.Counters) uint64 { return c.RingbufFull }))
	p.Counter("lattrace_storage_fail_total", "sockets lattrace could not follow: socket storage allocation failed", kernel(func(c tracer.Counters) uint64 { return c.StorageFail }))
	p.Counter("lattrace_records_submitted_total", "records the kernel side submitted", kernel(func(c tracer.Counters) uint64 { return c.Submitted }))
	p.Counter("lattrace_records_decoded_total", "records the daemon decoded", kernel(func(c tracer.Counters) uint64 { return c.Decoded }))
	p.Counter("lattrace_decode_errors_total", "records the daemon could not decode", kernel(func(c tracer.Counters) uint64 { return c.DecodeErrors }))
	p.Counter("lattrace_released_unsynced_total", "times records were released to the kernel before every output made them durable (a slow backend held half the ring)", kernel(func(c tracer.Counters) uint64 { return c.ReleasedUnsynced }))
	p.Counter("lattrace_flows_evicted_total", "flows evicted because the aggregator was full", func() float64 { return float64(d.agg.Stats().FlowsEvicted) })
	if d.otlp != nil {
		x := d.otlp
		p.Counter("lattrace_spans_dropped_queue_total", "sampled spans dropped: the export queue was full", func() float64 { return float64(x.Stats().DroppedQueue) })
		p.Counter("lattrace_spans_dropped_slow_budget_total", "slow exchanges not exported: over --span-slow-rate", func() float64 { return float64(x.Stats().SlowOverBudget) })
		p.Gauge("lattrace_export_queue_spans", "spans waiting for export", func() float64 { return float64(x.Stats().QueueDepth) })
		p.Counter("lattrace_export_errors_total", "failed OTLP exports", func() float64 { return float64(x.Stats().ExportErrors + x.Stats().MetricErrors) })
	}
	if d.jsonl != nil {
		j := d.jsonl
		p.Counter("lattrace_jsonl_dropped_total", "records not written to the JSON lines output", func() float64 { return float64(j.Dropped()) })
	}
}

// startKube watches the cluster's pods and services for the names of both
// ends of a flow.
func (d *Daemon) startKube() error {
	r, err := kube.NewInCluster(d.log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx, 30*time.Second); err != nil {
		cancel()
		return err
	}
	d.kube = r
	prev := d.closeOut
	d.closeOut = func() { cancel(); prev() }
	return nil
}

// health is the API's view of the daemon: hooks, counters, and whether
// anything is being lost.
func (d *Daemon) health() api.Health {
	h := api.Health{Version: d.cfg.Version, Started: d.start, Status: "ok", Hooks: d.tracer.Hooks(), Aggregate: d.agg.Stats()}
	c, err := d.tracer.Counters()
	if err != nil {
		h.Problems = append(h.Problems, "reading the kernel counters: "+err.Error())
	}
	h.Kernel = c
	// A hook whose fallback stands in is no problem: the fallback's own
	// status says what it covers.
	covered := map[string]bool{}
	for _, hk := range h.Hooks {
		if hk.Attached && hk.FallbackFor != "" {
			covered[hk.FallbackFor] = true
		}
	}
	for _, hk := range h.Hooks {
		if !hk.Attached && !covered[hk.Program] {
			h.Problems = append(h.Problems, fmt.Sprintf("hook %s not attached (%s): %s", hk.Hook, hk.Feature, hk.Error))
		}
	}
	if c.RingbufFull > 0 {
		h.Problems = append(h.Problems, fmt.Sprintf("%d records lost: the ring buffer was full", c.RingbufFull))
	}
	if c.StorageFail > 0 {
		h.Problems = append(h.Problems, fmt.Sprintf("%d sockets not followed: socket storage allocation failed", c.StorageFail))
	}
	if c.DecodeErrors > 0 {
		h.Problems = append(h.Problems, fmt.Sprintf("%d records could not be decoded", c.DecodeErrors))
	}
	if len(h.Problems) > 0 {
		h.Status = "degraded"
	}
	return h
}

// inFlight reads the exchanges in progress for the API; without the
// iterator (see the health's hooks) there are none to show.
func (d *Daemon) inFlight() []record.InFlight {
	ins, err := d.tracer.InFlight()
	if err != nil && !errors.Is(err, tracer.ErrNoInflight) {
		d.log.Warn("exchanges in progress", "err", err)
	}
	return ins
}

// Aggregator returns the live per-flow and per-peer statistics.
func (d *Daemon) Aggregator() *aggregate.Aggregator { return d.agg }

// Tracer returns the loaded tracer (hooks, counters).
func (d *Daemon) Tracer() *tracer.Tracer { return d.tracer }

// Run traces until ctx is done, then drains what the kernel still holds,
// closes the tracer and the outputs.
func (d *Daemon) Run(ctx context.Context) error {
	if d.cfg.OTLP != nil {
		defer func() { // after the exporter's shutdown below: final numbers
			st := d.otlp.Stats()
			d.log.Info("OTLP", "spans_exported", st.SpansExported, "spans_failed", st.SpansFailed,
				"dropped_sampling", st.DroppedSampling, "dropped_slow_budget", st.SlowOverBudget, "dropped_queue", st.DroppedQueue, "export_errors", st.ExportErrors)
		}()
	}
	defer d.closeOut()
	defer d.tracer.Close()
	attached := 0
	for _, h := range d.tracer.Hooks() {
		if h.Attached {
			attached++
		}
	}
	d.log.Info("tracing", "hooks_attached", attached, "hooks_total", len(d.tracer.Hooks()), "output", d.cfg.Output, "max_procs", runtime.GOMAXPROCS(0))

	go d.reportHealth(ctx)
	if d.api != nil {
		go d.api.Serve(d.apiLs)
		for _, l := range d.apiLs {
			d.log.Info("API", "addr", l.Addr().String())
		}
	}
	if d.prom != nil {
		go func() {
			if err := d.prom.Serve(); err != nil {
				d.log.Error("metrics server", "err", err)
			}
		}()
	}
	runErr := d.tracer.Run(ctx, enrichSink{d.sinks, d.containers, d.kube})
	c, err := d.tracer.Counters()
	if err != nil {
		d.log.Warn("reading counters", "err", err)
	}
	a := d.agg.Stats()
	if drops(c) > 0 {
		d.logCounters(slog.LevelWarn, "stopped: records lost", c, a)
	} else {
		d.logCounters(slog.LevelInfo, "stopped", c, a)
	}
	if d.jsonl != nil && d.jsonl.Err() != nil {
		return fmt.Errorf("writing JSON lines: %w (%d records dropped)", d.jsonl.Err(), d.jsonl.Dropped())
	}
	return runErr
}

// healthInterval is how often the daemon logs its counters when a drop
// counter moved: a loss shows up within a minute, not at exit.
const healthInterval = time.Minute

func (d *Daemon) reportHealth(ctx context.Context) {
	tick := time.NewTicker(healthInterval)
	defer tick.Stop()
	var lastDrops uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			c, err := d.tracer.Counters()
			if err != nil {
				continue
			}
			if n := drops(c); n != lastDrops {
				lastDrops = n
				d.logCounters(slog.LevelWarn, "records lost", c, d.agg.Stats())
			}
		}
	}
}

// drops counts what the kernel side could not record or hand over. A path
// slot taken over (PathFull) loses RTT history, not records.
func drops(c tracer.Counters) uint64 {
	return c.RingbufFull + c.StorageFail + c.DecodeErrors
}

func (d *Daemon) logCounters(level slog.Level, msg string, c tracer.Counters, a aggregate.Counters) {
	d.log.Log(context.Background(), level, msg, "records_submitted", c.Submitted, "records_decoded", c.Decoded, "exchanges", c.Exchanges,
		"ringbuf_full", c.RingbufFull, "storage_fail", c.StorageFail, "decode_errors", c.DecodeErrors,
		"path_entry_failures", c.PathFull, "sockets_without_tx_timestamps", c.TstampOff, "released_unsynced", c.ReleasedUnsynced,
		"flows", a.Flows, "flows_evicted", a.FlowsEvicted)
}

// Run is New followed by Run, for callers that need nothing in between.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	d, err := New(cfg, log)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}

// fanout hands every record to each sink in turn.
type fanout []record.Sink

func (f fanout) Exchange(e *record.Exchange) {
	for _, s := range f {
		s.Exchange(e)
	}
}

func (f fanout) ConnOpen(o record.ConnOpen) {
	for _, s := range f {
		s.ConnOpen(o)
	}
}

func (f fanout) ConnClose(c record.ConnClose) {
	for _, s := range f {
		s.ConnClose(c)
	}
}

func (f fanout) Flush() {
	for _, s := range f {
		s.Flush()
	}
}

// enrichSink adds what the kernel does not know before any output sees a
// record: the owner's container (and pod), the peer's pod or Service, and
// the exchange's diagnoses.
type enrichSink struct {
	fanout
	containers *containers.Resolver // nil without cgroup v2
	kube       *kube.Resolver       // nil outside a cluster
}

func (s enrichSink) owner(o *record.Owner) {
	if s.containers != nil {
		o.ContainerID = s.containers.ContainerID(o.CgroupID)
	}
	if s.kube != nil {
		o.K8s, _ = s.kube.ByContainer(o.ContainerID)
	}
}

func (s enrichSink) Exchange(e *record.Exchange) {
	s.owner(&e.Owner)
	if s.kube != nil {
		e.Peer, _ = s.kube.ByIP(e.Flow.Remote.Addr())
	}
	e.Diagnoses = diagnose.Exchange(e)
	s.fanout.Exchange(e)
}

func (s enrichSink) ConnClose(r record.ConnClose) {
	s.owner(&r.Owner)
	s.fanout.ConnClose(r)
}

// aggregatorSink feeds the aggregator and the recent history and, once per
// drain, retires what has expired.
type aggregatorSink struct {
	*aggregate.Aggregator
	hist *history.History
}

func (a aggregatorSink) Exchange(e *record.Exchange) {
	a.AddExchange(e)
	a.hist.Add(e)
}
func (a aggregatorSink) ConnOpen(o record.ConnOpen)   { a.AddConnOpen(o) }
func (a aggregatorSink) ConnClose(c record.ConnClose) { a.AddConnClose(c) }
func (a aggregatorSink) Flush()                       { a.Expire(record.Now()) }
