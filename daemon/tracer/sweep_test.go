package tracer

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
	"golang.org/x/sys/unix"
)

// TestIdleWrite: a connection makes three round trips and then stays open
// and quiet. Every exchange, the last one too, is written within about a
// second of its last byte (on the requester, the app's read of the reply;
// on the responder, the answer's ACK), with the connection still open,
// and its close writes nothing more: no exchange twice, none lost. With
// the iterator over the socket storage, and with the TCP iterator opened
// in each network namespace where the kernel refuses that one (here, a
// namespace of the test's own).
func TestIdleWrite(t *testing.T) {
	for _, each := range []bool{false, true} {
		name := "socket storage"
		if each {
			name = "each namespace"
		}
		t.Run(name, func(t *testing.T) {
			col := &collector{}
			opts := Options{DrainInterval: 20 * time.Millisecond, sweepEachNetns: each}
			tr, _ := openTracerWith(t, opts, col)
			in := func(fn func()) { fn() }
			if each {
				if tr.sweepNetns == nil {
					t.Fatalf("the TCP iterator does not stand in for the sweep: %+v", tr.Hooks())
				}
				in = testNetns(t)
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
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
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
		}()
		<-done
	}
}
