package pipeline

import (
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/record"
)

const ms = time.Millisecond

// seen is an output that keeps what reached it, in order.
type seen struct {
	name string
	log  *[]string
	last record.Exchange
}

func (s *seen) Exchange(e *record.Exchange) { *s.log = append(*s.log, s.name+" exchange"); s.last = *e }
func (s *seen) ConnOpen(record.ConnOpen)    { *s.log = append(*s.log, s.name+" open") }
func (s *seen) ConnClose(record.ConnClose)  { *s.log = append(*s.log, s.name+" close") }
func (s *seen) Flush()                      { *s.log = append(*s.log, s.name+" flush") }

// slowPeer is a requester's exchange whose peer thinks for 80 ms on a
// 20 ms path: attribution gives the peer 80 ms and the network 20.
// It starts now: the live state expires what is idle by the clock.
func slowPeer() *record.Exchange {
	t0 := record.Now()
	return &record.Exchange{
		Time: t0 + record.Mono(101*ms), Cookie: 1, Role: record.Requester, ConnRole: record.RoleClient,
		Owner:    record.Owner{PID: 1, Comm: "client", CgroupID: 1},
		Timeline: record.Timeline{W0: t0, W1: t0, X1: t0, A1: t0 + record.Mono(10*ms), R0: t0 + record.Mono(100*ms), R1: t0 + record.Mono(100*ms), D1: t0 + record.Mono(100*ms)},
		MinRTT:   20 * ms, PathRTT: 20 * ms, PathMinRTT: 20 * ms,
	}
}

func TestStagesThenOutputsInOrder(t *testing.T) {
	var log []string
	a, b := &seen{name: "a", log: &log}, &seen{name: "b", log: &log}
	p := New(Config{}, a, b)
	p.ConnOpen(record.ConnOpen{Cookie: 1})
	p.Exchange(slowPeer())
	p.ConnClose(record.ConnClose{Cookie: 1})
	p.Flush()
	want := []string{"a open", "b open", "a exchange", "b exchange", "a close", "b close", "a flush", "b flush"}
	if len(log) != len(want) {
		t.Fatalf("outputs saw %v, want %v", log, want)
	}
	for i := range want {
		if log[i] != want[i] {
			t.Fatalf("outputs saw %v, want %v", log, want)
		}
	}
	// Every output sees the exchange attributed and diagnosed.
	for _, s := range []*seen{a, b} {
		e := &s.last
		if e.Duration != 100*ms || e.Components.Sum() != e.Duration || e.Components.Network != 20*ms || e.Components.Peer != 80*ms {
			t.Errorf("%s: duration %v, components %+v", s.name, e.Duration, e.Components)
		}
		if len(e.Diagnoses) == 0 || e.Diagnoses[0].Name != diagnose.PeerThink {
			t.Errorf("%s: diagnoses %+v, want %s first", s.name, e.Diagnoses, diagnose.PeerThink)
		}
	}
}

func TestLiveFeedsStatisticsAndHistory(t *testing.T) {
	agg := aggregate.New(aggregate.Config{})
	hist := history.New(history.Config{})
	p := New(Config{}, Live(agg, hist))
	p.ConnOpen(record.ConnOpen{Cookie: 1, Role: record.RoleClient, Time: record.Now()})
	p.Exchange(slowPeer())
	p.Flush()
	flows := agg.Flows()
	if len(flows) != 1 || flows[0].Exchanges != 1 || flows[0].Metrics.Duration.Mean != 100*ms {
		t.Fatalf("flows %+v", flows)
	}
	if got := hist.Recent(1); len(got) != 1 || got[0].Duration != 100*ms {
		t.Errorf("history %+v", got)
	}
	// Without a history, only the statistics.
	agg2 := aggregate.New(aggregate.Config{})
	New(Config{}, Live(agg2, nil)).Exchange(slowPeer())
	if n := len(agg2.Flows()); n != 1 {
		t.Errorf("flows without history: %d", n)
	}
}
