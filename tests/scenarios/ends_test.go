package scenarios

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/workload"
)

// A server that speaks first, and a closing message: the server greets
// each connection (as MySQL, SMTP or SSH do), answers three requests after
// a known think time, and the client ends with a goodbye the server does
// not answer. The client is the requester on both ends, the greeting falls
// in the client's connection setup, and the goodbye is recorded as
// unanswered, outside the latency samples.
func TestGreetingAndGoodbye(t *testing.T) {
	const (
		think  = 5 * time.Millisecond
		rounds = 3
	)
	s := newScenario(t, symmetric(10*time.Millisecond), tracer.Options{})
	var own []time.Duration // the server's think times, by its own clock
	served := s.serveOnce(func(c net.Conn) error {
		if _, err := c.Write([]byte("220 greetings\r\n")); err != nil {
			return err
		}
		buf := make([]byte, 100)
		for range rounds {
			if _, err := io.ReadFull(c, buf); err != nil {
				return err
			}
			read := time.Now()
			time.Sleep(think)
			own = append(own, time.Since(read))
			if _, err := c.Write(make([]byte, 300)); err != nil {
				return err
			}
		}
		_, err := io.ReadFull(c, make([]byte, 6)) // the goodbye
		return err
	})

	connectStart := time.Now()
	conn := s.dial()
	greeting := make([]byte, 15)
	if _, err := io.ReadFull(conn, greeting); err != nil {
		t.Fatal(err)
	}
	setup := time.Since(connectStart)
	for range rounds {
		if _, err := conn.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, make([]byte, 300)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Write([]byte("QUIT\r\n")); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatalf("server: %v", err)
	}
	local := conn.LocalAddr().String()
	conn.Close()
	s.settle([]workload.ClientRecord{{Local: local}})

	client := s.col.Of(s.netnsA, func(e *record.Exchange) bool { return e.Flow.Local.String() == local })
	server := s.col.Of(s.netnsB, func(e *record.Exchange) bool { return e.Flow.Remote.String() == local })
	for name, side := range map[string][]*record.Exchange{"client": client, "server": server} {
		want := record.Requester
		if name == "server" {
			want = record.Responder
		}
		if len(side) != rounds+1 {
			t.Fatalf("%s: %d exchanges for %d requests and a goodbye", name, len(side), rounds)
		}
		agg := aggregate.New(aggregate.Config{})
		for i, e := range side {
			if e.Role != want {
				t.Errorf("%s exchange %d: role %s, want %s (the greeting must not make the server the requester)", name, i, e.Role, want)
			}
			if e.Greeting != (i == 0) || e.Unanswered != (i == rounds) {
				t.Errorf("%s exchange %d: greeting %v unanswered %v", name, i, e.Greeting, e.Unanswered)
			}
			if e.Components.Sum() != e.Duration {
				t.Errorf("%s exchange %d: sum %v duration %v", name, i, e.Components.Sum(), e.Duration)
			}
			if i < rounds && (e.BytesOut+e.BytesIn != 400) {
				t.Errorf("%s exchange %d: %d bytes out, %d in: the greeting is not part of an exchange", name, i, e.BytesOut, e.BytesIn)
			}
			agg.AddExchange(e)
		}
		if m := agg.Flows()[0].Metrics; m.Unanswered != 1 || m.Duration.Count != rounds {
			t.Errorf("%s: %d unanswered, %d latency samples; want 1 and %d", name, m.Unanswered, m.Duration.Count, rounds)
		}
	}
	// The client's first exchange starts at connect: the greeting's round
	// trip is connection setup, as the client's own clock saw it.
	first := client[0]
	t.Logf("client setup: own %v, lattrace handshake %v; first exchange %v", setup, first.Components.Handshake, first.Duration)
	if d := first.Components.Handshake - setup; d.Abs() > tolerance(setup) {
		t.Errorf("handshake %v, but the client took %v from connect to the greeting read", first.Components.Handshake, setup)
	}
	for i, e := range server[:rounds] {
		if d := e.Components.Think - own[i]; d.Abs() > time.Millisecond {
			t.Errorf("server think %v, the server's own %v", e.Components.Think, own[i])
		}
	}
}

// A server that pushes: after answering the second request it sends a
// message of its own 600 ms later (past the wait for a lost last segment
// of the answer, which a push must not be taken for) (server push, NOTIFY, pub/sub). The push
// is a record of its own at both ends, no latency sample, and the answers
// around it keep their own times: the silence is in no component.
func TestPush(t *testing.T) {
	const (
		think = 5 * time.Millisecond
		quiet = 600 * time.Millisecond
	)
	s := newScenario(t, symmetric(10*time.Millisecond), tracer.Options{})
	served := s.serveOnce(func(c net.Conn) error {
		for i := range 3 {
			if _, err := io.ReadFull(c, make([]byte, 100)); err != nil {
				return err
			}
			time.Sleep(think)
			if _, err := c.Write(make([]byte, 300)); err != nil {
				return err
			}
			if i == 1 {
				time.Sleep(quiet)
				if _, err := c.Write(make([]byte, 200)); err != nil {
					return err
				}
			}
		}
		_, err := io.ReadFull(c, make([]byte, 1))
		return err
	})
	conn := s.dial()
	for i := range 3 {
		if _, err := conn.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, make([]byte, 300)); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			if _, err := io.ReadFull(conn, make([]byte, 200)); err != nil {
				t.Fatal(err)
			}
		}
	}
	local := conn.LocalAddr().String()
	conn.Close()
	<-served
	s.settle([]workload.ClientRecord{{Local: local}})

	client := s.col.Of(s.netnsA, func(e *record.Exchange) bool { return e.Flow.Local.String() == local })
	server := s.col.Of(s.netnsB, func(e *record.Exchange) bool { return e.Flow.Remote.String() == local })
	for name, side := range map[string][]*record.Exchange{"client": client, "server": server} {
		var pushes, answered int
		for i, e := range side {
			t.Logf("%s %d: %s push %v unanswered %v out %d in %d duration %v %+v", name, i, e.Role, e.Push, e.Unanswered, e.BytesOut, e.BytesIn, e.Duration, e.Components)
			switch {
			case e.Push:
				pushes++
				if got := e.BytesIn + e.BytesOut; got != 200 {
					t.Errorf("%s: the push holds %d bytes, want 200", name, got)
				}
			case e.Timed():
				answered++
				if e.BytesOut+e.BytesIn != 400 || e.Duration > quiet/2 {
					t.Errorf("%s exchange %d: %d bytes out, %d in, %v: the push is not part of it", name, i, e.BytesOut, e.BytesIn, e.Duration)
				}
			}
		}
		if pushes != 1 || answered != 3 {
			t.Errorf("%s: %d pushes and %d answered exchanges, want 1 and 3", name, pushes, answered)
		}
	}
}

// serveOnce accepts one connection on B's port and runs handle on it; the
// channel gets handle's error.
func (s *scenario) serveOnce(handle func(net.Conn) error) <-chan error {
	s.t.Helper()
	var ln net.Listener
	if err := s.lab.B.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(s.lab.B.IPv4, port).String())
		return err
	}); err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { ln.Close() })
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		served <- handle(c)
	}()
	return served
}
