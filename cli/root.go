// Package cli is the lattrace command line: one cobra command per
// subcommand, each a thin layer that parses flags into the configuration of
// the package doing the work, and turns errors into one line for a person.
// A command checks its settings in PreRunE and does its work in RunE, so
// that a command line can be checked without running it (FuzzFlags).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unicode"

	"github.com/spf13/cobra"
)

// usageError marks errors in how lattrace was called (exit status 2).
type usageError struct{ error }

// Execute runs the command line and returns the process exit status.
func Execute(args []string, stdout, stderr io.Writer) int {
	return execute(newRoot(stdout, stderr), args, stderr)
}

// execute runs root with args, printing its error, if any, as one line.
func execute(root *cobra.Command, args []string, stderr io.Writer) int {
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	msg := err.Error()
	var typed string
	if _, serr := fmt.Sscanf(msg, "unknown command %q", &typed); serr == nil {
		msg += suggestion(root, typed)
	}
	fmt.Fprintf(stderr, "lattrace: %s\n", oneLine(msg))
	var ue usageError
	// cobra's own argument and command errors are usage errors too.
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") ||
		strings.Contains(err.Error(), "accepts ") || strings.Contains(err.Error(), "unknown flag") {
		return 2
	}
	return 1
}

// suggestion names the commands a mistyped one may be, as cobra would
// (which it does on lines of their own). A name much longer than every
// command's is none of them, and comparing it with each would cost a row of
// the edit distance per byte.
func suggestion(root *cobra.Command, typed string) string {
	if len(typed) > 32 {
		return ""
	}
	if s := root.SuggestionsFor(typed); len(s) > 0 {
		return " (did you mean " + strings.Join(s, " or ") + "?)"
	}
	return ""
}

// oneLine is an error's message as one line: a line break or another
// control character in it (from a value given on the command line, in a
// file, by the environment) is written as its Go escape, \n.
func oneLine(msg string) string {
	if !strings.ContainsFunc(msg, unicode.IsControl) {
		return msg
	}
	var b strings.Builder
	for _, r := range msg {
		if unicode.IsControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
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
	// Suggestions for a mistyped command are execute's to add: cobra's
	// take lines of their own.
	root.DisableSuggestions = true
	root.SuggestionsMinimumDistance = 2
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newDaemon(), newTop(), newFlows(), newRequests(), newExplain(), newRecord(), newReport(), newVersion())
	return root
}
