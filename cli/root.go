// Package cli is the lattrace command line: one cobra command per
// subcommand, each a thin layer that parses flags into the configuration of
// the package doing the work, and turns errors into one line for a person.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// usageError marks errors in how lattrace was called (exit status 2).
type usageError struct{ error }

// Execute runs the command line and returns the process exit status.
func Execute(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "lattrace: %v\n", err)
	var ue usageError
	// cobra's own argument and command errors are usage errors too.
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") ||
		strings.Contains(err.Error(), "accepts ") || strings.Contains(err.Error(), "unknown flag") {
		return 2
	}
	return 1
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:   "lattrace",
		Short: "eBPF TCP latency tracer: where each message's time goes (network, transport, app)",
		// Errors are printed once, as one line, by Execute.
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			// Commands with --config take settings from the file and the
			// environment too, the log level among them.
			if f := cmd.Flags().Lookup("config"); f != nil {
				path := f.Value.String()
				if !f.Changed {
					path = os.Getenv(envPrefix + "CONFIG") // the file itself, from the environment
				}
				if err := applyConfig(cmd, path); err != nil {
					return usageError{err}
				}
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return usageError{fmt.Errorf("--log-level: %q is not one of debug, info, warn, error", logLevel)}
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})))
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newDaemon(), newTop(), newFlows(), newExplain(), newRecord(), newReport(), newVersion())
	return root
}
