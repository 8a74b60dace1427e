package report

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// series makes n lognormal latencies over ascending times with irregular
// gaps (bursts and silences), and plants spikes far above everything else
// at least two intervals of a maxPoints reduction apart.
func series(n, spikes, maxPoints int, r *rand.Rand) (t, v []float64, spikeAt []int) {
	t = make([]float64, n)
	v = make([]float64, n)
	now := 0.0
	for i := range n {
		if r.IntN(1000) == 0 {
			now += 5 * r.Float64() // a silence
		}
		now += r.ExpFloat64() * 1e-4
		t[i] = now
		v[i] = math.Exp(r.NormFloat64()) // ~1 ms
	}
	width := (t[n-1] - t[0]) / float64(maxPoints/2)
	last := math.Inf(-1)
	for len(spikeAt) < spikes {
		i := r.IntN(n)
		if t[i]-last < 2*width || slices.ContainsFunc(spikeAt, func(j int) bool { return math.Abs(t[j]-t[i]) < 2*width }) {
			continue
		}
		v[i] = 1000 + float64(len(spikeAt))
		spikeAt = append(spikeAt, i)
	}
	return t, v, spikeAt
}

// A million points reduced to 2,000 keep every spike, the global minimum
// and maximum, and each interval's extremes: the drawn envelope is the
// true one.
func TestMinMaxKeepsExtremes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n, maxPoints = 1_000_000, 2000
	ts, v, spikes := series(n, 40, maxPoints, r)
	keep := MinMax(ts, v, maxPoints)
	if len(keep) > maxPoints {
		t.Fatalf("%d points kept, want at most %d", len(keep), maxPoints)
	}
	if !slices.IsSorted(keep) {
		t.Fatal("indices not in time order")
	}
	for _, i := range spikes {
		if _, ok := slices.BinarySearch(keep, i); !ok {
			t.Errorf("spike at %d (%.0f ms) dropped", i, v[i])
		}
	}
	minI, maxI := 0, 0
	for i := range v {
		if v[i] < v[minI] {
			minI = i
		}
		if v[i] > v[maxI] {
			maxI = i
		}
	}
	for _, want := range []int{minI, maxI} {
		if _, ok := slices.BinarySearch(keep, want); !ok {
			t.Errorf("global extreme %d (%v) dropped", want, v[want])
		}
	}
	// Envelope: within every interval, the highest and lowest value kept
	// are the highest and lowest there were.
	buckets := maxPoints / 2
	width := (ts[n-1] - ts[0]) / float64(buckets)
	bucket := func(x float64) int { return min(int((x-ts[0])/width), buckets-1) }
	trueMax := make([]float64, buckets)
	keptMax := make([]float64, buckets)
	for b := range trueMax {
		trueMax[b], keptMax[b] = math.Inf(-1), math.Inf(-1)
	}
	for i := range v {
		b := bucket(ts[i])
		trueMax[b] = max(trueMax[b], v[i])
	}
	for _, i := range keep {
		b := bucket(ts[i])
		keptMax[b] = max(keptMax[b], v[i])
	}
	for b := range trueMax {
		if trueMax[b] != keptMax[b] {
			t.Fatalf("interval %d: max %v drawn as %v", b, trueMax[b], keptMax[b])
		}
	}
	// Short series are kept whole.
	if got := MinMax(ts[:100], v[:100], maxPoints); len(got) != 100 {
		t.Errorf("100 points became %d", len(got))
	}
}

// Retransmission markers: all when few; when many, at most the bound,
// spread over the whole time range, the heaviest always among them.
func TestMarkers(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const n = 200_000
	ts := make([]float64, n)
	w := make([]float64, n)
	for i := range n {
		ts[i] = float64(i) * 1e-3
		if r.IntN(20) == 0 {
			w[i] = float64(1 + r.IntN(3))
		}
	}
	heaviest := n / 3
	w[heaviest] = 50
	few := slices.Clone(w)
	for i := 1000; i < n; i++ {
		few[i] = 0
	}
	hits := 0
	for _, x := range few {
		if x > 0 {
			hits++
		}
	}
	if got := Markers(ts, few, 500); len(got) != hits {
		t.Errorf("%d markers for %d retransmitting points under the bound", len(got), hits)
	}
	got := Markers(ts, w, 500)
	if len(got) > 500 || len(got) < 450 {
		t.Fatalf("%d markers, want close to the bound of 500", len(got))
	}
	if !slices.Contains(got, heaviest) {
		t.Error("the heaviest retransmission was dropped")
	}
	if ts[got[0]] > 0.01*ts[n-1] || ts[got[len(got)-1]] < 0.99*ts[n-1] {
		t.Errorf("markers span %v..%v of 0..%v", ts[got[0]], ts[got[len(got)-1]], ts[n-1])
	}
	for _, i := range got {
		if w[i] == 0 {
			t.Fatalf("marker at %d has no retransmission", i)
		}
	}
}

// The CDF of a million values is a few hundred points that include the
// minimum, the exact p99 and the maximum, and never decrease.
func TestCDFKeepsTail(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	v := make([]float64, 1_000_000)
	for i := range v {
		v[i] = math.Exp(r.NormFloat64())
	}
	s := StatsOf(v) // sorts
	pts := CDF(v, 400)
	if len(pts) > 420 {
		t.Fatalf("%d CDF points", len(pts))
	}
	if pts[0][0] != s.Min || pts[len(pts)-1] != [2]float64{s.Max, 1} {
		t.Errorf("ends %v .. %v, want min %v and (max %v, 1)", pts[0], pts[len(pts)-1], s.Min, s.Max)
	}
	found := false
	for i, p := range pts {
		if i > 0 && (p[0] <= pts[i-1][0] || p[1] <= pts[i-1][1]) {
			t.Fatalf("not increasing at %d: %v after %v", i, p, pts[i-1])
		}
		if p[0] == s.P99 {
			found = true
			if p[1] < 0.99 || p[1] > 0.990001 {
				t.Errorf("p99 %v at fraction %v", p[0], p[1])
			}
		}
	}
	if !found {
		t.Errorf("p99 %v is not a CDF point", s.P99)
	}
	// Every 1-10^-k quantile down to one value is drawn.
	for _, q := range []float64{0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999} {
		x := Quantile(v, q)
		if !slices.ContainsFunc(pts, func(p [2]float64) bool { return p[0] == x }) {
			t.Errorf("quantile %v (%v) not drawn", q, x)
		}
	}
	// Ties count every copy.
	if got := CDF([]float64{1, 2, 2, 2, 3}, 400); !slices.Equal(got, [][2]float64{{1, 0.2}, {2, 0.8}, {3, 1}}) {
		t.Errorf("ties: %v", got)
	}
}

func TestStats(t *testing.T) {
	v := []float64{9, 1, 2, 3, 4, 5, 6, 7, 8, 10}
	s := StatsOf(v)
	// Nearest rank: p50 of 1..10 is 5, p99 is 10; population std of
	// 1..10 is sqrt(8.25).
	if s.Count != 10 || s.Mean != 5.5 || s.P50 != 5 || s.P25 != 3 || s.P75 != 8 || s.P99 != 10 || s.Min != 1 || s.Max != 10 ||
		math.Abs(s.Std-math.Sqrt(8.25)) > 1e-12 {
		t.Errorf("%+v", s)
	}
	if (StatsOf(nil) != Stats{}) {
		t.Error("stats of nothing")
	}
}
