package scenarios

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/tests/capture"
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
			oneWay := 10 * time.Millisecond
			if emulated {
				oneWay = 25 * time.Millisecond
			}
			s := newScenario(t, symmetric(oneWay), tracer.Options{})
			s.server(workload.ServerConfig{})
			w := s.captureBoth()
			recs := s.client(workload.ClientConfig{ReqSize: 100, RespSize: 1000, Think: c.think,
				Count: 40, Interval: 50 * time.Millisecond})
			s.settle(recs)
			w.stop()
			pairs := s.match(recs)
			checkSums(t, pairs)
			med := componentMedians(pairs, true)
			t.Logf("medians: %v", med)
			// The injected delay is the path's floor; what the path gave
			// the exchanges is on the wire (below), which an emulated
			// CPU's slow stacks make longer.
			rtt := 2 * oneWay
			if med["network"] < rtt-tolerance(rtt) {
				t.Errorf("network %v, below the injected %v less %v", med["network"], rtt, tolerance(rtt))
			}
			accuracy(t, "network (median)", "ms", msf(rtt), fmt.Sprintf("injected: %v each way", oneWay), msf(med["network"]))
			var server []time.Duration
			for _, p := range pairs {
				server = append(server, time.Duration(p.app.ServerNs))
			}
			accuracy(t, "app.peer (median)", "ms", msf(median(server)), "the server's own think time", msf(med["peer"]))
			// Per exchange, the truth is read off the wire at both ends
			// (tshark on captures of A's and B's interfaces): the lab's
			// relay and B's wake-ups jitter on two shared vCPUs, so the
			// truth of one exchange is not exactly the injected one.
			truth := w.exchanges(netip.MustParseAddrPort(recs[0].Local))
			if len(truth) != len(pairs) {
				t.Fatalf("%d exchanges on the wire, %d traced", len(truth), len(pairs))
			}
			// The path's round trip per exchange on the wire: from the
			// request leaving A to the response reaching A, less B's
			// turnaround between them. With a peer that thinks, every ACK
			// of a request waits for the answer, so the connection's only
			// clean round trip may be its handshake's: lattrace's network
			// is the one or the other, as the wire saw them in this run
			// (they differ where the emulated CPU was slower for one).
			var nets []time.Duration
			for _, x := range truth[1:] {
				nets = append(nets, x.network())
			}
			wireRTT, synRTT := median(nets), w.synRTT(netip.MustParseAddrPort(recs[0].Local))
			if !near(med["network"], wireRTT) && !(c.think > 0 && near(med["network"], synRTT)) {
				t.Errorf("lattrace network median %v vs the wire's %v (handshake %v): more than %v apart", med["network"], wireRTT, synRTT, tolerance(wireRTT))
			}
			// tshark's own ACK RTT on A's interface (the ACKs B sent) is an
			// independent measure of the path and B's turnaround with it,
			// which for an immediate server is short on an idle machine and
			// longer on a busy one: lattrace's network is no longer.
			if c.think == 0 {
				samples, err := capture.ACKRTTs(w.pa, capture.SentBy(s.lab.B.IPv4))
				if err != nil {
					t.Fatal(err)
				}
				tsharkRTT := median(capture.RTTs(samples))
				accuracy(t, "network (median)", "ms", msf(tsharkRTT), "tshark ACK RTT, capture at A", msf(med["network"]))
				t.Logf("tshark median ACK RTT %v over %d samples, lattrace network %v", tsharkRTT, len(samples), med["network"])
				if med["network"] > tsharkRTT+tolerance(tsharkRTT) {
					t.Errorf("lattrace network median %v above tshark's ACK RTT median %v by more than %v", med["network"], tsharkRTT, tolerance(tsharkRTT))
				}
			}
			within := 0
			for i, p := range pairs {
				server := time.Duration(p.app.ServerNs)
				if server < c.think {
					t.Fatalf("exchange %d: server reports %v for a %v think time", p.app.ID, server, c.think)
				}
				x := truth[i]
				if x.peer() < server {
					t.Fatalf("exchange %d: B's turnaround on the wire %v is shorter than the server's own %v: captures misaligned", p.app.ID, x.peer(), server)
				}
				if p.ex.First {
					continue
				}
				// On an emulated CPU the relay's delay varies by
				// milliseconds from one exchange to the next while the
				// path estimate stays at its clean value, so there the
				// exchange's round trip (network + peer, from its own
				// timeline) is what is held to the wire; its split is
				// held by the medians above.
				ok := near(p.ex.Components.Network, x.network()) && near(p.ex.Components.Peer, x.peer())
				if emulated {
					ok = near(p.ex.Components.Network+p.ex.Components.Peer, x.network()+x.peer())
				}
				if ok {
					within++
				} else {
					t.Logf("outlier: exchange %d: network %v peer %v; wire: network %v peer %v (server's own %v); path %v ack %v",
						p.app.ID, p.ex.Components.Network, p.ex.Components.Peer, x.network(), x.peer(), server, p.ex.PathRTT, p.ex.AckRTT)
				}
			}
			// A clean RTT estimate can only come from samples the kernel
			// takes; when the path slows for one exchange and recovers, the
			// estimate for that exchange lags: 90 % must be within tolerance.
			if n := len(pairs) - 1; within < n*9/10 {
				t.Errorf("only %d of %d exchanges within the tolerance (max(5 %%, 300 us); emulated: max(10 %%, 2 ms)) of the wire's truth", within, n)
			}
		})
	}
}
