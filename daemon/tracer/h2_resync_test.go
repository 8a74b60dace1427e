package tracer

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

// TestHTTP2Adopted: an HTTP/2 connection open before the tracer, its
// preface long gone, its server's port above its client's. Its framing is
// found from frame headers alone (h2_resync.bpf.h): once both directions
// are confirmed each stream is an exchange at both ends, with the roles
// the listening socket gives, exactly as on a connection seen from its
// preface; the connection's own exchanges before that are no latency
// samples; PINGs between the calls (grpc-go's BDP pings) split nothing.
// The same through the TCP iterators, where the kernel refuses those over
// the socket storage.
func TestHTTP2Adopted(t *testing.T) {
	for _, tcpIters := range []bool{false, true} {
		t.Run(fmt.Sprintf("TCP iterators only %v", tcpIters), func(t *testing.T) { http2Adopted(t, tcpIters) })
	}
}

func http2Adopted(t *testing.T, tcpIters bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	server := ln.Addr().(*net.TCPAddr).AddrPort()
	cc := dialFromBelow(t, server)
	sconn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sc := sconn.(*net.TCPConn)
	ping := func(ack bool) []byte {
		var flags byte
		if ack {
			flags = h2Ack
		}
		return h2Whole(6, flags, 0, []byte{1, 2, 3, 4, 5, 6, 7, 8})
	}
	call := func(id uint32) {
		sendSegments(t, cc, sc, [][]byte{h2Request(id)})
		sendSegments(t, sc, cc, [][]byte{h2Response(id, 100)})
	}
	sendSegments(t, cc, sc, [][]byte{cat([]byte(h2Preface), clientSettings, h2Request(1))})
	sendSegments(t, sc, cc, [][]byte{cat(serverSettings, settingsAck, h2Response(1, 100))})
	sendSegments(t, cc, sc, [][]byte{settingsAck})

	col := &collector{}
	tr, _ := openTracerWith(t, Options{DrainInterval: 20 * time.Millisecond, noStorageIters: tcpIters}, col)
	const calls = 12
	id := uint32(3)
	for i := range calls {
		if i%3 == 1 {
			sendSegments(t, sc, cc, [][]byte{ping(false)})
			sendSegments(t, cc, sc, [][]byte{ping(true)})
		}
		call(id)
		id += 2
	}
	client := cc.LocalAddr().(*net.TCPAddr).AddrPort()
	cc.Close()
	sc.Close()
	col.find(t, client)
	col.find(t, server)
	streams := h2StreamsOf(col, client)

	// Each end: a stream exchange for every call after the framing was
	// confirmed (the client's direction needs three frame headers: the
	// third call), the same ids at both ends.
	ids := map[record.Role]map[uint32]bool{record.RoleClient: {}, record.RoleServer: {}}
	for _, e := range streams {
		want := record.Requester
		if e.ConnRole == record.RoleServer {
			want = record.Responder
		}
		if e.Role != want || e.RoleSource != record.RoleFromListener || e.ConnRole == record.RoleUnknown {
			t.Errorf("stream %d: role %s on a %s end, role source %q", e.Stream.ID, e.Role, e.ConnRole, e.RoleSource)
		}
		if e.First || e.Partial || !e.Timed() || e.BytesOut+e.BytesIn == 0 {
			t.Errorf("stream %d at the %s end: first %v partial %v timed %v (rejected %q) bytes %d/%d", e.Stream.ID, e.ConnRole, e.First, e.Partial, e.Timed(), e.Rejected, e.BytesOut, e.BytesIn)
		}
		ids[e.ConnRole][e.Stream.ID] = true
	}
	for role, got := range ids {
		if len(got) < calls-3 {
			t.Errorf("%s end: streams %v, want the %d calls after the third at least", role, got, calls-3)
		}
	}
	for _, e := range col.connExchanges(client) {
		if e.Stream == nil && e.Timed() && !e.Partial {
			t.Errorf("a connection-level exchange of the %s end is a latency sample: %+v", e.ConnRole, e.Timeline)
		}
	}
	for _, end := range []record.ConnClose{col.find(t, client), col.find(t, server)} {
		if end.HTTP2 == nil || !end.HTTP2.Resynced || end.HTTP2.Unsynced {
			t.Errorf("%s end's close: HTTP/2 %+v, want resynced", end.Role, end.HTTP2)
		}
	}
	if c, err := tr.Counters(); err != nil || c.H2Resynced == 0 {
		t.Errorf("counters: %+v, %v", c, err)
	}
}
