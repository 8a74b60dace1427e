package aggregate

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

func TestGoodputIsBytesOverActiveTime(t *testing.T) {
	a := New(Config{})
	o := owner("curl", 7, 1)
	// Two exchanges of 100 ms and 300 ms with 10 s of idle between them:
	// 4 MB received in 0.4 s of exchange time is 10 MB/s, whatever the
	// idle time.
	e1 := exch("10.0.0.1:40000", "10.0.0.2:443", 1, o, record.RoleClient, at(1), 100*ms)
	e1.BytesIn, e1.BytesOut = 1_000_000, 1_000
	e2 := exch("10.0.0.1:40000", "10.0.0.2:443", 1, o, record.RoleClient, at(11), 300*ms)
	e2.BytesIn, e2.BytesOut = 3_000_000, 3_000
	a.AddExchange(e1)
	a.AddExchange(e2)
	// A second connection to the same service: 1 MB in 100 ms.
	e3 := exch("10.0.0.1:40001", "10.0.0.2:443", 2, o, record.RoleClient, at(12), 100*ms)
	e3.BytesIn, e3.BytesOut = 1_000_000, 1_000
	a.AddExchange(e3)

	f, _ := a.Flow(flowKey(e1))
	if f.Active != 400*ms {
		t.Errorf("active %v", f.Active)
	}
	if f.In.Bytes != 4_000_000 || f.Out.Bytes != 4_000 {
		t.Errorf("bytes in %d out %d", f.In.Bytes, f.Out.Bytes)
	}
	if math.Abs(f.In.Goodput-10e6) > 1 || math.Abs(f.Out.Goodput-10e3) > 1e-3 {
		t.Errorf("goodput in %v out %v", f.In.Goodput, f.Out.Goodput)
	}
	if f.FirstSeen != e1.Start || f.LastSeen != e2.Time {
		t.Errorf("seen %d..%d", f.FirstSeen, f.LastSeen)
	}
	p := a.Peers()[0]
	// The pair: 5 MB over 0.5 s of summed exchange time.
	if p.Active != 500*ms || math.Abs(p.In.Goodput-10e6) > 1 {
		t.Errorf("peer active %v goodput %v", p.Active, p.In.Goodput)
	}

	// A partial exchange (its start predates lattrace) counts its bytes
	// but not its truncated timing.
	e4 := exch("10.0.0.1:40000", "10.0.0.2:443", 1, o, record.RoleClient, at(20), ms)
	e4.BytesIn, e4.Partial = 5_000_000, true
	a.AddExchange(e4)
	f, _ = a.Flow(flowKey(e1))
	if f.Exchanges != 3 || f.Partial != 1 || f.Duration.Count != 2 || f.Active != 400*ms ||
		f.In.Bytes != 9_000_000 || math.Abs(f.In.Goodput-10e6) > 1 || f.LastSeen != e4.Time {
		t.Errorf("with a partial exchange: %+v", f.Metrics)
	}

	// Exchanges that are no latency sample count apart, each in its
	// counter, outside the timing.
	for i, mark := range []func(*record.Exchange){
		func(e *record.Exchange) { e.Unanswered = true },
		func(e *record.Exchange) { e.Multiplexed = true },
		func(e *record.Exchange) { e.Push = true },
	} {
		e := exch("10.0.0.1:40000", "10.0.0.2:443", 1, o, record.RoleClient, at(21+float64(i)), 300*ms)
		mark(e)
		a.AddExchange(e)
	}
	f, _ = a.Flow(flowKey(e1))
	if f.Exchanges != 6 || f.Unanswered != 1 || f.Multiplexed != 1 || f.Pushes != 1 || f.Duration.Count != 2 || f.Active != 400*ms {
		t.Errorf("with unanswered, multiplexed and pushed exchanges: %+v", f.Metrics)
	}

	// No exchange time, no rate (not +Inf, which JSON cannot carry).
	if g := goodput(100, 0); g != 0 {
		t.Errorf("goodput with no active time %v", g)
	}
}

