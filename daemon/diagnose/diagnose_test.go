package diagnose

import (
	"slices"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/record"
)

const ms = time.Millisecond

// metrics builds flow metrics of n exchanges whose means are c.
func metrics(n uint64, c record.Components) aggregate.Metrics {
	m := aggregate.Metrics{Exchanges: n, Requester: n, ComponentMeans: c, Turns: aggregate.Turns{PerExchangeMean: 1}}
	m.Duration.Mean = c.Sum()
	m.Duration.Count = n
	m.Components.Handshake = aggregate.Summary{Count: n, Mean: c.Handshake}
	// Every exchange waits alike: the median is the mean.
	wait := c.SendWait
	if wait == 0 {
		wait = c.SendWaitCwnd + c.SendWaitRwnd + c.SendWaitSndbuf + c.SendWaitPacing + c.SendWaitOther
	}
	m.Components.SendWait = aggregate.Summary{Count: n, Mean: wait, P50: wait}
	if c.Handshake > 0 {
		m.Components.Handshake.Nonzero = n
	}
	return m
}

func names(ds []record.Diagnosis) []record.DiagnosisName {
	var out []record.DiagnosisName
	for _, d := range ds {
		out = append(out, d.Name)
	}
	return out
}

func TestRules(t *testing.T) {
	for _, c := range []struct {
		name  string
		m     aggregate.Metrics
		want  []record.DiagnosisName
		share float64 // of the first
	}{
		{"clean far path", metrics(100, record.Components{Network: 20 * ms, Propagation: 20 * ms, Peer: ms / 10}), nil, 0},
		{"nothing at all", aggregate.Metrics{}, nil, 0},
		{"slow app", metrics(100, record.Components{Network: 20 * ms, Propagation: 20 * ms, Peer: 60 * ms}), []record.DiagnosisName{PeerThink}, 0.75},
		{"bufferbloat", metrics(100, record.Components{Network: 180 * ms, Propagation: 20 * ms, Queueing: 160 * ms}), []record.DiagnosisName{Bufferbloat}, 160.0 / 180},
		{"queueing below propagation/2 is the path's own jitter",
			metrics(100, record.Components{Network: 25 * ms, Propagation: 20 * ms, Queueing: 5 * ms}), nil, 0},
		{"rwnd", metrics(10, record.Components{Network: 20 * ms, Propagation: 20 * ms, SendWait: 300 * ms, SendWaitRwnd: 300 * ms}), []record.DiagnosisName{RwndLimited}, 300.0 / 320},
		{"sndbuf", metrics(10, record.Components{Network: 20 * ms, Propagation: 20 * ms, SendWait: 20 * ms, SendWaitSndbuf: 20 * ms}), []record.DiagnosisName{SndbufLimited}, 0.5},
		{"nagle", metrics(10, record.Components{Network: 1 * ms, Propagation: 1 * ms, SendWait: 40 * ms, SendWaitOther: 40 * ms}), []record.DiagnosisName{SendStall}, 40.0 / 41},
		{"paced", metrics(10, record.Components{Network: 20 * ms, Propagation: 20 * ms, SendWait: 20 * ms, SendWaitPacing: 20 * ms}), []record.DiagnosisName{Paced}, 0.5},
		{"handshake", metrics(10, record.Components{Network: 20 * ms, Propagation: 20 * ms, Handshake: 20 * ms}), []record.DiagnosisName{ConnPerRequest}, 0.5},
		{"local reader", metrics(10, record.Components{Network: 2 * ms, Propagation: 2 * ms, LocalRead: 8 * ms}), []record.DiagnosisName{LocalRead}, 0.8},
		{"local think", metrics(10, record.Components{Network: 2 * ms, Propagation: 2 * ms, Think: 8 * ms}), []record.DiagnosisName{LocalThink}, 0.8},
		{"slow response transfer", metrics(10, record.Components{Network: 30 * ms, Propagation: 30 * ms, Receive: 31 * ms}), []record.DiagnosisName{ReceiveLimited}, 31.0 / 61},
	} {
		t.Run(c.name, func(t *testing.T) {
			ds := Of(&c.m)
			got := names(ds)
			if len(got) != len(c.want) || (len(got) > 0 && got[0] != c.want[0]) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
			if len(ds) > 0 {
				d := ds[0]
				if d.Share < c.share-1e-9 || d.Share > c.share+1e-9 || d.Summary == "" || d.Fix == "" || len(d.Evidence) == 0 {
					t.Errorf("%+v, want share %v", d, c.share)
				}
			}
		})
	}
}

