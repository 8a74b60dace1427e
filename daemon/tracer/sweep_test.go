package tracer

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/pipeline"
	"github.com/lattrace/lattrace/record"
	"golang.org/x/sys/unix"
)

// TestIdleWrite: a connection makes three round trips and then stays open
// and quiet. Every exchange, the last one too, is written within about a
// second of its last byte (on the requester, the app's read of the reply;
// on the responder, the answer's ACK), with the connection still open,
// and its close writes nothing more: no exchange twice, none lost. With
// the iterator the kernel takes, and with the TCP iterator opened in each
// network namespace, as where the kernel refuses the one over socket
// storage (here, in a namespace of the test's own, which only that
// alternative reaches by entering it).
func TestIdleWrite(t *testing.T) {
	forEachIterator(t, func(t *testing.T, opts Options) {
		col := &collector{}
		opts.DrainInterval = 20 * time.Millisecond
		tr, _ := openTracerWith(t, opts, col)
		checkHooks(t, tr.Hooks())
		in := func(fn func()) { fn() }
		if tr.sweepNetns != nil {
			in = testNetns(t)
		} else if opts.noStorageIters {
			t.Fatalf("the TCP iterator does not stand in for the sweep: %+v", tr.Hooks())
		}
		const rounds = 3
		var (
			c        net.Conn
			lastRead time.Time
		)
		in(func() {
			addr := replyServer(t, 100, 300, 2*time.Millisecond)
			var err error
			if c, err = net.Dial("tcp", addr); err != nil {
				t.Fatal(err)
			}
		})
		defer c.Close()
		for range rounds {
			if _, err := c.Write(make([]byte, 100)); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, make([]byte, 300)); err != nil {
				t.Fatal(err)
			}
			lastRead = time.Now()
		}
		local := c.LocalAddr().(*net.TCPAddr).AddrPort()
		got := waitExchanges(col, local, 2*rounds, time.Now().Add(3*time.Second))
		waited := time.Since(lastRead)
		if got != 2*rounds {
			t.Fatalf("%d exchanges written %v after the last reply was read, want %d (the last one waits for a turn that never comes)", got, waited, 2*rounds)
		}
		last := map[record.ExchangeRole]*record.Exchange{}
		for _, e := range col.connExchanges(local) {
			last[e.Role] = e
		}
		req, resp := last[record.Requester], last[record.Responder]
		if req == nil || resp == nil {
			t.Fatalf("no exchange of each role: %+v", last)
		}
		for _, e := range []*record.Exchange{req, resp} {
			end := e.Timeline.D1
			if e.Role == record.Responder {
				end = max(e.Timeline.X1, e.Timeline.A1)
			}
			after := time.Duration(e.Time - end)
			t.Logf("%s: last exchange written %v after its end; %v", e.Role, after, e.Components)
			if after < DefaultIdleWrite || after > DefaultIdleWrite+700*time.Millisecond {
				t.Errorf("%s: the last exchange was written %v after its end, want %v to about a second", e.Role, after, DefaultIdleWrite)
			}
			if e.Unfinished || e.Unanswered || e.Push || e.Components.Sum() != e.Duration || e.BytesOut+e.BytesIn != 400 {
				t.Errorf("%s: written idle, the exchange is not whole: unfinished %v unanswered %v push %v, %d+%d bytes, sum %v duration %v",
					e.Role, e.Unfinished, e.Unanswered, e.Push, e.BytesOut, e.BytesIn, e.Components.Sum(), e.Duration)
			}
		}
		c.Close()
		col.find(t, local)
		time.Sleep(100 * time.Millisecond)
		if n := len(col.connExchanges(local)); n != 2*rounds {
			t.Errorf("%d exchanges after the close, want %d: the close wrote one again", n, 2*rounds)
		}
		cs, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		if cs.IdleWritten < 2 || cs.NetnsUnswept != 0 {
			t.Errorf("counters: %d written idle (want at least 2), %d namespaces not swept", cs.IdleWritten, cs.NetnsUnswept)
		}
	})
}

