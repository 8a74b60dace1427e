package latency

import (
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

const ms = record.Mono(time.Millisecond)

// at builds a timeline in milliseconds from an arbitrary origin.
func at(v float64) record.Mono { return 1000*ms + record.Mono(v*float64(ms)) }

func TestRequesterComponents(t *testing.T) {
	e := &record.Exchange{
		Role: record.Requester,
		Timeline: record.Timeline{
			W0: at(0), W1: at(0.01), X1: at(0.02), A1: at(50.02),
			R0: at(50.02), R1: at(52.02), D1: at(53.02),
		},
		MinRTT:  20 * time.Millisecond,
		PathRTT: 20 * time.Millisecond,
	}
	Attribute(e)
	c := e.Components
	want := record.Components{
		SendWait: 20 * time.Microsecond, SendWaitOther: 20 * time.Microsecond,
		Network: 20 * time.Millisecond, Propagation: 20 * time.Millisecond,
		Peer: 30 * time.Millisecond, Receive: 2 * time.Millisecond, LocalRead: time.Millisecond,
	}
	if c != want {
		t.Errorf("components\n got %+v\nwant %+v", c, want)
	}
	if e.Duration != 53020*time.Microsecond || c.Sum() != e.Duration {
		t.Errorf("duration %v, sum %v", e.Duration, c.Sum())
	}
}

func TestQueueingAndPathMinimum(t *testing.T) {
	// A flow that began behind a full queue: its own minimum is inflated,
	// the path's is not.
	e := &record.Exchange{
		Role:     record.Requester,
		Timeline: record.Timeline{W0: at(0), X1: at(0), R0: at(180), R1: at(180), D1: at(180)},
		MinRTT:   120 * time.Millisecond, PathMinRTT: 20 * time.Millisecond, PathRTT: 178 * time.Millisecond,
	}
	Attribute(e)
	c := e.Components
	if c.Network != 178*time.Millisecond || c.Propagation != 20*time.Millisecond || c.Queueing != 158*time.Millisecond || c.Peer != 2*time.Millisecond {
		t.Errorf("%+v", c)
	}
}

func TestAckSampleLowersEstimate(t *testing.T) {
	e := &record.Exchange{
		Role:     record.Requester,
		Timeline: record.Timeline{W0: at(0), X1: at(0), R0: at(100), R1: at(100), D1: at(100)},
		MinRTT:   20 * time.Millisecond, PathRTT: 40 * time.Millisecond, AckRTT: 21 * time.Millisecond,
	}
	Attribute(e)
	if e.Components.Network != 21*time.Millisecond || e.Components.Peer != 79*time.Millisecond {
		t.Errorf("%+v", e.Components)
	}
}

func TestHandshakeAndLoss(t *testing.T) {
	e := &record.Exchange{
		Role: record.Requester,
		Timeline: record.Timeline{Connect: at(0), Established: at(20), W0: at(20.1), W1: at(20.2), X1: at(20.2),
			R0: at(280.2), R1: at(290.2), D1: at(290.3)},
		MinRTT: 20 * time.Millisecond,
		Raw:    record.ExchangeRaw{LossOut: 220 * time.Millisecond, LossIn: 4 * time.Millisecond},
	}
	Attribute(e)
	c := e.Components
	if c.Handshake != 20100*time.Microsecond || c.LossRecovery != 224*time.Millisecond ||
		c.Network != 20*time.Millisecond || c.Peer != 20*time.Millisecond || c.Receive != 6*time.Millisecond {
		t.Errorf("%+v", c)
	}
	if c.Sum() != e.Duration || e.Start != at(0) {
		t.Errorf("sum %v duration %v start %v", c.Sum(), e.Duration, e.Start)
	}
}

func TestSendWaitSplitScaled(t *testing.T) {
	e := &record.Exchange{
		Role:     record.Requester,
		Timeline: record.Timeline{W0: at(0), W1: at(1), X1: at(60), R0: at(80), R1: at(80), D1: at(80)},
		MinRTT:   20 * time.Millisecond,
		// The hooks saw slightly more than w0..x1: the split is scaled.
		Raw: record.ExchangeRaw{WaitCwnd: 45 * time.Millisecond, WaitRwnd: 30 * time.Millisecond},
	}
	Attribute(e)
	c := e.Components
	if c.SendWait != 60*time.Millisecond || c.SendWaitCwnd+c.SendWaitRwnd+c.SendWaitSndbuf+c.SendWaitOther != c.SendWait {
		t.Errorf("%+v", c)
	}
	if c.SendWaitCwnd != 36*time.Millisecond || c.SendWaitRwnd != 24*time.Millisecond {
		t.Errorf("scaled split %v %v", c.SendWaitCwnd, c.SendWaitRwnd)
	}
}

func TestResponderComponents(t *testing.T) {
	e := &record.Exchange{
		Role:     record.Responder,
		Timeline: record.Timeline{R0: at(0), R1: at(1), D1: at(1.5), W0: at(31.5), W1: at(31.6), X1: at(31.6), A1: at(52)},
		MinRTT:   20 * time.Millisecond,
	}
	Attribute(e)
	c := e.Components
	if c.Receive != time.Millisecond || c.LocalRead != 500*time.Microsecond || c.Think != 30*time.Millisecond ||
		c.SendWait != 100*time.Microsecond || c.Network != 0 || e.End != at(31.6) {
		t.Errorf("%+v end %v", c, e.End)
	}
}

// A lost answer: the responder retransmitted it 210 ms after it first
// left (an RTO). It got out then, so the responder's exchange runs to the
// retransmission and the wait is loss recovery, not think time.
func TestResponderAnswerLost(t *testing.T) {
	e := &record.Exchange{
		Role:     record.Responder,
		Timeline: record.Timeline{R0: at(0), R1: at(0), D1: at(0.5), W0: at(5.5), W1: at(5.6), X1: at(5.6), A1: at(236)},
		MinRTT:   20 * time.Millisecond,
		Raw:      record.ExchangeRaw{LossOut: 210 * time.Millisecond},
	}
	Attribute(e)
	c := e.Components
	if c.LossRecovery != 210*time.Millisecond || c.Think != 5*time.Millisecond || e.End != at(215.6) || c.Sum() != e.Duration {
		t.Errorf("%+v end %v duration %v", c, e.End, e.Duration)
	}
}

// Points out of order (hooks racing, a read before the last arrival was
// seen) never produce a negative component, and the sum still holds.
func TestOutOfOrderPointsClamp(t *testing.T) {
	for _, tl := range []record.Timeline{
		{W0: at(5), W1: at(4), X1: at(3), R0: at(2), R1: at(1), D1: at(0)},
		{W0: at(0), X1: at(10), R0: at(5), R1: at(20), D1: at(15)},
		{W0: at(0)},
		{R0: at(0), W0: at(0)},
	} {
		for _, role := range []record.ExchangeRole{record.Requester, record.Responder} {
			e := &record.Exchange{Role: role, Timeline: tl, MinRTT: 20 * time.Millisecond, PathRTT: 25 * time.Millisecond}
			Attribute(e)
			c := e.Components
			for _, v := range []time.Duration{c.Network, c.SendWait, c.LossRecovery, c.Handshake, c.Receive, c.Peer, c.LocalRead, c.Think, c.Queueing, c.Propagation, c.SendWaitOther} {
				if v < 0 {
					t.Errorf("%s %+v: negative component in %+v", role, tl, c)
				}
			}
			if c.Sum() != e.Duration || e.Duration < 0 {
				t.Errorf("%s %+v: sum %v duration %v", role, tl, c.Sum(), e.Duration)
			}
		}
	}
}

// A reply sooner than the path's round trip after the message left was
// sent before the message arrived: the connection carries overlapping
// messages, and the cut measures no network. Only an exact x1 tells.
func TestMultiplexed(t *testing.T) {
	req := &record.Exchange{
		Role:     record.Requester,
		Timeline: record.Timeline{W0: at(0), W1: at(0.01), X1: at(0.02), R0: at(1.02), R1: at(1.5), D1: at(1.6)},
		MinRTT:   24 * time.Millisecond, PathRTT: 24 * time.Millisecond, TxTimestamps: true,
	}
	Attribute(req)
	if c := req.Components; !req.Multiplexed || c.Network != 0 || c.Peer != time.Millisecond || c.Sum() != req.Duration {
		t.Errorf("requester: multiplexed %v, components %+v, duration %v", req.Multiplexed, c, req.Duration)
	}
	for _, c := range []struct {
		name string
		tl   record.Timeline
		want bool
	}{
		// Sent inside the write (x1 is its return): bounded by its start.
		{"sent in the write", record.Timeline{W0: at(0), W1: at(0.5), X1: at(0.5), R0: at(1.5), R1: at(1.6), D1: at(1.7)}, true},
		// The write's return came late (a descheduled thread): from its
		// start the reply took the path's round trip.
		{"late write return", record.Timeline{W0: at(0), W1: at(3), X1: at(3), R0: at(24.1), R1: at(24.2), D1: at(24.3)}, false},
		// x1 taken at the reply's own first segment (the fallback).
		{"fallback x1", record.Timeline{W0: at(0), W1: at(0.01), X1: at(30), R0: at(30), R1: at(30.1), D1: at(30.2)}, false},
		// The reply came before the write returned (no w1) and x1 was
		// taken at it: bounded by the write's start (HTTP/2's SETTINGS
		// ACK written as the server's next frames arrive).
		{"reply before the write returned", record.Timeline{W0: at(0), X1: at(0.05), R0: at(0.05), R1: at(0.1), D1: at(0.2)}, true},
		{"slow reply before the write returned", record.Timeline{W0: at(0), X1: at(30), R0: at(30), R1: at(30.1), D1: at(30.2)}, false},
	} {
		e := &record.Exchange{Role: record.Requester, Timeline: c.tl, MinRTT: 24 * time.Millisecond, PathRTT: 24 * time.Millisecond}
		Attribute(e)
		if e.Multiplexed != c.want || e.Components.Sum() != e.Duration {
			t.Errorf("%s: multiplexed %v, sum %v duration %v", c.name, e.Multiplexed, e.Components.Sum(), e.Duration)
		}
		// A reply cannot come sooner than the path's round trip: a late
		// x1 moves back to it, and the rest of the wait is the send's.
		if c.name == "fallback x1" && (e.Components.Network != 24*time.Millisecond || e.Components.SendWait != 6*time.Millisecond) {
			t.Errorf("fallback x1: %+v", e.Components)
		}
		// The write's return bounds x1 from above as well: the byte
		// left inside the write, a round trip before the reply at most.
		if c.name == "late write return" && (e.Components.Network != 24*time.Millisecond || e.Components.SendWait != 100*time.Microsecond) {
			t.Errorf("late write return: %+v", e.Components)
		}
	}
	// x1 read as the segment was handed to IP is exact, as a TX
	// timestamp: a reply sooner than the round trip after it overlaps,
	// however long the write took.
	xmit := &record.Exchange{
		Role:     record.Requester,
		Timeline: record.Timeline{W0: at(0), W1: at(30.01), X1: at(30), R0: at(30.5), R1: at(30.6), D1: at(30.7)},
		MinRTT:   24 * time.Millisecond, PathRTT: 24 * time.Millisecond, X1Transmit: true,
	}
	Attribute(xmit)
	if !xmit.Multiplexed || xmit.Components.SendWait != 30*time.Millisecond {
		t.Errorf("x1 at transmission: multiplexed %v, %+v", xmit.Multiplexed, xmit.Components)
	}
	lockstep := &record.Exchange{
		Role:     record.Requester,
		Timeline: record.Timeline{W0: at(0), W1: at(0.01), X1: at(0.02), R0: at(24.5), R1: at(24.6), D1: at(24.7)},
		MinRTT:   24 * time.Millisecond, PathRTT: 24 * time.Millisecond,
	}
	Attribute(lockstep)
	if lockstep.Multiplexed || lockstep.Components.Network != 24*time.Millisecond {
		t.Errorf("lockstep requester: multiplexed %v, network %v", lockstep.Multiplexed, lockstep.Components.Network)
	}
	for _, c := range []struct {
		idle  time.Duration
		first bool
		want  bool
	}{{time.Millisecond, false, true}, {20 * time.Millisecond, false, false}, {time.Millisecond, true, false}} {
		resp := &record.Exchange{
			Role:     record.Responder,
			Timeline: record.Timeline{R0: at(0), R1: at(0.1), D1: at(0.2), W0: at(0.3), W1: at(0.4), X1: at(0.4)},
			MinRTT:   24 * time.Millisecond, IdleGap: c.idle, First: c.first,
		}
		Attribute(resp)
		if resp.Multiplexed != c.want {
			t.Errorf("responder after %v idle (first %v): multiplexed %v", c.idle, c.first, resp.Multiplexed)
		}
	}
}

// A message alone: a push or a greeting the client closed on (requester
// without a write), a push on the server (responder without a request).
func TestOneMessage(t *testing.T) {
	greeting := &record.Exchange{Role: record.Requester, Timeline: record.Timeline{Connect: at(0), R0: at(40), R1: at(40.1), D1: at(40.2)}}
	Attribute(greeting)
	if c := greeting.Components; greeting.Start != at(0) || c.Handshake != 40*time.Millisecond || c.Sum() != greeting.Duration || greeting.Duration != 40200*time.Microsecond {
		t.Errorf("greeting: start %v, components %+v, duration %v", greeting.Start, c, greeting.Duration)
	}
	push := &record.Exchange{Role: record.Requester, Timeline: record.Timeline{R0: at(100), R1: at(100.5), D1: at(101)}}
	Attribute(push)
	if c := push.Components; push.Start != at(100) || c.Receive != 500*time.Microsecond || c.LocalRead != 500*time.Microsecond || c.Sum() != push.Duration {
		t.Errorf("push in: start %v, components %+v, duration %v", push.Start, c, push.Duration)
	}
	out := &record.Exchange{Role: record.Responder, Timeline: record.Timeline{W0: at(100), W1: at(100.1), X1: at(100.3)}}
	Attribute(out)
	if c := out.Components; out.Start != at(100) || c.SendWait != 300*time.Microsecond || c.Sum() != out.Duration {
		t.Errorf("push out: start %v, components %+v, duration %v", out.Start, c, out.Duration)
	}
}

// A message written in pieces with all of it sent in between: the pauses
// are the local app's (Think), on either end; the flow-control window's
// wait stays send wait, a cause of its own.
func TestWriteGapsAndFlowControl(t *testing.T) {
	e := &record.Exchange{
		Role:     record.Responder,
		Timeline: record.Timeline{R0: at(0), R1: at(0), D1: at(1), W0: at(3), W1: at(20), X1: at(20)},
		MinRTT:   20 * time.Millisecond,
		Raw:      record.ExchangeRaw{WriteGaps: 10 * time.Millisecond, WaitFlowControl: 5 * time.Millisecond},
	}
	Attribute(e)
	c := e.Components
	if c.Think != 12*time.Millisecond || c.SendWait != 7*time.Millisecond || c.SendWaitFlowControl != 5*time.Millisecond ||
		c.SendWaitOther != 2*time.Millisecond || c.Sum() != e.Duration {
		t.Errorf("%+v (duration %v)", c, e.Duration)
	}
	// Gaps beyond the send wait (a clamped timeline) take what there is.
	e = &record.Exchange{
		Role:     record.Requester,
		Timeline: record.Timeline{W0: at(0), X1: at(2), R0: at(30), R1: at(30), D1: at(30)},
		MinRTT:   20 * time.Millisecond,
		Raw:      record.ExchangeRaw{WriteGaps: 5 * time.Millisecond},
	}
	Attribute(e)
	if c := e.Components; c.Think != 2*time.Millisecond || c.SendWait != 0 || c.Sum() != e.Duration {
		t.Errorf("%+v", c)
	}
}

// An HTTP/2 stream's answer streamed with pauses: the pauses are the
// peer's, the rest of its arrival is receive.
func TestStreamInGaps(t *testing.T) {
	e := &record.Exchange{
		Role:     record.Requester,
		Timeline: record.Timeline{W0: at(0), X1: at(0), R0: at(40), R1: at(440), D1: at(441)},
		MinRTT:   20 * time.Millisecond,
		Stream:   &record.HTTP2Stream{ID: 1, DataIn: 3, InGaps: 390 * time.Millisecond},
	}
	Attribute(e)
	c := e.Components
	if c.Network != 20*time.Millisecond || c.Peer != 410*time.Millisecond || c.Receive != 10*time.Millisecond || c.Sum() != e.Duration {
		t.Errorf("%+v", c)
	}
	// An answer's first frame read a little sooner than the path's
	// minimum after the request's last (the hooks' own skew) is still
	// the stream's answer; one that began before the request ended
	// overlaps it.
	for _, r0 := range []float64{19.9, -1} {
		e = &record.Exchange{
			Role:     record.Requester,
			Timeline: record.Timeline{W0: at(0), X1: at(0), R0: at(r0), R1: at(30), D1: at(30)},
			MinRTT:   20 * time.Millisecond, X1Transmit: true,
			Stream: &record.HTTP2Stream{ID: 1},
		}
		Attribute(e)
		if e.Multiplexed != (r0 < 0) {
			t.Errorf("answer %v ms after the request: multiplexed %v", r0, e.Multiplexed)
		}
	}
	// A stream's request that follows the previous one at once is no
	// overlap: streams are cut by their own frames.
	e = &record.Exchange{
		Role:     record.Responder,
		Timeline: record.Timeline{R0: at(0), R1: at(0), D1: at(0), W0: at(13), W1: at(13), X1: at(13)},
		MinRTT:   20 * time.Millisecond,
		Stream:   &record.HTTP2Stream{ID: 3},
	}
	Attribute(e)
	if e.Multiplexed || e.Components.Think != 13*time.Millisecond {
		t.Errorf("multiplexed %v, %+v", e.Multiplexed, e.Components)
	}
}

// The model's guard: an answered request is a latency sample only when
// an RTT bounds its network part, that part is no less than the path's
// minimum, and its role is no guess; a cut already known to split
// overlapping messages keeps no network part.
func TestGuard(t *testing.T) {
	lockstep := record.Timeline{W0: at(0), W1: at(0.1), X1: at(0.1), R0: at(30), R1: at(30), D1: at(30)}
	cases := []struct {
		name string
		e    record.Exchange
		want record.Rejection
	}{
		{"sample", record.Exchange{Role: record.Requester, Timeline: lockstep, MinRTT: 24 * time.Millisecond}, ""},
		{"no RTT", record.Exchange{Role: record.Requester, Timeline: lockstep}, record.RejectedNoPathRTT},
		{"role guessed", record.Exchange{Role: record.Requester, Timeline: lockstep, MinRTT: 24 * time.Millisecond, RoleSource: record.RoleGuessed}, record.RejectedRoleGuessed},
		{"responder without RTT", record.Exchange{Role: record.Responder, Timeline: record.Timeline{R0: at(0), R1: at(0), W0: at(5), W1: at(5), X1: at(5)}}, ""},
		{"partial", record.Exchange{Role: record.Requester, Timeline: lockstep, Partial: true}, ""},
		{"unanswered", record.Exchange{Role: record.Requester, Timeline: record.Timeline{W0: at(0), X1: at(0)}, Unanswered: true}, ""},
	}
	for _, c := range cases {
		Attribute(&c.e)
		if c.e.Rejected != c.want || c.want != "" && c.e.Timed() {
			t.Errorf("%s: rejected %q (timed %v), want %q", c.name, c.e.Rejected, c.e.Timed(), c.want)
		}
	}
	// A stream's answer sooner than the path allows: its network part
	// would be below the path's minimum.
	s := record.Exchange{Role: record.Requester, Stream: &record.HTTP2Stream{ID: 1}, MinRTT: 24 * time.Millisecond,
		Timeline: record.Timeline{W0: at(0), W1: at(0.1), X1: at(0.1), R0: at(10), R1: at(10), D1: at(10)}}
	Attribute(&s)
	if s.Rejected != record.RejectedNetworkBelowPath || s.Timed() {
		t.Errorf("stream answered in 10 ms on a 24 ms path: rejected %q, network %v", s.Rejected, s.Components.Network)
	}
	m := record.Exchange{Role: record.Requester, Timeline: lockstep, MinRTT: 24 * time.Millisecond, Multiplexed: true, HTTP2Searching: true}
	Attribute(&m)
	if m.Components.Network != 0 || m.Components.Sum() != m.Duration || m.Rejected != "" {
		t.Errorf("a cut known to be multiplexed: network %v, sum %v of %v, rejected %q", m.Components.Network, m.Components.Sum(), m.Duration, m.Rejected)
	}
}

// The guard leaves the hooks' own error to them: a stream answered a
// little sooner after its request's last byte left than the kernel's
// minimum RTT (points read at other places, an emulated CPU) is a sample.
func TestGuardSlack(t *testing.T) {
	s := record.Exchange{Role: record.Requester, Stream: &record.HTTP2Stream{ID: 1}, MinRTT: 51 * time.Millisecond,
		Timeline: record.Timeline{W0: at(0), W1: at(0.1), X1: at(0.1), R0: at(50.1), R1: at(50.2), D1: at(50.3)}}
	Attribute(&s)
	if s.Rejected != "" || !s.Timed() {
		t.Errorf("answered 50 ms after on a 51 ms path: rejected %q", s.Rejected)
	}
}
