package requests

import (
	"fmt"
	"strings"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Move is a what-if: a service moved so that every round trip between it
// and the others takes Extra longer.
type Move struct {
	Service string
	Extra   time.Duration
}

// ParseMove reads "SERVICE=+20ms" (the service as a hop names it: pod or
// command).
func ParseMove(s string) (Move, error) {
	name, d, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return Move{}, fmt.Errorf("what-if %q: want SERVICE=+DURATION, such as postgres=+20ms", s)
	}
	extra, err := time.ParseDuration(strings.TrimPrefix(d, "+"))
	if err != nil {
		return Move{}, fmt.Errorf("what-if %q: %v", s, err)
	}
	return Move{Service: name, Extra: extra}, nil
}

// Prediction is a request's latency after a Move.
type Prediction struct {
	Duration time.Duration `json:"duration_ns"`
	// RoundTrips are the round trips on the critical path that cross the
	// moved service's edges (half their turns each).
	RoundTrips float64       `json:"round_trips"`
	Added      time.Duration `json:"added_ns"`
}

// WhatIf predicts r's latency with m applied: each round trip on its
// critical path between m's service and another one takes m.Extra longer
// (a request and its answer are one round trip: two turns; a connection's
// handshake one more). Hops off the
// critical path that would become critical are not counted: the
// prediction is a lower bound where parallel branches cross the edge.
func WhatIf(r *record.Request, m Move) Prediction {
	var rts float64
	var walk func(h *record.Hop)
	walk = func(h *record.Hop) {
		if (h.From == m.Service) != (h.To == m.Service) {
			rts += float64(h.Turns) / 2
			if h.Handshake {
				rts++
			}
		}
		for _, c := range h.Children {
			if c.Critical {
				walk(c)
			}
		}
	}
	walk(r.Root)
	added := time.Duration(rts * float64(m.Extra))
	return Prediction{Duration: r.Duration + added, RoundTrips: rts, Added: added}
}
