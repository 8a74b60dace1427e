package daemon

import (
	"fmt"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/otlp"
)

// Config is what `lattrace daemon` is told.
type Config struct {
	// Output is "jsonl" (one JSON object per record) or "none".
	Output string
	// OutputPath is the JSON lines file; "-" or empty means stdout.
	OutputPath string
	Tracer     tracer.Options
	Aggregate  aggregate.Config
	// RequestTrees makes request trees of the exchanges (package
	// requests; the command's flag defaults to on); the kernel's evidence
	// is gathered either way (Tracer.NoRequestLinks).
	RequestTrees bool
	// OTLP, when set, exports spans and metrics to an OpenTelemetry backend.
	OTLP *otlp.Config
	// MetricsAddr is where /metrics is served for Prometheus; empty: off.
	MetricsAddr string
	// MaxPeerPairs bounds the metrics' peer-pair series.
	MaxPeerPairs int
	// APISocket is the local API's Unix socket (empty: none); APIAddr a
	// loopback host:port to serve it on as well (empty: none).
	APISocket string
	APIAddr   string
	// Version is the build's version, reported by the API's health.
	Version string
	// MemoryLimit bounds the daemon's own memory in bytes; 0 takes its
	// memory cgroup's limit, which the kernel's BPF maps count against
	// too (daemon/memguard).
	MemoryLimit uint64
}

// DefaultPinPath is where a cluster deployment pins (the chart sets it);
// --cleanup looks there when no --pin-path is given.
const DefaultPinPath = "/sys/fs/bpf/lattrace"

// Outputs the daemon knows.
var Outputs = []string{"jsonl", "none"}

// Validate checks the configuration, its parts' included, before anything
// is loaded.
func (c Config) Validate() error {
	if c.MaxPeerPairs < 1 {
		return fmt.Errorf("--metrics-max-peer-pairs %d: want at least 1", c.MaxPeerPairs)
	}
	switch c.Output {
	case "jsonl", "none":
	default:
		return fmt.Errorf("unknown output %q (want one of %v)", c.Output, Outputs)
	}
	if c.APIAddr != "" {
		if err := api.CheckAddr(c.APIAddr); err != nil {
			return err
		}
	}
	if c.Output == "none" && c.OutputPath != "" && c.OutputPath != "-" {
		return fmt.Errorf("--output-file %s given with --output none", c.OutputPath)
	}
	if err := c.Tracer.Validate(); err != nil {
		return err
	}
	if err := c.Aggregate.Validate(); err != nil {
		return err
	}
	if c.OTLP != nil {
		if err := c.OTLP.Validate(); err != nil {
			return err
		}
	}
	return nil
}
