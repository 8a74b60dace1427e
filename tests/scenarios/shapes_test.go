package scenarios

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/workload"
)

// Scenario 8: both address families, and the responder's side: B's own
// records put the server's think time in app.think, next to what the
// server measured of itself.
func TestFamiliesAndResponder(t *testing.T) {
	for _, family := range []string{"ipv4", "ipv6"} {
		t.Run(family, func(t *testing.T) {
			const (
				think   = 10 * time.Millisecond
				reqSize = 500
			)
			s := newScenario(t, symmetric(10*time.Millisecond), tracer.Options{})
			srv := s.server(workload.ServerConfig{})
			dst := s.lab.B.IPv4
			if family == "ipv6" {
				dst = s.lab.B.IPv6
			}
			w := s.captureBoth()
			recs := s.client(workload.ClientConfig{Addr: netip.AddrPortFrom(dst, port).String(),
				ReqSize: reqSize, RespSize: 4000, Think: think, Count: 30, Interval: 40 * time.Millisecond})
			s.settle(recs)
			w.stop()
			pairs := s.match(recs)
			checkSums(t, pairs)
			med := componentMedians(pairs, true)
			t.Logf("requester medians: %v", med)
			// app.peer is B's turnaround, as B's side of the wire shows it:
			// the server's think time and whatever kept the server from
			// reading and writing at once.
			wire := w.exchanges(netip.MustParseAddrPort(recs[0].Local))
			if len(wire) != len(pairs) {
				t.Fatalf("%d exchanges on the wire, %d traced", len(wire), len(pairs))
			}
			// The network is the path's on the wire, at least the
			// injected 20 ms.
			var peerErr, nets []time.Duration
			for i, p := range pairs[1:] {
				if own := time.Duration(p.app.ServerNs); wire[i+1].peer() < own {
					t.Fatalf("exchange %d: B's turnaround on the wire %v is shorter than the server's own %v: captures misaligned", p.app.ID, wire[i+1].peer(), own)
				}
				peerErr = append(peerErr, p.ex.Components.Peer-wire[i+1].peer())
				nets = append(nets, wire[i+1].network())
			}
			if !near(med["network"], median(nets)) || med["network"] < 20*time.Millisecond-tolerance(20*time.Millisecond) || median(peerErr).Abs() > 300*time.Microsecond {
				t.Errorf("requester: network %v (the wire's %v), app.peer off B's turnaround on the wire by %v", med["network"], median(nets), median(peerErr))
			}
			for _, p := range pairs {
				if p.ex.Flow.IPv6() != (family == "ipv6") {
					t.Fatalf("exchange %d traced as %v", p.app.ID, p.ex.Flow)
				}
			}
			// B's records: each responder exchange's think time is the
			// server's own, from the read call that returned the request's
			// last byte to the write of the response: at least the time
			// between the read's return and the write's start, at most
			// that between the read's start and the write's return.
			server := map[uint64]workload.ServerRecord{}
			for _, r := range srv.Records() {
				server[r.ID] = r
			}
			resp := s.responders()
			if len(resp) != len(recs) {
				t.Fatalf("%d responder exchanges in B for %d requests", len(resp), len(recs))
			}
			var own, thinks []time.Duration
			for i, e := range resp {
				if e.Flow.IPv6() != (family == "ipv6") || e.Role != record.Responder || e.ConnRole != record.RoleServer {
					t.Errorf("responder exchange %d: %v role %s conn %s", i, e.Flow, e.Role, e.ConnRole)
				}
				if e.Components.Sum() != e.Duration || e.BytesIn != reqSize || e.BytesOut != 4000 {
					t.Errorf("responder exchange %d: sum %v duration %v bytes in %d out %d", i, e.Components.Sum(), e.Duration, e.BytesIn, e.BytesOut)
				}
				id := uint64((e.InSeq-e.ISNRemote-1)/reqSize) + 1
				r, ok := server[id]
				if !ok {
					t.Errorf("responder exchange %d: request %d, which the server did not answer", i, id)
					continue
				}
				least, most := time.Duration(r.RespWriteStartNs-r.LastReqByteNs), time.Duration(r.RespWriteDoneNs-r.LastReadCallNs)
				if got := e.Components.Think; got < least || got > most {
					t.Errorf("request %d: responder think %v, the server's own %v to %v", id, got, least, most)
				}
				own, thinks = append(own, least), append(thinks, e.Components.Think)
			}
			accuracy(t, "responder think (median)", "ms", msf(median(own)), "the server's own think time", msf(median(thinks)))
		})
	}
}