func TestPerExchangeFields(t *testing.T) {
	a := New(Config{})
	o := owner("curl", 7, 1)
	var last *record.Exchange
	var turnsBefore uint32
	for i, c := range []struct {
		turns          uint32
		minRTT, srtt   time.Duration
		cwnd0, cwnd1   uint32
		restart        bool
		retrans, rtos  uint32
		lossRecov      time.Duration
		handshake      time.Duration
		propagationPct int
	}{
		{turns: 2, minRTT: 10 * ms, srtt: 12 * ms, cwnd0: 10, cwnd1: 20, handshake: 30 * ms},
		{turns: 4, minRTT: 9 * ms, srtt: 11 * ms, cwnd0: 20, cwnd1: 40, retrans: 2, rtos: 1, lossRecov: 200 * ms},
		{turns: 8, minRTT: 0, srtt: 15 * ms, cwnd0: 4, cwnd1: 8, restart: true},
	} {
		ex := exch("10.0.0.1:40000", "10.0.0.2:443", 1, o, record.RoleClient, at(float64(i+1)), 400*ms)
		ex.Turns, ex.MinRTT, ex.SRTT = c.turns, c.minRTT, c.srtt
		ex.ExchangeTurns = c.turns - turnsBefore
		turnsBefore = c.turns
		ex.CwndStart, ex.CwndEnd, ex.CwndRestart = c.cwnd0, c.cwnd1, c.restart
		ex.Retransmits, ex.RTOs = c.retrans, c.rtos
		ex.SlowStartAfterIdle = true
		// Move time from peer to the other components, keeping the sum.
		ex.Components.LossRecovery = c.lossRecov
		ex.Components.Handshake = c.handshake
		ex.Components.Peer -= c.lossRecov + c.handshake
		a.AddExchange(ex)
		last = ex
	}
	f, _ := a.Flow(flowKey(last))
	if f.Turns.Last != 8 || f.Turns.PerExchangeMax != 4 || math.Abs(f.Turns.PerExchangeMean-8.0/3) > 1e-9 {
		t.Errorf("turns %+v", f.Turns)
	}
	if f.RTT.Min != 9*ms || f.RTT.SRTTLast != 15*ms {
		t.Errorf("rtt %+v", f.RTT)
	}
	if f.Cwnd != (Cwnd{Last: 8, Min: 4, Max: 40, Restarts: 1}) {
		t.Errorf("cwnd %+v", f.Cwnd)
	}
	if f.Retransmits != 2 || f.RTOs != 1 || !f.SlowStartAfterIdle {
		t.Errorf("retransmits %d rtos %d ssai %v", f.Retransmits, f.RTOs, f.SlowStartAfterIdle)
	}
	if f.Components.Handshake.Nonzero != 1 || f.Components.Handshake.Max != 30*ms ||
		f.Components.LossRecovery.Nonzero != 1 || f.Components.LossRecovery.Count != 3 {
		t.Errorf("handshake %+v loss %+v", f.Components.Handshake, f.Components.LossRecovery)
	}
	// Rule 1 of the latency model carries over to means: the top-level
	// component means add up to the mean duration.
	// Each mean is rounded to the ns: allow one per component.
	if got := f.ComponentMeans.Sum(); (got - f.Duration.Mean).Abs() > 8 {
		t.Errorf("component means sum to %v, mean duration %v", got, f.Duration.Mean)
	}
	if f.ComponentMeans.Propagation != 100*ms {
		t.Errorf("propagation mean %v", f.ComponentMeans.Propagation)
	}
	// The running turn count is per connection, meaningless for a pair.
	if p := a.Peers()[0]; p.Turns.Last != 0 || p.Turns.PerExchangeMax != 4 {
		t.Errorf("peer turns %+v", p.Turns)
	}
}

