package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/lattrace/lattrace/cli/top"
	"github.com/lattrace/lattrace/daemon"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/daemon/private"
	"github.com/lattrace/lattrace/exporters/otlp"
)

func newTop() *cobra.Command {
	var lf listFlags
	var interval time.Duration
	var once, requests bool
	var logFile string
	cmd := &cobra.Command{
		Use:   "top",
		Short: "live view of the flows on this node: where each one's latency goes, and what is wrong",
		Long: "top reads a running daemon's API. Without one (and without --api), it runs the\n" +
			"tracer in-process, which needs root. Keys are listed at the bottom of the screen:\n" +
			"v steps through flows, peer pairs and requests (request trees, unless the\n" +
			"daemon runs with --request-trees=false).\n" +
			"With --once, or when stdout is not a terminal, it prints one plain table and exits.",
		Args: cobra.NoArgs,
	}
	target, explicit := apiFlag(cmd)
	lf.add(cmd)
	f := cmd.Flags()
	f.DurationVar(&interval, "interval", time.Second, "refresh interval (250ms..60s)")
	f.BoolVar(&once, "once", false, "print one plain table and exit")
	f.BoolVar(&requests, "requests", false, "start on the recent requests (request trees, which a daemon makes unless started with --request-trees=false)")
	f.StringVar(&logFile, "log-file", "", "with the in-process tracer, write its log here (default: discarded; its counters are in the health)")
	var q api.Query
	cmd.PreRunE = func(*cobra.Command, []string) error {
		var err error
		if q, err = lf.query(); err != nil {
			return err
		}
		if requests && lf.peers {
			return usageError{errors.New("--requests and --peers: one view at a time")}
		}
		if interval < 250*time.Millisecond || interval > time.Minute {
			return usageError{fmt.Errorf("--interval %v outside 250ms..60s", interval)}
		}
		return nil
	}
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		ctx, cancel := context.WithCancel(cmd.Context())
		defer cancel()

		src, err := topSource(ctx, target(), explicit(), logFile)
		if err != nil {
			return err
		}
		defer src.stop()
		opts := top.Options{Interval: interval, Sort: q.Sort, Filter: q.Filter, Title: src.title, View: top.ViewFlows}
		switch {
		case lf.peers:
			opts.View = top.ViewPeers
		case requests:
			opts.View = top.ViewRequests
		}
		isTTY, w, h := terminal(os.Stdout)
		if once || !isTTY {
			return topOnce(ctx, src, opts, q, cmd.OutOrStdout())
		}
		if w < 80 || h < 24 {
			return fmt.Errorf("terminal is %dx%d; lattrace top needs at least 80x24 (or use --once)", w, h)
		}
		return top.Run(ctx, src.c, opts, os.Stdin, os.Stdout)
	}
	return cmd
}

// topSrc is where top reads from.
type topSrc struct {
	c     *api.Client
	title string
	// inProcess: the tracer runs in this process and started just now.
	inProcess bool
	stop      func()
}

// topSource finds the daemon's API or, when there is none and none was
// asked for by name, starts the tracer in this process behind a private
// API socket, so the screen is the same either way.
func topSource(ctx context.Context, target string, explicit bool, logFile string) (topSrc, error) {
	c, err := api.NewClient(target)
	if err != nil {
		return topSrc{}, usageError{err}
	}
	_, err = c.Health(ctx)
	switch {
	case err == nil:
		return topSrc{c: c, title: "daemon " + target, stop: func() {}}, nil
	case !errors.Is(err, api.ErrNoDaemon) || explicit:
		return topSrc{}, clientError(err, target)
	}

	dir, err := os.MkdirTemp("", "lattrace-top-")
	if err != nil {
		return topSrc{}, err
	}
	logw := io.Discard
	if logFile != "" {
		lf, err := private.Create(logFile, os.O_APPEND)
		if err != nil {
			os.RemoveAll(dir)
			return topSrc{}, fmt.Errorf("--log-file: %w", err)
		}
		logw = lf
	}
	// The screen owns the terminal: the tracer's log must not draw on it.
	log := slog.New(slog.NewTextHandler(logw, nil))
	sock := filepath.Join(dir, "api.sock")
	// Request trees on: the requests view is top's as much as the lists.
	d, err := daemon.New(daemon.Config{Output: "none", APISocket: sock, MaxPeerPairs: otlp.DefaultMaxPeerPairs, RequestTrees: true, Version: Version()}, log)
	if err != nil {
		os.RemoveAll(dir)
		return topSrc{}, fmt.Errorf("no daemon at %s, and tracing in-process failed: %w", target, err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	c, err = api.NewClient(sock)
	if err != nil {
		stop()
		<-done
		os.RemoveAll(dir)
		return topSrc{}, err
	}
	wait := func() {
		stop()
		if err := <-done; err != nil {
			fmt.Fprintf(os.Stderr, "lattrace: in-process tracer: %v\n", err)
		}
		os.RemoveAll(dir)
	}
	return topSrc{c: c, title: "in-process tracer (no daemon at " + target + ")", inProcess: true, stop: wait}, nil
}

// topOnce prints one table. A fresh in-process tracer has seen nothing
// yet, so it first traces for one interval.
func topOnce(ctx context.Context, src topSrc, opts top.Options, q api.Query, out io.Writer) error {
	c := src.c
	if src.inProcess {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(opts.Interval):
		}
		// Said, so nobody reads a second of tracing as a node's history.
		fmt.Fprintf(os.Stderr, "note: %s; these are %v of tracing in this process\n", src.title, opts.Interval)
	}
	width := tableWidth(os.Stdout)
	switch opts.View {
	case top.ViewRequests:
		l, err := c.Requests(ctx, true)
		if err != nil {
			return clientError(err, c.Target)
		}
		return top.WriteRequests(out, l, q.Filter, width)
	case top.ViewPeers:
		l, err := c.Peers(ctx, q)
		if err != nil {
			return clientError(err, c.Target)
		}
		return top.WritePeers(out, l, width)
	}
	l, err := c.Flows(ctx, q)
	if err != nil {
		return clientError(err, c.Target)
	}
	return top.WriteFlows(out, l, width)
}
