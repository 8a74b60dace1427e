package bench

import (
	"bytes"
	_ "embed"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"text/template"
	"time"

	"github.com/lattrace/lattrace/daemon/tracer"
)

//go:embed report.md.tmpl
var reportTemplate string

// WriteReport writes the markdown report to md and its plots to plotDir.
func WriteReport(res *Results, md, plotDir string) error {
	if err := os.MkdirAll(plotDir, 0o755); err != nil {
		return err
	}
	plots, err := writePlots(res, plotDir)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(md), plotDir)
	if err != nil {
		return err
	}
	for k, v := range plots {
		plots[k] = filepath.ToSlash(filepath.Join(rel, v))
	}
	t, err := template.New("report").Funcs(template.FuncMap{
		"f1": func(x float64) string { return fmtNum(x, 1) },
		"f0": func(x float64) string { return fmtNum(x, 0) },
		"f2": func(x float64) string { return fmtNum(x, 2) },
		"sf0": func(x float64) string {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return "–"
			}
			return fmt.Sprintf("%+.0f", x)
		},
		"mib":  func(b uint64) string { return fmtNum(mib(b), 1) },
		"rate": fmtRate,
		"loss": func(r Result, o string) string {
			s, ok := r.loss(o)
			if !ok {
				return "–"
			}
			return fmt.Sprintf("%.1f (%.1f … %.1f)", s.Median, s.Min, s.Max)
		},
		"median": func(r Result, o string) string { return fmtRate(Median(r.Rates[o])) },
		"p50":    func(r Result, o string) string { return fmtNum(Median(r.P50s[o]), 1) },
		"added": func(r Result, o string) string {
			a, ok := r.Added(o)
			if !ok {
				return "–"
			}
			return fmt.Sprintf("%+.1f (%+.1f … %+.1f)", a.Median, a.Min, a.Max)
		},
		"errpct":      func(a Accuracy) string { return fmtNum(a.ErrorPct(), 1) },
		"errabs":      func(a Accuracy) string { return fmtAbsErr(a) },
		"num":         fmtNum,
		"duration":    func(a, b time.Time) string { return b.Sub(a).Round(time.Second).String() },
		"mulf":        func(a, b float64) float64 { return a * b },
		"seconds":     func(d time.Duration) string { return fmt.Sprintf("%g-second", d.Seconds()) },
		"binaryPages": binaryPages,
		"lastFlows": func(f []FlowCost) *FlowCost {
			if len(f) == 0 {
				return nil
			}
			return &f[len(f)-1]
		},
	}).Parse(reportTemplate)
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if err := t.Execute(&b, map[string]any{"R": res, "Targets": Targets(res), "Plots": plots, "Baseline": Baseline}); err != nil {
		return err
	}
	return os.WriteFile(md, b.Bytes(), 0o644)
}

func fmtNum(x float64, prec int) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "–"
	}
	return fmt.Sprintf("%.*f", prec, x)
}

