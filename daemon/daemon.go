// Package daemon runs lattrace on a node: it opens the tracer, fans the
// decoded records out to the configured outputs and reports its own health
// (hooks attached, records read, drops) so that nothing is lost silently.
package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/lattrace/lattrace/daemon/record"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/jsonl"
)

// Config is what `lattrace daemon` is told.
type Config struct {
	// Output is "jsonl" (one JSON object per record) or "none".
	Output string
	// OutputPath is the JSON lines file; "-" or empty means stdout.
	OutputPath string
	Tracer     tracer.Options
}

// Outputs the daemon knows.
var Outputs = []string{"jsonl", "none"}

// Validate checks the configuration before anything is loaded.
func (c Config) Validate() error {
	switch c.Output {
	case "jsonl", "none":
	default:
		return fmt.Errorf("unknown output %q (want one of %v)", c.Output, Outputs)
	}
	if c.Tracer.DrainInterval < 0 {
		return fmt.Errorf("drain interval %v is negative", c.Tracer.DrainInterval)
	}
	if c.Tracer.CgroupPath != "" {
		if err := tracer.CheckCgroup2(c.Tracer.CgroupPath); err != nil {
			return err
		}
	}
	return nil
}

// Run traces until ctx is done.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	sink, closeOut, err := openOutput(cfg)
	if err != nil {
		return err
	}
	defer closeOut()

	cfg.Tracer.Logger = log
	tr, err := tracer.Open(cfg.Tracer)
	if err != nil {
		return err
	}
	defer tr.Close()
	attached := 0
	for _, h := range tr.Hooks() {
		if h.Attached {
			attached++
		}
	}
	log.Info("tracing", "hooks_attached", attached, "hooks_total", len(tr.Hooks()), "output", cfg.Output)

	runErr := tr.Run(ctx, sink)
	c, err := tr.Counters()
	if err != nil {
		log.Warn("reading counters", "err", err)
	}
	log.Info("stopped", "records_decoded", c.Decoded, "ringbuf_full", c.RingbufFull,
		"storage_fail", c.StorageFail, "decode_errors", c.DecodeErrors)
	if w, ok := sink.(*jsonl.Writer); ok && w.Err() != nil {
		return fmt.Errorf("writing JSON lines: %w", w.Err())
	}
	return runErr
}

func openOutput(cfg Config) (tracer.Sink, func(), error) {
	if cfg.Output == "none" {
		return discard{}, func() {}, nil
	}
	var out io.Writer = os.Stdout
	closeOut := func() {}
	if cfg.OutputPath != "" && cfg.OutputPath != "-" {
		f, err := os.OpenFile(cfg.OutputPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err != nil {
			return nil, nil, fmt.Errorf("opening output: %w", err)
		}
		out, closeOut = f, func() { f.Close() }
	}
	return jsonl.New(out), closeOut, nil
}

// discard is the sink for --output none: the tracer still runs and counts.
type discard struct{}

func (discard) Exchange(*record.Exchange)  {}
func (discard) ConnOpen(record.ConnOpen)   {}
func (discard) ConnClose(record.ConnClose) {}
func (discard) Flush()                     {}
