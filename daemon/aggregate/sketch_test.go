package aggregate

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

// exact is the order statistic the sketch estimates: rank q*(n-1), lower.
func exact(sorted []time.Duration, q float64) time.Duration {
	return sorted[int(q*float64(len(sorted)-1))]
}

func within(got, want time.Duration, rel float64) bool {
	// +1 ns: the sketch's value is rounded to whole nanoseconds.
	return math.Abs(float64(got-want)) <= rel*float64(want)+1
}

// lognormal draws latencies around median with a heavy right tail, the
// usual shape of request latency.
func lognormal(r *rand.Rand, median time.Duration, sigma float64) time.Duration {
	return time.Duration(float64(median) * math.Exp(sigma*r.NormFloat64()))
}

func checkSummary(t *testing.T, name string, s Summary, vals []time.Duration) {
	t.Helper()
	sorted := slices.Clone(vals)
	slices.Sort(sorted)
	var sum float64
	zeros := 0
	for _, v := range sorted {
		sum += float64(v)
		if v == 0 {
			zeros++
		}
	}
	if s.Count != uint64(len(vals)) || s.Nonzero != uint64(len(vals)-zeros) {
		t.Errorf("%s: count %d nonzero %d, want %d %d", name, s.Count, s.Nonzero, len(vals), len(vals)-zeros)
	}
	for _, c := range []struct {
		q   float64
		got time.Duration
	}{{0.5, s.P50}, {0.9, s.P90}, {0.99, s.P99}} {
		want := exact(sorted, c.q)
		if !within(c.got, want, 0.01) {
			t.Errorf("%s: p%v = %v, exact %v (%.3f%% off)", name, c.q*100, c.got, want,
				100*math.Abs(float64(c.got-want))/float64(want))
		}
	}
	if s.Max != sorted[len(sorted)-1] || s.Min != sorted[0] {
		t.Errorf("%s: min/max %v/%v, want %v/%v", name, s.Min, s.Max, sorted[0], sorted[len(sorted)-1])
	}
	if want := time.Duration(math.Round(sum / float64(len(vals)))); s.Mean != want {
		t.Errorf("%s: mean %v, want %v", name, s.Mean, want)
	}
}

// storeKinds are the two sketch flavours: flows' and peers'.
func storeKinds() []struct {
	name string
	c    sketchCfg
} {
	m := newMapping(0.01)
	return []struct {
		name string
		c    sketchCfg
	}{{"flow", flowSketches(m)}, {"peer", peerSketches(m, DefaultSketchBins)}}
}

func TestQuantilesWithinOnePercent(t *testing.T) {
	for _, kind := range storeKinds() {
		t.Run(kind.name, func(t *testing.T) { testQuantiles(t, kind.c) })
	}
}

func testQuantiles(t *testing.T, c sketchCfg) {
	r := rand.New(rand.NewPCG(1, 2))

	t.Run("lognormal", func(t *testing.T) {
		var s sketch
		vals := make([]time.Duration, 100000)
		for i := range vals {
			vals[i] = lognormal(r, 20*ms, 1)
			s.add(&c, vals[i])
		}
		checkSummary(t, "lognormal", s.summary(&c), vals)
	})
	t.Run("bimodal with zeros", func(t *testing.T) {
		// A component absent from 40 % of exchanges, and two modes three
		// decades apart (cache hit vs miss).
		var s sketch
		vals := make([]time.Duration, 50000)
		for i := range vals {
			switch u := r.Float64(); {
			case u < 0.4:
				vals[i] = 0
			case u < 0.9:
				vals[i] = lognormal(r, 50*time.Microsecond, 0.3)
			default:
				vals[i] = lognormal(r, 80*ms, 0.5)
			}
			s.add(&c, vals[i])
		}
		checkSummary(t, "bimodal", s.summary(&c), vals)
	})
	t.Run("eight decades", func(t *testing.T) {
		// From 1 µs to 100 s uniformly in log scale: the widest spread
		// the default bin cap must still cover exactly.
		var s sketch
		vals := make([]time.Duration, 20000)
		for i := range vals {
			vals[i] = time.Duration(1e3 * math.Pow(10, 8*r.Float64()))
			s.add(&c, vals[i])
		}
		checkSummary(t, "wide", s.summary(&c), vals)
	})
}

