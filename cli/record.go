package cli

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/lattrace/lattrace/daemon/recorder"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/exporters/recording"
)

func newRecord() *cobra.Command {
	cfg := recorder.Config{Sampling: recording.DefaultSampling}
	cmd := &cobra.Command{
		Use:   "record --out FILE",
		Short: "trace this node for a while into one file, for `lattrace report`",
		Long: "record loads its own tracer (root needed; it runs beside a daemon) and writes every\n" +
			"exchange, connection, RTT/cwnd sample and diagnosis it sees into FILE\n" +
			"(docs/recording.md). Ctrl-C stops it early; the file is complete either way.",
		Args: cobra.NoArgs,
	}
	f := cmd.Flags()
	f.StringVarP(&cfg.Out, "out", "o", "", "the recording to write (required)")
	f.DurationVar(&cfg.Duration, "duration", time.Minute, "how long to record (1s..24h)")
	f.DurationVar(&cfg.Sampling.Interval, "sample-interval", recording.DefaultSampling.Interval, "least time between two RTT/cwnd samples of one flow (retransmissions are always sampled)")
	f.IntVar(&cfg.Sampling.MaxPerFlow, "max-samples-per-flow", recording.DefaultSampling.MaxPerFlow, "RTT/cwnd samples kept per flow")
	f.IntVar(&cfg.Sampling.Max, "max-samples", recording.DefaultSampling.Max, "RTT/cwnd samples kept in all")
	f.StringVar(&cfg.Tracer.CgroupPath, "cgroup", "", "cgroup v2 directory to watch sockets in (default: the whole node)")
	f.StringVar(&cfg.Tracer.KernelBTF, "kernel-btf", "", "BTF file for kernels without /sys/kernel/btf/vmlinux")
	f.DurationVar(&cfg.Tracer.DrainInterval, "drain-interval", 0, "how often to empty the ring buffer (default "+tracer.DefaultDrainInterval.String()+")")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if err := cfg.Validate(); err != nil {
			return usageError{err}
		}
		return nil
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		cfg.Version = Version()
		return recorder.Run(cmd.Context(), cfg, cmd.ErrOrStderr())
	}
	return cmd
}
