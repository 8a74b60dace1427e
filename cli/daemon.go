package cli

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/lattrace/lattrace/daemon"
)

func newDaemon() *cobra.Command {
	var cfg daemon.Config
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "trace every TCP connection on this node and write what it finds",
		Args:  cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return daemon.Run(cmd.Context(), cfg, slog.Default())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Output, "output", "jsonl", "where records go: jsonl or none")
	f.StringVar(&cfg.OutputPath, "output-file", "-", "file for --output jsonl (- is stdout)")
	f.DurationVar(&cfg.Tracer.DrainInterval, "drain-interval", 0, "how often to empty the ring buffer (default 100ms)")
	f.StringVar(&cfg.Tracer.CgroupPath, "cgroup", "", "cgroup v2 directory to watch sockets in (default: the whole node)")
	f.StringVar(&cfg.Tracer.KernelBTF, "kernel-btf", "", "BTF file for kernels without /sys/kernel/btf/vmlinux")
	return cmd
}