func TestConnOpenAndClose(t *testing.T) {
	a := New(Config{})
	fl := record.Flow{Local: ap("10.0.0.1:40000"), Remote: ap("10.0.0.2:443"), Netns: 4026531840}
	a.AddConnOpen(record.ConnOpen{Time: at(1), Cookie: 1, Flow: fl, Role: record.RoleClient,
		ConnectLatency: 3 * ms, HandshakeRTT: 2 * ms})

	f, ok := a.Flow(record.FlowKey{Flow: fl, Cookie: 1})
	if !ok || f.ConnRole != record.RoleClient || f.ConnectLatency != 3*ms || f.Opened != at(1) || f.Exchanges != 0 {
		t.Fatalf("opened flow %v %+v", ok, f)
	}
	if len(a.Peers()) != 0 {
		t.Error("a peer pair before the flow had an owner")
	}

	// The first exchange does not carry ConnRole here: the open's wins.
	ex := exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("curl", 7, 1), record.RoleUnknown, at(2), 10*ms)
	ex.Role = record.Responder // the server spoke first; still a client
	a.AddExchange(ex)
	p := a.Peers()
	if len(p) != 1 || p[0].Side != record.RoleClient || p[0].Connections != 1 ||
		p[0].ConnectLatency.Count != 1 || p[0].ConnectLatency.Max != 3*ms {
		t.Fatalf("peer %+v", p)
	}

	a.AddConnClose(record.ConnClose{Time: at(3), Cookie: 1, Flow: fl, Owner: owner("curl", 7, 1),
		Role: record.RoleClient, Established: at(1), BytesSent: 100})
	f, _ = a.Flow(record.FlowKey{Flow: fl, Cookie: 1})
	if f.Close == nil || f.Close.Lifetime() != 2*time.Second || f.LastSeen != at(3) {
		t.Errorf("closed flow %+v", f)
	}
	if p := a.Peers()[0]; p.Connections != 1 {
		t.Errorf("close counted the connection again: %d", p.Connections)
	}

	// A connection that closed without any exchange still counts for
	// its pair (connection per request that failed, say).
	fl2 := fl
	fl2.Local = ap("10.0.0.1:40001")
	a.AddConnClose(record.ConnClose{Time: at(4), Cookie: 2, Flow: fl2, Owner: owner("curl", 7, 1), Role: record.RoleClient})
	if p := a.Peers(); len(p) != 1 || p[0].Connections != 2 || p[0].Exchanges != 1 {
		t.Errorf("peer after bare close %+v", p)
	}
	st := a.Stats()
	if st.ConnOpens != 1 || st.ConnCloses != 2 || st.Exchanges != 1 || st.Flows != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestRetireAfterCloseGrace(t *testing.T) {
	a := New(Config{CloseGrace: 5 * time.Second})
	o := owner("curl", 7, 1)
	ex := exch("10.0.0.1:40000", "10.0.0.2:443", 1, o, record.RoleClient, at(1), ms)
	a.AddExchange(ex)
	keep := exch("10.0.0.1:40001", "10.0.0.2:443", 2, o, record.RoleClient, at(1), ms)
	a.AddExchange(keep)
	cl := record.ConnClose{Time: at(10), Cookie: 1, Flow: ex.Flow, Owner: o, Role: record.RoleClient}
	a.AddConnClose(cl)
	a.AddConnClose(cl) // a duplicate close must not extend or double anything

	if n := a.Expire(at(14.9)); n != 0 {
		t.Errorf("expired %d before the grace period ended", n)
	}
	if f, ok := a.Flow(flowKey(ex)); !ok || f.Close == nil {
		t.Fatal("closed flow not visible during grace")
	}
	if n := a.Expire(at(15)); n != 1 {
		t.Errorf("expired %d at the end of grace, want 1", n)
	}
	if _, ok := a.Flow(flowKey(ex)); ok {
		t.Error("closed flow still there after grace")
	}
	if _, ok := a.Flow(flowKey(keep)); !ok {
		t.Error("open flow retired")
	}
	st := a.Stats()
	if st.FlowsRetired != 1 || st.Flows != 1 || st.Peers != 1 || st.FlowsEvicted != 0 {
		t.Errorf("stats %+v", st)
	}
	// The pair outlives its connections.
	if p := a.Peers()[0]; p.Connections != 2 || p.Exchanges != 2 {
		t.Errorf("peer %+v", p)
	}
}

func TestIdleExpiry(t *testing.T) {
	a := New(Config{FlowIdle: time.Minute, PeerIdle: 10 * time.Minute})
	o := owner("curl", 7, 1)
	old := exch("10.0.0.1:40000", "10.0.0.2:443", 1, o, record.RoleClient, at(0), ms)
	a.AddExchange(old)
	a.AddExchange(exch("10.0.0.1:40001", "10.0.0.2:443", 2, o, record.RoleClient, at(50), ms))
	other := exch("10.0.0.1:40002", "10.0.0.3:443", 3, o, record.RoleClient, at(50), ms)
	a.AddExchange(other)

	if n := a.Expire(at(60)); n != 1 {
		t.Errorf("expired %d, want the one idle flow", n)
	}
	if _, ok := a.Flow(flowKey(old)); ok {
		t.Error("idle flow kept")
	}
	if n := a.Expire(at(700)); n != 4 {
		t.Errorf("expired %d, want 2 flows and 2 peers", n)
	}
	st := a.Stats()
	if st.FlowsExpired != 3 || st.PeersExpired != 2 || st.Flows != 0 || st.Peers != 0 {
		t.Errorf("stats %+v", st)
	}

	// Disabled idle expiry keeps entries forever (the bound still holds).
	b := New(Config{FlowIdle: -1, PeerIdle: -1})
	b.AddExchange(old)
	if n := b.Expire(at(1e6)); n != 0 {
		t.Errorf("expired %d with idle expiry disabled", n)
	}
}

