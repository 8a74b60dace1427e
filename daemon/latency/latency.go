// Package latency implements the latency model of docs/latency-model.md:
// from the timeline of one exchange it computes where the time went
// (network, transport, app). It is pure arithmetic on record.Exchange, so
// every rule of the model is unit-tested here without a kernel.
//
// The components are differences between consecutive points of a chain
// that is forced to be monotonic, so they are never negative and always sum
// to the exchange's duration exactly (rule 1 of the model), whatever order
// the kernel's hooks happened to see the points in.
package latency

import (
	"time"

	"github.com/lattrace/lattrace/record"
)

// chain walks points in order, clamping each to be no earlier than the one
// before, and returns the time from the previous point to the next one.
type chain struct{ at record.Mono }

func (c *chain) to(p record.Mono) time.Duration {
	if p <= c.at {
		return 0
	}
	d := p.Sub(c.at)
	c.at = p
	return d
}

// Attribute fills e.Start, e.End, e.Duration and e.Components from e's
// timeline and RTT fields.
func Attribute(e *record.Exchange) {
	if e.Role == record.Responder {
		responder(e)
	} else {
		requester(e)
	}
	e.Duration = e.End.Sub(e.Start)
	e.Rejected = guard(e)
}

// guard keeps the model's own rules on an exchange that would otherwise
// be a latency sample: a requester's answer comes no sooner than the
// path's minimum round trip, so a network part below it (or none, for
// want of any RTT sample) says the cut is wrong; and an exchange whose
// role is a guess may be cut between a response and the next request.
// The overlap of request and answer is Multiplexed already.
func guard(e *record.Exchange) record.Rejection {
	if !e.Timed() || e.Partial {
		return ""
	}
	if e.RoleSource == record.RoleGuessed {
		return record.RejectedRoleGuessed
	}
	if e.Role == record.Responder || e.Timeline.W0 == 0 || e.Timeline.R0 == 0 {
		return ""
	}
	prop := propagation(e)
	switch {
	case prop == 0 && NetworkRTT(e) == 0:
		return record.RejectedNoPathRTT
	case e.Components.Network < guardBound(prop):
		return record.RejectedNetworkBelowPath
	}
	return ""
}

// guardBound is the least network part the guard lets through on a path
// whose minimum round trip is prop: the exchange's points and the
// kernel's RTT samples are read at different places, which a busy or
// emulated CPU sets further apart than hookSlack (an HTTP/2 stream's
// answer, its own by its frames, is never cut by overlapBound), so a
// tenth of the round trip more is taken as the hooks' and not the
// model's error; a network part of nothing, or of half the path, is
// still caught.
func guardBound(prop time.Duration) time.Duration { return max(prop-prop/10-hookSlack, 0) }

// NetworkRTT is the round trip the path gave this exchange: the path's
// clean RTT while the exchange was in flight (or a recent one; the path's
// minimum when there is none), lowered to the exchange's own ACK sample
// when a pure ACK came back before the reply (an ACK cannot arrive faster
// than the path), and never below the path's minimum.
func NetworkRTT(e *record.Exchange) time.Duration {
	est := e.PathRTT
	if est <= 0 {
		est = propagation(e)
	}
	if e.AckRTT > 0 && e.AckRTT < est {
		est = e.AckRTT
	}
	return max(est, propagation(e))
}

// propagation is the path's lowest RTT: the path's minimum over all flows
// when known (a flow that started behind a full queue never saw the empty
// path), else the flow's own.
func propagation(e *record.Exchange) time.Duration {
	if e.PathMinRTT > 0 && (e.MinRTT == 0 || e.PathMinRTT < e.MinRTT) {
		return e.PathMinRTT
	}
	return e.MinRTT
}

// overlapBound is the least time a message's answer can take on a path
// whose minimum round trip is prop: the kernel's minimum is taken between
// the same points as an exchange's (a segment sent, the answer
// processed), less hookSlack for the two being read at different hooks.
// Without an RTT sample nothing can be told (0).
func overlapBound(prop time.Duration) time.Duration { return max(prop-hookSlack, 0) }

