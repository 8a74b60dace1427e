package tracer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/record"
)

// TestHTTP2AdversarialFraming drives the programs that read cleartext
// HTTP/2's framing (bpf/http2.bpf.h) with byte streams a peer may send,
// over real loopback connections both of whose ends this test writes, one
// segment per write: frame headers cut across segments at every offset,
// frame lengths at the limits, frame types no RFC defines, junk right
// after the preface, a preface cut in two, a connection cut mid-frame.
// Each end's close record must count what the bytes really held, or say
// the framing was lost (unsynced); no stream may come out as a timed
// exchange that the bytes do not hold; and every connection ends.
func TestHTTP2AdversarialFraming(t *testing.T) {
	tr, col := openTracer(t)
	before, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	unsynced := 0
	for _, c := range h2Cases() {
		t.Run(c.name, func(t *testing.T) {
			client, server := runH2(t, c)
			ends := map[string]netip.AddrPort{"client": client, "server": server}
			for end, local := range ends {
				checkH2End(t, c, end, col.find(t, local), h2StreamsOf(col, local))
			}
		})
		if c.unsynced {
			unsynced += 2
		}
	}
	after, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	// The counter is the node's: other connections may add to it.
	if got := after.H2Unsynced - before.H2Unsynced; got < uint64(unsynced) {
		t.Errorf("http2_unsynced rose by %d, want at least the %d connection ends whose framing was lost", got, unsynced)
	}
}

// h2Case is a conversation and what its bytes hold.
type h2Case struct {
	name string
	// turns are written in order, each as its segments: the client's
	// bytes from the preface on, the server's from its first.
	turns []h2Turn
	// http2: the client's preface was read, so the close records count
	// frames; unsynced: the framing was lost on the way.
	http2, unsynced bool
	// streams are the streams whose request and answer the bytes hold
	// whole; on a connection whose framing was lost, the upper bound.
	streams []h2Stream
}

type h2Turn struct {
	client   bool
	segments [][]byte
}

// h2Stream is a stream as the client's end sees it.
type h2Stream struct {
	id              uint32
	dataOut, dataIn uint32
}

// HTTP/2 frame types and flags (RFC 9113, section 6).
const (
	h2Data, h2Headers, h2Settings, h2GoAway = 0, 1, 4, 7
	h2EndStream, h2Ack, h2EndHeaders        = 0x1, 0x1, 0x4
)

const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// h2Frame is a frame with payload, its length field claiming length.
func h2Frame(length int, typ, flags byte, stream uint32, payload []byte) []byte {
	b := []byte{byte(length >> 16), byte(length >> 8), byte(length), typ, flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[5:], stream)
	return append(b, payload...)
}

func h2Whole(typ, flags byte, stream uint32, payload []byte) []byte {
	return h2Frame(len(payload), typ, flags, stream, payload)
}

// What the conversations are made of. Header blocks are HPACK's static
// table (:method GET, :scheme http, :path /; :status 200): the programs
// never read them.
var (
	clientSettings = h2Whole(h2Settings, 0, 0, []byte{0, 2, 0, 0, 0, 0}) // ENABLE_PUSH 0
	serverSettings = h2Whole(h2Settings, 0, 0, []byte{0, 3, 0, 0, 0, 100})
	settingsAck    = h2Whole(h2Settings, h2Ack, 0, nil)
)

func h2Request(id uint32) []byte {
	return h2Whole(h2Headers, h2EndStream|h2EndHeaders, id, []byte{0x82, 0x86, 0x84})
}

