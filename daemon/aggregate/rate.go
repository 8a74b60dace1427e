package aggregate

import (
	"time"

	"github.com/lattrace/lattrace/record"
)

// rateSlice is how long a slice of a flow's rate window lasts.
const rateSlice = 5 * time.Second

// rateWindow counts a flow's exchanges in the current and the previous
// slice of rateSlice, so its rate covers between one and two slices of
// recent time. It is kept with the flow, packed or not, so that every
// listed flow has its rate.
type rateWindow struct {
	cur, prev     uint64
	curAt, prevAt record.Mono
	hasPrev       bool
}

// add counts an exchange at t.
func (w *rateWindow) add(t record.Mono) {
	if w.curAt == 0 {
		w.curAt = t
	}
	if t.Sub(w.curAt) >= rateSlice {
		if t.Sub(w.curAt) >= 2*rateSlice {
			// Idle for more than a slice: nothing recent to carry.
			w.prev, w.prevAt = 0, t-record.Mono(rateSlice)
		} else {
			w.prev, w.prevAt = w.cur, w.curAt
		}
		w.cur, w.curAt, w.hasPrev = 0, t, true
	}
	w.cur++
}

// at is the exchanges per second over the last five to ten seconds
// before now (zero when the flow was idle that long).
func (w *rateWindow) at(now record.Mono) float64 {
	if w.curAt == 0 {
		return 0
	}
	since := now.Sub(w.curAt)
	switch {
	case since >= 2*rateSlice:
		return 0
	case since >= rateSlice:
		// Only the current slice is still recent.
		return float64(w.cur) / since.Seconds()
	}
	start := w.curAt
	if w.hasPrev {
		start = w.prevAt
	}
	span := max(now.Sub(start), time.Second)
	return float64(w.cur+w.prev) / span.Seconds()
}

// RateAt is the flow's exchanges per second over the last five to ten
// seconds before now, on the records' clock.
func (s *FlowStats) RateAt(now record.Mono) float64 { return s.rate.at(now) }