// hookSlack is how much sooner than the kernel's own RTT sample an
// exchange's x1..r0 may look: x1 is read at the qdisc or at the write's
// return, a few microseconds after the kernel stamps the segment.
const hookSlack = 50 * time.Microsecond

// earliestDeparture is the earliest the outgoing message's last byte can
// have left: x1 itself when read where the byte left (a TX timestamp, the
// segment handed to IP); the write's start when x1 is the write's return
// (the byte left inside the write, and the return is read after the
// socket is released, late when the thread is descheduled) or when the
// answer came before the write returned (no w1); the write's return when
// x1 came from a later hook (the fallback), since the write saw the byte
// unsent.
func earliestDeparture(e *record.Exchange) record.Mono {
	t := &e.Timeline
	switch {
	case e.ExactDeparture():
		return t.X1
	case t.X1 != 0 && t.X1 == t.W1, t.W1 == 0:
		return t.W0
	}
	return t.W1
}

// departure is x1 (the write's return when none was seen), except that an
// x1 read after the byte left (the write's return; the fallback, the next
// incoming segment, which may be the reply itself) moves back to the
// path's round trip before the reply when the reply came sooner after it:
// a reply cannot, so the byte had left by then. It stays at or after the
// earliest departure.
func departure(e *record.Exchange) record.Mono {
	t := &e.Timeline
	x1 := sent(*t)
	if e.ExactDeparture() || t.R0 == 0 {
		return x1
	}
	if latest := t.R0 - record.Mono(NetworkRTT(e)); latest < x1 {
		x1 = max(latest, earliestDeparture(e))
	}
	return x1
}

// sent is x1, or the write's return when no departure was seen (no TX
// timestamp and no ACK observed): the best bound.
func sent(t record.Timeline) record.Mono {
	if t.X1 == 0 {
		return t.W1
	}
	return t.X1
}

func requester(e *record.Exchange) {
	t := e.Timeline
	c := &e.Components
	// The first point is this end's first write, or the peer's message
	// when this end wrote nothing (a push, or a greeting the client closed
	// on); from connect to it is set-up, when this end connected.
	first := t.W0
	if first == 0 {
		first = t.R0
	}
	e.Start = first
	if t.Connect != 0 && t.Connect < first {
		e.Start = t.Connect
	}
	ch := chain{at: e.Start}
	c.Handshake = ch.to(first)
	if t.W0 == 0 {
		c.LossRecovery = receive(e, &ch)
		e.End = ch.at
		return
	}
	x1 := send(e, &ch, departure(e))

	if t.R0 == 0 {
		// One-way message: it ends when it is acknowledged.
		end := t.A1
		if end == 0 {
			end = x1
		}
		c.Network = ch.to(end)
		splitNetwork(e)
		e.End = ch.at
		return
	}
	overlap := t.R0 < x1
	gap := ch.to(t.R0)
	c.LossRecovery = min(e.Raw.LossOut, gap)
	gap -= c.LossRecovery
	// No answer comes sooner than the path's round trip: data that does,
	// even after the earliest the message can have left, was sent before
	// the message arrived. An HTTP/2 stream's answer is its own by its
	// frames: only one that began before the request ended (a
	// bidirectional stream) overlaps it.
	if prop := propagation(e); e.Multiplexed || overlap || e.Stream == nil && t.R0.Sub(earliestDeparture(e))-c.LossRecovery < overlapBound(prop) {
		e.Multiplexed = true
		c.Peer = gap
	} else {
		c.Network = min(NetworkRTT(e), gap)
		c.Peer = gap - c.Network
	}
	splitNetwork(e)

	c.LossRecovery += receive(e, &ch)
	e.End = ch.at
}