func TestEvictionAtBound(t *testing.T) {
	a := New(Config{MaxFlows: 4, MaxPeers: 100})
	o := owner("curl", 7, 1)
	var exs []*record.Exchange
	for i := range 4 {
		ex := exch(fmt.Sprintf("10.0.0.1:%d", 40000+i), "10.0.0.2:443", uint64(i+1), o, record.RoleClient, at(float64(i)), ms)
		exs = append(exs, ex)
		a.AddExchange(ex)
	}
	// Flow 0 is used again: flow 1 is now the least recently updated.
	a.AddExchange(exs[0])
	a.AddExchange(exch("10.0.0.1:40100", "10.0.0.2:443", 100, o, record.RoleClient, at(10), ms))
	if _, ok := a.Flow(flowKey(exs[1])); ok {
		t.Error("flow 1 should have been evicted")
	}
	if f, ok := a.Flow(flowKey(exs[0])); !ok || f.Exchanges != 2 {
		t.Error("recently updated flow evicted")
	}
	st := a.Stats()
	if st.Flows != 4 || st.FlowsEvicted != 1 || st.FlowsCreated != 5 {
		t.Errorf("stats %+v", st)
	}

	// A closed flow is evicted before any open one, however recent.
	a.AddConnClose(record.ConnClose{Time: at(11), Cookie: 4, Flow: exs[3].Flow, Owner: o, Role: record.RoleClient})
	a.AddExchange(exch("10.0.0.1:40101", "10.0.0.2:443", 101, o, record.RoleClient, at(12), ms))
	if _, ok := a.Flow(flowKey(exs[3])); ok {
		t.Error("closed flow kept while an open one was evicted")
	}
	if _, ok := a.Flow(flowKey(exs[2])); !ok {
		t.Error("open flow evicted although a closed one was there")
	}
	if st := a.Stats(); st.FlowsEvicted != 2 || st.Flows != 4 {
		t.Errorf("stats %+v", st)
	}

	// Many more flows than the bound: the table never grows past it.
	for i := range 1000 {
		a.AddExchange(exch(fmt.Sprintf("10.0.1.%d:%d", i%250, 1000+i), "10.0.0.2:443", uint64(1000+i), o, record.RoleClient, at(20), ms))
	}
	if st := a.Stats(); st.Flows != 4 || st.FlowsEvicted != 1002 || len(a.Flows()) != 4 {
		t.Errorf("stats %+v", st)
	}
	if len(a.freeFlows) > freeCap(4) {
		t.Errorf("free list %d over its cap", len(a.freeFlows))
	}
}

func TestPeerEvictionAndReuse(t *testing.T) {
	a := New(Config{MaxFlows: 100, MaxPeers: 1})
	o := owner("curl", 7, 1)
	e1 := exch("10.0.0.1:40000", "10.0.0.2:443", 1, o, record.RoleClient, at(1), 900*ms)
	a.AddExchange(e1)
	e2 := exch("10.0.0.1:40001", "10.0.0.3:443", 2, o, record.RoleClient, at(2), ms)
	a.AddExchange(e2) // evicts the pair of e1, whose entry is reused
	p := a.Peers()
	if len(p) != 1 || p[0].Remote.String() != "10.0.0.3" || p[0].Exchanges != 1 || p[0].Duration.Max != ms {
		t.Fatalf("reused peer entry leaked old data: %+v", p)
	}
	// Flow 1 comes back: its cached pair is gone, so the pair is created
	// again, fresh, with this connection counted once.
	e1b := *e1
	e1b.Time = at(3)
	a.AddExchange(&e1b)
	p = a.Peers()
	if len(p) != 1 || p[0].Remote.String() != "10.0.0.2" || p[0].Exchanges != 1 || p[0].Connections != 1 {
		t.Fatalf("peer %+v", p)
	}
	if st := a.Stats(); st.PeersEvicted != 2 || st.PeersCreated != 3 || st.Peers != 1 {
		t.Errorf("stats %+v", st)
	}
	// The flow itself kept its history.
	if f, _ := a.Flow(flowKey(e1)); f.Exchanges != 2 || f.Duration.Max != 900*ms {
		t.Errorf("flow %+v", f.Metrics)
	}
}

