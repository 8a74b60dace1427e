package streams

import (
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

const ms = record.Mono(time.Millisecond)

// run feeds events to a new Assembler and returns copies of the exchanges
// it writes.
type run struct {
	a   *Assembler
	out []record.Exchange
}

func newRun() *run { return &run{a: New()} }

func (r *run) emit(e *record.Exchange) { r.out = append(r.out, *e) }

func (r *run) add(evs ...Event) {
	for i := range evs {
		ev := evs[i]
		if ev.Cookie == 0 {
			ev.Cookie = 7
		}
		if ev.ConnRole == "" {
			ev.ConnRole = record.RoleClient
		}
		r.a.Add(&ev, r.emit)
	}
}

// headers: a HEADERS frame's header block is whole (END_HEADERS) unless
// a test says otherwise.
func headers(typ, flags uint8) uint8 {
	if typ == TypeHeaders {
		flags |= FlagEndHeaders
	}
	return flags
}

func frameOut(stream uint32, typ, flags uint8, seq, end uint32, at record.Mono) Event {
	flags = headers(typ, flags)
	return Event{Kind: FrameOut, Stream: stream, Type: typ, Flags: flags, Seq: seq, End: end, T0: at, T1: at}
}

func frameIn(stream uint32, typ, flags uint8, seq, end uint32, at record.Mono) Event {
	flags = headers(typ, flags)
	return Event{Kind: FrameIn, Stream: stream, Type: typ, Flags: flags, Seq: seq, End: end, T0: at, T1: at,
		MinRTT: 24 * time.Millisecond, PathMinRTT: 24 * time.Millisecond}
}

func written(seq, end uint32, t0, t1 record.Mono) Event {
	return Event{Kind: Write, Seq: seq, End: end, T0: t0, T1: t1}
}

func read(copied uint32, at record.Mono) Event { return Event{Kind: Read, Seq: copied, T1: at} }

// A unary call at the client: the request's frames leave inside their
// write (whose event follows them), the answer's arrive and are read.
func TestUnaryClient(t *testing.T) {
	r := newRun()
	r.add(
		frameOut(1, TypeHeaders, 0, 100, 150, 10*ms+1),
		frameOut(1, TypeData, FlagEndStream, 150, 200, 10*ms+2),
		written(100, 200, 10*ms, 10*ms+5),
		frameIn(1, TypeHeaders, 0, 500, 540, 50*ms),
		frameIn(1, TypeData, 0, 540, 600, 50*ms+1),
	)
	if len(r.out) != 0 {
		t.Fatalf("written before the answer's end: %+v", r.out)
	}
	r.add(frameIn(1, TypeHeaders, FlagEndStream, 600, 620, 50*ms+2))
	if len(r.out) != 0 {
		t.Fatalf("written before the answer was read")
	}
	r.add(read(620, 51*ms))
	if len(r.out) != 1 {
		t.Fatalf("%d exchanges, want 1", len(r.out))
	}
	e := r.out[0]
	want := record.Timeline{W0: 10 * ms, W1: 10*ms + 5, X1: 10*ms + 2, R0: 50 * ms, R1: 50*ms + 2, D1: 51 * ms}
	if e.Timeline != want || e.Role != record.Requester || e.Stream.ID != 1 || e.OutSeq != 100 || e.InSeq != 500 ||
		e.BytesOut != 100 || e.BytesIn != 120 || e.Stream.DataOut != 1 || e.Stream.DataIn != 1 || !e.First || e.Unanswered || e.Partial || !e.X1Transmit {
		t.Errorf("exchange %+v\ntimeline %+v, want %+v", e, e.Timeline, want)
	}
	if e.MinRTT != 24*time.Millisecond {
		t.Errorf("min RTT %v, want the answer's HEADERS' 24ms", e.MinRTT)
	}
}

// Two streams at once at the server: each answer is its own exchange,
// whatever order the frames interleave in, and a read that takes both
// requests ends both.
func TestConcurrentServer(t *testing.T) {
	r := newRun()
	srv := func(evs ...Event) {
		for i := range evs {
			evs[i].ConnRole = record.RoleServer
		}
		r.add(evs...)
	}
	srv(
		frameIn(1, TypeHeaders, 0, 100, 140, 1*ms),
		frameIn(3, TypeHeaders, 0, 140, 180, 1*ms),
		frameIn(1, TypeData, FlagEndStream, 180, 200, 1*ms),
		frameIn(3, TypeData, FlagEndStream, 200, 220, 1*ms+1),
		read(220, 2*ms),
		// Stream 3 answers first.
		written(900, 1000, 15*ms, 15*ms+10),
		frameOut(3, TypeHeaders, 0, 900, 950, 15*ms+5),
		frameOut(3, TypeHeaders, FlagEndStream, 950, 1000, 15*ms+6),
		frameOut(1, TypeHeaders, 0, 1000, 1050, 20*ms+1),
		frameOut(1, TypeHeaders, FlagEndStream, 1050, 1100, 20*ms+2),
		written(1000, 1100, 20*ms, 20*ms+3),
	)
	if len(r.out) != 2 {
		t.Fatalf("%d exchanges, want 2", len(r.out))
	}
	for i, id := range []uint32{3, 1} {
		e := r.out[i]
		if e.Stream.ID != id || e.Role != record.Responder || e.Timeline.D1 != 2*ms || e.Unanswered {
			t.Errorf("exchange %d: stream %d role %s d1 %v unanswered %v", i, e.Stream.ID, e.Role, e.Timeline.D1, e.Unanswered)
		}
	}
	if r.out[0].Timeline.W0 != 15*ms || r.out[1].Timeline.W0 != 20*ms || r.out[1].Timeline.X1 != 20*ms+2 {
		t.Errorf("writes: %+v and %+v", r.out[0].Timeline, r.out[1].Timeline)
	}
	if r.out[0].First || !r.out[1].First {
		t.Errorf("first: stream 3 %v, stream 1 %v; want stream 1's, whose request came first", r.out[0].First, r.out[1].First)
	}
	if r.out[0].InSeq != 140 || r.out[1].InSeq != 100 {
		t.Errorf("requests start at %d and %d, want 140 and 100", r.out[0].InSeq, r.out[1].InSeq)
	}
}

// A streamed answer: its pauses between messages, longer than two round
// trips, are the peer's (InGaps); the messages are counted.
func TestStreamedAnswer(t *testing.T) {
	r := newRun()
	r.add(
		frameOut(1, TypeHeaders, FlagEndStream, 100, 150, 1*ms),
		written(100, 150, 1*ms, 1*ms),
		frameIn(1, TypeHeaders, 0, 500, 520, 40*ms),
		frameIn(1, TypeData, 0, 520, 540, 40*ms),
		frameIn(1, TypeData, 0, 540, 560, 240*ms),
		frameIn(1, TypeData, 0, 560, 580, 440*ms),
		frameIn(1, TypeHeaders, FlagEndStream, 580, 600, 440*ms),
		read(600, 441*ms),
	)
	if len(r.out) != 1 {
		t.Fatalf("%d exchanges, want 1", len(r.out))
	}
	s := r.out[0].Stream
	if s.DataIn != 3 || s.InGaps != 400*time.Millisecond {
		t.Errorf("data in %d, in gaps %v; want 3 and 400ms", s.DataIn, s.InGaps)
	}
}

// A request written in pieces: a pause with all of it sent is the app's
// (WriteGaps), one that ends as the peer's WINDOW_UPDATE arrives is the
// flow-control window's.
func TestWriteGapsAndFlowControl(t *testing.T) {
	r := newRun()
	r.add(
		written(100, 200, 1*ms, 1*ms+1),
		frameOut(1, TypeHeaders, 0, 100, 200, 1*ms),
		// The app pauses 9 ms.
		written(200, 300, 10*ms, 10*ms+1),
		frameOut(1, TypeData, 0, 200, 300, 10*ms),
		// The window opens at 40 ms; the next write follows at once.
		Event{Kind: FrameIn, Stream: 0, Type: TypeWindowUpdate, Seq: 700, End: 713, T0: 40 * ms, T1: 40 * ms},
		written(300, 400, 40*ms+100, 40*ms+200),
		frameOut(1, TypeData, FlagEndStream, 300, 400, 40*ms+150),
		frameIn(1, TypeHeaders, FlagEndStream, 713, 750, 80*ms),
		read(750, 80*ms),
	)
	if len(r.out) != 1 {
		t.Fatalf("%d exchanges, want 1", len(r.out))
	}
	raw := r.out[0].Raw
	if want := (10 * ms).Sub(1*ms + 1); raw.WriteGaps != want {
		t.Errorf("write gaps %v, want %v", raw.WriteGaps, want)
	}
	if raw.WaitFlowControl != (40*ms + 100).Sub(10*ms+1) {
		t.Errorf("flow control %v, want %v", raw.WaitFlowControl, (40*ms + 100).Sub(10*ms+1))
	}
}

// Frames of a write never traced are placed at their own departure once
// a later write shows none is coming, and counted.
func TestUnplacedFrame(t *testing.T) {
	r := newRun()
	r.add(
		frameOut(1, TypeHeaders, FlagEndStream, 100, 150, 1*ms),
		written(150, 200, 2*ms, 2*ms),
		frameIn(1, TypeHeaders, FlagEndStream, 500, 550, 30*ms),
		read(550, 31*ms),
	)
	if len(r.out) != 1 || r.out[0].Timeline.W0 != 1*ms || r.a.Stats.Unplaced.Load() != 1 {
		t.Fatalf("%d exchanges (%+v), %d unplaced", len(r.out), r.out, r.a.Stats.Unplaced.Load())
	}
}

// A connection that closes with a stream unanswered writes it so; one
// whose answer no read takes is written after ReadWait, without d1.
func TestCloseAndExpire(t *testing.T) {
	r := newRun()
	r.add(
		frameOut(1, TypeHeaders, FlagEndStream, 100, 150, 1*ms),
		written(100, 150, 1*ms, 1*ms),
		frameOut(3, TypeHeaders, FlagEndStream, 150, 200, 2*ms),
		written(150, 200, 2*ms, 2*ms),
		frameIn(1, TypeHeaders, FlagEndStream, 500, 550, 30*ms),
	)
	r.a.Expire(30*ms+record.Mono(ReadWait), r.emit)
	if len(r.out) != 0 {
		t.Fatalf("expired before ReadWait")
	}
	r.a.Expire(31*ms+record.Mono(ReadWait), r.emit)
	if len(r.out) != 1 || r.out[0].Stream.ID != 1 || r.out[0].Timeline.D1 != 0 || r.a.Stats.Unread.Load() != 1 {
		t.Fatalf("after ReadWait: %+v, %d unread", r.out, r.a.Stats.Unread.Load())
	}
	r.a.Close(7, r.emit)
	if len(r.out) != 2 || r.out[1].Stream.ID != 3 || !r.out[1].Unanswered || r.a.Conns() != 0 {
		t.Fatalf("after the close: %+v, %d connections", r.out, r.a.Conns())
	}
}

// The connection's set-up is the first streams', opened before any answer
// arrived (grpc-go's calls wait for it), not a later one's.
func TestConnectOnFirstStreams(t *testing.T) {
	r := newRun()
	conn := func(ev Event) Event { ev.Connect = 1 * ms; return ev }
	r.add(
		conn(frameOut(1, TypeHeaders, FlagEndStream, 100, 150, 50*ms)),
		conn(frameOut(3, TypeHeaders, FlagEndStream, 150, 200, 50*ms)),
		conn(written(100, 200, 50*ms, 50*ms)),
		conn(frameIn(1, TypeHeaders, FlagEndStream, 500, 550, 80*ms)),
		conn(frameIn(3, TypeHeaders, FlagEndStream, 550, 600, 80*ms)),
		conn(read(600, 80*ms)),
		conn(frameOut(5, TypeHeaders, FlagEndStream, 200, 250, 90*ms)),
		conn(written(200, 250, 90*ms, 90*ms)),
		conn(frameIn(5, TypeHeaders, FlagEndStream, 600, 650, 120*ms)),
		conn(read(650, 120*ms)),
	)
	if len(r.out) != 3 {
		t.Fatalf("%d exchanges, want 3", len(r.out))
	}
	// A read that ends two streams writes them in no set order.
	for _, e := range r.out {
		want := map[uint32]record.Mono{1: 1 * ms, 3: 1 * ms, 5: 0}[e.Stream.ID]
		if e.Timeline.Connect != want || e.First != (e.Stream.ID == 1) {
			t.Errorf("stream %d: connect %v first %v, want %v and %v", e.Stream.ID, e.Timeline.Connect, e.First, want, e.Stream.ID == 1)
		}
	}
}

// A header block that goes on in CONTINUATION frames ends the message
// with its END_HEADERS, not at the HEADERS frame's END_STREAM.
func TestContinuation(t *testing.T) {
	r := newRun()
	r.add(
		frameOut(1, TypeHeaders, FlagEndStream, 100, 150, 1*ms),
		written(100, 150, 1*ms, 1*ms),
		Event{Kind: FrameIn, Stream: 1, Type: TypeHeaders, Flags: FlagEndStream, Seq: 500, End: 600, T0: 30 * ms, T1: 30 * ms},
		Event{Kind: FrameIn, Stream: 1, Type: TypeContinuation, Flags: FlagEndHeaders, Seq: 600, End: 700, T0: 31 * ms, T1: 31 * ms},
		read(700, 32*ms),
	)
	if len(r.out) != 1 || r.out[0].Timeline.R1 != 31*ms || r.out[0].BytesIn != 200 {
		t.Fatalf("%+v", r.out)
	}
}

// A frame of a stream already written (DATA the server had queued before
// the client's reset) starts no stream of its own; the daemon's stop
// writes the streams in progress unfinished.
func TestLateFrameAndStop(t *testing.T) {
	r := newRun()
	r.add(
		frameOut(1, TypeHeaders, FlagEndStream, 100, 150, 1*ms),
		written(100, 150, 1*ms, 1*ms),
		frameIn(1, TypeRstStream, 0, 500, 513, 30*ms),
		frameIn(1, TypeData, 0, 513, 600, 30*ms),
		frameOut(3, TypeHeaders, FlagEndStream, 150, 200, 40*ms),
		written(150, 200, 40*ms, 40*ms),
	)
	if len(r.out) != 1 || !r.out[0].Stream.Reset || r.a.Stats.Ignored.Load() != 1 {
		t.Fatalf("%+v, %d ignored", r.out, r.a.Stats.Ignored.Load())
	}
	r.a.Stop(r.emit)
	if len(r.out) != 2 || r.out[1].Stream.ID != 3 || !r.out[1].Unfinished || r.out[1].Unanswered || r.a.Conns() != 0 {
		t.Fatalf("after the stop: %+v", r.out)
	}
}

// The framing lost: the streams in progress are written as they stand.
func TestLost(t *testing.T) {
	r := newRun()
	r.add(
		frameOut(1, TypeHeaders, FlagEndStream, 100, 150, 1*ms),
		written(100, 150, 1*ms, 1*ms),
		Event{Kind: Lost},
	)
	if len(r.out) != 1 || !r.out[0].Unanswered || r.a.Conns() != 0 {
		t.Fatalf("%+v", r.out)
	}
}

// Sequence numbers past 2^31 (half of all connections): a frame that
// leaves after its write returned still finds it.
func TestHighSequenceNumbers(t *testing.T) {
	r := newRun()
	const base = 0xfffff000
	r.add(
		written(base, base+100, 1*ms, 1*ms+1),
		frameOut(1, TypeHeaders, FlagEndStream, base, base+100, 5*ms),
		frameIn(1, TypeHeaders, FlagEndStream, 500, 550, 30*ms),
		read(550, 31*ms),
	)
	if len(r.out) != 1 || r.out[0].Timeline.W0 != 1*ms || r.a.Stats.Unplaced.Load() != 0 {
		t.Fatalf("%+v, %d unplaced", r.out, r.a.Stats.Unplaced.Load())
	}
}

// An answer its write left unsent (a paced socket) leaves 5 ms after the
// write returned: that time is the cause the write reported, and an
// answer held by nothing measured (Nagle, cork) is other.
func TestHeldAfterWrite(t *testing.T) {
	for _, held := range []Cause{CausePacing, CauseCwnd, CauseOther} {
		r := newRun()
		w := written(900, 1000, 20*ms, 20*ms+1)
		w.Held = held
		evs := []Event{
			frameIn(1, TypeHeaders, FlagEndStream, 100, 140, 1*ms),
			read(140, 2*ms),
			w,
			frameOut(1, TypeHeaders, 0, 900, 950, 20*ms+1),
			frameOut(1, TypeData, FlagEndStream, 950, 1000, 25*ms+1),
		}
		for i := range evs {
			evs[i].ConnRole = record.RoleServer
		}
		r.add(evs...)
		if len(r.out) != 1 {
			t.Fatalf("%d exchanges, want 1", len(r.out))
		}
		raw := r.out[0].Raw
		got := map[Cause]time.Duration{CausePacing: raw.WaitPacing, CauseCwnd: raw.WaitCwnd, CauseOther: raw.WaitOther}
		if got[held] != 5*time.Millisecond || raw.WaitPacing+raw.WaitCwnd+raw.WaitOther+raw.WaitRwnd+raw.WaitSndbuf != 5*time.Millisecond {
			t.Errorf("held by %d: raw %+v, want 5ms of that cause", held, raw)
		}
	}
}
