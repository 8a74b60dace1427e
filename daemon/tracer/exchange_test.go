package tracer

import (
	"cmp"
	"context"
	"io"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
	"golang.org/x/sys/unix"
)

// TestExchangesLoopback checks exchange cutting on loopback: N round trips
// with a server that thinks give N exchanges on each side, the responder
// sees as its own think time what the server measured between its read's
// return and its write, the requester as app.peer the responder's whole
// exchange (on loopback the network is nothing), and every exchange's
// components sum to its duration. The server's own clock is the truth: on
// a busy machine its sleep of 3 ms lasts longer.
func TestExchangesLoopback(t *testing.T) {
	_, col := openTracer(t)
	const n, think = 20, 3 * time.Millisecond
	addr, thought := timedReplyServer(t, 100, 2000, think)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if _, err := c.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 2000)); err != nil {
			t.Fatal(err)
		}
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	c.Close()
	col.find(t, local) // the close record comes after the last exchange

	count := map[record.ExchangeRole]int{}
	var responders, requesters []*record.Exchange
	for _, e := range col.connExchanges(local) {
		count[e.Role]++
		c := e.Components
		if c.Sum() != e.Duration || e.Duration <= 0 {
			t.Errorf("%s: components sum to %v, duration %v", e.Role, c.Sum(), e.Duration)
		}
		wantOut, wantIn := uint64(100), uint64(2000)
		if e.Role == record.Responder {
			wantOut, wantIn = wantIn, wantOut
			responders = append(responders, e)
		} else {
			requesters = append(requesters, e)
		}
		if e.BytesOut != wantOut || e.BytesIn != wantIn {
			t.Errorf("%s: bytes out %d in %d, want %d and %d", e.Role, e.BytesOut, e.BytesIn, wantOut, wantIn)
		}
		// A small write leaves inside the sendmsg: x1 is read at w1, and
		// the three callbacks of a TX timestamp are not worth it.
		if e.TxTimestamps {
			t.Errorf("%s: a %d-byte message that left at once was TX timestamped", e.Role, e.BytesOut)
		}
		// On loopback the peer takes the data, and may ACK it, inside
		// the sendmsg: x1 and a1 may come before w1, never before w0.
		if e.Timeline.X1 < e.Timeline.W0 || e.Timeline.A1 != 0 && e.Timeline.A1 < e.Timeline.X1 {
			t.Errorf("%s: w0 %d x1 %d a1 %d out of order", e.Role, e.Timeline.W0, e.Timeline.X1, e.Timeline.A1)
		}
	}
	if count[record.Requester] != n || count[record.Responder] != n {
		t.Fatalf("exchanges by role %v, want %d each", count, n)
	}
	sortByStart(responders)
	sortByStart(requesters)
	for i, th := range thought() {
		req, resp := requesters[i], responders[i]
		// The kernel's points and the server's clock are read a system
		// call apart.
		if d := resp.Components.Think - th; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("round %d: responder think %v, the server thought %v", i, resp.Components.Think, th)
		}
		if d := req.Components.Peer - resp.Duration; d < -time.Millisecond || d > time.Millisecond {
			t.Errorf("round %d: requester peer %v, the responder's exchange lasted %v", i, req.Components.Peer, resp.Duration)
		}
	}
}

// sortByStart orders exchanges by their start.
func sortByStart(es []*record.Exchange) {
	slices.SortFunc(es, func(a, b *record.Exchange) int { return cmp.Compare(a.Start, b.Start) })
}

// timedReplyServer is replyServer measuring its own think of each round:
// from its read's return to its write's start, as the model's think is.
// thought returns what it measured once the connection is done.
func timedReplyServer(tb testing.TB, req, resp int, think time.Duration) (addr string, thought func() []time.Duration) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	done := make(chan []time.Duration, 1)
	go func() {
		var out []time.Duration
		defer func() { done <- out }()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		in, reply := make([]byte, req), make([]byte, resp)
		for {
			if _, err := io.ReadFull(c, in); err != nil {
				return
			}
			read := time.Now()
			time.Sleep(think)
			out = append(out, time.Since(read))
			if _, err := c.Write(reply); err != nil {
				return
			}
		}
	}()
	return ln.Addr().String(), func() []time.Duration { return <-done }
}

// TestTxTimestampsWhenHeldBack: a message the receive window holds back
// waits in the send queue, so its last byte's transmission is taken from
// a BPF TX timestamp, long after the write returned.
func TestTxTimestampsWhenHeldBack(t *testing.T) {
	_, col := openTracer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const size = 1 << 20
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// A reader that drains a small buffer slowly: the sender waits
		// for the window.
		buf := make([]byte, 16<<10)
		for got := 0; got < size; {
			time.Sleep(2 * time.Millisecond)
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			got += n
		}
		c.Write([]byte("ok"))
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).SetWriteBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := c.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	c.Close()
	col.find(t, local)
	t.Logf("1 MiB to a slow reader took %v", time.Since(start))

	col.mu.Lock()
	defer col.mu.Unlock()
	for _, e := range col.exchanges {
		if e.Flow.Local != local || e.Role != record.Requester {
			continue
		}
		if !e.TxTimestamps {
			t.Errorf("a 1 MiB message held back by the window has no TX timestamp: w1 %d x1 %d", e.Timeline.W1, e.Timeline.X1)
		}
		if e.Timeline.X1 <= e.Timeline.W1 {
			t.Errorf("x1 %d not after w1 %d: the message did wait in the send queue", e.Timeline.X1, e.Timeline.W1)
		}
		return
	}
	t.Fatal("no requester exchange for the 1 MiB message")
}

