package tracer

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/record"
)

// TestExchangesLoopback checks exchange cutting on loopback: N round trips
// with a known server think time give N exchanges on each side, the
// requester sees the think time as app.peer, the responder as its own
// think time, and every exchange's components sum to its duration.
func TestExchangesLoopback(t *testing.T) {
	_, col := openTracer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const n, think = 20, 3 * time.Millisecond
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, resp := make([]byte, 100), make([]byte, 2000)
		for i := 0; i < n; i++ {
			if _, err := io.ReadFull(c, req); err != nil {
				return
			}
			time.Sleep(think)
			c.Write(resp)
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	req, resp := make([]byte, 100), make([]byte, 2000)
	for i := 0; i < n; i++ {
		if _, err := c.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			t.Fatal(err)
		}
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	c.Close()
	col.find(t, local) // the close record comes after the last exchange

	col.mu.Lock()
	defer col.mu.Unlock()
	count := map[record.ExchangeRole]int{}
	for _, e := range col.exchanges {
		if e.Flow.Local != local && e.Flow.Remote != local {
			continue
		}
		count[e.Role]++
		c := e.Components
		if c.Sum() != e.Duration || e.Duration <= 0 {
			t.Errorf("%s: components sum to %v, duration %v", e.Role, c.Sum(), e.Duration)
		}
		wantOut, wantIn := uint64(100), uint64(2000)
		if e.Role == record.Responder {
			wantOut, wantIn = wantIn, wantOut
			if c.Think < think || c.Think > think+5*time.Millisecond {
				t.Errorf("responder think %v, want about %v", c.Think, think)
			}
		} else if c.Peer < think || c.Peer > think+5*time.Millisecond {
			t.Errorf("requester peer %v, want about %v", c.Peer, think)
		}
		if e.BytesOut != wantOut || e.BytesIn != wantIn {
			t.Errorf("%s: bytes out %d in %d, want %d and %d", e.Role, e.BytesOut, e.BytesIn, wantOut, wantIn)
		}
		if !e.TxTimestamps {
			t.Errorf("%s: BPF TX timestamps not used on a kernel that has them", e.Role)
		}
	}
	if count[record.Requester] != n || count[record.Responder] != n {
		t.Errorf("exchanges by role %v, want %d each", count, n)
	}
}
