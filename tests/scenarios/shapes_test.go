package scenarios

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

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
			const think = 10 * time.Millisecond
			s := newScenario(t, symmetric(10*time.Millisecond), tracer.Options{})
			s.server(workload.ServerConfig{})
			dst := s.lab.B.IPv4
			if family == "ipv6" {
				dst = s.lab.B.IPv6
			}
			recs := s.client(workload.ClientConfig{Addr: netip.AddrPortFrom(dst, port).String(),
				ReqSize: 500, RespSize: 4000, Think: think, Count: 30, Interval: 40 * time.Millisecond})
			s.settle(recs)
			pairs := s.match(recs)
			checkSums(t, pairs)
			med := componentMedians(pairs, true)
			t.Logf("requester medians: %v", med)
			var peerErr []time.Duration
			for _, p := range pairs[1:] {
				peerErr = append(peerErr, p.ex.Components.Peer-time.Duration(p.app.ServerNs))
			}
			if !near(med["network"], 20*time.Millisecond) || median(peerErr).Abs() > 300*time.Microsecond {
				t.Errorf("requester: network %v, app.peer off the server's own time by %v", med["network"], median(peerErr))
			}
			for _, p := range pairs {
				if p.ex.Flow.IPv6() != (family == "ipv6") {
					t.Fatalf("exchange %d traced as %v", p.app.ID, p.ex.Flow)
				}
			}
			// B's records: each responder exchange's think time is the
			// server's own last-request-byte-read to response-write-start.
			server := map[int]time.Duration{}
			for _, p := range pairs {
				server[len(server)] = time.Duration(p.app.ServerNs)
			}
			resp := s.responders()
			if len(resp) != len(recs) {
				t.Fatalf("%d responder exchanges in B for %d requests", len(resp), len(recs))
			}
			var errs []time.Duration
			for i, e := range resp {
				if e.Flow.IPv6() != (family == "ipv6") || e.Role != record.Responder || e.ConnRole != record.RoleServer {
					t.Errorf("responder exchange %d: %v role %s conn %s", i, e.Flow, e.Role, e.ConnRole)
				}
				if e.Components.Sum() != e.Duration || e.BytesIn != 500 || e.BytesOut != 4000 {
					t.Errorf("responder exchange %d: sum %v duration %v bytes in %d out %d", i, e.Components.Sum(), e.Duration, e.BytesIn, e.BytesOut)
				}
				errs = append(errs, e.Components.Think-server[i])
			}
			var own, thinks []time.Duration
			for i, e := range resp {
				own, thinks = append(own, server[i]), append(thinks, e.Components.Think)
			}
			accuracy(t, "responder think (median)", "ms", msf(median(own)), "the server's own think time", msf(median(thinks)))
			if m := median(errs); m.Abs() > 300*time.Microsecond {
				t.Errorf("responder think time off the server's own measure by %v (median)", m)
			}
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
// timestamps: x1 and a1 are reconstructed), and the first exchange seen is
// marked partial.
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
		if e.TxTimestamps || e.ConnRole != record.RoleUnknown || e.Partial != (i == 0) {
			t.Errorf("exchange %d: tx timestamps %v, conn role %s, partial %v", i, e.TxTimestamps, e.ConnRole, e.Partial)
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
	s.server(workload.ServerConfig{})
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
	recv := func() {
		if _, err := io.ReadFull(conn, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	// The server is thinking about request 1 when the tracer starts (it
	// takes a few hundred ms to load).
	start := time.Now()
	send(1, 2*time.Second)
	s.startTracer(tracer.Options{})
	if time.Since(start) > 1500*time.Millisecond {
		t.Fatalf("the tracer took %v to start: the test needs it attached before the response", time.Since(start))
	}
	recv()
	for id := uint64(2); id <= 6; id++ {
		send(id, think)
		recv()
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
	for i, e := range client[1:] {
		if e.Components.Peer < think || e.Components.Peer > think+20*time.Millisecond {
			t.Errorf("client exchange %d: peer %v, want the server's %v think time", i+1, e.Components.Peer, think)
		}
	}
}