// TestUnfinishedAtStop: the daemon stops (without pinning) while a request
// waits for its answer. Both ends' exchanges are written then, flagged
// unfinished, outside the latency samples; nothing is lost silently.
func TestUnfinishedAtStop(t *testing.T) {
	col := &collector{}
	tr, stop := openTracerWith(t, Options{DrainInterval: 20 * time.Millisecond}, col)
	c, err := net.Dial("tcp", replyServer(t, 100, 300, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the server has read it
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	cs, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	stop()
	roles := map[record.ExchangeRole]int{}
	for _, e := range col.connExchanges(local) {
		if !e.Unfinished || e.Timed() || e.Unanswered {
			t.Errorf("%s: unfinished %v timed %v unanswered %v", e.Role, e.Unfinished, e.Timed(), e.Unanswered)
		}
		out, in := e.BytesOut, e.BytesIn
		if e.Role == record.Responder {
			out, in = in, out
		}
		if out != 100 || in != 0 {
			t.Errorf("%s: %d bytes out, %d in", e.Role, e.BytesOut, e.BytesIn)
		}
		roles[e.Role]++
	}
	if roles[record.Requester] != 1 || roles[record.Responder] != 1 {
		t.Errorf("exchanges written at the stop by role: %v, want one each", roles)
	}
	if cs.Unfinished != 0 {
		t.Errorf("%d exchanges unfinished before the stop", cs.Unfinished)
	}
}

// TestStopFloodWritesEveryExchange: more exchanges are in progress at the
// daemon's stop than its ring holds. Every one is written all the same,
// flagged unfinished, in passes of the sweep with a drain between them;
// none is lost, and nothing is counted as unwritten. Through the iterator
// the kernel takes and the TCP iterator that stands in for it.
func TestStopFloodWritesEveryExchange(t *testing.T) {
	forEachIterator(t, func(t *testing.T, opts Options) {
		const conns, req = 600, 100
		opts.RingBufferBytes = 64 << 10
		opts.DrainInterval = 20 * time.Millisecond
		col := &collector{}
		tr, err := Open(opts)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		checkHooks(t, tr.Hooks())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- tr.Run(ctx, pipeline.New(pipeline.Config{}, col)) }()
		if ring := int(opts.RingBufferBytes); 2*conns*ringLen[lattraceLtExchange]() < 2*ring {
			t.Fatalf("%d exchanges fit the %d-byte ring: the test would not flood it", 2*conns, ring)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		// The server reads each request and never answers: both ends'
		// exchanges stay in progress.
		read := make(chan net.Conn, conns)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					if _, err := io.ReadFull(c, make([]byte, req)); err == nil {
						read <- c
					}
				}()
			}
		}()
		locals := map[string]bool{}
		var clients []net.Conn
		for range conns {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
			locals[c.LocalAddr().String()] = true
			if _, err := c.Write(make([]byte, req)); err != nil {
				t.Fatal(err)
			}
		}
		var servers []net.Conn
		for range conns {
			servers = append(servers, <-read)
		}
		defer func() {
			for _, c := range append(clients, servers...) {
				c.Close()
			}
		}()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		written := map[record.ExchangeRole]int{}
		col.mu.Lock()
		server := ln.Addr().String()
		for _, e := range col.exchanges {
			l, r := e.Flow.Local.String(), e.Flow.Remote.String()
			if !(locals[l] && r == server) && !(locals[r] && l == server) {
				continue // another connection, which had one of the ports before
			}
			if !e.Unfinished || e.Timed() {
				t.Errorf("%s exchange of %v written at the stop: unfinished %v, timed %v", e.Role, e.Flow, e.Unfinished, e.Timed())
			}
			written[e.Role]++
		}
		col.mu.Unlock()
		cs, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("written at the stop: %v; %d exchanges flagged unfinished by the kernel, %d unwritten", written, cs.Unfinished, cs.UnwrittenAtStop)
		if written[record.Requester] != conns || written[record.Responder] != conns {
			t.Errorf("exchanges written at the stop by role %v, want %d each: more in progress than the ring holds were lost", written, conns)
		}
		if cs.UnwrittenAtStop != 0 {
			t.Errorf("%d exchanges counted unwritten at the stop", cs.UnwrittenAtStop)
		}
	})
}

// testNetns makes a network namespace for the test, bound in /run/netns
// as `ip netns add` does, and returns a function that runs fn with its
// thread in it: the sockets fn makes belong to the namespace.
func testNetns(t *testing.T) func(fn func()) {
	t.Helper()
	name := fmt.Sprintf("lt-sweep-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	return func(fn func()) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			// Back to its namespace before it is unlocked: a goroutine
			// that ends locked on the main thread does not end the thread,
			// which would stay in the test's namespace, keep it alive and
			// make /proc/self/ns/net name it.
			runtime.LockOSThread()
			orig, err := os.Open("/proc/thread-self/ns/net")
			if err != nil {
				t.Error(err)
				return
			}
			defer orig.Close()
			f, err := os.Open("/run/netns/" + name)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				t.Error(err)
				return
			}
			fn()
			if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
				t.Error(err) // stays locked: the thread ends with the goroutine
				return
			}
			runtime.UnlockOSThread()
		}()
		<-done
	}
}
