package bench

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// writePlots draws the run's figures as PNG files in dir and returns
// their file names by figure.
func writePlots(res *Results, dir string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range []struct {
		name string
		draw func(*Results) (*plot.Plot, vg.Length, vg.Length, error)
	}{
		{"rr-cost", plotRR},
		{"hooks", plotHooks},
		{"daemon-cpu", plotRates},
		{"daemon-memory", plotFlows},
		{"accuracy", plotAccuracy},
	} {
		p, w, h, err := f.draw(res)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		if p == nil {
			continue // no data in this run
		}
		// PNG: drawn with the fonts the layout was measured in (an SVG's
		// text is set by the viewer in its own, and labels overrun bars).
		file := f.name + ".png"
		if err := p.Save(w, h, filepath.Join(dir, file)); err != nil {
			return nil, err
		}
		out[f.name] = file
	}
	return out, nil
}

func palette(i int) color.Color { return plotutil.Color(i) }

// plotRR: per workload, each observer's cost in % of the untraced rate
// (median, with the repetitions' range as error bars).
func plotRR(res *Results) (*plot.Plot, vg.Length, vg.Length, error) {
	if len(res.RR) == 0 {
		return nil, 0, 0, nil
	}
	p := plot.New()
	p.Title.Text = "Cost of watching: rate lost against untraced (median of the repetitions)"
	p.Y.Label.Text = "% of the untraced rate lost"
	var names []string
	for _, r := range res.RR {
		names = append(names, r.Workload)
	}
	observers := res.Observers[1:]
	w := vg.Points(10)
	for i, o := range observers {
		vals := make(plotter.Values, len(res.RR))
		for j, r := range res.RR {
			if s, ok := r.loss(o.Name); ok {
				vals[j] = s.Median
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return nil, 0, 0, err
		}
		bars.Color = palette(i)
		bars.LineStyle.Width = 0
		bars.Offset = w * vg.Length(float64(i)-float64(len(observers)-1)/2)
		p.Add(bars)
		p.Legend.Add(o.Name, bars)
	}
	p.NominalX(names...)
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	// Room above the bars for the legend, and below for negative medians
	// (noise: a run faster than the baseline's).
	lo, hi := 0.0, 0.0
	for _, r := range res.RR {
		for _, o := range observers {
			if s, ok := r.loss(o.Name); ok {
				lo, hi = math.Min(lo, s.Median), math.Max(hi, s.Median)
			}
		}
	}
	p.Y.Min, p.Y.Max = lo-1, hi+(hi-lo)*0.6+1
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	return p, 32 * vg.Centimeter, 13 * vg.Centimeter, nil
}

// plotHooks: ns per run of each program of each BPF tool.
func plotHooks(res *Results) (*plot.Plot, vg.Length, vg.Length, error) {
	if len(res.Hooks) == 0 {
		return nil, 0, 0, nil
	}
	p := plot.New()
	p.Title.Text = "BPF run time per run: per round trip of loopback RR 100 B, or per connection of a churn"
	p.X.Label.Text = "ns per run"
	var labels []string
	var vals plotter.Values
	for _, h := range res.Hooks {
		for _, pr := range h.Warm() {
			// A program that ran less than every other round trip (or
			// connection) where it ran the most ran cold: the table has
			// it.
			if pr.PerRoundTrip < 0.5 {
				continue
			}
			per := "round trip"
			if pr.Churn {
				per = "connection"
			}
			labels = append(labels, fmt.Sprintf("%s: %s x%.0f per %s", h.Tool, pr.Name, pr.PerRoundTrip, per))
			vals = append(vals, pr.Ns)
		}
	}
	if err := hbars(p, labels, vals, 0); err != nil {
		return nil, 0, 0, err
	}
	if err := targetLine(p, "target: 150 ns", plotter.XYs{{X: 150, Y: -0.5}, {X: 150, Y: float64(len(vals)) - 0.5}}); err != nil {
		return nil, 0, 0, err
	}
	p.Legend.Top = true
	return p, 22 * vg.Centimeter, barsHeight(len(vals)), nil
}

// hbars draws vals as horizontal bars named by labels, the first on top.
func hbars(p *plot.Plot, labels []string, vals plotter.Values, colour int) error {
	labels, vals = slices.Clone(labels), slices.Clone(vals)
	slices.Reverse(labels)
	slices.Reverse(vals)
	bars, err := plotter.NewBarChart(vals, vg.Points(9))
	if err != nil {
		return err
	}
	bars.Horizontal = true
	bars.Color = palette(colour)
	bars.LineStyle.Width = 0
	p.Add(bars, plotter.NewGrid())
	p.NominalY(labels...)
	return nil
}

// barsHeight is the height of a plot of n horizontal bars.
func barsHeight(n int) vg.Length { return vg.Length(2+0.5*float64(n)) * vg.Centimeter }

// plotRates: daemon CPU against the exchange rate it handled.
func plotRates(res *Results) (*plot.Plot, vg.Length, vg.Length, error) {
	if len(res.Rates) == 0 {
		return nil, 0, 0, nil
	}
	p := plot.New()
	p.Title.Text = "lattrace daemon CPU against exchanges per second"
	p.X.Label.Text = "exchanges/s (counted by the daemon)"
	p.Y.Label.Text = "% of one core"
	var configs []string
	for _, r := range res.Rates {
		if !slices.Contains(configs, r.Config) {
			configs = append(configs, r.Config)
		}
	}
	var ss []series
	xmax := 0.0
	for _, c := range configs {
		s := series{name: c}
		for _, r := range res.Rates {
			if r.Config == c {
				s.xys = append(s.xys, plotter.XY{X: r.Measured, Y: r.CPU})
				xmax = math.Max(xmax, r.Measured)
			}
		}
		ss = append(ss, s)
	}
	return lines(p, ss, target{"target at 50k/s: 3 %", 0, xmax, 3})
}

// plotFlows: daemon RSS and kernel map memory against open connections.
func plotFlows(res *Results) (*plot.Plot, vg.Length, vg.Length, error) {
	if len(res.Flows) == 0 {
		return nil, 0, 0, nil
	}
	p := plot.New()
	p.Title.Text = "Memory with many connections open"
	p.X.Label.Text = "connections open (log scale)"
	p.Y.Label.Text = "MiB"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	rss, anon, maps := series{name: "daemon RSS"}, series{name: "daemon anonymous memory"}, series{name: "kernel maps (socket storage: estimated)"}
	for _, f := range res.Flows {
		x := float64(f.Conns)
		rss.xys = append(rss.xys, plotter.XY{X: x, Y: mib(f.RSS)})
		anon.xys = append(anon.xys, plotter.XY{X: x, Y: mib(f.Anon)})
		maps.xys = append(maps.xys, plotter.XY{X: x, Y: mib(f.MapBytes())})
	}
	p.X.Max = rss.xys[len(rss.xys)-1].X * 1.5 // room for the last tick's label
	return lines(p, []series{rss, anon, maps}, target{"target for the daemon: 64 MiB", rss.xys[0].X, rss.xys[len(rss.xys)-1].X, 64})
}

// series is one line of a line plot.
type series struct {
	name string
	xys  plotter.XYs
}

// target is a goal drawn as a dashed horizontal line from x0 to x1.
type target struct {
	name   string
	x0, x1 float64
	y      float64
}

// lines draws series as lines with points, and the target, on p.
func lines(p *plot.Plot, ss []series, t target) (*plot.Plot, vg.Length, vg.Length, error) {
	for i, s := range ss {
		l, pts, err := plotter.NewLinePoints(s.xys)
		if err != nil {
			return nil, 0, 0, err
		}
		l.Color, pts.Color = palette(i), palette(i)
		p.Add(l, pts)
		p.Legend.Add(s.name, l, pts)
	}
	if err := targetLine(p, t.name, plotter.XYs{{X: t.x0, Y: t.y}, {X: t.x1, Y: t.y}}); err != nil {
		return nil, 0, 0, err
	}
	p.Add(plotter.NewGrid())
	p.Legend.Top, p.Legend.Left = true, true
	return p, 16 * vg.Centimeter, 10 * vg.Centimeter, nil
}

// plotAccuracy: each scenario quantity's error in % of the truth.
func plotAccuracy(res *Results) (*plot.Plot, vg.Length, vg.Length, error) {
	if len(res.Accuracy) == 0 {
		return nil, 0, 0, nil
	}
	p := plot.New()
	p.Title.Text = "Accuracy: error against the truth (truths of 1 ms or more)"
	p.X.Label.Text = "error, % of the truth"
	var labels []string
	var vals plotter.Values
	for _, a := range res.Accuracy {
		e := a.ErrorPct()
		// A few µs off a truth of a few µs is hundreds of %: those rows
		// are in the table, in µs.
		if math.IsNaN(e) || a.Unit == "ms" && a.Truth < 1 {
			continue
		}
		labels = append(labels, a.Scenario+": "+a.Quantity)
		vals = append(vals, e)
	}
	if len(vals) == 0 {
		return nil, 0, 0, nil
	}
	if err := hbars(p, labels, vals, 1); err != nil {
		return nil, 0, 0, err
	}
	m := math.Max(math.Abs(slices.Min(vals)), math.Abs(slices.Max(vals))) * 1.1
	p.X.Min, p.X.Max = -m, m
	return p, 28 * vg.Centimeter, barsHeight(len(vals)), nil
}

// targetLine draws a goal as a dashed red line through xys, named in the
// legend.
func targetLine(p *plot.Plot, name string, xys plotter.XYs) error {
	line, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	line.Color = color.RGBA{R: 200, A: 255}
	line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(line)
	p.Legend.Add(name, line)
	return nil
}
