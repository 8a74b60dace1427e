// Package streams cuts a cleartext HTTP/2 connection into one exchange per
// stream. A change of direction is no request on HTTP/2: control frames
// (PING, SETTINGS, WINDOW_UPDATE) cross the connection at any time and
// several streams overlap. The kernel side (bpf/http2.bpf.h) therefore
// reports a followed connection as events: each frame of a stream when its
// last byte crosses the socket's edge, and each write and read with the
// sequence numbers it covered. The Assembler places every frame in the
// write that handed it to the kernel and every incoming end in the read
// that took it, and makes of each stream the exchange the latency model
// reads (docs/latency-model.md, "HTTP/2 and gRPC"):
//
//   - the request is the stream's frames from its HEADERS to the client's
//     END_STREAM, the answer the server's, trailers included;
//   - w0 is the start of the write holding the message's first frame, w1
//     the return of the one holding its last, x1 when that last byte left;
//   - r0 is when the first frame of the incoming message arrived, r1 its
//     END_STREAM frame's last byte, d1 the read that took it.
//
// Events come from one ring buffer in the order they were made, except
// that a write's event, made at its return, follows the frames it sent:
// outgoing frames wait for their write.
package streams

import (
	"sync/atomic"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Kind is what an Event reports.
type Kind uint8

// The kinds of event (enum lt_h2_event_kind).
const (
	FrameOut Kind = iota + 1 // a frame of a stream left
	FrameIn                  // a frame of a stream, or a WINDOW_UPDATE, arrived
	Write                    // a write returned
	Read                     // a read returned
	Lost                     // the framing was lost: the connection's streams end
)

// Frame types and flags of RFC 9113 that cut a stream.
const (
	TypeData         = 0
	TypeHeaders      = 1
	TypeRstStream    = 3
	TypeWindowUpdate = 8
	TypeContinuation = 9
	FlagEndStream    = 0x1
	FlagEndHeaders   = 0x4
)

// Cause is what held a write's unsent bytes as it returned (enum
// lt_wait_cause).
type Cause uint8

// The causes, in the kernel's numbering.
const (
	CauseOther Cause = iota // Nagle, cork, or nothing held
	CauseCwnd
	CauseRwnd
	CauseSndbuf
	CausePacing
)

// Event is one event of a followed connection (struct lt_h2_event).
type Event struct {
	Kind     Kind
	Cookie   uint64
	Flow     record.Flow
	Owner    record.Owner
	ConnRole record.Role
	// Seq and End: a frame's bytes, [Seq, End); a write's; a read's End
	// is unused and Seq is the first byte not yet read.
	Seq, End uint32
	// T0: a frame's header passed, a write began. T1: a frame's last byte
	// passed, a write or read returned.
	T0, T1 record.Mono
	Stream uint32
	Type   uint8
	Flags  uint8
	// Held: a write's, what held the bytes it left unsent as it returned.
	Held Cause
	// RTTs as an incoming HEADERS arrived.
	SRTT, MinRTT, PathRTT, PathMinRTT time.Duration
	ISNLocal, ISNRemote               uint32
	// Connect is when the local end sent the connection's SYN (0: it
	// accepted the connection).
	Connect record.Mono
	// Adopted: the connection was open before lattrace started, its role
	// told by the listening sockets and its framing found mid-way: none
	// of its streams is its first.
	Adopted bool
}

// Stats counts what the assembler made and what it could not place; other
// goroutines read them.
type Stats struct {
	// Streams counts the exchanges made of streams.
	Streams atomic.Uint64
	// Unplaced counts outgoing frames whose write was never seen (placed
	// at their own departure instead).
	Unplaced atomic.Uint64
	// Unread counts streams written without the read that took their
	// incoming message (none came within ReadWait).
	Unread atomic.Uint64
	// Ignored counts frames of streams already written (a frame that
	// follows a reset) or beyond maxStreams open on a connection.
	Ignored atomic.Uint64
}

// Bounds on what one connection keeps.
const (
	// maxWrites: the writes kept to place frames in: the writes before the
	// oldest frame still waiting are dropped, so this only bounds a
	// connection whose frames never show (its framing lost).
	maxWrites = 256
	// maxWaiting: outgoing frames waiting for their write.
	maxWaiting = 1024
	// maxStreams: streams open at once on a connection (servers allow 100
	// to a few hundred by SETTINGS_MAX_CONCURRENT_STREAMS).
	maxStreams = 4096
	// maxClosed: streams written whose late frames are recognised.
	maxClosed = 1024
)

// ReadWait is how long a stream whose answer arrived waits for the read
// that takes it, and a frame for its write, before it is written without.
const ReadWait = 2 * time.Second

// Assembler keeps the followed connections' streams in progress. It is
// used from one goroutine (the tracer's reader).
type Assembler struct {
	conns map[uint64]*conn
	ex    record.Exchange
	Stats Stats
}

// New returns an empty Assembler.
func New() *Assembler { return &Assembler{conns: map[uint64]*conn{}} }

type write struct {
	seq, end uint32
	t0, t1   record.Mono
	held     Cause
}

type rtts struct{ srtt, min, path, pathMin time.Duration }

type conn struct {
	cookie        uint64
	flow          record.Flow
	owner         record.Owner
	role          record.Role
	isnL, isnR    uint32
	writes        []write
	waiting       []Event
	streams       map[uint32]*stream
	rtt           rtts
	last          record.Mono
	ownerFromTask bool
	// connect is the connection's SYN; answered that a stream's answer
	// has begun to arrive since. Until then the streams opened waited for
	// the connection (and the server's SETTINGS): its set-up is theirs.
	connect  record.Mono
	answered bool
	first    bool        // the connection's first stream is opened
	adopted  bool        // Event.Adopted
	window   record.Mono // the peer's latest WINDOW_UPDATE for the connection
	// sent is after the latest outgoing frame (once sentSeen): frames
	// leave in order, so no frame to come is in a write that ends before
	// it.
	sent     uint32
	sentSeen bool
	// closed holds the streams written lately, oldest first in
	// closedOrder: a frame of one (DATA queued before the peer's reset)
	// starts nothing.
	closed      map[uint32]struct{}
	closedOrder []uint32
}

// half is one message of a stream: the local end's (out) or the peer's (in).
type half struct {
	seen    bool
	headers bool // its first frame was HEADERS: the stream began in sight
	seq     uint32
	t0      record.Mono // first frame's header
	w0, w1  record.Mono // out: its writes
	ended   bool
	// endAfter: END_STREAM came on a HEADERS frame whose header block
	// goes on in CONTINUATION frames: the message ends with END_HEADERS.
	endAfter bool
	end      uint32      // after its last byte
	last     record.Mono // out: when its latest bytes left the kernel or the app got control back; in: the latest frame's arrival
	wlast    record.Mono // out: its latest write returned
	x1       record.Mono // out: the last byte left; in: it arrived (r1)
	held     Cause       // out: what held the bytes its last write left unsent
	d1       record.Mono // in: the read that took it
	gaps     time.Duration
	flow     time.Duration // out: waits for the flow-control window
	data     uint32
	bytes    uint64
}

type stream struct {
	id      uint32
	out, in half
	reset   bool
	rtt     rtts
	endedAt record.Mono // both messages complete (or reset): waiting for the read
	connect record.Mono // the connection's SYN, for a stream opened before any answer
	first   bool        // the connection's first stream
	window  record.Mono // the peer's latest WINDOW_UPDATE for the stream
}

// Add takes one event; the exchanges of the streams it completes go to
// emit, valid until emit returns.
func (a *Assembler) Add(ev *Event, emit func(*record.Exchange)) {
	c := a.conns[ev.Cookie]
	if c == nil {
		if ev.Kind == Lost {
			return
		}
		c = &conn{cookie: ev.Cookie, streams: map[uint32]*stream{}, closed: map[uint32]struct{}{}, adopted: ev.Adopted, first: ev.Adopted}
		a.conns[ev.Cookie] = c
	}
	c.flow, c.role, c.connect = ev.Flow, ev.ConnRole, ev.Connect
	// The owner as the task that wrote or read saw it; a frame's is the
	// socket's last one, which is the same unless the socket changed hands.
	if ev.Kind == Write || ev.Kind == Read || !c.ownerFromTask {
		c.owner, c.ownerFromTask = ev.Owner, ev.Kind == Write || ev.Kind == Read
	}
	c.last = max(c.last, ev.T1)
	switch ev.Kind {
	case FrameOut:
		c.isnL, c.isnR = ev.ISNLocal, ev.ISNRemote
		if len(c.waiting) == 0 && a.tryOut(c, ev, emit) {
			c.prune()
			break
		}
		if len(c.waiting) == maxWaiting {
			a.Stats.Unplaced.Add(1)
			old := c.waiting[0]
			c.waiting = c.waiting[1:]
			a.out(c, &old, nil, nil, emit)
		}
		c.waiting = append(c.waiting, *ev)
	case Write:
		if len(c.writes) == maxWrites {
			c.writes = c.writes[1:]
		}
		c.writes = append(c.writes, write{seq: ev.Seq, end: ev.End, t0: ev.T0, t1: ev.T1, held: ev.Held})
		a.place(c, emit)
	case FrameIn:
		c.isnL, c.isnR = ev.ISNLocal, ev.ISNRemote
		if ev.Type == TypeWindowUpdate {
			c.windowUpdate(ev)
			break
		}
		a.in(c, ev, emit)
	case Read:
		for _, s := range c.streams {
			if h := &s.in; h.ended && h.d1 == 0 && !before(ev.Seq, h.end) {
				h.d1 = ev.T1
				a.finish(c, s, complete, emit)
			}
		}
	case Lost:
		// What is in progress is written as it stands; the
		// connection's own exchanges take over.
		a.Close(ev.Cookie, emit)
	}
}

// tryOut places an outgoing frame if the writes of its first and last
// bytes are seen.
func (a *Assembler) tryOut(c *conn, ev *Event, emit func(*record.Exchange)) bool {
	last, ok := c.writeOf(ev.End - 1)
	if !ok {
		return false
	}
	first, ok := c.writeOf(ev.Seq)
	if !ok {
		first = last
	}
	a.out(c, ev, &first, &last, emit)
	return true
}

// writeOf finds the write that handed seq to the kernel.
func (c *conn) writeOf(seq uint32) (write, bool) {
	for i := len(c.writes) - 1; i >= 0; i-- {
		if w := c.writes[i]; !before(seq, w.seq) && before(seq, w.end) {
			return w, true
		}
	}
	return write{}, false
}

// place places the waiting frames the writes now cover, in order. One
// whose bytes end before every write seen since has no write to come
// (sent by a write that was not traced): it is placed at its own
// departure.
func (a *Assembler) place(c *conn, emit func(*record.Exchange)) {
	newest := c.writes[len(c.writes)-1]
	n := 0
	for i := range c.waiting {
		ev := &c.waiting[i]
		switch {
		case n == 0 && a.tryOut(c, ev, emit):
		case n == 0 && before(ev.End-1, newest.seq):
			a.Stats.Unplaced.Add(1)
			a.out(c, ev, nil, nil, emit)
		default:
			// Frames are placed in order: one waits, those after it wait.
			c.waiting[n] = *ev
			n++
		}
	}
	c.waiting = c.waiting[:n]
	c.prune()
}

// prune drops the writes that no frame to come can be in.
func (c *conn) prune() {
	for len(c.writes) > 0 && c.sentSeen && !after(c.writes[0].end, c.sent) &&
		(len(c.waiting) == 0 || !after(c.writes[0].end, c.waiting[0].Seq)) {
		c.writes = c.writes[1:]
	}
}

// stream is stream id's state, made at its first frame; nil for a frame
// of a stream written already, or beyond maxStreams (counted).
func (a *Assembler) stream(c *conn, id uint32) *stream {
	s := c.streams[id]
	if s != nil {
		return s
	}
	if _, done := c.closed[id]; done || len(c.streams) >= maxStreams {
		a.Stats.Ignored.Add(1)
		return nil
	}
	s = &stream{id: id}
	c.streams[id] = s
	return s
}

// out takes an outgoing frame, placed in the writes of its first and last
// bytes (nil: none seen).
func (a *Assembler) out(c *conn, ev *Event, first, last *write, emit func(*record.Exchange)) {
	if !c.sentSeen || after(ev.End, c.sent) {
		c.sent, c.sentSeen = ev.End, true
	}
	s := a.stream(c, ev.Stream)
	if s == nil {
		return
	}
	wt0, wt1, held := ev.T0, ev.T1, CauseOther
	if first != nil {
		wt0, wt1, held = first.t0, last.t1, last.held
	}
	h := &s.out
	if !h.seen {
		h.seen, h.headers, h.seq, h.t0, h.w0 = true, ev.Type == TypeHeaders, ev.Seq, ev.T0, wt0
		if !c.answered && c.connect != 0 && c.connect < wt0 {
			s.connect = c.connect
		}
		if !s.in.seen {
			s.first, c.first = !c.first, true
		}
	} else if wt0 > h.wlast {
		// A later write of the message. One that follows the peer's
		// WINDOW_UPDATE was held by the library for the flow-control
		// window since the write before returned, whatever the kernel
		// still had to send (a pacing sender spreads a window over the
		// round trip). Otherwise, with nothing of the message in the
		// kernel since its last bytes left, the app was producing it.
		if wu := max(c.window, s.window); wu > h.wlast && wu <= wt0 && wt0.Sub(wu) <= windowFollows {
			h.flow += wt0.Sub(h.wlast)
		} else if wt0 > h.last {
			h.gaps += wt0.Sub(h.last)
		}
	}
	h.last = max(h.last, ev.T1, wt1)
	h.wlast = max(h.wlast, wt1)
	if h.take(s, ev) {
		h.w1, h.held = wt1, held
	}
	a.finish(c, s, complete, emit)
}

// windowFollows is how soon after the peer's WINDOW_UPDATE the write of a
// stream held by flow control comes: the library writes as it reads the
// frame.
const windowFollows = 2 * time.Millisecond

// windowUpdate notes the peer's WINDOW_UPDATE for a stream or (stream 0)
// the connection.
func (c *conn) windowUpdate(ev *Event) {
	if ev.Stream == 0 {
		c.window = ev.T1
	} else if s := c.streams[ev.Stream]; s != nil {
		s.window = ev.T1
	}
}

// in takes an incoming frame.
func (a *Assembler) in(c *conn, ev *Event, emit func(*record.Exchange)) {
	s := a.stream(c, ev.Stream)
	if s == nil {
		return
	}
	if ev.Type == TypeHeaders && (ev.MinRTT > 0 || ev.PathMinRTT > 0) {
		r := rtts{ev.SRTT, ev.MinRTT, ev.PathRTT, ev.PathMinRTT}
		c.rtt = r
		if !s.in.seen {
			s.rtt = r
		}
	}
	h := &s.in
	c.answered = true
	if !h.seen {
		h.seen, h.headers, h.seq, h.t0 = true, ev.Type == TypeHeaders, ev.Seq, ev.T0
		if !s.out.seen {
			s.first, c.first = !c.first, true
		}
	} else if silence := ev.T0.Sub(h.last); silence > pause(c.rtt) {
		// The peer paused between parts of a streamed message.
		h.gaps += silence
	}
	h.last = max(h.last, ev.T1)
	h.take(s, ev)
	a.finish(c, s, complete, emit)
}

// take counts a frame of the message; END_STREAM (or RST_STREAM, which
// ends the stream) ends the message at the frame's last byte, and take
// reports it.
func (h *half) take(s *stream, ev *Event) bool {
	h.bytes += uint64(ev.End - ev.Seq)
	switch ev.Type {
	case TypeRstStream:
		s.reset = true
	case TypeData:
		h.data++
	}
	switch {
	case ev.Type == TypeRstStream:
	case ev.Type == TypeHeaders && ev.Flags&FlagEndStream != 0 && ev.Flags&FlagEndHeaders == 0:
		h.endAfter = true
		return false
	case ev.Type == TypeContinuation && h.endAfter && ev.Flags&FlagEndHeaders != 0:
	case ev.Type != TypeContinuation && ev.Flags&FlagEndStream != 0:
	default:
		return false
	}
	h.ended, h.end, h.x1 = true, ev.End, ev.T1
	return true
}

// pause is the least silence inside an incoming message that is the peer's
// pause, not the transfer's: two round trips (a window's worth of data
// comes back at least once a round trip while it flows), 1 ms at least.
func pause(r rtts) time.Duration {
	rtt := max(r.path, r.min, r.pathMin)
	return max(2*rtt, time.Millisecond)
}

// requester reports whether the local end opened stream id: the client
// opens odd-numbered streams, the server's pushes are even.
func (c *conn) requester(id uint32) bool { return (c.role == record.RoleClient) == (id%2 == 1) }

// How finish writes a stream.
type ending int

const (
	complete ending = iota // only when complete: both messages ended (or reset) and the incoming one read
	asIs                   // as it stands: a message not ended is unanswered
	stopped                // as it stands, the daemon stopping: one not complete is unfinished
)

// finish writes s as how says.
func (a *Assembler) finish(c *conn, s *stream, how ending, emit func(*record.Exchange)) {
	done := s.out.ended && s.in.ended || s.reset
	if how == complete {
		if !done {
			return
		}
		if s.endedAt == 0 {
			s.endedAt = c.last
		}
		if s.in.ended && s.in.d1 == 0 && !s.reset {
			return
		}
	}
	if s.in.ended && s.in.d1 == 0 {
		a.Stats.Unread.Add(1)
	}
	delete(c.streams, s.id)
	c.closed[s.id] = struct{}{}
	c.closedOrder = append(c.closedOrder, s.id)
	if len(c.closedOrder) > maxClosed {
		delete(c.closed, c.closedOrder[0])
		c.closedOrder = c.closedOrder[1:]
	}
	a.Stats.Streams.Add(1)
	e := &a.ex
	a.exchange(c, s, e)
	if how == stopped && !done {
		e.Unanswered, e.Unfinished = false, true
	}
	emit(e)
}

// exchange makes e of stream s.
func (a *Assembler) exchange(c *conn, s *stream, e *record.Exchange) {
	*e = record.Exchange{
		Time:      c.last,
		Cookie:    c.cookie,
		Flow:      c.flow,
		Owner:     c.owner,
		ConnRole:  c.role,
		ISNLocal:  c.isnL,
		ISNRemote: c.isnR,
		OutSeq:    s.out.seq,
		InSeq:     s.in.seq,
		BytesOut:  s.out.bytes,
		BytesIn:   s.in.bytes,
		Timeline: record.Timeline{
			Connect: s.connect,
			W0:      s.out.w0, W1: s.out.w1, X1: s.out.x1,
			R0: s.in.t0, R1: s.in.x1, D1: s.in.d1,
		},
		X1Transmit: s.out.x1 != 0,
		First:      s.first,
		// A request and its answer: the turns of a plain exchange.
		ExchangeTurns: 2,
		Raw:           s.out.raw(),
		Stream: &record.HTTP2Stream{
			ID: s.id, DataOut: s.out.data, DataIn: s.in.data, Reset: s.reset, InGaps: s.in.gaps,
		},
	}
	r := s.rtt
	if r.min == 0 && r.pathMin == 0 {
		r = c.rtt
	}
	e.SRTT, e.MinRTT, e.PathRTT, e.PathMinRTT = r.srtt, r.min, r.path, r.pathMin
	e.Role = record.Responder
	if c.requester(s.id) {
		e.Role = record.Requester
	}
	if c.adopted {
		e.RoleSource = record.RoleFromListener
	}
	// A stream that began before the daemon saw it (a restart, or the
	// framing found mid-way) has lost its beginning.
	e.Partial = s.out.seen && !s.out.headers || s.in.seen && !s.in.headers
	// A message without its answer: the connection closed first, or a
	// server's push (which has no request on the stream).
	e.Unanswered = !s.out.ended || !s.in.ended
}

// raw is what was measured of an outgoing message's wait: the pauses
// between its writes, its waits for HTTP/2's flow-control window, and its
// time in the kernel after its last write returned, charged to what held
// the socket's unsent bytes then. The kernel's own accounting of causes
// spans the connection, whose streams overlap; a message is one write or a
// few, so the cause as the last one returns is its wait's.
func (h *half) raw() record.ExchangeRaw {
	r := record.ExchangeRaw{WriteGaps: h.gaps, WaitFlowControl: h.flow}
	if h.x1 == 0 || h.w1 == 0 || h.x1 <= h.w1 {
		return r
	}
	held := h.x1.Sub(h.w1)
	switch h.held {
	case CauseCwnd:
		r.WaitCwnd = held
	case CauseRwnd:
		r.WaitRwnd = held
	case CauseSndbuf:
		r.WaitSndbuf = held
	case CausePacing:
		r.WaitPacing = held
	default:
		r.WaitOther = held
	}
	return r
}

// Expire writes what waited too long at now: frames whose write never
// came, streams whose answer no read took.
func (a *Assembler) Expire(now record.Mono, emit func(*record.Exchange)) {
	for _, c := range a.conns {
		for len(c.waiting) > 0 && now.Sub(c.waiting[0].T1) > ReadWait {
			ev := c.waiting[0]
			c.waiting = c.waiting[1:]
			a.Stats.Unplaced.Add(1)
			a.out(c, &ev, nil, nil, emit)
		}
		for _, s := range c.streams {
			if s.endedAt != 0 && now.Sub(s.endedAt) > ReadWait {
				a.finish(c, s, asIs, emit)
			}
		}
		// A connection whose close was not seen (its record lost) goes
		// once quiet; if it was only idle, its next events start afresh.
		// One with streams open is kept longer (a watch is quiet for
		// minutes), then written as it stands.
		switch quiet := now.Sub(c.last); {
		case len(c.streams) == 0 && len(c.waiting) == 0 && quiet > idleForget:
			delete(a.conns, c.cookie)
		case quiet > openForget:
			a.Close(c.cookie, emit)
		}
	}
}

// idleForget is how long a connection without streams in progress is kept
// after its last event; openForget one with streams open.
const (
	idleForget = 10 * time.Minute
	openForget = time.Hour
)

// Stop writes every stream in progress as it stands, those not complete
// unfinished (the daemon stops: nothing more will be read of them), and
// forgets every connection.
func (a *Assembler) Stop(emit func(*record.Exchange)) {
	for cookie, c := range a.conns {
		a.flushWaiting(c, emit)
		for _, s := range c.streams {
			a.finish(c, s, stopped, emit)
		}
		delete(a.conns, cookie)
	}
}

// flushWaiting places the frames still waiting for their writes at their
// own departures.
func (a *Assembler) flushWaiting(c *conn, emit func(*record.Exchange)) {
	for i := range c.waiting {
		a.Stats.Unplaced.Add(1)
		a.out(c, &c.waiting[i], nil, nil, emit)
	}
	c.waiting = nil
}

// Close writes the connection's streams still open, as they stand (an
// answer that never came is unanswered), and forgets it.
func (a *Assembler) Close(cookie uint64, emit func(*record.Exchange)) {
	c := a.conns[cookie]
	if c == nil {
		return
	}
	a.flushWaiting(c, emit)
	for _, s := range c.streams {
		a.finish(c, s, asIs, emit)
	}
	delete(a.conns, cookie)
}

// Conns is how many connections have streams followed.
func (a *Assembler) Conns() int { return len(a.conns) }

func before(a, b uint32) bool { return int32(a-b) < 0 }
func after(a, b uint32) bool  { return int32(a-b) > 0 }
