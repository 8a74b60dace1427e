package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/memguard"
	"github.com/lattrace/lattrace/daemon/pipeline"
	"github.com/lattrace/lattrace/daemon/requests"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/otlp"
	"github.com/lattrace/lattrace/exporters/prometheus"
	"github.com/lattrace/lattrace/record"
)

// health is the API's view of the daemon: hooks, counters, and whether
// anything is being lost.
func (d *Daemon) health() api.Health {
	hooks := d.tracer.Hooks()
	h := api.Health{Version: d.cfg.Version, Started: d.start, Status: "ok", Hooks: make([]api.Hook, len(hooks)), Aggregate: d.agg.Stats()}
	for i, hk := range hooks {
		h.Hooks[i] = api.Hook(hk)
	}
	c, err := d.tracer.Counters()
	if err != nil {
		h.Problems = append(h.Problems, "reading the kernel counters: "+err.Error())
	}
	h.Kernel = api.KernelCounters(c)
	// A hook whose fallback stands in is no problem: the fallback's own
	// status says what it covers.
	for _, hk := range tracer.FeaturesOff(hooks) {
		h.Problems = append(h.Problems, hk.Unavailable())
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
	if n := h.Aggregate.PackErrors; n > 0 {
		h.Problems = append(h.Problems, fmt.Sprintf("%d flows dropped: their packed state did not decode", n))
	}
	if g := d.guard.Stats(); g.Level > 0 {
		h.Problems = append(h.Problems, fmt.Sprintf("memory at %.0f %% of its limit (%d MiB): shedding the %s", 100*float64(g.WorkingSet)/float64(g.Limit), g.Limit>>20, memguard.Steps[g.Level]))
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

// serveHealth puts the daemon's own counters on /metrics (drops in the
// kernel, decoding, the aggregator's bounds, the exporters' queues) and
// answers the probes: the daemon answers while it traces (its required
// hooks are attached, or New would have failed), with the API's health,
// problems included, as the body.
func (d *Daemon) serveHealth() {
	p := d.prom
	if p == nil {
		return
	}
	kernel := func(f func(tracer.Counters) uint64) func() float64 {
		return func() float64 {
			c, _ := d.tracer.Counters()
			return float64(f(c))
		}
	}
	p.Counter("lattrace_ringbuf_full_total", "records lost in the kernel: the ring buffer was full", kernel(func(c tracer.Counters) uint64 { return c.RingbufFull }))
	p.Counter("lattrace_storage_fail_total", "sockets lattrace could not follow: socket storage allocation failed", kernel(func(c tracer.Counters) uint64 { return c.StorageFail }))
	p.Counter("lattrace_records_submitted_total", "records the kernel side submitted", kernel(func(c tracer.Counters) uint64 { return c.Submitted }))
	p.Counter("lattrace_records_decoded_total", "records the daemon decoded", kernel(func(c tracer.Counters) uint64 { return c.Decoded }))
	p.Counter("lattrace_decode_errors_total", "records the daemon could not decode", kernel(func(c tracer.Counters) uint64 { return c.DecodeErrors }))
	p.Counter("lattrace_http2_unsynced_total", "HTTP/2 connections whose framing was lost in a direction (a gap in the segments): their frame counts stop there", kernel(func(c tracer.Counters) uint64 { return c.H2Unsynced }))
	p.Counter("lattrace_http2_streams_total", "exchanges made of HTTP/2 streams (each replaces the connection's own exchanges)", kernel(func(c tracer.Counters) uint64 { return c.H2Streams }))
	p.Counter("lattrace_http2_frames_unplaced_total", "outgoing HTTP/2 frames whose write was not seen: their departure stands in for the write", kernel(func(c tracer.Counters) uint64 { return c.H2Unplaced }))
	p.Counter("lattrace_http2_streams_unread_total", "HTTP/2 streams written without the read of their incoming message (no local read time)", kernel(func(c tracer.Counters) uint64 { return c.H2Unread }))
	p.Counter("lattrace_http2_connection_exchanges_replaced_total", "connection-level exchanges of HTTP/2 connections dropped for their streams' exchanges", kernel(func(c tracer.Counters) uint64 { return c.H2ConnReplaced }))
	p.Counter("lattrace_http2_frames_ignored_total", "HTTP/2 frames of streams already written (after a reset) or beyond the open streams a connection may keep", kernel(func(c tracer.Counters) uint64 { return c.H2Ignored }))
	p.Counter("lattrace_exchanges_replayed_unsure_total", "exchanges a daemon restarted after a kill gave an output again that the killed daemon may have delivered (an acknowledgement in flight at the kill)", kernel(func(c tracer.Counters) uint64 { return c.ReplayedUnsure }))
	p.Counter("lattrace_released_unsynced_total", "times records were released to the kernel before every output made them durable (a slow backend held half the ring)", kernel(func(c tracer.Counters) uint64 { return c.ReleasedUnsynced }))
	p.Counter("lattrace_flows_evicted_total", "flows evicted because the aggregator was full", func() float64 { return float64(d.agg.Stats().FlowsEvicted) })
	p.Gauge("lattrace_flows_packed", "flows held packed: not updated since the most recently updated ones (--active-flows) were", func() float64 { return float64(d.agg.Stats().PackedFlows) })
	guard := func(f func(memguard.Stats) float64) func() float64 {
		return func() float64 { return f(d.guard.Stats()) }
	}
	p.Gauge("lattrace_memory_limit_bytes", "the memory limit the daemon keeps under (its cgroup's, or --memory-limit-mib); 0: none", guard(func(s memguard.Stats) float64 { return float64(s.Limit) }))
	p.Gauge("lattrace_memory_working_set_bytes", "what counts against that limit: the cgroup's working set, BPF maps included", guard(func(s memguard.Stats) float64 { return float64(s.WorkingSet) }))
	p.Gauge("lattrace_memory_go_limit_bytes", "the Go runtime's memory limit as the daemon last set it (0: not set, GOMEMLIMIT from the environment or no limit)", guard(func(s memguard.Stats) float64 { return float64(s.GoLimit) }))
	p.Gauge("lattrace_memory_shed_step", "what is being shed for memory: 0 nothing, 1 the history of recent exchanges, 2 flows too, 3 new sockets not followed too", guard(func(s memguard.Stats) float64 { return float64(s.Level) }))
	p.Counter("lattrace_history_shed_total", "exchanges dropped from the history of recent exchanges for memory", guard(func(s memguard.Stats) float64 { return float64(s.HistoryShed) }))
	p.Counter("lattrace_flows_shed_total", "flows dropped with their statistics for memory (their peer pairs keep theirs)", guard(func(s memguard.Stats) float64 { return float64(s.FlowsShed) }))
	p.Counters("lattrace_connections_adopted_total", "ends of connections open before lattrace started that it follows (both ends of a connection within the node count), by how the end's role was told: server (a listener on its local port), client (none), guessed (from the ports: the namespace's listeners were never read)",
		"role", []string{"server", "client", "guessed"}, func() []float64 {
			c, _ := d.tracer.Counters()
			return []float64{float64(c.AdoptedServer), float64(c.AdoptedClient), float64(c.AdoptedGuessed)}
		})
	p.Counters("lattrace_exchanges_rejected_total", "exchanges that are no latency sample by the model's own rules, by reason: overlap (request and answer overlap, or the answer came sooner than the path's minimum round trip: multiplexed), no_path_rtt (no RTT sample to bound the network part), network_below_path_rtt, role_guessed (a connection open before lattrace whose role is a guess)",
		"reason", pipeline.RejectReasons, func() []float64 {
			n := d.pipeline.Rejected()
			out := make([]float64, len(n))
			for i, v := range n {
				out[i] = float64(v)
			}
			return out
		})
	p.Counters("lattrace_http2_adopted_total", "ends of HTTP/2 connections open before lattrace started (both ends of a connection within the node count), by whether their framing was found from frame headers: synced (streams followed from there) or lost (it looked like HTTP/2 but was not confirmed: the connection's own exchanges, no latency samples while it was tried)",
		"framing", []string{"synced", "lost"}, func() []float64 {
			c, _ := d.tracer.Counters()
			return []float64{float64(c.H2Resynced), float64(c.H2ResyncLost)}
		})
	if d.requests != nil {
		reqs := func(f func(requests.Stats) float64) func() float64 {
			return func() float64 { return f(d.requests.Stats()) }
		}
		edges := func(turns bool) func() []prometheus.Series {
			return func() []prometheus.Series {
				var out []prometheus.Series
				for _, e := range d.requests.Edges() {
					v := e.ExchangesPerRequest
					if turns {
						v = e.TurnsPerRequest
					}
					out = append(out, prometheus.Series{Labels: []string{e.Endpoint, e.From, e.To}, Value: v})
				}
				return out
			}
		}
		p.Dynamic("lattrace_request_edge_exchanges_per_request", "exchanges per request to a root endpoint on one service edge (from, to: pod, else command), over the requests seen", false,
			[]string{"endpoint", "from", "to"}, edges(false))
		p.Dynamic("lattrace_request_edge_turns_per_request", "turns (changes of direction) per request to a root endpoint on one service edge: the seed's turns per request between two tiers", false,
			[]string{"endpoint", "from", "to"}, edges(true))
		p.Dynamic("lattrace_request_ambiguous_exchanges_total", "outbound exchanges more than one inbound exchange of their process could own, by the process's command: each roots a detached request", true,
			[]string{"comm"}, func() []prometheus.Series {
				byComm := map[string]float64{}
				for _, a := range d.requests.Ambiguous() {
					byComm[a.Comm] += float64(a.Exchanges)
				}
				var out []prometheus.Series
				for c, n := range byComm {
					out = append(out, prometheus.Series{Labels: []string{c}, Value: n})
				}
				return out
			})
		p.Gauge("lattrace_request_exchanges_held", "exchanges held until their request trees form (middle tiers' exchanges and calls naming a request; at most 100,000, shed first under memory pressure)",
			func() float64 { return float64(d.requests.Held()) })
		p.Counter("lattrace_requests_total", "request trees made: a root exchange and every exchange made on the node to answer it (lattrace requests)", reqs(func(s requests.Stats) float64 { return float64(s.Requests) }))
		p.Counters("lattrace_request_hops_linked_total", "exchanges linked under the request they ran inside, by the evidence: thread (the writing thread read the request), goroutine (the same, a Go program's goroutine), handoff (the thread that read it woke the writer), go_parent (the goroutine that read it started the writer), window (no evidence; the only request of its process whose window held it)",
			"method", linkMethods, func() []float64 {
				s := d.requests.Stats()
				out := make([]float64, len(linkMethods))
				for i, m := range linkMethods {
					out[i] = float64(s.Linked[record.LinkMethod(m)])
				}
				return out
			})
		p.Counters("lattrace_request_hops_unlinked_total", "exchanges left out of request trees, by reason: ambiguous (outbound exchanges more than one inbound request of their process could own; per process in lattrace requests), orphaned (held exchanges whose request's record never came), dropped (held exchanges over the bound), shed (held exchanges let go for the daemon's memory), truncated (a tree over its bound of hops)",
			"reason", []string{"ambiguous", "orphaned", "dropped", "shed", "truncated"}, func() []float64 {
				s := d.requests.Stats()
				return []float64{float64(s.Ambiguous), float64(s.Orphaned), float64(s.Dropped), float64(s.Shed), float64(s.Truncated)}
			})
	}
	p.Gauge("lattrace_go_programs_followed", "Go processes whose goroutines the request evidence follows (the goroutine that read a request is the context, not the thread)", func() float64 {
		f, _, _ := d.tracer.GoPrograms()
		return float64(f)
	})
	p.Gauge("lattrace_go_programs_unfollowed", "Go processes whose goroutines cannot be followed (another architecture, a Go before 1.21): no request evidence is gathered in them", func() float64 {
		_, u, _ := d.tracer.GoPrograms()
		return float64(u)
	})
	p.Counter("lattrace_go_programs_lost_total", "Go processes the request evidence could not note (its table full): their threads taken for contexts", func() float64 {
		_, _, full := d.tracer.GoPrograms()
		return float64(full)
	})
	p.Counter("lattrace_request_links_lost_total", "outbound exchanges whose kernel evidence of the request they served could not be kept (its table full, or evicted by newer evidence before the exchange was written): linked by timing alone", kernel(func(c tracer.Counters) uint64 { return c.LinksLost }))
	p.Counter("lattrace_listeners_lost_total", "listening sockets lattrace could not count (its table full): roles of connections open before it may be wrong in their namespace", kernel(func(c tracer.Counters) uint64 { return c.ListenersLost }))
	p.Counter("lattrace_netns_unseeded_total", "network namespaces whose listening sockets could not be read at the start: roles of their connections open before lattrace are guessed", kernel(func(c tracer.Counters) uint64 { return c.NetnsUnseeded }))
	p.Counter("lattrace_sockets_unfollowed_total", "connection ends born while new sockets were not followed, for memory", kernel(func(c tracer.Counters) uint64 { return c.SocketsUnfollowed }))
	p.Counter("lattrace_flows_pack_errors_total", "flows dropped because their packed state did not decode", func() float64 { return float64(d.agg.Stats().PackErrors) })
	if x := d.otlp; x != nil {
		p.Counter("lattrace_spans_sampled_slow_total", "exchanges sampled as spans for being at or above --span-slow-threshold", func() float64 { return float64(x.Stats().SampledSlow) })
		p.Counter("lattrace_spans_sampled_diagnosed_total", "exchanges below --span-slow-threshold sampled as spans for a warning or critical diagnosis", func() float64 { return float64(x.Stats().SampledDiagnosed) })
		p.Counter("lattrace_spans_sampled_rate_total", "exchanges sampled as spans by the rate sample (--span-rate, --span-ratio)", func() float64 { return float64(x.Stats().SampledRate) })
		p.Counter("lattrace_exchanges_exported_total", "exchanges whose spans the OTLP receiver accepted", func() float64 { return float64(x.Stats().ExchangesExported) })
		p.Counters("lattrace_exchanges_unexported_total", "exchanges not exported as spans, by reason: not_sampled and slow_budget by the sampler; no_timeline, queue_full (made room for a newer or more important one), rejected (the backend refused the content) and shutdown (still queued at the stop) among the sampled",
			"reason", otlp.DropReasons[:], func() []float64 {
				st := x.Stats()
				out := make([]float64, len(st.Unexported))
				for i, n := range st.Unexported {
					out[i] = float64(n)
				}
				return out
			})
		p.Counter("lattrace_spans_exported_total", "spans the OTLP receiver accepted: this node's load on a collector or gateway", func() float64 { return float64(x.Stats().SpansExported) })
		p.Gauge("lattrace_export_queue_spans", "spans waiting for export", func() float64 { return float64(x.Stats().QueueDepth) })
		p.Gauge("lattrace_export_queue_exchanges", "exchanges waiting for export", func() float64 { return float64(x.Stats().QueueExchanges) })
		p.Counters("lattrace_export_errors_total", "failed OTLP export attempts, by signal (a batch of spans that failed waits in the queue and is tried again)",
			"signal", []string{"spans", "metrics"}, func() []float64 {
				st := x.Stats()
				return []float64{float64(st.ExportErrors), float64(st.MetricErrors)}
			})
	}
	if j := d.jsonl; j != nil {
		p.Counter("lattrace_jsonl_dropped_total", "records not written to the JSON lines output", func() float64 { return float64(j.Dropped()) })
	}
	p.Handle("GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := d.health()
		h.APIVersion = api.Version
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(h)
	}))
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

// logStopped gives the final counters, as a warning when records were lost.
func (d *Daemon) logStopped() {
	c, err := d.tracer.Counters()
	if err != nil {
		d.log.Warn("reading counters", "err", err)
	}
	if drops(c) > 0 {
		d.logCounters(slog.LevelWarn, "stopped: records lost", c, d.agg.Stats())
	} else {
		d.logCounters(slog.LevelInfo, "stopped", c, d.agg.Stats())
	}
}

// drops counts what the kernel side could not record or hand over. A path
// slot taken over (PathFull) loses RTT history, not records.
func drops(c tracer.Counters) uint64 {
	return c.RingbufFull + c.StorageFail + c.DecodeErrors + c.UnwrittenAtStop
}

func (d *Daemon) logCounters(level slog.Level, msg string, c tracer.Counters, a aggregate.Counters) {
	d.log.Log(context.Background(), level, msg, "records_submitted", c.Submitted, "records_decoded", c.Decoded, "exchanges", c.Exchanges,
		"ringbuf_full", c.RingbufFull, "storage_fail", c.StorageFail, "decode_errors", c.DecodeErrors,
		"path_entry_failures", c.PathFull, "sockets_without_tx_timestamps", c.TstampOff, "released_unsynced", c.ReleasedUnsynced,
		"replayed_unsure", c.ReplayedUnsure,
		"exchanges_idle_written", c.IdleWritten, "exchanges_unfinished", c.Unfinished, "exchanges_unwritten_at_stop", c.UnwrittenAtStop, "netns_unswept", c.NetnsUnswept, "http2_unsynced", c.H2Unsynced,
		"http2_streams", c.H2Streams, "http2_connection_exchanges_replaced", c.H2ConnReplaced, "http2_frames_unplaced", c.H2Unplaced,
		"http2_streams_unread", c.H2Unread, "http2_frames_ignored", c.H2Ignored,
		"flows", a.Flows, "flows_packed", a.PackedFlows, "flows_evicted", a.FlowsEvicted, "flows_shed", a.FlowsShed,
		"sockets_unfollowed", c.SocketsUnfollowed, "adopted_server", c.AdoptedServer, "adopted_client", c.AdoptedClient, "adopted_guessed", c.AdoptedGuessed)
}

// linkMethods label lattrace_request_hops_linked_total.
var linkMethods = []string{string(record.LinkThread), string(record.LinkGoroutine), string(record.LinkHandoff), string(record.LinkGoParent), string(record.LinkWindow)}
