package netlab

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// Direction names one way through the relay.
type Direction int

const (
	AtoB Direction = iota // frames sent by host A towards host B
	BtoA                  // frames sent by host B towards host A
	Both                  // SetLink only: apply to both directions
)

func (d Direction) String() string {
	switch d {
	case AtoB:
		return "A->B"
	case BtoA:
		return "B->A"
	case Both:
		return "both"
	}
	return fmt.Sprintf("Direction(%d)", int(d))
}

// Link describes one direction of the emulated path. The zero value is a
// perfect wire (no delay, no loss, unlimited rate).
type Link struct {
	// Delay is the one-way propagation delay added after serialization.
	Delay time.Duration
	// Jitter adds a uniform random offset in [-Jitter, +Jitter] to each
	// frame's delay (netem's default distribution). Delivery stays FIFO, so a
	// frame never overtakes the previous one: it waits for it instead, which
	// makes the mean extra delay slightly positive when Jitter is large
	// compared to the gap between frames.
	Jitter time.Duration
	// Loss is the probability (0..1) that a frame is dropped on arrival,
	// before it reaches the queue.
	Loss float64
	// RateBitsPerSec is the bottleneck rate; 0 means unlimited. It counts IP
	// packet bytes (the Ethernet frame minus its 14-byte header), like tbf on
	// an IP link, so that a 10 Mbit/s link carries 10 Mbit/s of IP traffic
	// and TCP goodput is rate*MSS/MTU (about 96.5 % for MTU 1500 with TCP
	// timestamps).
	RateBitsPerSec int64
	// QueueLimitBytes bounds the bytes waiting for serialization (a byte
	// FIFO, like bfifo). 0 picks DefaultQueueLimit(rate). Ignored when the
	// rate is unlimited, since nothing then waits for serialization.
	QueueLimitBytes int
}

// String formats the link in the units the netlab command accepts.
func (l Link) String() string {
	rate := "unlimited"
	if l.RateBitsPerSec > 0 {
		rate = FormatRate(l.RateBitsPerSec)
	}
	q := l.QueueLimitBytes
	if q == 0 {
		q = DefaultQueueLimit(l.RateBitsPerSec)
	}
	return fmt.Sprintf("delay %v jitter %v loss %g%% rate %s queue %dB", l.Delay, l.Jitter, l.Loss*100, rate, q)
}

// Validate reports the first field out of range.
func (l Link) Validate() error {
	switch {
	case l.Delay < 0:
		return fmt.Errorf("delay %v is negative", l.Delay)
	case l.Jitter < 0:
		return fmt.Errorf("jitter %v is negative", l.Jitter)
	case math.IsNaN(l.Loss) || l.Loss < 0 || l.Loss > 1:
		return fmt.Errorf("loss %v is outside 0..1", l.Loss)
	case l.RateBitsPerSec < 0:
		return fmt.Errorf("rate %d bit/s is negative", l.RateBitsPerSec)
	case l.QueueLimitBytes < 0:
		return fmt.Errorf("queue limit %d bytes is negative", l.QueueLimitBytes)
	}
	return nil
}

// DefaultQueueLimit is the queue limit used when Link.QueueLimitBytes is 0:
// 100 ms worth of the rate but at least 64 KiB. That is deep enough for one
// TCP flow to keep the bottleneck busy at the RTTs tests use, without the
// seconds of bufferbloat a 1000-packet txqueuelen would give on slow links;
// scenarios that want bufferbloat set the limit explicitly.
func DefaultQueueLimit(rateBitsPerSec int64) int {
	const floor = 64 << 10
	if rateBitsPerSec <= 0 {
		return floor
	}
	q := rateBitsPerSec / 8 / 10
	if q < floor {
		return floor
	}
	if q > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(q)
}

// LinkStats are counters for one direction since the lab started.
type LinkStats struct {
	Received   uint64 // frames read from the sending side
	Frames     uint64 // frames delivered to the receiving side
	Bytes      uint64 // Ethernet bytes of the delivered frames
	LossDrops  uint64 // frames dropped by Link.Loss
	QueueDrops uint64 // frames tail-dropped because the queue was full
	SendErrors uint64 // frames the kernel refused to send on the far side
	// KernelDrops are frames the kernel dropped because the relay's socket
	// buffer was full: the relay itself fell behind. Tests should expect 0.
	KernelDrops uint64
	QueueBytes  int // bytes waiting for serialization right now
	Pending     int // frames accepted and not yet delivered (queue + delay line)
	// MaxFrame is the largest frame seen, in Ethernet bytes. Anything above
	// MTU+14 means a segmentation offload leaked a super-packet.
	MaxFrame int
}