func TestReusedFlowEntryStartsClean(t *testing.T) {
	a := New(Config{MaxFlows: 1})
	o := owner("curl", 7, 1)
	fl := record.Flow{Local: ap("10.0.0.1:40000"), Remote: ap("10.0.0.2:443"), Netns: 1}
	a.AddConnOpen(record.ConnOpen{Time: at(0), Cookie: 1, Flow: fl, Role: record.RoleClient, ConnectLatency: ms})
	e1 := exch("10.0.0.1:40000", "10.0.0.2:443", 1, o, record.RoleClient, at(1), time.Second)
	e1.Flow.Netns = 1
	e1.Turns, e1.ExchangeTurns = 50, 50
	a.AddExchange(e1)
	a.AddConnClose(record.ConnClose{Time: at(2), Cookie: 1, Flow: fl, Owner: o, Role: record.RoleClient})
	e2 := exch("10.0.0.1:40001", "10.0.0.2:443", 2, o, record.RoleUnknown, at(3), ms)
	e2.Turns, e2.ExchangeTurns = 2, 2
	a.AddExchange(e2)
	f, ok := a.Flow(flowKey(e2))
	if !ok {
		t.Fatal("new flow missing")
	}
	if f.Close != nil || f.Opened != 0 || f.ConnectLatency != 0 || f.Exchanges != 1 ||
		f.Duration.Max != ms || f.Turns.PerExchangeMax != 2 || f.FirstSeen != e2.Start || f.ConnRole != record.RoleUnknown {
		t.Errorf("reused entry kept old state: %+v", f)
	}
	// Side is decided anew for the new flow (requester: client).
	if f.Peer.Side != record.RoleClient || f.Peer.RemotePort != 443 {
		t.Errorf("peer key %+v", f.Peer)
	}
}