func h2Response(id uint32, body int) []byte {
	return append(h2Whole(h2Headers, h2EndHeaders, id, []byte{0x88}), h2Whole(h2Data, h2EndStream, id, make([]byte, body))...)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// cutHeaders cuts b, whole frames after skip bytes, into segments: each
// frame header is cut after 1 to 8 of its bytes, in turn, so that every
// offset inside a header is a segment boundary somewhere. The bytes that
// open a direction (the preface, the server's first header) are skipped:
// they are read from the first segment whole, or not at all.
func cutHeaders(b []byte, skip int) [][]byte {
	var cuts []int
	for off, i := skip, 0; off+9 <= len(b); i++ {
		cuts = append(cuts, off+1+i%8)
		off += 9 + (int(b[off])<<16 | int(b[off+1])<<8 | int(b[off+2]))
	}
	var segs [][]byte
	last := 0
	for _, c := range cuts {
		segs = append(segs, b[last:c])
		last = c
	}
	return append(segs, b[last:])
}

func h2Cases() []h2Case {
	one := []h2Stream{{id: 1, dataIn: 1}}
	valid := func(name string, cut func([]byte, int) [][]byte) h2Case {
		return h2Case{name: name, http2: true, streams: one, turns: []h2Turn{
			{true, cut(cat([]byte(h2Preface), clientSettings, h2Request(1)), len(h2Preface))},
			{false, cut(cat(serverSettings, settingsAck, h2Response(1, 100)), 9)},
			{true, cut(settingsAck, 0)},
		}}
	}
	whole := func(b []byte, _ int) [][]byte { return [][]byte{b} }
	unknown := cat(h2Whole(0x0a, 0, 0, []byte("ext")), h2Whole(0xfe, 0xff, 1, nil), h2Frame(300, 0xff, 0, 0, make([]byte, 300)))
	limits := h2Case{name: "lengths at the limits", http2: true,
		streams: []h2Stream{{id: 1, dataIn: 1}, {id: 3, dataIn: 1}, {id: 5, dataIn: 1}, {id: 7, dataIn: 1}},
		turns: []h2Turn{
			{true, [][]byte{cat([]byte(h2Preface), clientSettings, h2Request(1), h2Request(3), h2Request(5), h2Request(7))}},
			{false, cutHeaders(cat(serverSettings, settingsAck, h2Response(1, 0), h2Response(3, 16384), h2Response(5, 16385), h2Response(7, 1<<24-1)), 9)},
		}}
	return []h2Case{
		valid("whole segments", whole),
		valid("headers cut at every offset", cutHeaders),
		limits,
		{name: "unknown frame types", http2: true, streams: one, turns: []h2Turn{
			{true, cutHeaders(cat([]byte(h2Preface), clientSettings, unknown, h2Request(1)), len(h2Preface))},
			{false, cutHeaders(cat(serverSettings, unknown, settingsAck, h2Response(1, 10)), 9)},
		}},
		{name: "a header across three segments", http2: true, unsynced: true, streams: one, turns: []h2Turn{
			{true, [][]byte{cat([]byte(h2Preface), clientSettings, h2Request(1)[:3]), h2Request(1)[3:6], h2Request(1)[6:]}},
			{false, [][]byte{cat(serverSettings, settingsAck, h2Response(1, 10))}},
		}},
		{name: "junk after the preface", http2: true, unsynced: true, turns: []h2Turn{
			{true, [][]byte{cat([]byte(h2Preface), []byte("GET / HTTP/1.1\r\nHost: h2\r\n\r\n"))}},
			{false, [][]byte{cat(serverSettings, h2Whole(h2GoAway, 0, 0, []byte{0, 0, 0, 0, 0, 0, 0, 1}))}},
		}},
		// Frames, but not HTTP/2: the preface must be followed by the
		// client's SETTINGS (RFC 9113, 3.4), and a server would refuse
		// the connection; this one answers as if it were.
		{name: "a request in place of the settings", http2: true, unsynced: true, turns: []h2Turn{
			{true, [][]byte{cat([]byte(h2Preface), h2Request(1))}},
			{false, [][]byte{cat(serverSettings, settingsAck, h2Response(1, 10))}},
		}},
		// The server's direction opens with a SETTINGS header read
		// whole from its first segment, or is not HTTP/2: the client's
		// preface was read, so the framing is lost.
		{name: "the server's first header cut", http2: true, unsynced: true, streams: one, turns: []h2Turn{
			{true, [][]byte{cat([]byte(h2Preface), clientSettings, h2Request(1))}},
			{false, [][]byte{serverSettings[:4], cat(serverSettings[4:], settingsAck, h2Response(1, 10))}},
		}},
		{name: "preface cut in two", turns: []h2Turn{
			{true, [][]byte{[]byte(h2Preface[:16]), cat([]byte(h2Preface[16:]), clientSettings, h2Request(1))}},
			{false, [][]byte{cat(serverSettings, settingsAck, h2Response(1, 10))}},
		}},
		// The connection ends inside a DATA frame that claims 1000
		// bytes and brings 100, with END_STREAM: the request never
		// ends.
		{name: "cut mid-frame", http2: true, turns: []h2Turn{
			{false, [][]byte{serverSettings}},
			{true, [][]byte{cat([]byte(h2Preface), clientSettings, settingsAck, h2Whole(h2Headers, h2EndHeaders, 1, []byte{0x83, 0x86, 0x84}),
				h2Frame(1000, h2Data, h2EndStream, 1, make([]byte, 100)))}},
			{false, [][]byte{settingsAck}},
		}},
	}
}

// runH2 makes c's conversation on a new loopback connection and closes
// it; it returns the two ends' local addresses.
func runH2(t testing.TB, c h2Case) (client, server netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	ends := map[bool]*net.TCPConn{true: cc.(*net.TCPConn), false: sc.(*net.TCPConn)}
	for _, turn := range c.turns {
		sendSegments(t, ends[turn.client], ends[!turn.client], turn.segments)
	}
	cc.Close()
	sc.Close()
	return cc.LocalAddr().(*net.TCPAddr).AddrPort(), sc.LocalAddr().(*net.TCPAddr).AddrPort()
}

// sendSegments writes each segment on from with nothing else in flight
// (TCP_NODELAY is Go's default, and the last write is acknowledged before
// the next), while to reads them all. A segment smaller than a loopback
// MSS must leave as one segment of its own: the count of data segments
// the kernel sent (TCP_INFO) says so.
func sendSegments(t testing.TB, from, to *net.TCPConn, segments [][]byte) {
	t.Helper()
	total := 0
	for _, s := range segments {
		total += len(s)
	}
	read := make(chan error, 1)
	go func() {
		_, err := io.CopyN(io.Discard, to, int64(total))
		read <- err
	}()
	for _, s := range segments {
		before := tcpInfo(t, from, true)
		if _, err := from.Write(s); err != nil {
			t.Fatal(err)
		}
		after := tcpInfo(t, from, true)
		if n := after.Data_segs_out - before.Data_segs_out; len(s) < 16<<10 && n != 1 {
			t.Fatalf("a write of %d bytes left in %d segments: the cut the test makes is not the one the programs saw", len(s), n)
		}
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
}

// tcpInfo reads c's TCP_INFO, with drained once everything written was
// sent and acknowledged.
func tcpInfo(t testing.TB, c *net.TCPConn, drained bool) *unix.TCPInfo {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var info *unix.TCPInfo
		var gerr error
		if err := raw.Control(func(fd uintptr) { info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || gerr != nil {
			t.Fatalf("TCP_INFO: %v %v", err, gerr)
		}
		if !drained || info.Unacked == 0 && info.Notsent_bytes == 0 {
			return info
		}
		if time.Now().After(deadline) {
			t.Fatalf("the connection's writes were not acknowledged in 10 s: %d unacknowledged, %d unsent", info.Unacked, info.Notsent_bytes)
		}
		time.Sleep(time.Millisecond)
	}
}

// h2StreamsOf waits for the stream exchanges of the connection with an end
// at local to stop coming, and returns them (both ends').
func h2StreamsOf(col *collector, local netip.AddrPort) []*record.Exchange {
	n := -1
	for {
		var out []*record.Exchange
		for _, e := range col.connExchanges(local) {
			if e.Stream != nil {
				out = append(out, e)
			}
		}
		if len(out) == n {
			return out
		}
		n = len(out)
		time.Sleep(300 * time.Millisecond)
	}
}

// checkH2End holds one end's close record and stream exchanges to what
// the bytes of c held.
func checkH2End(t *testing.T, c h2Case, end string, cl record.ConnClose, streams []*record.Exchange) {
	t.Helper()
	want := h2FramesIn(c)
	switch h := cl.HTTP2; {
	case !c.http2:
		if h != nil {
			t.Errorf("%s end: HTTP/2 frames %v counted on a connection whose preface was not read", end, h.Frames)
		}
	case h == nil:
		t.Errorf("%s end: no HTTP/2 frame counts; want %v", end, want)
	case h.Unsynced != c.unsynced:
		t.Errorf("%s end: unsynced %v, want %v (frames %v)", end, h.Unsynced, c.unsynced, h.Frames)
	case !c.unsynced && !maps.Equal(h.Frames, want):
		t.Errorf("%s end: HTTP/2 frames %v, the bytes hold %v", end, h.Frames, want)
	case c.unsynced:
		// Counted up to the loss: never more than the bytes hold.
		for typ, n := range h.Frames {
			if n > want[typ] {
				t.Errorf("%s end: %d %s frames counted, the bytes hold %d", end, n, typ, want[typ])
			}
		}
	}
	role := record.Requester
	if end == "server" {
		role = record.Responder
	}
	var timed []h2Stream
	for _, e := range streams {
		if e.Flow.Local != cl.Flow.Local {
			continue
		}
		s := h2Stream{id: e.Stream.ID, dataOut: e.Stream.DataOut, dataIn: e.Stream.DataIn}
		if end == "server" {
			s.dataOut, s.dataIn = s.dataIn, s.dataOut
		}
		if !e.Timed() {
			continue
		}
		if e.Role != role {
			t.Errorf("%s end: stream %d is the %s's", end, s.id, e.Role)
		}
		timed = append(timed, s)
	}
	slices.SortFunc(timed, func(a, b h2Stream) int { return int(a.id) - int(b.id) })
	if c.unsynced {
		for _, s := range timed {
			if !slices.Contains(c.streams, s) {
				t.Errorf("%s end: stream %+v timed, which the bytes do not hold", end, s)
			}
		}
		return
	}
	if !slices.Equal(timed, c.streams) {
		t.Errorf("%s end: streams %+v timed, the bytes hold %+v", end, timed, c.streams)
	}
}

// h2FramesIn counts the frames c's bytes hold, by the name the close
// record gives their type, walking each direction from header to header
// as a reader of the whole byte stream would.
func h2FramesIn(c h2Case) map[string]uint64 {
	out := map[string]uint64{}
	for _, client := range []bool{true, false} {
		var b []byte
		for _, turn := range c.turns {
			if turn.client == client {
				b = append(b, bytes.Join(turn.segments, nil)...)
			}
		}
		if client {
			b = bytes.TrimPrefix(b, []byte(h2Preface))
		}
		for len(b) >= 9 {
			name := "other"
			if int(b[3]) < len(record.HTTP2FrameTypes) {
				name = record.HTTP2FrameTypes[b[3]]
			}
			out[name]++
			b = b[min(len(b), 9+(int(b[0])<<16|int(b[1])<<8|int(b[2]))):]
		}
	}
	return out
}

func (s h2Stream) String() string {
	return fmt.Sprintf("stream %d (DATA out %d, in %d)", s.id, s.dataOut, s.dataIn)
}
