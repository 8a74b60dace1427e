// Package daemon runs lattrace on a node: it opens the outputs, the tracer
// and the local API, runs every record through the pipeline (enrich,
// attribute, diagnose, fan out) and reports its own health (hooks attached,
// records read, drops) so that nothing is lost silently.
package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/daemon/kube"
	"github.com/lattrace/lattrace/daemon/memguard"
	"github.com/lattrace/lattrace/daemon/pipeline"
	"github.com/lattrace/lattrace/daemon/private"
	"github.com/lattrace/lattrace/daemon/requests"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/jsonl"
	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/exporters/prometheus"
	"github.com/lattrace/lattrace/record"
)

// Daemon is a running tracer with its pipeline, outputs and API.
type Daemon struct {
	cfg   Config
	log   *slog.Logger
	start time.Time

	agg  *aggregate.Aggregator
	hist *history.History
	// requests makes request trees of the exchanges (package requests).
	requests *requests.Tracker
	// Each is nil when not configured.
	jsonl *jsonl.Writer
	otlp  *otlp.Exporter
	prom  *prometheus.Server
	kube  *kube.Resolver
	api   *api.Server
	apiLs []net.Listener

	tracer   *tracer.Tracer
	pipeline *pipeline.Pipeline
	guard    *memguard.Guard
	// durable are the outputs whose records outlive the daemon; each is
	// resumed across restarts (tracer.Resume).
	durable []durable
	// closers undo what New opened, the last opened first.
	closers []func()
}

type durable struct {
	name string
	out  tracer.Durable
}

// New opens the outputs, loads the tracer and opens the API; Run then
// traces. On error, what was opened is closed again.
func New(cfg Config, log *slog.Logger) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, start: time.Now(), agg: aggregate.New(cfg.Aggregate)}
	d.hist = history.New(history.Config{Flows: d.agg.Config().ActiveFlows})
	if err := d.open(); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// open opens the outputs first: a file or port that cannot be opened
// fails before anything is loaded into the kernel. The API comes after
// the tracer: without privilege, the line to give is the tracer's, which
// names what is missing.
func (d *Daemon) open() error {
	if err := d.openJSONL(); err != nil {
		return err
	}
	if err := d.openTelemetry(); err != nil {
		return err
	}
	d.startKube()
	if err := d.openTracer(); err != nil {
		return err
	}
	if err := d.openAPI(); err != nil {
		return err
	}
	d.guard = memguard.New(memguard.Config{Limit: d.cfg.MemoryLimit, Logger: d.log}, memguard.Actions{
		ShedHistory: d.shedHistory, ShedFlows: d.agg.Shed, LimitSockets: d.tracer.LimitSockets,
	})
	d.closers = append(d.closers, func() {
		// The pause and the budget are in a pinned map: they would
		// outlive the daemon.
		if err := d.tracer.LimitSockets(-1); err != nil {
			d.log.Warn("new sockets may stay unfollowed until the next daemon", "err", err)
		}
	})
	d.serveHealth()
	return nil
}

// shedHistory is the memory guard's first step: the history of recent
// exchanges, and the exchanges held for request trees.
func (d *Daemon) shedHistory() int {
	n := d.hist.Shed()
	if d.requests != nil {
		n += d.requests.Shed()
	}
	return n
}

// Run traces until ctx is done, then drains what the kernel still holds and
// closes everything New opened.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.logExports() // after the exporter's shutdown: final numbers
	defer d.close()
	// A hook counts once, attached when it or an alternative is.
	hooks := d.tracer.Hooks()
	total := 0
	for _, h := range hooks {
		if h.FallbackFor == "" {
			total++
		}
	}
	attached := total - len(tracer.FeaturesOff(hooks))
	d.log.Info("tracing", "hooks_attached", attached, "hooks_total", total, "output", d.cfg.Output, "max_procs", runtime.GOMAXPROCS(0))
	go d.reportHealth(ctx)
	// The guard watches until the tracer's last drain is done, not only
	// until the stop begins: the stop's sweep writes every exchange in
	// progress, and under a memory limit that drain, unguarded and with
	// the pause lifted, got the daemon killed. It is done, its pause
	// lifted, before anything closes: a look still running could
	// otherwise pause the programs after the closer lifted it, and in a
	// pinned map that outlives the daemon.
	guardCtx, stopGuard := context.WithCancel(context.WithoutCancel(ctx))
	guardDone := make(chan struct{})
	go func() {
		defer close(guardDone)
		d.guard.Run(guardCtx)
	}()
	defer func() {
		stopGuard()
		<-guardDone
	}()
	d.serve()
	runErr := d.tracer.Run(ctx, d.pipeline)
	d.logStopped()
	if d.jsonl != nil && d.jsonl.Err() != nil {
		return fmt.Errorf("writing JSON lines: %w (%d records dropped)", d.jsonl.Err(), d.jsonl.Dropped())
	}
	return runErr
}

// Run is New followed by Run, for callers that need nothing in between.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	d, err := New(cfg, log)
	if err != nil {
		return err
	}
	return d.Run(ctx)
}

// Aggregator returns the live per-flow and per-peer statistics.
func (d *Daemon) Aggregator() *aggregate.Aggregator { return d.agg }

// Tracer returns the loaded tracer (hooks, counters).
func (d *Daemon) Tracer() *tracer.Tracer { return d.tracer }

func (d *Daemon) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
	d.closers = nil
}

