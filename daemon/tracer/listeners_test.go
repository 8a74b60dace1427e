package tracer

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/record"
)

// TestAdoptedRoles: a connection open before the tracer, its server's
// port above its client's (gRPC's 50051 against an ephemeral port), has
// its ends' roles from the listening socket: the client requests, the
// server responds, as on a connection seen from its handshake, every
// exchange after the first (partial) a latency sample. Without the
// listener table the roles are the ports' guess (here inverted), said on
// every exchange, and none is a latency sample. The same through the TCP
// iterators, where the kernel refuses those over the socket storage.
func TestAdoptedRoles(t *testing.T) {
	for _, v := range []struct{ seeded, tcpIters bool }{{true, false}, {true, true}, {false, false}} {
		seeded, tcpIters := v.seeded, v.tcpIters
		t.Run(fmt.Sprintf("listeners read %v, TCP iterators only %v", seeded, tcpIters), func(t *testing.T) {
			const before, after, req, resp = 3, 8, 100, 1000
			server := netip.MustParseAddrPort(replyServer(t, req, resp, 2*time.Millisecond))
			c := dialFromBelow(t, server)
			// A pause between calls: a request that follows the answer
			// sooner than half the path's round trip is multiplexed on
			// the responder (latency.responder), and an emulated CPU's
			// loopback round trip is long.
			roundTrips := func(n int) {
				for range n {
					time.Sleep(5 * time.Millisecond)
					if _, err := c.Write(make([]byte, req)); err != nil {
						t.Fatal(err)
					}
					if _, err := io.ReadFull(c, make([]byte, resp)); err != nil {
						t.Fatal(err)
					}
				}
			}
			roundTrips(before)
			col := &collector{}
			tr, _ := openTracerWith(t, Options{DrainInterval: 20 * time.Millisecond, noListeners: !seeded, noStorageIters: tcpIters}, col)
			roundTrips(after)
			local := c.LocalAddr().(*net.TCPAddr).AddrPort()
			c.Close()
			col.find(t, local)

			byEnd := map[netip.AddrPort][]*record.Exchange{}
			for _, e := range col.connExchanges(local) {
				byEnd[e.Flow.Local] = append(byEnd[e.Flow.Local], e)
			}
			for _, end := range []struct {
				addr      netip.AddrPort
				conn      record.Role
				role      record.ExchangeRole
				guessRole record.ExchangeRole
			}{
				{local, record.RoleClient, record.Requester, record.Responder},
				{server, record.RoleServer, record.Responder, record.Requester},
			} {
				es := byEnd[end.addr]
				// The first after the tracer started is partial; the
				// close may leave one more, unanswered or not.
				if len(es) < after {
					t.Errorf("%s end: %d exchanges, want %d or more", end.conn, len(es), after)
					continue
				}
				for i, e := range es {
					switch {
					case seeded && (e.ConnRole != end.conn || e.Role != end.role || e.RoleSource != record.RoleFromListener):
						t.Errorf("%s end, exchange %d: conn role %s, role %s, role source %q; want %s, %s, listener", end.conn, i, e.ConnRole, e.Role, e.RoleSource, end.conn, end.role)
					case !seeded && (e.ConnRole != record.RoleUnknown || e.Role != end.guessRole || e.RoleSource != record.RoleGuessed):
						t.Errorf("%s end, exchange %d: conn role %s, role %s, role source %q; want unknown, %s, guessed", end.conn, i, e.ConnRole, e.Role, e.RoleSource, end.guessRole)
					}
					if e.Partial != (i == 0) {
						t.Errorf("%s end, exchange %d: partial %v", end.conn, i, e.Partial)
					}
					if e.Partial || e.Unanswered {
						continue
					}
					if seeded && (!e.Timed() || e.BytesOut+e.BytesIn != req+resp) {
						t.Errorf("%s end, exchange %d: timed %v (rejected %q, multiplexed %v), bytes %d out %d in", end.conn, i, e.Timed(), e.Rejected, e.Multiplexed, e.BytesOut, e.BytesIn)
					}
					if !seeded && e.Rejected != record.RejectedRoleGuessed {
						t.Errorf("%s end, exchange %d: rejected %q, want %q", end.conn, i, e.Rejected, record.RejectedRoleGuessed)
					}
				}
			}
			cn, err := tr.Counters()
			if err != nil {
				t.Fatal(err)
			}
			if seeded && (cn.AdoptedServer == 0 || cn.AdoptedClient == 0) || !seeded && cn.AdoptedGuessed < 2 {
				t.Errorf("counters: adopted server %d, client %d, guessed %d", cn.AdoptedServer, cn.AdoptedClient, cn.AdoptedGuessed)
			}
		})
	}
}

// dialFromBelow connects to server from a local port below its own and
// below the ephemeral range, so that the ports' order says the opposite
// of the truth.
func dialFromBelow(t *testing.T, server netip.AddrPort) *net.TCPConn {
	t.Helper()
	for port := 20000 + int(time.Now().UnixNano()%5000); port < 32000; port++ {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port}}
		c, err := d.Dial("tcp", server.String())
		if err == nil {
			return c.(*net.TCPConn)
		}
		if !isAddrInUse(err) {
			t.Fatal(err)
		}
	}
	t.Fatal("no free local port below 32000")
	return nil
}

func isAddrInUse(err error) bool {
	var errno syscall.Errno
	for e := err; e != nil; {
		if x, ok := e.(syscall.Errno); ok {
			errno = x
			break
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			break
		}
		e = u.Unwrap()
	}
	return errno == syscall.EADDRINUSE
}

// TestListenersPruned: the table of listeners counts a listener opened
// after the start (the state tracepoint) and uncounts it at its close;
// the entry left at zero goes once its network namespace is gone, and
// one of a namespace that lives on stays.
func TestListenersPruned(t *testing.T) {
	// No sweeps, whose prune would run beside the test's own.
	tr, _ := openTracerWith(t, Options{DrainInterval: 20 * time.Millisecond, IdleWrite: -1}, &collector{})
	listeners := tr.maps.Maps["listeners"]
	count := func(k listenerKey) (uint32, bool) {
		var n uint32
		err := listeners.Lookup(k, &n)
		return n, err == nil
	}
	in := testNetns(t)
	var gone listenerKey
	in(func() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Error(err)
			return
		}
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			t.Error(err)
		}
		gone = listenerKey{Netns: uint32(st.Ino), Port: uint32(ln.Addr().(*net.TCPAddr).Port)}
		if n, ok := count(gone); !ok || n != 1 {
			t.Errorf("a listener opened after the start: count %d (present %v), want 1", n, ok)
		}
		ln.Close()
	})
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var self unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		t.Fatal(err)
	}
	stays := listenerKey{Netns: uint32(self.Ino), Port: uint32(host.Addr().(*net.TCPAddr).Port)}
	host.Close()
	for _, k := range []listenerKey{gone, stays} {
		if n, ok := count(k); !ok || n != 0 {
			t.Errorf("listener %+v closed: count %d (present %v), want 0", k, n, ok)
		}
	}
	if out, err := exec.Command("ip", "netns", "del", fmt.Sprintf("lt-sweep-%d", os.Getpid())).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	tr.lastPrune = time.Time{}
	tr.pruneListeners()
	if _, ok := count(gone); ok {
		t.Errorf("the entry of a namespace that is gone stays")
	}
	if _, ok := count(stays); !ok {
		t.Errorf("the entry of this namespace went")
	}
}
