package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/pipeline"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/recording"
	"github.com/lattrace/lattrace/record"
)

func newRecord() *cobra.Command {
	var out string
	var duration time.Duration
	var sampling recording.Sampling
	var opts tracer.Options
	cmd := &cobra.Command{
		Use:   "record --out FILE",
		Short: "trace this node for a while into one file, for `lattrace report`",
		Long: "record loads its own tracer (root needed; it runs beside a daemon) and writes every\n" +
			"exchange, connection, RTT/cwnd sample and diagnosis it sees into FILE\n" +
			"(docs/recording.md). Ctrl-C stops it early; the file is complete either way.",
		Args: cobra.NoArgs,
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "", "the recording to write (required)")
	f.DurationVar(&duration, "duration", time.Minute, "how long to record (1s..24h)")
	f.DurationVar(&sampling.Interval, "sample-interval", recording.DefaultSampling.Interval, "least time between two RTT/cwnd samples of one flow (retransmissions are always sampled)")
	f.IntVar(&sampling.MaxPerFlow, "max-samples-per-flow", recording.DefaultSampling.MaxPerFlow, "RTT/cwnd samples kept per flow")
	f.IntVar(&sampling.Max, "max-samples", recording.DefaultSampling.Max, "RTT/cwnd samples kept in all")
	f.StringVar(&opts.CgroupPath, "cgroup", "", "cgroup v2 directory to watch sockets in (default: the whole node)")
	f.StringVar(&opts.KernelBTF, "kernel-btf", "", "BTF file for kernels without /sys/kernel/btf/vmlinux")
	f.DurationVar(&opts.DrainInterval, "drain-interval", 0, "how often to empty the ring buffer (default "+tracer.DefaultDrainInterval.String()+")")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		switch {
		case out == "":
			return usageError{errors.New("--out FILE is required: where to write the recording")}
		case duration < time.Second || duration > 24*time.Hour:
			return usageError{fmt.Errorf("--duration %v outside 1s..24h", duration)}
		}
		if err := sampling.Validate(); err != nil {
			return usageError{err}
		}
		if err := opts.Validate(); err != nil {
			return usageError{err}
		}
		return recordRun(cmd.Context(), out, duration, sampling, opts, cmd.ErrOrStderr())
	}
	return cmd
}

// recordRun traces for duration (or until ctx ends) into the file at path.
func recordRun(ctx context.Context, path string, duration time.Duration, sampling recording.Sampling, opts tracer.Options, msgs io.Writer) error {
	// The file first: a path that cannot be written fails before
	// anything is loaded into the kernel.
	file, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o640)
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
		LattraceVersion: Version(),
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
	agg := aggregate.New(aggregate.Config{MaxFlows: 1 << 16, MaxPeers: 1 << 14, FlowIdle: -1, PeerIdle: -1, CloseGrace: 48 * time.Hour})
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