func responder(e *record.Exchange) {
	t := e.Timeline
	c := &e.Components
	if t.R0 == 0 {
		// This end's message alone (a push): its write until it left.
		e.Start = t.W0
		ch := chain{at: t.W0}
		send(e, &ch, sent(t))
		e.End = ch.at
		return
	}
	e.Start = t.R0
	ch := chain{at: t.R0}
	// A request that follows the previous answer sooner than the path's
	// round trip was sent before that answer arrived. The silence is
	// counted from this end's last activity (a write's return, read after
	// the socket is released): half the round trip leaves room for a
	// descheduled thread.
	if e.Stream == nil && !e.First && e.IdleGap < propagation(e)/2 {
		e.Multiplexed = true
	}
	c.LossRecovery = receive(e, &ch)
	if t.W0 == 0 {
		e.End = ch.at
		return
	}
	c.Think = ch.to(t.W0)
	x1 := send(e, &ch, sent(t))
	// The exchange ends when the response has left: the path's round trip
	// after that is the requester's to see (PathRTT still reports it). A
	// response that was lost left with the retransmission that got
	// through: the time from its first departure is loss recovery, which
	// the requester alone cannot tell from the peer's time when the lost
	// part was its only or last segment.
	c.LossRecovery += ch.to(x1 + record.Mono(e.Raw.LossOut))
	e.End = ch.at
}

// send sets SendWait, the outgoing message's time from the write (where ch
// stands) to its last byte first sent, x1, and returns x1. Between the
// pieces of a message written in pieces, with all of it so far sent, the
// kernel holds nothing: that time is the local app's (Think).
func send(e *record.Exchange, ch *chain, x1 record.Mono) record.Mono {
	c := &e.Components
	c.SendWait = ch.to(x1)
	gaps := min(e.Raw.WriteGaps, c.SendWait)
	c.SendWait -= gaps
	c.Think += gaps
	splitSendWait(e)
	return x1
}

// receive sets Receive, the incoming message's own transfer from its first
// byte (where ch stands) to its last, less the loss recovery in it, which
// it returns; then LocalRead, the wait until the app read it.
func receive(e *record.Exchange, ch *chain) (lossIn time.Duration) {
	recv := ch.to(e.Timeline.R1)
	lossIn = min(e.Raw.LossIn, recv)
	recv -= lossIn
	if e.Stream != nil {
		// A streamed message's pauses between its parts are the
		// peer's.
		gaps := min(e.Stream.InGaps, recv)
		recv -= gaps
		e.Components.Peer += gaps
	}
	e.Components.Receive = recv
	e.Components.LocalRead = ch.to(e.Timeline.D1)
	return lossIn
}

// splitNetwork divides Network into propagation (the path's minimum RTT)
// and queueing (the rest).
func splitNetwork(e *record.Exchange) {
	c := &e.Components
	c.Propagation = min(c.Network, propagation(e))
	c.Queueing = c.Network - c.Propagation
}

// splitSendWait divides SendWait among the causes the kernel side
// measured; measured time beyond SendWait (the hooks see time slightly
// outside w0..x1) is scaled down so the split always adds up.
func splitSendWait(e *record.Exchange) {
	c := &e.Components
	cwnd, rwnd, sndbuf, pacing, flow := e.Raw.WaitCwnd, e.Raw.WaitRwnd, e.Raw.WaitSndbuf, e.Raw.WaitPacing, e.Raw.WaitFlowControl
	measured := cwnd + rwnd + sndbuf + pacing + flow
	if measured > c.SendWait {
		scale := float64(c.SendWait) / float64(measured)
		cwnd = time.Duration(float64(cwnd) * scale)
		rwnd = time.Duration(float64(rwnd) * scale)
		sndbuf = time.Duration(float64(sndbuf) * scale)
		pacing = time.Duration(float64(pacing) * scale)
		flow = time.Duration(float64(flow) * scale)
		measured = cwnd + rwnd + sndbuf + pacing + flow
	}
	c.SendWaitCwnd, c.SendWaitRwnd, c.SendWaitSndbuf, c.SendWaitPacing, c.SendWaitFlowControl = cwnd, rwnd, sndbuf, pacing, flow
	c.SendWaitOther = c.SendWait - measured
}