func TestSketchEdgeCases(t *testing.T) {
	for _, kind := range storeKinds() {
		t.Run(kind.name, func(t *testing.T) { testSketchEdges(t, kind.c) })
	}
}

func testSketchEdges(t *testing.T, c sketchCfg) {
	var s sketch
	if got := s.summary(&c); got != (Summary{}) {
		t.Errorf("empty summary %+v", got)
	}
	s.add(&c, 0)
	s.add(&c, -5) // a tracer bug must not go negative
	if got := s.summary(&c); got.Count != 2 || got.Nonzero != 0 || got.P99 != 0 || got.Mean != 0 {
		t.Errorf("zeros %+v", got)
	}
	for range 3 {
		s.add(&c, 7*ms)
	}
	// Ranks 0-1 are the zeros, 2-4 the 7 ms: p50 (rank 2) is 7 ms, and
	// never above the exact max.
	got := s.summary(&c)
	if got.P50 < 6930*time.Microsecond || got.P99 > 7*ms || got.P99 < got.P50 || got.Max != 7*ms || got.Min != 0 {
		t.Errorf("one value %+v", got)
	}
	s.reset()
	if got := s.summary(&c); got != (Summary{}) || s.st == nil {
		t.Errorf("reset %+v, store kept %v", got, s.st != nil)
	}
}

// The same guarantee end to end: a flow fed a known distribution reports
// its duration's quantiles and its components' exact statistics, and its
// pair the quantiles of every component.
func TestFlowQuantilesMatchDistribution(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	a := New(Config{})
	var durs, nets, peers []time.Duration
	var ex *record.Exchange
	for i := range 20000 {
		d := lognormal(r, 10*ms, 0.8)
		ex = exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("curl", 7, 1), record.RoleClient, at(float64(i)), d)
		a.AddExchange(ex)
		durs = append(durs, ex.Duration)
		nets = append(nets, ex.Components.Network)
		peers = append(peers, ex.Components.Peer)
	}
	f, ok := a.Flow(flowKey(ex))
	if !ok {
		t.Fatal("flow missing")
	}
	checkSummary(t, "duration", f.Duration, durs)
	for _, c := range []struct {
		name string
		s    Summary
		v    []time.Duration
	}{{"network", f.Components.Network, nets}, {"peer", f.Components.Peer, peers}, {"path rtt", f.RTT.Path, nets}} {
		x := exactOf(c.v)
		if c.s.Count != x.Count || c.s.Min != x.Min || c.s.Max != x.Max || absDur(c.s.Mean-x.Mean) > time.Microsecond || c.s.P50 != 0 || c.s.P99 != 0 {
			t.Errorf("flow's %s %+v, want the exact %+v and no quantiles", c.name, c.s, x)
		}
	}
	if f.Components.Think.Count != 20000 || f.Components.Think.Nonzero != 0 {
		t.Errorf("think %+v", f.Components.Think)
	}
	p := a.Peers()[0]
	checkSummary(t, "pair's duration", p.Duration, durs)
	checkSummary(t, "pair's network", p.Components.Network, nets)
	checkSummary(t, "pair's peer", p.Components.Peer, peers)
	checkSummary(t, "pair's path rtt", p.RTT.Path, nets)
}

// exactOf is the exact count, min, max and mean of v.
func exactOf(v []time.Duration) Summary {
	s := Summary{Count: uint64(len(v)), Min: slices.Min(v), Max: slices.Max(v)}
	var sum float64
	for _, d := range v {
		sum += float64(d)
	}
	s.Mean = time.Duration(math.Round(sum / float64(len(v))))
	return s
}

func absDur(d time.Duration) time.Duration { return max(d, -d) }
