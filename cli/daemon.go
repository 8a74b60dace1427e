package cli

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/lattrace/lattrace/daemon"
	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/private"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/otlp"
)

func newDaemon() *cobra.Command {
	var cfg daemon.Config
	var ox otlp.Config
	var otlpOn, http2Framing, requestLinks bool
	var ringMiB, maxProcs, memMiB int
	var cleanup bool
	var cpuProfile string
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "trace every TCP connection on this node and write what it finds",
		Args:  cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			if cleanup {
				return nil
			}
			// The flag is in MiB; the tracer checks the bytes.
			if ringMiB < 1 || ringMiB > 1024 || ringMiB&(ringMiB-1) != 0 {
				return usageError{fmt.Errorf("--ring-buffer-mib %d: want a power of two from 1 to 1024", ringMiB)}
			}
			cfg.Tracer.RingBufferBytes = uint32(ringMiB) << 20
			cfg.Tracer.NoHTTP2Framing = !http2Framing
			cfg.Tracer.NoRequestLinks = !requestLinks
			if memMiB < 0 || memMiB > 1<<20 || (memMiB > 0 && memMiB < 32) {
				return usageError{fmt.Errorf("--memory-limit-mib %d: want 0 (the memory cgroup's limit) or 32 to 1048576 (1 TiB)", memMiB)}
			}
			cfg.MemoryLimit = uint64(memMiB) << 20
			if maxProcs < 0 {
				return usageError{fmt.Errorf("--max-procs %d: want 1 or more, or 0 for Go's default", maxProcs)}
			}
			cfg.Version = Version()
			// OTLP is on when asked for, or when the standard variable
			// names an endpoint.
			if otlpOn || ox.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" {
				ox.ServiceVersion = Version()
				cfg.OTLP = &ox
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cleanup {
				return cleanupPins(cmd, cfg.Tracer.PinPath)
			}
			if maxProcs > 0 {
				runtime.GOMAXPROCS(maxProcs)
			}
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			return daemon.Run(cmd.Context(), cfg, slog.Default())
		},
	}
	f := cmd.Flags()
	f.String("config", "", "YAML file of settings: the flags' names with underscores as keys (docs/configuration.md); the environment (LATTRACE_<KEY>) and flags override it")
	f.StringVar(&cfg.Output, "output", "jsonl", "where records go: jsonl or none")
	f.StringVar(&cfg.OutputPath, "output-file", "-", "file for --output jsonl (- is stdout)")
	f.DurationVar(&cfg.Tracer.DrainInterval, "drain-interval", 0, "how often to empty the ring buffer (default "+tracer.DefaultDrainInterval.String()+")")
	f.DurationVar(&cfg.Tracer.IdleWrite, "idle-write", tracer.DefaultIdleWrite, "write a complete exchange once its connection has been quiet this long, not at its next turn (100ms..1m; negative: at the next turn or close only)")
	f.BoolVar(&cfg.RequestTrees, "request-trees", true, "make request trees of the exchanges (lattrace requests, /v1/requests, OTLP request traces): each outbound exchange under the inbound one it served; false saves the copies of middle tiers' exchanges it holds (docs/configuration.md)")
	f.BoolVar(&requestLinks, "request-links", true, "gather the kernel's evidence of which inbound request each outbound exchange serves (the thread or goroutine that read it, a futex wake-up handing it on), for request trees; false leaves it ungathered and trees link by timing alone")
	f.BoolVar(&http2Framing, "http2-framing", true, "read cleartext HTTP/2's connection preface and 9-byte frame headers (never header blocks or DATA) to count its frames per connection; false leaves those programs unattached")
	f.StringSliceVar(&cfg.Tracer.NetnsDirs, "netns-dir", []string{"/run/netns"}, "directories of bound network namespaces the idle sweep visits, with those in /proc, where the kernel refuses iterators over socket storage")
	f.IntVar(&ringMiB, "ring-buffer-mib", tracer.DefaultRingBufferBytes>>20, "size of the ring buffer records wait in for the daemon, in MiB (a power of two): 8 MiB holds about 24,000 records; raise it where bursts overflow it (lattrace_ringbuf_full_total)")
	// One CPU by default: the daemon's work is one loop draining the ring,
	// and a second CPU for the runtime mostly adds wake-ups of idle
	// threads (docs/decisions.md). It also bounds what the tracer can take
	// from a node to about one CPU.
	f.IntVar(&maxProcs, "max-procs", 1, "CPUs that run the daemon's Go code at once (GOMAXPROCS); 0 leaves Go's default: $GOMAXPROCS, else the CPUs the container may use")
	f.IntVar(&memMiB, "memory-limit-mib", 0, "memory the daemon keeps its own under, in MiB, shedding the history of recent exchanges, then flows, counted (docs/reliability.md); 0: its memory cgroup's limit, which the kernel's BPF maps count against too, or none")
	f.StringVar(&cfg.Tracer.CgroupPath, "cgroup", "", "cgroup v2 directory to watch sockets in (default: the whole node)")
	f.StringVar(&cfg.Tracer.PinPath, "pin-path", "", "bpffs directory to pin maps and links in, so the programs trace on across restarts and the next daemon adopts them (empty: nothing outlives the daemon; see --cleanup)")
	f.BoolVar(&cleanup, "cleanup", false, "remove everything pinned under --pin-path (default "+daemon.DefaultPinPath+"), which detaches the programs, and exit")
	f.StringVar(&cfg.Tracer.KernelBTF, "kernel-btf", "", "BTF file for kernels without /sys/kernel/btf/vmlinux")
	f.StringVar(&cpuProfile, "cpu-profile", "", "write a Go CPU profile of the daemon to this file until it exits (for a report of its cost; make pgo builds from one)")
	f.IntVar(&cfg.Aggregate.MaxFlows, "max-flows", aggregate.DefaultMaxFlows, "connections (flows) the live tables hold at most, closed ones for 30s after; past it the least recently updated is evicted (lattrace_flows_evicted_total)")
	f.IntVar(&cfg.Aggregate.ActiveFlows, "active-flows", 0, fmt.Sprintf("most recently updated flows kept unpacked, with their recent exchanges for the live view; the others are held packed, a few hundred bytes each, until their next record (0: %d, or --max-flows when lower)", aggregate.DefaultActiveFlows))
	f.IntVar(&cfg.Aggregate.MaxPeers, "max-peers", aggregate.DefaultMaxPeers, "peer pairs the live tables hold at most; past it the least recently updated is evicted")
	f.IntVar(&cfg.MaxPeerPairs, "metrics-max-peer-pairs", otlp.DefaultMaxPeerPairs, "distinct peer pairs in the metrics; more are folded into \"other\"")
	f.StringVar(&cfg.APISocket, "api-socket", api.DefaultSocket, "serve the local API (top, flows, explain) on this Unix socket, mode 0600 (empty: off)")
	f.StringVar(&cfg.APIAddr, "api-addr", "", "also serve the local API on this loopback host:port")
	f.StringVar(&cfg.MetricsAddr, "metrics-addr", "127.0.0.1:9464", "serve Prometheus /metrics here (empty: off)")
	f.BoolVar(&otlpOn, "otlp", false, "export OTLP spans and metrics (endpoint from OTEL_EXPORTER_OTLP_ENDPOINT when --otlp-endpoint is not given)")
	f.StringVar(&ox.Endpoint, "otlp-endpoint", "", "OTLP endpoint host:port, gRPC or HTTP by --otlp-protocol (turns OTLP on)")
	f.BoolVar(&ox.Insecure, "otlp-insecure", false, "OTLP without TLS")
	f.StringVar(&ox.Protocol, "otlp-protocol", "", "grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)")
	f.DurationVar(&ox.SlowThreshold, "span-slow-threshold", 100*time.Millisecond, "export a span for every exchange at least this slow, or with a warning or critical diagnosis, within --span-slow-rate (negative: no threshold)")
	f.Float64Var(&ox.RatePerSecond, "span-rate", 10, "spans per second sampled at random from the other exchanges")
	f.Float64Var(&ox.Ratio, "span-ratio", 1, "share of the other exchanges --span-rate samples from, chosen by each exchange's identity so that both ends' nodes choose alike (0 < r <= 1)")
	f.Float64Var(&ox.SlowRatePerSecond, "span-slow-rate", otlp.DefaultSlowRate, "at most this many spans per second of slow or diagnosed exchanges (a connection storm makes every exchange slow); the rest are counted (negative: no bound)")
	return cmd
}

// cleanupPins is `lattrace daemon --cleanup`: what a daemon left pinned goes,
// and the programs with it.
func cleanupPins(cmd *cobra.Command, dir string) error {
	if dir == "" {
		dir = daemon.DefaultPinPath
	}
	removed, err := tracer.Cleanup(dir)
	if err != nil {
		return err
	}
	if len(removed) == 0 {
		fmt.Fprintf(cmd.OutOrStdout(), "nothing pinned under %s\n", dir)
		return nil
	}
	fmt.Fprintf(cmd.OutOrStdout(), "removed %d pins under %s: the programs are detached\n", len(removed), dir)
	return nil
}

// startCPUProfile profiles the daemon's Go code into path until stop, which
// the daemon calls on its way out (SIGTERM or SIGINT; a kill leaves the
// file without its samples).
func startCPUProfile(path string) (stop func(), err error) {
	f, err := private.Create(path, os.O_TRUNC)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			slog.Error("writing the CPU profile", "file", path, "err", err)
		}
	}, nil
}