// TestRequestResponseSkipsTxTimestamping: on a socket TCP does not pace,
// TX timestamping is switched on only once one of its writes waited in
// the send queue. With it on, every sendmsg runs the sockops program once
// more (the SENDMSG callback). Request/response writes leave at once, so
// on their sockets the program runs only for the RTT sample of the ACK
// riding on each reply: about two runs per round trip for both ends, not
// four. A paced socket (BBR) has it from its start, and still no write of
// one skb is timestamped.
func TestRequestResponseSkipsTxTimestamping(t *testing.T) {
	enableRunStats(t)
	tr, col := openTracer(t)
	if tr.Programs()["lattrace_sockops"] == nil {
		t.Fatal("the sockops program is not attached")
	}
	runs := func() uint64 { return runStats(t, tr)["lattrace_sockops"].count }
	const n = 500
	before := runs()
	local := pingPongCC(t, "bbr", n, 100, 100, 0)
	col.find(t, local)
	perRT := float64(runs()-before) / n
	t.Logf("bbr: sockops runs per round trip: %.2f", perRT)
	if perRT < 3.5 {
		t.Errorf("bbr: sockops ran %.2f times per round trip: a paced socket did not get TX timestamping at establishment", perRT)
	}
	exs := col.connExchanges(local)
	if len(exs) < 2*n {
		t.Fatalf("bbr: %d exchanges for %d round trips at both ends", len(exs), n)
	}
	for _, e := range exs {
		if e.TxTimestamps {
			t.Fatalf("bbr: %s exchange of 100 bytes each way was TX timestamped", e.Role)
		}
	}
	before = runs()
	local = pingPongCC(t, "cubic", n, 100, 100, 0)
	col.find(t, local)
	perRT = float64(runs()-before) / n
	t.Logf("cubic: sockops runs per round trip: %.2f", perRT)
	if perRT > 3 {
		t.Errorf("cubic: sockops ran %.2f times per round trip: the request/response sockets got TX timestamping", perRT)
	}
	for _, e := range col.connExchanges(local) {
		if e.TxTimestamps {
			t.Fatalf("%s exchange of 100 bytes each way was TX timestamped", e.Role)
		}
	}
}

// replyServer listens on loopback and answers each req-byte message of its
// first connection with resp bytes after think, until the client closes.
// It returns the address to dial.
func replyServer(tb testing.TB, req, resp int, think time.Duration) string {
	tb.Helper()
	return replyServerCC(tb, "", req, resp, think)
}

// congestion sets the congestion control of a socket before connect or
// listen (accepted sockets inherit the listener's); "" leaves the
// namespace's default.
func congestion(cc string) func(network, address string, c syscall.RawConn) error {
	if cc == "" {
		return nil
	}
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, cc)
		}); err != nil {
			return err
		}
		return serr
	}
}

// replyServerCC is replyServer with the congestion control cc.
func replyServerCC(tb testing.TB, cc string, req, resp int, think time.Duration) string {
	tb.Helper()
	lc := net.ListenConfig{Control: congestion(cc)}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		in, out := make([]byte, req), make([]byte, resp)
		for {
			if _, err := io.ReadFull(c, in); err != nil {
				return
			}
			time.Sleep(think)
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	}()
	return ln.Addr().String()
}

// pingPong makes n round trips on a new loopback connection: req bytes from
// the client, then after think resp bytes back. It returns the client's
// address once the client has closed.
func pingPong(t *testing.T, n, req, resp int, think time.Duration) netip.AddrPort {
	t.Helper()
	return pingPongCC(t, "", n, req, resp, think)
}

// pingPongCC is pingPong with the congestion control cc at both ends.
func pingPongCC(t *testing.T, cc string, n, req, resp int, think time.Duration) netip.AddrPort {
	t.Helper()
	d := net.Dialer{Control: congestion(cc)}
	c, err := d.Dial("tcp", replyServerCC(t, cc, req, resp, think))
	if err != nil {
		t.Fatal(err)
	}
	out, in := make([]byte, req), make([]byte, resp)
	for range n {
		if _, err := c.Write(out); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, in); err != nil {
			t.Fatal(err)
		}
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	c.Close()
	return local
}

// TestMessagePastFourGiB: sequence numbers wrap at 4 GiB; a message longer
// than that keeps its exact size at both ends.
func TestMessagePastFourGiB(t *testing.T) {
	_, col := openTracer(t)
	const size = 4<<30 + 512<<20 + 12345
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		served <- func() error {
			c, err := ln.Accept()
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := io.CopyN(io.Discard, c, size); err != nil {
				return err
			}
			_, err = c.Write([]byte("ok"))
			return err
		}()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for left := int64(size); left > 0; {
		n := min(left, int64(len(buf)))
		if _, err := c.Write(buf[:n]); err != nil {
			t.Fatal(err)
		}
		left -= n
	}
	if _, err := io.ReadFull(c, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	c.Close()
	col.find(t, local)
	exs := col.connExchanges(local)
	if len(exs) != 2 {
		t.Fatalf("%d exchanges for the message and its answer at both ends, want 2", len(exs))
	}
	for _, e := range exs {
		out, in := e.BytesOut, e.BytesIn
		if e.Role == record.Responder {
			out, in = in, out
		}
		if out != size || in != 2 {
			t.Errorf("%s: %d bytes out and %d in, want %d and 2", e.Role, e.BytesOut, e.BytesIn, size)
		}
	}
}