// Rx timestamps and due times are nanoseconds on the relay's monotonic clock
// (see relay.now).
type frame struct {
	data []byte
	due  int64
}

// maxPending bounds the delay line so that an unlimited-rate, long-delay link
// fed by a fast sender cannot exhaust memory; frames beyond it count as
// queue drops.
const maxPending = 1 << 17

const ethHeaderLen = 14

// shaper is the per-direction state machine: it decides, at arrival, whether
// a frame is dropped and when it is due. Keeping every decision at arrival
// (instead of modelling a queue that drains in real time) makes the model
// exact and independent of when the relay's goroutines get scheduled.
type shaper struct {
	mu      sync.Mutex
	link    Link
	limit   int // effective queue limit in bytes
	rng     *rand.Rand
	lastDep int64   // departure (end of serialization) of the last accepted frame
	lastDue int64   // due time of the last accepted frame, for FIFO order
	q       []frame // delay line; q[head:] are pending
	head    int
	wake    chan struct{}

	received, lossDrops, queueDrops uint64
	maxFrame                        int
}

func newShaper(l Link, seed1, seed2 uint64) *shaper {
	s := &shaper{rng: rand.New(rand.NewPCG(seed1, seed2)), wake: make(chan struct{}, 1)}
	s.set(l)
	return s
}

func (s *shaper) set(l Link) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.link = l
	s.limit = l.QueueLimitBytes
	if s.limit == 0 {
		s.limit = DefaultQueueLimit(l.RateBitsPerSec)
	}
}

// backlog returns the bytes still waiting for serialization at time now.
// The byte count is derived from the departure time of the last frame:
// with a constant-rate server that is exactly the unsent bytes, including the
// part of the frame being serialized.
func (s *shaper) backlog(now int64) int {
	if s.link.RateBitsPerSec <= 0 || s.lastDep <= now {
		return 0
	}
	return int(float64(s.lastDep-now) * float64(s.link.RateBitsPerSec) / 8e9)
}

// offer runs the drop/queue decision for one frame that arrived at time
// arrival and, if accepted, appends it to the delay line.
func (s *shaper) offer(data []byte, arrival int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.received++
	if len(data) > s.maxFrame {
		s.maxFrame = len(data)
	}
	l := &s.link
	if l.Loss > 0 && s.rng.Float64() < l.Loss {
		s.lossDrops++
		return
	}
	if s.pending() >= maxPending {
		s.queueDrops++
		return
	}
	dep := arrival
	if l.RateBitsPerSec > 0 {
		size := len(data) - ethHeaderLen
		if size < 0 {
			size = 0
		}
		// A frame always fits an empty queue, so a limit below one MTU still
		// passes traffic (one frame at a time) instead of blackholing it.
		if b := s.backlog(arrival); b > 0 && b+size > s.limit {
			s.queueDrops++
			return
		}
		start := max(arrival, s.lastDep)
		dep = start + int64(float64(size)*8e9/float64(l.RateBitsPerSec))
		s.lastDep = dep
	}
	due := dep + int64(l.Delay)
	if l.Jitter > 0 {
		due += int64((s.rng.Float64()*2 - 1) * float64(l.Jitter))
	}
	due = max(due, s.lastDue, arrival)
	s.lastDue = due
	s.q = append(s.q, frame{data: data, due: due})
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// popDue moves the frames due at or before now into buf and returns it, with
// the due time of the next frame (0 if none is left).
func (s *shaper) popDue(now int64, buf []frame) ([]frame, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.head
	for i < len(s.q) && s.q[i].due <= now {
		i++
	}
	buf = append(buf, s.q[s.head:i]...)
	clear(s.q[s.head:i])
	s.head = i
	switch {
	case s.head == len(s.q):
		s.q, s.head = s.q[:0], 0
	case s.head > 1024 && s.head > len(s.q)/2:
		n := copy(s.q, s.q[s.head:])
		clear(s.q[n:])
		s.q, s.head = s.q[:n], 0
	}
	if s.head == len(s.q) {
		return buf, 0
	}
	return buf, s.q[s.head].due
}

func (s *shaper) pending() int { return len(s.q) - s.head }

func (s *shaper) stats(now int64, st *LinkStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st.Received = s.received
	st.LossDrops = s.lossDrops
	st.QueueDrops = s.queueDrops
	st.QueueBytes = s.backlog(now)
	st.Pending = s.pending()
	st.MaxFrame = s.maxFrame
}

var errClosed = errors.New("netlab: lab is closed")
