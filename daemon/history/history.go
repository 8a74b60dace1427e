// Package history keeps the last few exchanges of the most recently active
// flows, so a person looking at one flow sees what just happened to it
// (durations, cwnd and RTT over the last exchanges). The aggregate keeps
// the distributions and rates of every flow; this keeps the recent
// sequence.
package history

import (
	"container/list"
	"sync"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Defaults for the zero Config fields.
const (
	DefaultFlows   = 2048
	DefaultPerFlow = 64
)

// Config bounds a History.
type Config struct {
	// Flows is how many flows are remembered; the least recently active is
	// forgotten first.
	Flows int
	// PerFlow is how many exchanges of each flow are kept.
	PerFlow int
}

// Sample is one exchange, reduced to what a live view draws.
type Sample struct {
	Time        record.Mono         `json:"time_mono_ns"`
	Role        record.ExchangeRole `json:"role"`
	Duration    time.Duration       `json:"duration_ns"`
	Components  record.Components   `json:"components"`
	BytesOut    uint64              `json:"bytes_out"`
	BytesIn     uint64              `json:"bytes_in"`
	Retransmits uint32              `json:"retransmits"`
	RTOs        uint32              `json:"rtos"`
	Turns       uint32              `json:"turns"`
	CwndEnd     uint32              `json:"cwnd_end"`
	SRTT        time.Duration       `json:"srtt_ns"`
	PathRTT     time.Duration       `json:"path_rtt_ns"`
	CwndRestart bool                `json:"cwnd_restart,omitempty"`
	Partial     bool                `json:"partial,omitempty"`
}

type flow struct {
	cookie uint64
	ring   []Sample
	next   int // where the next sample goes once ring is full
	elem   *list.Element
}

// History is safe for one writer and many readers.
type History struct {
	cfg   Config
	mu    sync.Mutex
	flows map[uint64]*flow
	lru   list.List // front: most recently active
	// free holds forgotten flows for reuse, rings included: under
	// connection churn a new flow per connection was most of the daemon's
	// garbage.
	free []*flow
}

// New returns an empty History.
func New(cfg Config) *History {
	if cfg.Flows <= 0 {
		cfg.Flows = DefaultFlows
	}
	if cfg.PerFlow <= 0 {
		cfg.PerFlow = DefaultPerFlow
	}
	return &History{cfg: cfg, flows: make(map[uint64]*flow)}
}

// Add records an exchange under its connection's cookie.
func (h *History) Add(e *record.Exchange) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := h.flows[e.Cookie]
	if f == nil {
		if len(h.flows) >= h.cfg.Flows {
			h.forget(h.lru.Back().Value.(*flow))
		}
		if n := len(h.free); n > 0 {
			f, h.free = h.free[n-1], h.free[:n-1]
			*f = flow{ring: f.ring[:0]}
		} else {
			// The ring grows by append: most flows of a churning host
			// carry one or two exchanges, and a ring made at full size
			// for each was a third of the daemon's heap with 2,048 of
			// them.
			f = &flow{}
		}
		f.cookie = e.Cookie
		f.elem = h.lru.PushFront(f)
		h.flows[e.Cookie] = f
	} else {
		h.lru.MoveToFront(f.elem)
	}
	s := Sample{
		Time: e.Time, Role: e.Role, Duration: e.Duration, Components: e.Components,
		BytesOut: e.BytesOut, BytesIn: e.BytesIn, Retransmits: e.Retransmits, RTOs: e.RTOs,
		Turns: e.ExchangeTurns, CwndEnd: e.CwndEnd, SRTT: e.SRTT, PathRTT: e.PathRTT,
		CwndRestart: e.CwndRestart, Partial: e.Partial,
	}
	if len(f.ring) < h.cfg.PerFlow {
		f.ring = append(f.ring, s)
	} else {
		f.ring[f.next] = s
		f.next = (f.next + 1) % len(f.ring)
	}
}

// Recent returns the flow's kept exchanges, oldest first.
func (h *History) Recent(cookie uint64) []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	f := h.flows[cookie]
	if f == nil {
		return nil
	}
	out := make([]Sample, 0, len(f.ring))
	out = append(out, f.ring[f.next:]...)
	return append(out, f.ring[:f.next]...)
}

// Forget drops a flow (its connection is gone from the aggregate).
func (h *History) Forget(cookie uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if f := h.flows[cookie]; f != nil {
		h.forget(f)
	}
}

// forget drops f, keeping it for reuse. The caller holds mu.
func (h *History) forget(f *flow) {
	h.lru.Remove(f.elem)
	delete(h.flows, f.cookie)
	f.elem = nil
	if len(h.free) < h.cfg.Flows/8+1 {
		h.free = append(h.free, f)
	}
}

// Shed forgets every flow's exchanges, to give their memory back when the
// daemon nears its memory limit (daemon/memguard), rings and spare flows
// included; it returns how many exchanges went. The flows' statistics are
// the aggregate's, and stay.
func (h *History) Shed() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, f := range h.flows {
		n += len(f.ring)
	}
	clear(h.flows)
	h.lru.Init()
	h.free = nil
	return n
}

// Len is how many flows are remembered.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.flows)
}