func TestSlowStartAfterIdleVsCwnd(t *testing.T) {
	m := metrics(10, record.Components{Network: 20 * ms, Propagation: 20 * ms, SendWait: 50 * ms, SendWaitCwnd: 50 * ms})
	if ds := Of(&m); len(ds) != 1 || ds[0].Name != CwndLimited {
		t.Errorf("without restarts: %v", names(ds))
	}
	m.Cwnd = aggregate.Cwnd{Restarts: 10, Min: 10, Max: 70}
	m.SlowStartAfterIdle = true
	ds := Of(&m)
	if len(ds) != 1 || ds[0].Name != SlowStartAfterIdle || ds[0].Severity != record.SeverityCritical {
		t.Fatalf("with restarts: %+v", ds)
	}
	if ev := ds[0].Evidence; ev[len(ev)-1].Name != "tcp_slow_start_after_idle" || ev[len(ev)-1].Value != 1 {
		t.Errorf("evidence %+v", ev)
	}
}

func TestLossAndTurnsAndOrder(t *testing.T) {
	m := metrics(10, record.Components{Network: 100 * ms, Propagation: 100 * ms, LossRecovery: 200 * ms, Peer: 30 * ms})
	m.RTOs, m.Retransmits = 1, 1
	m.Turns.PerExchangeMean, m.Turns.PerExchangeMax = 6, 6
	ds := Of(&m)
	if got := names(ds); len(got) != 2 || got[0] != Loss || got[1] != ManyTurns {
		t.Fatalf("%v", got)
	}
	// A chatty client: three queries back to back per request over 5 ms.
	chatty := metrics(30, record.Components{Network: 5 * ms, Propagation: 5 * ms, Peer: ms / 10})
	chatty.Turns = aggregate.Turns{PerExchangeMean: 2, PerExchangeMax: 2, Bursts: 10, PerBurstMean: 6, PerBurstMax: 6, ExchangesPerBurstMean: 3}
	if ds := Of(&chatty); len(ds) != 1 || ds[0].Name != ManyTurns || ds[0].Severity != record.SeverityCritical {
		t.Errorf("chatty: %+v", ds)
	}
	// A server's exchanges hold no round trip: distance adds nothing.
	server := chatty
	server.Requester, server.Responder = 0, server.Exchanges
	if extra, _ := WhatIf(&server, 20*ms); extra != 0 {
		t.Errorf("responder what-if %v", extra)
	}
	if extra, rounds := WhatIfBurst(&chatty, 20*ms); rounds != 3 || extra != 60*ms {
		t.Errorf("burst what-if %v over %v round trips", extra, rounds)
	}
	chatty.Turns.PerBurstMean, chatty.Turns.ExchangesPerBurstMean = 2, 1
	if ds := Of(&chatty); ds != nil {
		t.Errorf("one exchange per request: %+v", ds)
	}
	// Six turns are three round trips: 20 ms more each.
	extra, rounds := WhatIf(&m, 20*ms)
	if rounds != 3 || extra != 60*ms {
		t.Errorf("what-if %v over %v round trips", extra, rounds)
	}
}

func TestExchange(t *testing.T) {
	e := &record.Exchange{
		Duration: 80 * ms, ExchangeTurns: 2, CwndStart: 10, CwndEnd: 40, CwndRestart: true, SlowStartAfterIdle: true,
		IdleGap:    time.Second,
		Components: record.Components{Network: 20 * ms, Propagation: 20 * ms, SendWait: 60 * ms, SendWaitCwnd: 60 * ms},
	}
	ds := Exchange(e)
	if len(ds) != 1 || ds[0].Name != SlowStartAfterIdle {
		t.Fatalf("%+v", ds)
	}
	ev := map[string]float64{}
	for _, x := range ds[0].Evidence {
		ev[x.Name] = x.Value
	}
	if ev["idle_gap"] != 1000 || ev["extra_round_trips"] != 3 || ev["cwnd_min"] != 10 || ev["cwnd_max"] != 40 {
		t.Errorf("evidence %v", ev)
	}
	e.Partial = true
	if ds := Exchange(e); ds != nil {
		t.Errorf("partial exchange diagnosed: %+v", ds)
	}
	clean := &record.Exchange{Duration: 20*ms + 300*time.Microsecond, ExchangeTurns: 2,
		Components: record.Components{Network: 20 * ms, Propagation: 20 * ms, Peer: 200 * time.Microsecond, LocalRead: 100 * time.Microsecond}}
	if ds := Exchange(clean); ds != nil {
		t.Errorf("clean exchange diagnosed: %+v", ds)
	}
	// A loopback exchange: a large share of tiny parts is not a finding.
	loop := &record.Exchange{Duration: 100 * time.Microsecond, ExchangeTurns: 2,
		Components: record.Components{Network: 20 * time.Microsecond, LocalRead: 80 * time.Microsecond}}
	if ds := Exchange(loop); ds != nil {
		t.Errorf("loopback exchange diagnosed: %+v", ds)
	}
}

