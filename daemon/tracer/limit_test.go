package tracer

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

// TestLimitSockets: a budget of new sockets is kept by the programs
// themselves, whatever the daemon does in between: with room for two, of
// three connections (six ends) at most two ends are followed and the rest
// are counted as not followed; with none, no new end is; under a budget
// a socket first seen after its birth is not followed either; without a
// bound, every one is again, and such a socket too.
func TestLimitSockets(t *testing.T) {
	tr, col := openTracer(t)
	unfollowed := func() uint64 {
		c, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		return c.SocketsUnfollowed
	}
	// ends counts the ends of the connections at locals that have
	// exchanges, once the drain has had time to bring them.
	ends := func(locals ...netip.AddrPort) int {
		time.Sleep(300 * time.Millisecond)
		n := 0
		for _, l := range locals {
			seen := map[record.ExchangeRole]bool{}
			for _, e := range col.connExchanges(l) {
				seen[e.Role] = true
			}
			n += len(seen)
		}
		return n
	}

	before := unfollowed()
	if err := tr.LimitSockets(2); err != nil {
		t.Fatal(err)
	}
	budgeted := []netip.AddrPort{pingPong(t, 2, 100, 100, 0), pingPong(t, 2, 100, 100, 0), pingPong(t, 2, 100, 100, 0)}
	// Other sockets on the node may take the budget first: only fewer
	// of ours can be followed, and more counted.
	if got, left := ends(budgeted...), unfollowed()-before; got > 2 || left < 4 {
		t.Errorf("a budget of 2 sockets: %d ends of 3 connections followed (want at most 2), %d counted as not followed (want at least 4)", got, left)
	}

	before = unfollowed()
	if err := tr.LimitSockets(0); err != nil {
		t.Fatal(err)
	}
	if got, left := ends(pingPong(t, 2, 100, 100, 0)), unfollowed()-before; got != 0 || left < 2 {
		t.Errorf("no budget: %d ends followed (want none), %d counted as not followed (want at least 2)", got, left)
	}

	// A connection born while none were followed: under a budget, its
	// exchanges do not get it followed; without a bound they do.
	c, err := net.Dial("tcp", replyServerCC(t, "", 100, 100, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	talk := func() {
		if _, err := c.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.LimitSockets(1000); err != nil {
		t.Fatal(err)
	}
	talk()
	talk()
	if got := ends(local); got != 0 {
		t.Errorf("a budget, a connection born unfollowed: %d ends followed, want none", got)
	}

	if err := tr.LimitSockets(-1); err != nil {
		t.Fatal(err)
	}
	if got := ends(pingPong(t, 2, 100, 100, 0)); got != 2 {
		t.Errorf("unbounded again: %d ends followed, want 2", got)
	}
	for range 3 {
		talk()
	}
	if got := ends(local); got == 0 {
		t.Errorf("unbounded again, a connection born unfollowed: no end followed at its next exchanges")
	}
}
