package streams

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/fuzz"
)

// eventSize is the bytes of one event as FuzzAssembler reads them.
const eventSize = 24

// assembleBound is what one event may make the assembler allocate: a
// connection, a stream, the event kept waiting for its write and their
// share of the tables' growth, a few kilobytes for the 24 bytes of an
// event.
var assembleBound = fuzz.Bound{PerByte: 256, Fixed: 256 << 10}

// FuzzAssembler feeds the stream assembler the events of the kernel's
// HTTP/2 records in any order and with any values (another version's
// programs, a ring read twice), 24 bytes each (see event), with an Expire
// where an event asks for one. Whatever comes, each connection's tables
// stay within their bounds, every exchange written is a stream's of a
// connection that was given, and Stop forgets every connection.
func FuzzAssembler(f *testing.F) {
	fuzz.Seeds(f, map[string][]any{
		"unary-client": {encodeEvents(
			frameOut(1, TypeHeaders, 0, 100, 150, 10*ms+1),
			frameOut(1, TypeData, FlagEndStream, 150, 200, 10*ms+2),
			written(100, 200, 10*ms, 10*ms+5),
			frameIn(1, TypeHeaders, 0, 500, 540, 50*ms),
			frameIn(1, TypeData, 0, 540, 600, 50*ms+1),
			frameIn(1, TypeHeaders, FlagEndStream, 600, 620, 50*ms+2),
			read(620, 51*ms),
		)},
		"reset-and-lost": {encodeEvents(
			frameOut(3, TypeHeaders, FlagEndStream, 100, 120, 10*ms),
			written(100, 120, 10*ms, 10*ms+1),
			frameIn(3, TypeRstStream, 0, 500, 513, 20*ms),
			frameIn(0, TypeWindowUpdate, 0, 513, 526, 21*ms),
			frameOut(5, TypeHeaders, 0, 120, 140, 30*ms),
			Event{Kind: Lost, T1: 40 * ms},
		)},
	})
	f.Fuzz(func(t *testing.T, b []byte) {
		a := New()
		given := map[uint64]bool{}
		var written uint64
		emit := func(e *record.Exchange) {
			written++
			if e.Stream == nil || !given[e.Cookie] {
				t.Fatalf("an exchange of stream %v of connection %d, which was given no event", e.Stream, e.Cookie)
			}
		}
		fuzz.Alloc(t, len(b), assembleBound, func() {
			for ; len(b) >= eventSize; b = b[eventSize:] {
				ev, expire := event(b)
				given[ev.Cookie] = true
				a.Add(&ev, emit)
				if expire {
					a.Expire(ev.T1+record.Mono(ReadWait)+1, emit)
				}
				withinBounds(t, a)
			}
			a.Stop(emit)
		})
		if a.Conns() != 0 {
			t.Fatalf("%d connections left after Stop", a.Conns())
		}
		if written != a.Stats.Streams.Load() {
			t.Fatalf("%d exchanges written, %d counted", written, a.Stats.Streams.Load())
		}
	})
}

// event reads one event: its kind (any value), one of four connections
// and its role, the stream, the frame's type and flags, sequence numbers,
// times in microseconds, the write's cause, the RTTs and the connect; and
// whether an Expire follows it.
func event(b []byte) (ev Event, expire bool) {
	u32 := binary.LittleEndian.Uint32
	t0 := record.Mono(u32(b[12:])&0xffffff) * record.Mono(time.Microsecond)
	ev = Event{
		Kind:     Kind(b[0] & 7),
		Cookie:   uint64(b[1]&3) + 1,
		ConnRole: []record.Role{record.RoleClient, record.RoleServer, record.RoleUnknown}[b[23]%3],
		Stream:   uint32(b[2]),
		Type:     b[3],
		Flags:    b[1] >> 2,
		Seq:      u32(b[4:]),
		End:      u32(b[8:]),
		T0:       t0,
		T1:       t0 + record.Mono(binary.LittleEndian.Uint16(b[16:]))*record.Mono(time.Microsecond),
		Held:     Cause(b[18] % 5),
		MinRTT:   time.Duration(b[19]) * 100 * time.Microsecond,
		SRTT:     time.Duration(b[20]) * 100 * time.Microsecond,
		Connect:  record.Mono(b[21]) * record.Mono(time.Millisecond),
	}
	return ev, b[22]&1 != 0
}

// encodeEvents writes events as event reads them (times to the
// microsecond), for seeds.
func encodeEvents(evs ...Event) []byte {
	var out []byte
	for _, ev := range evs {
		b := make([]byte, eventSize)
		b[0] = byte(ev.Kind)
		b[1] = byte(max(ev.Cookie, 1)-1)&3 | ev.Flags<<2
		b[2], b[3] = byte(ev.Stream), ev.Type
		binary.LittleEndian.PutUint32(b[4:], ev.Seq)
		binary.LittleEndian.PutUint32(b[8:], ev.End)
		us := uint32(ev.T0 / record.Mono(time.Microsecond))
		binary.LittleEndian.PutUint32(b[12:], us&0xffffff)
		binary.LittleEndian.PutUint16(b[16:], uint16((ev.T1-ev.T0)/record.Mono(time.Microsecond)))
		b[18] = byte(ev.Held)
		b[19] = byte(ev.MinRTT / (100 * time.Microsecond))
		b[20] = byte(ev.SRTT / (100 * time.Microsecond))
		if ev.ConnRole == record.RoleServer {
			b[23] = 1
		}
		out = append(out, b...)
	}
	return out
}

// withinBounds fails t when a connection holds more than the bounds let it.
func withinBounds(t *testing.T, a *Assembler) {
	t.Helper()
	for cookie, c := range a.conns {
		if len(c.writes) > maxWrites || len(c.waiting) > maxWaiting || len(c.streams) > maxStreams ||
			len(c.closed) > maxClosed || len(c.closedOrder) > maxClosed {
			t.Fatalf("connection %d holds %d writes, %d frames waiting, %d streams, %d closed (%d in order): past the bounds",
				cookie, len(c.writes), len(c.waiting), len(c.streams), len(c.closed), len(c.closedOrder))
		}
	}
}
