package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/lattrace/lattrace/cli/report"
)

func newReport() *cobra.Command {
	var out string
	var o report.Options
	cmd := &cobra.Command{
		Use:   "report RECORDING [-o report.html]",
		Short: "draw a recording (lattrace record) as one self-contained HTML page",
		Long: "report reads a recording and writes one HTML file that opens offline: a summary\n" +
			"table per peer pair, then latency over time by component, app vs TCP vs network RTT,\n" +
			"CDFs, box plots, cwnd and srtt with retransmissions, turns and the diagnoses\n" +
			"(docs/recording.md). It needs no privilege.",
		Args: cobra.ExactArgs(1),
	}
	f := cmd.Flags()
	f.StringVarP(&out, "out", "o", "", "the HTML file to write (default: the recording's name with .html)")
	f.IntVar(&o.MaxPairs, "max-pairs", report.DefaultMaxPairs, "peer pairs drawn with charts (the ones that cost the most time); the table lists all")
	f.IntVar(&o.Points, "points", report.DefaultPoints, "points per time series at most (each interval's lowest and highest are kept)")
	f.IntVar(&o.FlowsPerPair, "flows-per-pair", report.DefaultFlowsPerPair, "connections per pair whose cwnd and srtt are drawn")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		switch {
		case o.MaxPairs < 1 || o.FlowsPerPair < 1:
			return usageError{errors.New("--max-pairs and --flows-per-pair: want at least 1")}
		case o.Points < 10:
			return usageError{fmt.Errorf("--points %d: want at least 10", o.Points)}
		}
		return nil
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		in := args[0]
		if out == "" {
			out = strings.TrimSuffix(in, filepath.Ext(in)) + ".html"
		}
		start := time.Now()
		m, err := report.Build(in, o)
		if err != nil {
			return err
		}
		if err := writeReport(out, m); err != nil {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d exchanges, %d peer pairs (%d drawn) in %v\n",
			out, m.End.Exchanges, len(m.Rows)+m.MoreRows, len(m.Pairs), time.Since(start).Round(time.Millisecond))
		return nil
	}
	return cmd
}

// writeReport writes the page beside its final name and renames it, so a
// failed write leaves no half page behind (nor clobbers an older one).
func writeReport(path string, m *report.Model) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("-o %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	err = report.Write(tmp, m)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("-o %s: %w", path, err)
	}
	return nil
}
