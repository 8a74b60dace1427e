package aggregate

import (
	"math"
	"time"

	"github.com/DataDog/sketches-go/ddsketch/mapping"
	"github.com/DataDog/sketches-go/ddsketch/store"
)

// Summary is a latency distribution reduced to what a table row or an
// exporter shows. Quantiles come from the sketch (within the configured
// relative accuracy of the exact order statistic); Min, Max and Mean are
// exact.
type Summary struct {
	// Count is how many values were recorded, zeros included: a component
	// that did not happen in an exchange (no handshake on a reused
	// connection) is a zero, so quantiles are "per exchange". For the
	// exchange distributions it is Metrics.Exchanges - Metrics.Partial -
	// Metrics.Unanswered - Metrics.Multiplexed - Metrics.Pushes -
	// Metrics.Unfinished - Metrics.Rejected.
	Count uint64 `json:"count"`
	// Nonzero is how many of them were above zero: how often the
	// component happened at all.
	Nonzero uint64        `json:"nonzero"`
	Min     time.Duration `json:"min_ns"`
	// A quantile of zero is left out of JSON.
	P50  time.Duration `json:"p50_ns,omitempty"`
	P90  time.Duration `json:"p90_ns,omitempty"`
	P99  time.Duration `json:"p99_ns,omitempty"`
	Max  time.Duration `json:"max_ns"`
	Mean time.Duration `json:"mean_ns"`
	// NoDistribution says no distribution is kept, so there are no
	// quantiles: a flow's components and path RTT other than its send
	// wait (flowSketches). Their peer pair has them.
	NoDistribution bool `json:"no_distribution,omitempty"`
}

// sketch is a DDSketch specialised for non-negative durations: the
// logarithmic index mapping of sketches-go over a store of positive values,
// with zeros counted apart. Components are zero in most exchanges (think
// time on a requester, handshake after the first exchange), so the store
// is only allocated once a positive value arrives, and adding a zero costs
// two increments. The exact count, sum, min and max are kept beside it
// because they are cheap and a "max" that is off by 1 % looks wrong to a
// user.
type sketch struct {
	exactStats
	st store.Store // nil until the first positive value
}

// exactStats is a sketch's exact statistics.
type exactStats struct {
	n      uint64
	zeros  uint64
	sum    float64 // float: an int64 ns sum could overflow on a busy peer
	minPos time.Duration
	max    time.Duration
}

// sketchCfg is what the sketches of one table share.
type sketchCfg struct {
	m        mapping.IndexMapping
	newStore func() store.Store
	// binned says which of a metrics' sketches keep a store, and so
	// quantiles; the others keep only their exact statistics.
	binned [numSketches]bool
}

func newMapping(relAcc float64) mapping.IndexMapping {
	// The cubically interpolated mapping keeps the relative-accuracy
	// guarantee of the logarithmic one with a few % more bins, and
	// indexes without calling math.Log: it is on the per-exchange path
	// about twenty times.
	m, err := mapping.NewCubicallyInterpolatedMapping(relAcc)
	if err != nil {
		// Config.withDefaults validates relAcc: a programming error.
		panic("aggregate: " + err.Error())
	}
	return m
}

// flowSketches bin only a flow's duration and send wait: the live views
// show the duration's quantiles per connection, and the diagnoses ask
// whether the typical exchange waited to be sent. The components' and the
// path RTT's distributions are the peer pair's, where the connections of
// one conversation meet; a flow keeps their exact count, min, max and
// mean. Updating eleven stores per exchange per flow was the largest part
// of the daemon's work, and a node's many idle flows held them all.
//
// The stores keep pages of 32 bins allocated where values fall, behind a
// small buffer: most flows are short (one exchange for a connection per
// request) or narrow, and a dense store would allocate at least 64 bins
// for them.
func flowSketches(m mapping.IndexMapping) sketchCfg {
	c := sketchCfg{m: m, newStore: func() store.Store { return store.NewBufferedPaginatedStore() }}
	c.binned[skDuration], c.binned[skSendWait] = true, true
	return c
}

// peerSketches bin every sketch, in a dense store whose lowest bins
// collapse past maxBins: pairs are few, long-lived and see every exchange,
// so the store that is fastest to update and has a hard size bound fits
// them. With the default bound the collapse starts only when the values
// span eight decades.
func peerSketches(m mapping.IndexMapping, maxBins int) sketchCfg {
	c := sketchCfg{m: m, newStore: func() store.Store { return store.NewCollapsingLowestDenseStore(maxBins) }}
	for k := range c.binned {
		c.binned[k] = true
	}
	return c
}

func (s *sketch) add(c *sketchCfg, v time.Duration) {
	if s.count(v) {
		s.store(c).Add(c.m.Index(float64(v)))
	}
}

// noBin is the index of a value that goes to no bin of the store: a zero,
// counted apart.
const noBin = math.MinInt32

// count counts v in the exactStats statistics and reports whether it also goes
// to a bin of the store: false for a zero.
func (s *sketch) count(v time.Duration) bool {
	s.n++
	if v <= 0 {
		// Negative values would be a tracer bug; they count as "did not
		// happen" rather than poisoning the sum.
		s.zeros++
		return false
	}
	s.sum += float64(v)
	if s.max < v {
		s.max = v
	}
	if s.minPos == 0 || v < s.minPos {
		s.minPos = v
	}
	return true
}

// pend returns the bin b as a pending bin index for bin to count later
// (metrics batches the store updates, which cost cache misses). An index
// beyond int32 (only with an absurdly fine accuracy) is counted at once.
func (s *sketch) pend(c *sketchCfg, b int) int32 {
	if b <= math.MinInt32 || b > math.MaxInt32 {
		s.store(c).Add(b)
		return noBin
	}
	return int32(b)
}

// bin counts a value pend returned the bin of.
func (s *sketch) bin(c *sketchCfg, b int32) { s.store(c).Add(int(b)) }

// store is the sketch's store, made at its first positive value.
func (s *sketch) store(c *sketchCfg) store.Store {
	if s.st == nil {
		s.st = c.newStore()
	}
	return s.st
}

// reset empties the sketch for reuse, keeping the store's memory.
func (s *sketch) reset() {
	st := s.st
	if st != nil {
		st.Clear()
	}
	*s = sketch{st: st}
}

// quantile returns the value at rank q*(n-1) (the lower order statistic),
// the same rank DDSketch uses.
func (s *sketch) quantile(c *sketchCfg, q float64) time.Duration {
	if s.n == 0 {
		return 0
	}
	rank := q * float64(s.n-1)
	if rank < float64(s.zeros) || s.st == nil || s.st.IsEmpty() {
		return 0
	}
	v := c.m.Value(s.st.KeyAtRank(rank - float64(s.zeros)))
	d := time.Duration(math.Round(v))
	// The bin's representative value can lie just outside the observed
	// range; clamping keeps p99 <= max, which readers rely on.
	if d > s.max {
		d = s.max
	}
	if d < s.minPos {
		d = s.minPos
	}
	return d
}

func (s *sketch) summary(c *sketchCfg) Summary {
	if s.n == 0 {
		return Summary{}
	}
	out := Summary{
		Count:   s.n,
		Nonzero: s.n - s.zeros,
		Max:     s.max,
		Mean:    time.Duration(math.Round(s.sum / float64(s.n))),
		P50:     s.quantile(c, 0.50),
		P90:     s.quantile(c, 0.90),
		P99:     s.quantile(c, 0.99),
	}
	if s.zeros == 0 {
		out.Min = s.minPos
	}
	return out
}