func fmtRate(x float64) string {
	switch {
	case math.IsNaN(x):
		return "–"
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

// fmtAbsErr is the error in the row's unit, in µs for durations.
func fmtAbsErr(a Accuracy) string {
	if a.Unit == "ms" {
		return fmt.Sprintf("%+.0f µs", 1000*a.Error())
	}
	return fmt.Sprintf("%+.2f %s", a.Error(), a.Unit)
}

// Summary is the run's results as plain tables for the terminal.
func Summary(res *Results) string {
	var b bytes.Buffer
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	if len(res.RR) > 0 {
		fmt.Fprintf(w, "\nworkload\tobserver\tmedian rate\tcost %% of untraced (min … max)\n")
		for _, r := range res.RR {
			names := slices.Sorted(maps.Keys(r.Rates))
			for _, o := range res.Observers {
				if !slices.Contains(names, o.Name) {
					continue
				}
				cost := "baseline"
				if s, ok := r.loss(o.Name); ok && o.Name != Baseline {
					cost = fmt.Sprintf("%.1f (%.1f … %.1f)", s.Median, s.Min, s.Max)
				}
				fmt.Fprintf(w, "%s\t%s\t%s %s\t%s\n", r.Workload, o.Name, fmtRate(Median(r.Rates[o.Name])), r.Unit, cost)
			}
		}
	}
	for _, h := range res.Hooks {
		fmt.Fprintf(w, "\n%s program\tns/run\truns/round trip\n", h.Tool)
		for _, p := range h.Programs {
			fmt.Fprintf(w, "%s\t%.0f\t%.2f\n", p.Name, p.Ns, p.PerRoundTrip)
		}
		fmt.Fprintf(w, "per exchange\t%.0f ns\t\n", h.NsPerExchange())
		for _, p := range h.Churn {
			fmt.Fprintf(w, "%s (churn)\t%.0f\t%.2f per connection\n", p.Name, p.Ns, p.PerRoundTrip)
		}
		for _, p := range h.Path {
			fmt.Fprintf(w, "%s (1 ms path)\t%.0f\t%.2f\n", p.Name, p.Ns, p.PerRoundTrip)
		}
		if h.Path != nil {
			fmt.Fprintf(w, "per exchange (1 ms path)\t%.0f ns\t\n", h.PathNsPerExchange())
		}
	}
	if len(res.Rates) > 0 {
		fmt.Fprintf(w, "\ndaemon\toffered ex/s\tcounted ex/s\tCPU %% of a core\tRSS MiB\n")
		for _, r := range res.Rates {
			fmt.Fprintf(w, "%s\t%.0f\t%.0f\t%.2f\t%.1f\n", r.Config, r.Offered, r.Measured, r.CPU, mib(r.RSS))
		}
	}
	if len(res.Flows) > 0 {
		fmt.Fprintf(w, "\nconnections\tflows kept\tevicted\tRSS MiB\tkernel maps MiB\n")
		for _, f := range res.Flows {
			fmt.Fprintf(w, "%d\t%.0f\t%.0f\t%.1f\t%.1f\n", f.Conns, f.Flows, f.Evicted, mib(f.RSS), mib(f.MapBytes()))
		}
	}
	if o := res.Overload; o != nil {
		fmt.Fprintf(w, "\noverload\tmade %d\tdecoded %d\tlost %d\texact %v\talive %v\n", o.Made, o.Decoded, o.Lost, o.Exact(), o.Alive)
	}
	if len(res.Accuracy) > 0 {
		fmt.Fprintf(w, "\nscenario\tquantity\ttruth\tlattrace\terror\n")
		for _, a := range res.Accuracy {
			fmt.Fprintf(w, "%s\t%s\t%.2f %s (%s)\t%.2f\t%s, %s %%\n", a.Scenario, a.Quantity, a.Truth, a.Unit, a.TruthFrom, a.Measured, fmtAbsErr(a), fmtNum(a.ErrorPct(), 1))
		}
	}
	fmt.Fprintf(w, "\ntarget\tmeasured\tmet\n")
	for _, t := range Targets(res) {
		fmt.Fprintf(w, "%s\t%s\t%s\n", t.Goal, t.Measured, t.Met)
	}
	for s, e := range res.Errors {
		fmt.Fprintf(w, "\nsection %s FAILED: %s\n", s, strings.SplitN(e, "\n", 2)[0])
	}
	w.Flush()
	return b.String()
}

// binaryPages is the range, over the held-connection rows, of the daemon's
// file-backed resident pages less the ring buffer it maps: the pages of its
// own binary it touched, which the page cache shares.
func binaryPages(flows []FlowCost) string {
	var lo, hi float64
	for i, f := range flows {
		b := mib(f.RSS-f.Anon) - mib(tracer.DefaultRingBufferBytes)
		if i == 0 || b < lo {
			lo = b
		}
		hi = max(hi, b)
	}
	if l, h := fmtNum(lo, 0), fmtNum(hi, 0); l != h {
		return l + " to " + h + " MiB"
	}
	return "about " + fmtNum(lo, 0) + " MiB"
}