// One slow handshake on a long connection (a lost SYN) is not a
// connection per request.
func TestOneSlowHandshake(t *testing.T) {
	m := metrics(60, record.Components{Network: 20 * ms, Propagation: 20 * ms, Handshake: 17 * ms})
	m.Components.Handshake = aggregate.Summary{Count: 60, Nonzero: 1, Mean: 17 * ms, Max: 1020 * ms}
	for _, d := range Of(&m) {
		if d.Name == ConnPerRequest {
			t.Errorf("fired: %+v", d)
		}
	}
}

// Equal shares keep the order the rules run in (the sort is stable), so a
// case where every rule fires with the same share shows that order: the
// critical ones first, then the info ones, then the asymmetry, which has
// no share. Slow start after idle is left out: it excludes cwnd_limited.
func TestRuleOrder(t *testing.T) {
	m := metrics(10, record.Components{
		Network: 20 * ms, Propagation: 10 * ms, Queueing: 10 * ms,
		SendWaitCwnd: 10 * ms, SendWaitRwnd: 10 * ms, SendWaitSndbuf: 10 * ms, SendWaitOther: 10 * ms,
		LossRecovery: 10 * ms, Receive: 10 * ms, Handshake: 10 * ms,
		Peer: 10 * ms, LocalRead: 10 * ms, Think: 10 * ms,
	})
	m.Duration.Mean = 20 * ms // every part above is half of it
	m.Turns.PerExchangeMean = manyExchangeTurns
	m.Out.Transfers, m.Out.TransferRate = 1, 1e6
	m.In.Transfers, m.In.TransferRate = 1, 1e5
	want := []record.DiagnosisName{
		CwndLimited, RwndLimited, SndbufLimited, SendStall, Bufferbloat, Loss, ConnPerRequest, ManyTurns, LocalRead,
		ReceiveLimited, PeerThink, LocalThink,
		Asymmetry,
	}
	if got := names(Of(&m)); !slices.Equal(got, want) {
		t.Errorf("got  %v\nwant %v", got, want)
	}
}

// A window that limits a flow limits its typical exchange: one slow
// start at a connection's beginning, however long against the short
// exchanges of a responder, is no cwnd_limited flow.
func TestWindowWaitMustBeTypical(t *testing.T) {
	m := metrics(100, record.Components{SendWaitCwnd: 2 * ms, Think: ms / 2})
	if got := names(Of(&m)); !slices.Contains(got, CwndLimited) {
		t.Fatalf("every exchange waiting: %v", got)
	}
	m.Components.SendWait.P50 = 0 // one exchange of a hundred waited 200 ms
	if got := names(Of(&m)); slices.Contains(got, CwndLimited) {
		t.Errorf("cwnd_limited from one exchange's slow start: %v", got)
	}
}

// A tail is a pair's p99 and a flow's exact max: a flow keeps no
// distribution of its components or path RTT, and says so.
func TestEvidenceTails(t *testing.T) {
	evidence := func(ds []record.Diagnosis, name record.DiagnosisName) map[string]float64 {
		out := map[string]float64{}
		for _, d := range ds {
			if d.Name == name {
				for _, e := range d.Evidence {
					out[e.Name] = e.Value
				}
			}
		}
		return out
	}
	for _, flow := range []bool{false, true} {
		m := metrics(100, record.Components{Network: 20 * ms, Propagation: 20 * ms, Peer: 80 * ms})
		m.Components.Peer = aggregate.Summary{Count: 100, Nonzero: 100, Mean: 80 * ms, P50: 70 * ms, P99: 150 * ms, Max: 300 * ms, NoDistribution: flow}
		b := metrics(100, record.Components{Network: 180 * ms, Propagation: 20 * ms, Queueing: 160 * ms})
		b.RTT.Path = aggregate.Summary{Count: 100, Nonzero: 100, Mean: 180 * ms, P50: 170 * ms, P99: 250 * ms, Max: 400 * ms, NoDistribution: flow}
		if flow {
			m.Components.Peer.P50, m.Components.Peer.P99 = 0, 0
			b.RTT.Path.P50, b.RTT.Path.P99 = 0, 0
		}
		peer, bloat := evidence(Of(&m), PeerThink), evidence(Of(&b), Bufferbloat)
		want := map[bool][2]map[string]float64{
			false: {{"peer_p99": 150}, {"path_rtt_p50": 170, "path_rtt_p99": 250}},
			true:  {{"peer_max": 300}, {"path_rtt_mean": 180, "path_rtt_max": 400}},
		}[flow]
		for i, got := range []map[string]float64{peer, bloat} {
			for k, v := range want[i] {
				if got[k] != v {
					t.Errorf("flow %v: evidence %s = %v, want %v (all: %v)", flow, k, got[k], v, got)
				}
			}
		}
	}
}
