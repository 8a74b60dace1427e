package otlp

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lattrace/lattrace/record"
)

// sampler decides which exchanges become spans, in one place: every
// exchange at least threshold long or with a warning or critical
// diagnosis, within the slow budget, and a random sample of the rest at a
// steady rate, drawn from the share Config.Ratio of them. It counts its
// decisions for Stats.
type sampler struct {
	threshold time.Duration // negative: no exchange counts as slow
	slow      bucket        // the budget of slow and diagnosed spans; rate <= 0: no bound
	random    bucket        // the rate sample
	// share: an exchange whose identity hashes below it is in the share
	// the rate sample draws from; all: every exchange is.
	share uint64
	all   bool

	sampledSlow, sampledDiagnosed, slowOverBudget, sampledRate, dropped atomic.Uint64
}

func (s *sampler) init(cfg Config) {
	s.threshold = cfg.SlowThreshold
	s.slow.init(cfg.SlowRatePerSecond, max(1, int(cfg.SlowRatePerSecond)))
	s.random.init(cfg.RatePerSecond, cfg.Burst)
	s.all = cfg.Ratio >= 1
	s.share = uint64(cfg.Ratio * (1 << 63) * 2)
}

// inShare tells whether e is in the share the rate sample draws from: by a
// hash of what its trace ID is made of, so both ends of its connection
// tell alike; an exchange without ISNs (no trace across nodes) by a coin.
func (s *sampler) inShare(e *record.Exchange) bool {
	if s.all {
		return true
	}
	k, ok := exchangeKey(e)
	if !ok {
		return rand.Uint64() < s.share
	}
	return k.hash() < s.share
}

// sample tells whether e is exported as spans, and with which priority
// in the export queue. A slow or diagnosed exchange beyond the budget does
// not fall through to the rate sample: in a connection storm every
// exchange is slow, and the budget is what bounds their spans.
func (s *sampler) sample(e *record.Exchange) (priority, bool) {
	slow := s.threshold >= 0 && e.Duration >= s.threshold
	diagnosed := flagged(e)
	switch {
	case slow || diagnosed:
		if s.slow.rate > 0 && !s.slow.take(e.Time) {
			s.slowOverBudget.Add(1)
			return 0, false
		}
		if slow {
			s.sampledSlow.Add(1)
		} else {
			s.sampledDiagnosed.Add(1)
		}
		if diagnosed {
			return prioDiagnosed, true
		}
		return prioSlow, true
	case s.inShare(e) && s.random.take(e.Time):
		s.sampledRate.Add(1)
		return prioRate, true
	default:
		s.dropped.Add(1)
		return 0, false
	}
}

// flagged tells whether a diagnosis of e is a warning or worse: such an
// exchange is kept however short, as a gateway's tail sampling keeps its
// trace.
func flagged(e *record.Exchange) bool {
	for _, d := range e.Diagnoses {
		if d.Severity.Rank() >= record.SeverityWarning.Rank() {
			return true
		}
	}
	return false
}

// bucket is a token bucket on the exchanges' own clock: reading the
// system clock for every exchange would cost more than the rest of the
// sampling.
type bucket struct {
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   record.Mono // 0: not yet started
}

func (b *bucket) init(rate float64, burst int) {
	b.rate, b.burst, b.tokens = rate, float64(burst), float64(burst)
}

// take spends a token if there is one at now, an exchange's end.
func (b *bucket) take(now record.Mono) bool {
	if b.rate <= 0 {
		return false
	}
	if now == 0 { // an exchange without a time: the bucket's clock must still run
		now = record.Now()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Records of different CPUs arrive slightly out of order: time only
	// moves forward here.
	if now > b.last {
		if b.last != 0 {
			b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
		}
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	return false
}
