package report

import (
	"math"
	"slices"
)

// A chart of a million points is neither drawable in a browser nor
// readable; a chart that averages them hides the one slow exchange a
// person is looking for. Every reduction here therefore keeps extremes:
// time series keep each interval's lowest and highest value, markers each
// interval's largest, and distributions are computed on every value and
// then drawn at quantiles that always include p99 and the maximum.

// MinMax picks at most maxPoints indices of the series v over the
// ascending times t such that a line through them has the envelope of the
// whole series: the time range is cut into maxPoints/2 equal intervals
// and each keeps its lowest and highest value, in time order. A series of
// maxPoints or fewer points is kept whole. The global minimum and maximum
// are always among the indices.
func MinMax(t, v []float64, maxPoints int) []int {
	n := len(v)
	if n <= maxPoints || maxPoints < 2 {
		return identity(n)
	}
	buckets := maxPoints / 2
	lo, hi := t[0], t[n-1]
	width := (hi - lo) / float64(buckets)
	out := make([]int, 0, maxPoints)
	i := 0
	for b := 0; b < buckets && i < n; b++ {
		end := lo + float64(b+1)*width
		minI, maxI := i, i
		for ; i < n && (t[i] < end || b == buckets-1); i++ {
			if v[i] < v[minI] {
				minI = i
			}
			if v[i] > v[maxI] {
				maxI = i
			}
		}
		switch {
		case i == minI: // the interval is empty
		case minI == maxI:
			out = append(out, minI)
		case minI < maxI:
			out = append(out, minI, maxI)
		default:
			out = append(out, maxI, minI)
		}
	}
	return out
}

// Markers picks at most max of the indices with a positive weight (a
// retransmission count) over the ascending times t: all of them when they
// are few, else each interval's heaviest, so that bursts stay visible and
// the heaviest of all is always there.
func Markers(t, weight []float64, max int) []int {
	var hits []int
	for i, w := range weight {
		if w > 0 {
			hits = append(hits, i)
		}
	}
	if len(hits) <= max || max < 1 {
		return hits
	}
	lo, hi := t[hits[0]], t[hits[len(hits)-1]]
	width := (hi - lo) / float64(max)
	out := make([]int, 0, max)
	best, bucket := -1, 0
	for _, i := range hits {
		b := min(int((t[i]-lo)/width), max-1)
		if width == 0 {
			b = 0
		}
		if b != bucket && best >= 0 {
			out = append(out, best)
			best = -1
		}
		bucket = b
		if best < 0 || weight[i] > weight[best] {
			best = i
		}
	}
	if best >= 0 {
		out = append(out, best)
	}
	return out
}

func identity(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// Quantile is the nearest-rank q-quantile of sorted values: the smallest
// value with at least a fraction q of the values at or below it. It is
// always one of the values, so a chart's p99 is an exchange that happened.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[rank(len(sorted), q)]
}

func rank(n int, q float64) int {
	r := int(math.Ceil(q*float64(n))) - 1
	return min(max(r, 0), n-1)
}

// CDF returns points (value, fraction of values at or below it) of sorted
// values: all of them when there are at most points, else points evenly
// spread in probability plus the tail's 0.9, 0.99, 0.999, ... quantiles
// down to a single value, the minimum and the maximum.
func CDF(sorted []float64, points int) [][2]float64 {
	n := len(sorted)
	var ranks []int
	if n <= points {
		ranks = identity(n)
	} else {
		for i := range points {
			ranks = append(ranks, rank(n, float64(i+1)/float64(points)))
		}
		for tail := 0.1; tail*float64(n) >= 1; tail /= 10 {
			ranks = append(ranks, rank(n, 1-tail))
		}
		ranks = append(ranks, 0, rank(n, 0.99), n-1)
		slices.Sort(ranks)
		ranks = slices.Compact(ranks)
	}
	out := make([][2]float64, 0, len(ranks))
	for _, r := range ranks {
		// Ties: the fraction at a value counts every copy of it.
		for r+1 < n && sorted[r+1] == sorted[r] {
			r++
		}
		if len(out) > 0 && out[len(out)-1][0] == sorted[r] {
			continue
		}
		out = append(out, [2]float64{sorted[r], float64(r+1) / float64(n)})
	}
	return out
}

// Stats summarize a distribution: what the report's table shows.
type Stats struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	Std   float64 `json:"std"`
	Min   float64 `json:"min"`
	P25   float64 `json:"p25"`
	P50   float64 `json:"p50"`
	P75   float64 `json:"p75"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// StatsOf sorts values in place and summarizes them; Std is the
// population standard deviation, as the seed study's summary gave it.
func StatsOf(values []float64) Stats {
	n := len(values)
	if n == 0 {
		return Stats{}
	}
	slices.Sort(values)
	var sum float64
	for _, v := range values {
		sum += v
	}
	mean := sum / float64(n)
	var sq float64
	for _, v := range values {
		sq += (v - mean) * (v - mean)
	}
	return Stats{
		Count: n, Mean: mean, Std: math.Sqrt(sq / float64(n)),
		Min: values[0], P25: Quantile(values, 0.25), P50: Quantile(values, 0.5), P75: Quantile(values, 0.75),
		P90: Quantile(values, 0.9), P99: Quantile(values, 0.99), Max: values[n-1],
	}
}
