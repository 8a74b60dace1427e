package history

import (
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

func ex(cookie uint64, t time.Duration, turns uint32) *record.Exchange {
	return &record.Exchange{Cookie: cookie, Time: record.Mono(t), Duration: t, Turns: turns, ExchangeTurns: 2}
}

func TestRingKeepsTheLastInOrder(t *testing.T) {
	h := New(Config{PerFlow: 4})
	for i := 1; i <= 10; i++ {
		h.Add(ex(1, time.Duration(i)*time.Second, uint32(2*i)))
	}
	r := h.Recent(1)
	if len(r) != 4 || r[0].Time != record.Mono(7*time.Second) || r[3].Time != record.Mono(10*time.Second) {
		t.Fatalf("%+v", r)
	}
	for _, s := range r {
		if s.Turns != 2 { // the running count went up by 2 each time
			t.Errorf("turns %d", s.Turns)
		}
	}
	if h.Recent(2) != nil {
		t.Error("unknown flow has samples")
	}
}

func TestBoundedByFlows(t *testing.T) {
	h := New(Config{Flows: 3})
	for c := uint64(1); c <= 5; c++ {
		h.Add(ex(c, time.Duration(c)*time.Second, 0))
	}
	h.Add(ex(3, 6*time.Second, 0)) // 3 is now the most recent
	h.Add(ex(6, 7*time.Second, 0))
	if h.Len() != 3 || h.Recent(4) != nil || h.Recent(3) == nil || h.Recent(6) == nil || h.Recent(5) == nil {
		t.Errorf("kept %d flows: 3 %v 4 %v 5 %v 6 %v", h.Len(), h.Recent(3) != nil, h.Recent(4) != nil, h.Recent(5) != nil, h.Recent(6) != nil)
	}
	h.Forget(3)
	if h.Len() != 2 {
		t.Errorf("forget: %d", h.Len())
	}
}