// Scenario 9a: pipelining. Four requests in flight on one connection: an
// exchange is cut at each change of direction, so requests written back to
// back share one; turns are still counted and nothing goes negative.
func TestPipelined(t *testing.T) {
	s := newScenario(t, symmetric(5*time.Millisecond), tracer.Options{})
	s.server(workload.ServerConfig{})
	recs := s.client(workload.ClientConfig{ReqSize: 200, RespSize: 2000, Think: 3 * time.Millisecond, Count: 40, Depth: 4})
	s.settle(recs)
	var ex []*record.Exchange
	s.col.Mu.Lock()
	for _, e := range s.col.Exchanges {
		if e.Flow.Netns == s.netnsA && e.Role == record.Requester {
			ex = append(ex, e)
		}
	}
	s.col.Mu.Unlock()
	var out, in uint64
	for _, e := range ex {
		if e.Components.Sum() != e.Duration || e.Duration < 0 {
			t.Errorf("exchange: sum %v duration %v", e.Components.Sum(), e.Duration)
		}
		out += e.BytesOut
		in += e.BytesIn
	}
	if len(ex) == 0 || len(ex) > len(recs) {
		t.Fatalf("%d exchanges for %d pipelined requests", len(ex), len(recs))
	}
	last := ex[len(ex)-1]
	if out != 40*200 || in != 40*2000 {
		t.Errorf("bytes across exchanges: out %d in %d, want %d and %d", out, in, 40*200, 40*2000)
	}
	if want := uint32(2*len(ex) - 1); last.Turns < want {
		t.Errorf("turns %d after %d exchanges", last.Turns, len(ex))
	}
	t.Logf("40 pipelined requests: %d exchanges, %d turns", len(ex), last.Turns)
}

