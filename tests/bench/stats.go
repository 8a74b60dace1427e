package bench

import (
	"math"
	"slices"
)

// Median of xs (NaN for none). It sorts a copy.
func Median(xs []float64) float64 { return Quantile(xs, 0.5) }

// Quantile q of xs by linear interpolation between order statistics
// (NaN for none).
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return s[lo] + (s[hi]-s[lo])*(pos-float64(lo))
}

// Ratios pairs each repetition's value with the baseline's of the same
// repetition: value[i] / base[i]. Pairing inside a repetition cancels the
// drift of a noisy machine between repetitions.
func Ratios(values, base []float64) []float64 {
	n := min(len(values), len(base))
	out := make([]float64, 0, n)
	for i := range n {
		if base[i] > 0 {
			out = append(out, values[i]/base[i])
		}
	}
	return out
}

// Spread is a set of repeated measurements reduced to what a table shows.
type Spread struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// Q1 and Q3 are the quartiles: half the repetitions lie between them.
	Q1 float64 `json:"q1"`
	Q3 float64 `json:"q3"`
}

// SpreadOf reduces xs.
func SpreadOf(xs []float64) Spread {
	if len(xs) == 0 {
		nan := math.NaN()
		return Spread{Median: nan, Min: nan, Max: nan, Q1: nan, Q3: nan}
	}
	return Spread{
		N:      len(xs),
		Median: Median(xs),
		Min:    slices.Min(xs),
		Max:    slices.Max(xs),
		Q1:     Quantile(xs, 0.25),
		Q3:     Quantile(xs, 0.75),
	}
}

// Rotate returns xs rotated left by k: repetition k of an interleaved
// run starts with a different configuration, so none is always first
// (after a warm cache) or last (after the others heated the machine).
func Rotate[T any](xs []T, k int) []T {
	if len(xs) == 0 {
		return nil
	}
	k %= len(xs)
	return append(slices.Clone(xs[k:]), xs[:k]...)
}
