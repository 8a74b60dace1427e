// Package recorder is `lattrace record`: a tracer of its own, for a while,
// writing into one recording file (exporters/recording) through the
// pipeline, with samples of the exchanges in progress and, at the end, the
// diagnoses of every flow and peer pair of the run. It runs beside a
// daemon; `lattrace report` draws what it writes.
package recorder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/pipeline"
	"github.com/lattrace/lattrace/daemon/private"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/recording"
	"github.com/lattrace/lattrace/record"
)

// Config is what `lattrace record` is told.
type Config struct {
	// Out is the recording to write.
	Out string
	// Duration is how long to record, at most MaxDuration.
	Duration time.Duration
	Sampling recording.Sampling
	Tracer   tracer.Options
	// Version is lattrace's, for the file's header.
	Version string
}

// MaxDuration is the longest recording.
const MaxDuration = 24 * time.Hour

// Validate checks the configuration, its parts' included, before anything
// is opened.
func (c Config) Validate() error {
	switch {
	case c.Out == "":
		return errors.New("--out FILE is required: where to write the recording")
	case c.Duration < time.Second || c.Duration > MaxDuration:
		return fmt.Errorf("--duration %v outside 1s..24h", c.Duration)
	}
	if err := c.Sampling.Validate(); err != nil {
		return err
	}
	return c.Tracer.Validate()
}

// Run traces for cfg.Duration (or until ctx ends) into the file cfg.Out,
// and says on msgs what it is doing and what it wrote.
func Run(ctx context.Context, cfg Config, msgs io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	path, duration, sampling, opts := cfg.Out, cfg.Duration, cfg.Sampling, cfg.Tracer
	// The file first: a path that cannot be written fails before
	// anything is loaded into the kernel.
	file, err := private.Create(path, os.O_TRUNC)
	if err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			file.Close()
			os.Remove(path)
		}
	}()
	opts.Logger = slog.Default()
	tr, err := tracer.Open(opts)
	if err != nil {
		return err
	}
	defer tr.Close()

	hdr := recording.Header{
		LattraceVersion: cfg.Version,
		Started:         time.Now().UTC(),
		StartedMono:     record.Now(),
		Duration:        duration,
		Sampling:        sampling,
		Notes:           hookNotes(tr.Hooks()),
	}
	hdr.Host, _ = os.Hostname()
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		hdr.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	w, err := recording.NewWriter(file, hdr)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	// The recorder keeps every flow of the run for the closing diagnoses:
	// nothing expires within the longest recording, only the table bounds
	// evict.
	agg := aggregate.New(aggregate.Config{MaxFlows: 1 << 16, MaxPeers: 1 << 14, FlowIdle: -1, PeerIdle: -1, CloseGrace: 2 * MaxDuration})
	sink := pipeline.New(pipeline.Config{Containers: pipeline.HostContainers()}, pipeline.Live(agg, nil), w)

	runCtx, stop := context.WithTimeout(ctx, duration)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- tr.Run(runCtx, sink) }()
	go sampleInFlight(runCtx, tr, w, sampling.Interval)
	fmt.Fprintf(msgs, "recording for %v into %s (Ctrl-C stops early)\n", duration, path)
	runErr := <-done

	for _, d := range closingDiagnoses(agg) {
		w.Diagnoses(d)
	}
	end := recording.End{Ended: record.Now(), EndedWall: time.Now().UTC(), Lost: lost(tr)}
	if err := errors.Join(runErr, w.Close(end), file.Sync(), file.Close()); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	ok = true
	c := w.Counts()
	size := int64(0)
	if st, err := os.Stat(path); err == nil {
		size = st.Size()
	}
	fmt.Fprintf(msgs, "recorded %d exchanges, %d connections opened, %d closed, %d RTT/cwnd samples in %v: %s (%.1f MB); `lattrace report %s` draws it\n",
		c.Exchanges, c.ConnOpens, c.ConnCloses, c.Samples, time.Duration(end.Ended-hdr.StartedMono).Round(time.Millisecond),
		path, float64(size)/1e6, path)
	if len(end.Lost) > 0 {
		fmt.Fprintf(msgs, "warning: the tracer lost records while recording: %v\n", end.Lost)
	}
	return nil
}

// sampleInFlight samples the exchanges in progress every interval (at most
// ten times a second: each read walks every socket), where the kernel lets
// the tracer list them.
func sampleInFlight(ctx context.Context, tr *tracer.Tracer, w *recording.Writer, interval time.Duration) {
	interval = max(interval, 100*time.Millisecond)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ins, err := tr.InFlight()
		if errors.Is(err, tracer.ErrNoInflight) {
			return
		}
		if err == nil {
			w.InFlight(ins, record.Now())
		}
	}
}

// closingDiagnoses are the findings about every flow and peer pair of the
// run, as `lattrace explain` would give them at its end.
func closingDiagnoses(agg *aggregate.Aggregator) []recording.Diagnoses {
	flows := agg.Flows()
	var out []recording.Diagnoses
	for i := range flows {
		f := &flows[i]
		if ds := diagnose.WithBulkSenders(diagnose.Of(&f.Metrics), &f.Metrics, flows); len(ds) > 0 {
			out = append(out, recording.Diagnoses{Scope: recording.ScopeFlow, Flow: &f.FlowKey, Exchanges: f.Exchanges, Diagnoses: ds})
		}
	}
	peers := agg.Peers()
	for i := range peers {
		p := &peers[i]
		if ds := diagnose.WithBulkSenders(diagnose.OfPair(p), &p.Metrics, flows); len(ds) > 0 {
			out = append(out, recording.Diagnoses{Scope: recording.ScopePeer, Peer: &p.PeerKey, Exchanges: p.Exchanges, Diagnoses: ds})
		}
	}
	return out
}

// hookNotes says which features the kernel left out, and which run
// through a fallback.
func hookNotes(hooks []tracer.HookStatus) []string {
	var notes []string
	for _, h := range tracer.FeaturesOff(hooks) {
		notes = append(notes, h.Unavailable())
	}
	for _, h := range hooks {
		if h.Attached && h.FallbackFor != "" {
			notes = append(notes, fmt.Sprintf("%s: through the fallback hook %s", h.Feature, h.Hook))
		}
	}
	return notes
}

// lost reads what the tracer could not deliver.
func lost(tr *tracer.Tracer) map[string]uint64 {
	c, err := tr.Counters()
	if err != nil {
		return map[string]uint64{"counters_unreadable": 1}
	}
	m := map[string]uint64{}
	for name, v := range map[string]uint64{
		"ringbuf_full": c.RingbufFull, "storage_fail": c.StorageFail,
		"decode_errors": c.DecodeErrors, "path_entry_failures": c.PathFull,
	} {
		if v > 0 {
			m[name] = v
		}
	}
	return m
}
