package scenarios

import (
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/workload"
)

func symmetric(oneWay time.Duration) netlab.Config {
	l := netlab.Link{Delay: oneWay}
	return netlab.Config{AtoB: l, BtoA: l}
}

// Scenario 1: pure path delay, immediate server: network is the path's
// RTT, the peer's part is nothing, and the parts add up to the app's RTT.
// Scenario 2: the same path with 30 ms of server think time: app.peer
// takes it, network stays the path.
func TestPathDelayAndThinkTime(t *testing.T) {
	for _, c := range []struct {
		name  string
		think time.Duration
	}{
		{"immediate", 0},
		{"think30ms", 30 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScenario(t, symmetric(10*time.Millisecond), tracer.Options{})
			s.server(workload.ServerConfig{})
			recs := s.client(workload.ClientConfig{ReqSize: 100, RespSize: 1000, Think: c.think,
				Count: 40, Interval: 50 * time.Millisecond})
			s.settle(recs)
			pairs := s.match(recs)
			checkSums(t, pairs)
			med := componentMedians(pairs, true)
			t.Logf("medians: %v", med)
			const rtt = 20 * time.Millisecond
			if !near(med["network"], rtt) {
				t.Errorf("network %v, want %v +- %v", med["network"], rtt, tolerance(rtt))
			}
			// The truth for app.peer is what the server measured of itself:
			// last request byte read to response write started (the think
			// time as it really slept, plus its own processing).
			for _, p := range pairs {
				server := time.Duration(p.app.ServerNs)
				if server < c.think {
					t.Fatalf("exchange %d: server reports %v for a %v think time", p.app.ID, server, c.think)
				}
				if !p.ex.First && (!near(p.ex.Components.Network, rtt) || !near(p.ex.Components.Peer, server)) {
					t.Errorf("exchange %d: network %v peer %v, want %v and %v", p.app.ID, p.ex.Components.Network, p.ex.Components.Peer, rtt, server)
				}
			}
		})
	}
}