// Scenario 9b: a one-way stream. 4 MB up and a small acknowledgement back:
// one exchange whose outgoing message carries the stream.
func TestOneWayStream(t *testing.T) {
	s := newScenario(t, symmetric(5*time.Millisecond), tracer.Options{})
	s.server(workload.ServerConfig{})
	var res workload.BulkResult
	err := s.lab.A.Do(func() (err error) {
		res, err = workload.RunBulk(context.Background(), workload.BulkConfig{Addr: netip.AddrPortFrom(s.lab.B.IPv4, port).String(),
			Direction: workload.BulkUp, Bytes: 4 << 20})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	s.settle([]workload.ClientRecord{{Local: res.Local}})
	s.col.Mu.Lock()
	defer s.col.Mu.Unlock()
	var got []*record.Exchange
	for _, e := range s.col.Exchanges {
		if e.Flow.Netns == s.netnsA && e.Flow.Local.String() == res.Local {
			got = append(got, e)
		}
	}
	if len(got) != 1 {
		t.Fatalf("%d exchanges for one stream", len(got))
	}
	e := got[0]
	t.Logf("stream: %v, send wait %v, network %v, bytes out %d", e.Duration, e.Components.SendWait, e.Components.Network, e.BytesOut)
	if e.BytesOut < 4<<20 || e.Components.Sum() != e.Duration {
		t.Errorf("stream exchange: bytes out %d, sum %v, duration %v", e.BytesOut, e.Components.Sum(), e.Duration)
	}
	// The stream's time is spent pushing it out; the reply is one RTT.
	if e.Components.SendWait < e.Duration/2 {
		t.Errorf("send wait %v of %v for a 4 MB stream", e.Components.SendWait, e.Duration)
	}
}

// Scenario 9c: a connection that carries no data gives its connect latency
// and close, and no exchange. Five of them, for a median: one handshake on
// a lab that shares two vCPUs may see the path a few ms slow.
func TestConnectionWithoutData(t *testing.T) {
	s := newScenario(t, symmetric(10*time.Millisecond), tracer.Options{})
	s.server(workload.ServerConfig{})
	var recs []workload.ClientRecord
	for i := 0; i < 5; i++ {
		err := s.lab.A.Do(func() error {
			c, err := net.Dial("tcp", netip.AddrPortFrom(s.lab.B.IPv4, port).String())
			if err != nil {
				return err
			}
			recs = append(recs, workload.ClientRecord{Local: c.LocalAddr().String()})
			return c.Close()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s.settle(recs)
	s.col.Mu.Lock()
	defer s.col.Mu.Unlock()
	locals := map[string]bool{}
	for _, r := range recs {
		locals[r.Local] = true
	}
	for _, e := range s.col.Exchanges {
		if locals[e.Flow.Local.String()] {
			t.Errorf("an exchange for a connection without data: %+v", e)
		}
	}
	var lats []time.Duration
	for _, o := range s.col.Opens {
		if locals[o.Flow.Local.String()] {
			lats = append(lats, o.ConnectLatency)
			if o.ConnectLatency < o.HandshakeRTT || o.Role != record.RoleClient {
				t.Errorf("connection open %+v: connect latency below the handshake's own RTT sample", o)
			}
		}
	}
	if len(lats) != len(recs) || !near(median(lats), 20*time.Millisecond) {
		t.Errorf("connect latencies %v for %d connections, want a median of one RTT", lats, len(recs))
	}
}

// The tracer picks up connections that were open before it started: their
// sockets get state at their first event, without sockops (so without TX
// timestamps: x1 and a1 are reconstructed), their roles from the listening
// socket, and the first exchange seen is marked partial.
func TestPreexistingConnection(t *testing.T) {
	s := newLab(t, symmetric(10*time.Millisecond))
	s.server(workload.ServerConfig{})
	conn := s.dial()
	defer conn.Close()
	exchange := func(id uint64) {
		req := make([]byte, 100)
		workload.Header{Kind: workload.KindRequest, ID: id, ReqLen: 100, RespLen: 1000}.Put(req)
		if _, err := conn.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	exchange(1)
	s.startTracer(tracer.Options{})
	for id := uint64(2); id <= 12; id++ {
		exchange(id)
		time.Sleep(20 * time.Millisecond)
	}
	local := conn.LocalAddr().String()
	conn.Close()
	s.settle([]workload.ClientRecord{{Local: local}})
	s.col.Mu.Lock()
	defer s.col.Mu.Unlock()
	var got []*record.Exchange
	for _, e := range s.col.Exchanges {
		if e.Flow.Local.String() == local && e.Role == record.Requester {
			got = append(got, e)
		}
	}
	if len(got) != 11 {
		t.Fatalf("%d requester exchanges traced of the 11 made after the tracer started", len(got))
	}
	var nets []time.Duration
	for i, e := range got {
		if e.TxTimestamps || e.ConnRole != record.RoleClient || e.RoleSource != record.RoleFromListener || e.Partial != (i == 0) {
			t.Errorf("exchange %d: tx timestamps %v, conn role %s (%s), partial %v", i, e.TxTimestamps, e.ConnRole, e.RoleSource, e.Partial)
		}
		if e.Components.Sum() != e.Duration {
			t.Errorf("exchange %d: sum %v duration %v", i, e.Components.Sum(), e.Duration)
		}
		nets = append(nets, e.Components.Network)
	}
	if m := median(nets); !near(m, 20*time.Millisecond) {
		t.Errorf("network %v on a pre-existing connection, want 20 ms", m)
	}
}

// Without BPF TX timestamps (kernels before 6.15, or turned off), x1 and a1
// are reconstructed from snd_nxt and ACKs: the components stay within
// tolerance of the wire's truth.
func TestWithoutTxTimestamps(t *testing.T) {
	s := newScenario(t, symmetric(10*time.Millisecond), tracer.Options{NoTxTimestamps: true})
	s.server(workload.ServerConfig{})
	recs := s.client(workload.ClientConfig{ReqSize: 100, RespSize: 1000, Think: 5 * time.Millisecond, Count: 30, Interval: 30 * time.Millisecond})
	s.settle(recs)
	pairs := s.match(recs)
	checkSums(t, pairs)
	for _, p := range pairs {
		if p.ex.TxTimestamps {
			t.Fatalf("exchange %d used TX timestamps with them turned off", p.app.ID)
		}
	}
	med := componentMedians(pairs, true)
	var peerErr []time.Duration
	for _, p := range pairs[1:] {
		peerErr = append(peerErr, p.ex.Components.Peer-time.Duration(p.app.ServerNs))
	}
	if !near(med["network"], 20*time.Millisecond) || median(peerErr).Abs() > 300*time.Microsecond {
		t.Errorf("without TX timestamps: %v; app.peer off the server's own time by %v", med, median(peerErr))
	}
}

// Both ends name an exchange alike: the requester's (ISN local, ISN remote,
// request start) is the responder's (ISN remote, ISN local, request start).
func TestBothEndsAgreeOnSequenceNumbers(t *testing.T) {
	s := newScenario(t, symmetric(2*time.Millisecond), tracer.Options{})
	s.server(workload.ServerConfig{})
	recs := s.client(workload.ClientConfig{ReqSize: 300, RespSize: 700, Count: 10, Interval: 10 * time.Millisecond})
	s.settle(recs)
	type key struct{ client, server, req uint32 }
	seen := map[key]int{}
	for _, p := range s.match(recs) {
		seen[key{p.ex.ISNLocal, p.ex.ISNRemote, p.ex.OutSeq}]++
		if p.ex.OutSeq-p.ex.ISNLocal != uint32(1+300*(p.app.ID-1)) {
			t.Errorf("exchange %d: request starts at relative seq %d", p.app.ID, p.ex.OutSeq-p.ex.ISNLocal)
		}
	}
	for _, e := range s.responders() {
		seen[key{e.ISNRemote, e.ISNLocal, e.InSeq}]++
	}
	for k, n := range seen {
		if n != 2 {
			t.Errorf("exchange %+v seen by %d ends, want 2", k, n)
		}
	}
	if len(seen) != len(recs) {
		t.Errorf("%d distinct exchanges for %d requests", len(seen), len(recs))
	}
}

// A tracer started in the middle of an exchange sees the client's socket
// first when the response arrives and the server's when it writes the
// response. The ports decide the roles there (the client has the ephemeral
// one), so the client stays the requester and the server the responder,
// and the peer's think time lands in app.peer from the next exchange on.
func TestAdoptedMidExchange(t *testing.T) {
	s := newLab(t, symmetric(5*time.Millisecond))
	// The server holds its answer to request 1 until the tracer is
	// attached, however long that takes: the test needs the tracer to start
	// between the request and its answer.
	held, attached := make(chan struct{}), make(chan struct{})
	s.server(workload.ServerConfig{Hold: func(id uint64) {
		if id == 1 {
			close(held)
			<-attached
		}
	}})
	release := sync.OnceFunc(func() { close(attached) })
	t.Cleanup(release) // before the server's cleanup, which waits for it
	conn := s.dial()
	defer conn.Close()
	const think = 100 * time.Millisecond
	send := func(id uint64, think time.Duration) {
		req := make([]byte, 100)
		workload.Header{Kind: workload.KindRequest, ID: id, ReqLen: 100, RespLen: 1000, ThinkMicros: uint32(think / time.Microsecond)}.Put(req)
		if _, err := conn.Write(req); err != nil {
			t.Fatal(err)
		}
	}
	// recv returns the server's own time for the request (the response
	// header's aux).
	recv := func() time.Duration {
		resp := make([]byte, 1000)
		if _, err := io.ReadFull(conn, resp); err != nil {
			t.Fatal(err)
		}
		h, err := workload.ParseHeader(resp)
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(h.Aux)
	}
	// Request 1 is read by the server and acknowledged to the client when
	// the tracer starts: neither socket has anything left to show of it
	// but the answer.
	send(1, 0)
	<-held
	waitAcked(t, conn)
	s.startTracer(tracer.Options{})
	release()
	recv()
	// Each later exchange, as the client timed it and as the server did.
	var appRTT, own []time.Duration
	for id := uint64(2); id <= 6; id++ {
		start := time.Now()
		send(id, think)
		own = append(own, recv())
		appRTT = append(appRTT, time.Since(start))
	}
	local := conn.LocalAddr().String()
	conn.Close()
	s.settle([]workload.ClientRecord{{Local: local}})
	s.col.Mu.Lock()
	defer s.col.Mu.Unlock()
	var client, server []*record.Exchange
	for _, e := range s.col.Exchanges {
		switch {
		case e.Flow.Local.String() == local:
			client = append(client, e)
		case e.Flow.Remote.String() == local:
			server = append(server, e)
		}
	}
	// Exchange 1 (partial: its request came before the tracer) and 2..6.
	for name, side := range map[string][]*record.Exchange{"client": client, "server": server} {
		want := record.Requester
		if name == "server" {
			want = record.Responder
		}
		if len(side) != 6 {
			t.Errorf("%s: %d exchanges, want 6", name, len(side))
			for _, e := range side {
				t.Logf("%s %+v %+v out %d in %d partial %v", e.Role, e.Timeline, e.Components, e.BytesOut, e.BytesIn, e.Partial)
			}
		}
		for i, e := range side {
			if e.Role != want || e.Partial != (i == 0) {
				t.Errorf("%s exchange %d: role %s partial %v, want %s", name, i, e.Role, e.Partial, want)
			}
		}
	}
	if len(client) != 6 {
		t.FailNow()
	}
	// The server thinks at least think; the rest of what the client waited
	// is the path's round trip at least, which is not the peer's.
	for i, e := range client[1:] {
		t.Logf("client exchange %d: peer %v, the server's own %v, the client's %v", i+1, e.Components.Peer, own[i], appRTT[i])
		if most := appRTT[i] - 2*5*time.Millisecond; e.Components.Peer < think || e.Components.Peer > most {
			t.Errorf("client exchange %d: peer %v, want the server's think time: at least %v, at most %v (the client waited %v, the server says it took %v)",
				i+1, e.Components.Peer, think, most, appRTT[i], own[i])
		}
	}
}

// waitAcked waits until everything written on conn is acknowledged.
func waitAcked(t *testing.T, conn net.Conn) {
	t.Helper()
	raw, err := conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		var info *unix.TCPInfo
		if err := raw.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
			t.Fatal(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		if info.Unacked == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d segments still unacknowledged after 10 s", info.Unacked)
		}
	}
}