// openJSONL opens the JSON lines output, on stdout or appending to a file.
func (d *Daemon) openJSONL() error {
	if d.cfg.Output != "jsonl" {
		return nil
	}
	out := os.Stdout
	if p := d.cfg.OutputPath; p != "" && p != "-" {
		// The records are the node's flows: root's alone, as the API is.
		f, err := private.Create(p, os.O_APPEND)
		if err != nil {
			return fmt.Errorf("opening output: %w", err)
		}
		d.closers = append(d.closers, func() { f.Close() })
		out = f
	}
	d.jsonl = jsonl.New(out)
	d.jsonl.OnError = func(err error) {
		d.log.Error("JSON lines output failed; records are dropped and counted from now on", "err", err)
	}
	d.durable = append(d.durable, durable{"jsonl", d.jsonl})
	return nil
}

// openTelemetry opens the OpenTelemetry side: the latency metrics are
// instruments of the OTLP exporter, pushed over OTLP, read by /metrics, or
// both.
func (d *Daemon) openTelemetry() error {
	var ocfg otlp.Config
	switch {
	case d.cfg.OTLP != nil:
		ocfg = *d.cfg.OTLP
	case d.cfg.MetricsAddr != "":
		ocfg = otlp.Config{DisableTraces: true, DisableMetrics: true}
	default:
		return nil
	}
	if d.cfg.MetricsAddr != "" {
		prom, err := prometheus.Listen(d.cfg.MetricsAddr)
		if err != nil {
			return err
		}
		d.prom = prom
		d.closers = append(d.closers, func() { prom.Close() })
		ocfg.MetricReaders = append(ocfg.MetricReaders, prom.Reader())
	}
	ocfg.MaxPeerPairs = d.cfg.MaxPeerPairs
	x, err := otlp.New(context.Background(), ocfg)
	if err != nil {
		return fmt.Errorf("OTLP exporter: %w", err)
	}
	d.otlp = x
	d.closers = append(d.closers, func() {
		// The backend may be down: bounded, and what is lost is counted.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := x.Shutdown(ctx); err != nil {
			d.log.Warn("OTLP exporter shutdown", "err", err)
		}
	})
	d.durable = append(d.durable, durable{"otlp", x})
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
			d.log.Warn("flows gauge", "err", err)
		}
	}
	return nil
}

// startKube watches the cluster's pods and Services for the names of both
// ends of a flow, in a pod; elsewhere there are none, and no noise.
func (d *Daemon) startKube() {
	if !kube.InCluster() {
		return
	}
	r, err := kube.NewInCluster(d.log)
	if err == nil {
		ctx, cancel := context.WithCancel(context.Background())
		if err = r.Start(ctx, 30*time.Second); err == nil {
			d.kube = r
			d.closers = append(d.closers, cancel)
			return
		}
		cancel()
	}
	d.log.Warn("Kubernetes names are off; container ids still come from cgroups", "err", err)
}

// openTracer loads the programs and builds the pipeline that ends in the
// live state and the outputs.
func (d *Daemon) openTracer() error {
	opts := d.cfg.Tracer
	opts.Logger = d.log
	tr, err := tracer.Open(opts)
	if err != nil {
		return err
	}
	d.tracer = tr
	d.closers = append(d.closers, func() { tr.Close() })
	// Loading decoded the kernel's BTF (tens of MB of Go objects), now
	// garbage: hand it back now rather than when the scavenger gets to it,
	// so the daemon's resident memory is what it uses to trace.
	debug.FreeOSMemory()
	outputs := []record.Sink{pipeline.Live(d.agg, d.hist)}
	if d.cfg.RequestTrees {
		reqCfg := requests.Config{Self: uint32(os.Getpid())}
		if d.otlp != nil {
			reqCfg.OnRequest = d.otlp.Request
		}
		d.requests = requests.New(reqCfg)
		outputs = append(outputs, d.requests)
	}
	for _, o := range d.durable {
		outputs = append(outputs, tr.Resume(o.name, o.out))
	}
	d.pipeline = pipeline.New(pipeline.Config{Containers: pipeline.HostContainers(), Kube: d.kube}, outputs...)
	return nil
}

// openAPI opens the local API's listeners; serve answers on them.
func (d *Daemon) openAPI() error {
	if d.cfg.APISocket == "" && d.cfg.APIAddr == "" {
		return nil
	}
	ls, err := api.Listen(d.cfg.APISocket, d.cfg.APIAddr)
	if err != nil {
		return err
	}
	d.apiLs = ls
	d.api = api.NewServer(d.agg, d.hist, d.health, d.inFlight, d.log)
	if d.requests != nil {
		d.api.SetRequests(d.requests)
	}
	d.closers = append(d.closers, func() {
		d.api.Close()
		// Listeners Serve never took are not closed by the server.
		for _, l := range ls {
			l.Close()
		}
	})
	return nil
}

// serve answers the API and /metrics until close.
func (d *Daemon) serve() {
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
}

// logExports says what became of the spans, once the exporter has shut
// down.
func (d *Daemon) logExports() {
	if d.cfg.OTLP == nil {
		return
	}
	st := d.otlp.Stats()
	args := []any{"exchanges", st.Exchanges, "exchanges_exported", st.ExchangesExported, "spans_exported", st.SpansExported,
		"sampled_slow", st.SampledSlow, "sampled_diagnosed", st.SampledDiagnosed, "sampled_rate", st.SampledRate,
		"export_errors", st.ExportErrors, "metric_export_errors", st.MetricErrors}
	for r, n := range st.Unexported {
		args = append(args, "unexported_"+otlp.DropReasons[r], n)
	}
	d.log.Info("OTLP", args...)
}