func TestSnapshotsAreSortedAndJSON(t *testing.T) {
	a := New(Config{})
	o := owner("curl", 7, 1)
	for i := 9; i >= 0; i-- {
		a.AddExchange(exch(fmt.Sprintf("10.0.0.%d:40000", i+1), fmt.Sprintf("10.0.1.%d:443", i%3), uint64(i), o, record.RoleClient, at(float64(i)), ms))
	}
	flows := a.Flows()
	if !slices.IsSortedFunc(flows, func(x, y FlowStats) int { return x.FlowKey.Compare(y.FlowKey) }) {
		t.Error("flows not sorted")
	}
	peers := a.Peers()
	if len(peers) != 3 || !slices.IsSortedFunc(peers, func(x, y PeerStats) int { return x.PeerKey.Compare(y.PeerKey) }) {
		t.Error("peers not sorted")
	}
	// Two snapshots of an unchanged aggregator are identical.
	again, _ := json.Marshal(a.Flows())
	first, _ := json.Marshal(flows)
	if string(again) != string(first) {
		t.Error("snapshots differ")
	}

	b, err := json.Marshal(flows[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"flow":{"local":"10.0.0.1:40000"`, `"cookie":0`, `"p99_ns":`, `"duration":{"count":1`,
		`"goodput_bytes_per_s":`, `"components":{"network":`, `"local_read":`, `"component_means":{"network_ns":`,
		`"rtt":{"min_ns":`, `"first_seen_mono_ns":`, `"conn_role":"client"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("flow JSON lacks %s: %s", want, b)
		}
	}
	b, _ = json.Marshal(peers[0])
	for _, want := range []string{`"comm":"curl"`, `"side":"client"`, `"remote_addr":"10.0.1.0"`, `"remote_port":443`, `"connections":`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("peer JSON lacks %s: %s", want, b)
		}
	}
	b, _ = json.Marshal(a.Stats())
	if !strings.Contains(string(b), `"flows_evicted":0`) {
		t.Errorf("stats JSON %s", b)
	}
	var back []FlowStats
	if err := json.Unmarshal(first, &back); err != nil || len(back) != len(flows) || back[0].Duration != flows[0].Duration {
		t.Errorf("round trip: %v", err)
	}
}

// A writer adds at full speed, with a small table so entries are evicted
// and recycled under the readers' feet, while readers snapshot. Run with
// -race; the invariants catch torn or recycled entries.
func TestConcurrentSnapshots(t *testing.T) {
	a := New(Config{MaxFlows: 64, ActiveFlows: 16, MaxPeers: 8, CloseGrace: time.Second})
	const writes = 30000
	var done atomic.Bool
	var wg sync.WaitGroup

	wg.Add(1)
	go func() {
		defer wg.Done()
		defer done.Store(true)
		for i := range writes {
			flow := i % 200
			o := owner(fmt.Sprintf("app%d", flow%12), 1, 1)
			ex := exch(fmt.Sprintf("10.0.0.1:%d", 30000+flow), fmt.Sprintf("10.0.2.%d:443", flow%10),
				uint64(flow+1), o, record.RoleClient, at(float64(i)/1000), time.Duration(1+i%97)*ms)
			a.AddExchange(ex)
			if i%50 == 0 {
				a.AddConnClose(record.ConnClose{Time: ex.Time, Cookie: ex.Cookie, Flow: ex.Flow, Owner: o, Role: record.RoleClient})
			}
			if i%500 == 0 {
				a.Expire(ex.Time)
			}
		}
	}()

	check := func(m Metrics, what string) error {
		if m.Duration.Count != m.Exchanges || m.Components.Network.Count != m.Exchanges ||
			m.Requester+m.Responder != m.Exchanges {
			return fmt.Errorf("%s: torn counts %+v", what, m)
		}
		if m.Duration.P50 > m.Duration.P99 || m.Duration.P99 > m.Duration.Max {
			return fmt.Errorf("%s: quantiles out of order %+v", what, m.Duration)
		}
		return nil
	}
	errs := make(chan error, 4)
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !done.Load() || n < 3; n++ {
				var err error
				switch r {
				case 0:
					for _, f := range a.Flows() {
						if err = check(f.Metrics, "flow"); err != nil {
							break
						}
						if f.Exchanges > 0 && f.Owner.Comm != f.Peer.Comm {
							err = fmt.Errorf("flow owner %q under pair %q", f.Owner.Comm, f.Peer.Comm)
							break
						}
					}
				case 1:
					for _, p := range a.Peers() {
						if err = check(p.Metrics, "peer"); err != nil {
							break
						}
					}
				case 2:
					st := a.Stats()
					if st.Flows > 64 || st.Peers > 8 {
						err = fmt.Errorf("over the bound: %+v", st)
					}
					fl := record.Flow{Local: ap("10.0.0.1:30005"), Remote: ap("10.0.2.5:443"), Netns: 4026531840}
					if f, ok := a.Flow(record.FlowKey{Flow: fl, Cookie: 6}); ok && f.Cookie != 6 {
						err = fmt.Errorf("Flow returned %+v", f.FlowKey)
					}
				}
				if err != nil {
					errs <- err
					return
				}
				// Real readers poll about once a second; back to back
				// they would only measure the scheduler on two cores.
				time.Sleep(50 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st := a.Stats()
	if st.Exchanges != writes || st.FlowsEvicted == 0 || st.PeersEvicted == 0 {
		t.Errorf("stats %+v", st)
	}
}

// A socket adopted from softirq has no owner at its first exchange: that
// exchange counts for the flow, and the pair is the owner's, not a
// nameless one.
func TestOwnerlessFirstExchange(t *testing.T) {
	a := New(Config{})
	e1 := exch("10.0.0.1:40000", "10.0.0.2:443", 1, record.Owner{}, record.RoleUnknown, at(1), 10*ms)
	e1.Partial = true
	a.AddExchange(e1)
	if p := a.Peers(); len(p) != 0 {
		t.Fatalf("a pair without an owner: %+v", p)
	}
	a.AddExchange(exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("curl", 7, 1), record.RoleUnknown, at(2), 10*ms))
	a.AddExchange(exch("10.0.0.1:40000", "10.0.0.2:443", 1, record.Owner{}, record.RoleUnknown, at(3), 10*ms))
	f, _ := a.Flow(flowKey(e1))
	p := a.Peers()
	if f.Exchanges != 3 || f.Owner.Comm != "curl" || len(p) != 1 || p[0].Comm != "curl" || p[0].Exchanges != 2 || p[0].Connections != 1 {
		t.Errorf("flow %d exchanges owner %q; pairs %+v", f.Exchanges, f.Owner.Comm, p)
	}
}

// Exchanges back to back make one burst; an idle gap starts the next, and
// the close ends the last. A chatty client: three queries per
// request, six turns.
func TestBursts(t *testing.T) {
	a := New(Config{})
	o := owner("orders", 7, 1)
	var first *record.Exchange
	for req := range 4 {
		for q := range 3 {
			e := exch("10.0.0.1:40000", "10.0.0.2:5432", 1, o, record.RoleClient, at(float64(req)+0.01*float64(q)), 5*ms)
			e.ExchangeTurns, e.SRTT = 2, 5*ms
			e.IdleGap = 50 * time.Microsecond
			if q == 0 {
				e.IdleGap = 900 * ms
			}
			if first == nil {
				first = e
			}
			a.AddExchange(e)
		}
	}
	f, _ := a.Flow(flowKey(first))
	if f.Turns.Bursts != 3 || f.Turns.PerBurstMean != 6 || f.Turns.ExchangesPerBurstMean != 3 {
		t.Errorf("before the close: %+v", f.Turns)
	}
	a.AddConnClose(record.ConnClose{Time: at(5), Cookie: 1, Flow: first.Flow, Owner: o, Role: record.RoleClient})
	f, _ = a.Flow(flowKey(first))
	p := a.Peers()[0]
	if f.Turns.Bursts != 4 || p.Turns.Bursts != 4 || p.Turns.PerBurstMax != 6 || p.Turns.PerExchangeMean != 2 {
		t.Errorf("after the close: flow %+v, pair %+v", f.Turns, p.Turns)
	}
}

// The remote end's Kubernetes names stay with the flow.
func TestPeerK8sKept(t *testing.T) {
	a := New(Config{})
	e := exch("10.0.0.1:40000", "10.1.0.5:8080", 1, owner("curl", 7, 1), record.RoleClient, at(1), 10*ms)
	e.Peer = &record.K8s{Namespace: "shop", Pod: "cart-1", Service: "cart"}
	a.AddExchange(e)
	a.AddExchange(exch("10.0.0.1:40000", "10.1.0.5:8080", 1, owner("curl", 7, 1), record.RoleClient, at(2), 10*ms))
	if f, _ := a.Flow(flowKey(e)); f.PeerK8s == nil || f.PeerK8s.Service != "cart" {
		t.Errorf("peer names %+v", f.PeerK8s)
	}
}

// A pair with one flow has that flow's distributions exactly: the two
// tables share each exchange's bins, zeros and "no path RTT" alike. The
// flow keeps the quantiles of its duration and send wait only; the rest
// of its summaries are the pair's without them.
func TestPairDistributionsMatchTheFlow(t *testing.T) {
	a := New(Config{})
	exs := workload(500, 1, 1)
	for i, ex := range exs {
		if i%7 == 0 {
			ex.PathRTT = 0 // no sample: not a zero RTT
		}
		a.AddExchange(ex)
	}
	f, ok := a.Flow(flowKey(exs[0]))
	if !ok || len(a.Peers()) != 1 {
		t.Fatalf("flow %v, %d pairs", ok, len(a.Peers()))
	}
	p := a.Peers()[0]
	noQ := func(s *Summary) { s.P50, s.P90, s.P99, s.NoDistribution = 0, 0, 0, true }
	want, wantPath := p.Components, p.RTT.Path
	for _, s := range []*Summary{&want.Network, &want.Queueing, &want.LossRecovery, &want.Handshake,
		&want.Receive, &want.Peer, &want.LocalRead, &want.Think, &wantPath} {
		noQ(s)
	}
	if p.Components.Network.P50 == 0 || p.Components.SendWait.P50 == 0 || p.RTT.Path.P99 == 0 {
		t.Errorf("the pair lacks quantiles: %+v", p.Components)
	}
	if f.Duration != p.Duration || f.Components != want || f.RTT.Path != wantPath {
		t.Errorf("flow and its only pair differ:\nflow %+v %+v %+v\npair %+v %+v %+v",
			f.Duration, f.Components, f.RTT.Path, p.Duration, p.Components, p.RTT.Path)
	}
	if f.Duration.Count != 500 || f.RTT.Path.Count != 500-72 || f.Components.LossRecovery.Nonzero != 5 {
		t.Errorf("counts: duration %d, path RTT %d (72 without a sample), loss recovery %d nonzero",
			f.Duration.Count, f.RTT.Path.Count, f.Components.LossRecovery.Nonzero)
	}
}
