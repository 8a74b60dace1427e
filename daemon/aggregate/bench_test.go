package aggregate

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/lattrace/lattrace/record"
)

// workload builds n exchanges over flows connections of peers pairs, with
// every component the model has non-zero somewhere, from one seed.
func workload(n, flows, peers int) []*record.Exchange {
	r := rand.New(rand.NewPCG(7, 8))
	out := make([]*record.Exchange, n)
	for i := range out {
		f := i % flows
		o := owner(fmt.Sprintf("svc%d", f%peers), uint64(f%peers), uint32(f))
		d := lognormal(r, 5*ms, 1)
		ex := exch(fmt.Sprintf("10.%d.%d.%d:%d", f/62500, f/250%250, f%250, 30000+f%30000), fmt.Sprintf("10.1.0.%d:443", f%peers),
			uint64(f+1), o, record.RoleClient, at(float64(i)/1e4), d)
		// Spread the time over more components, keeping the sum.
		ex.Components.SendWait = d / 20
		ex.Components.Receive = d / 10
		ex.Components.LocalRead = d / 50
		ex.Components.Queueing = ex.Components.Network / 3
		ex.Components.Peer -= ex.Components.SendWait + ex.Components.Receive + ex.Components.LocalRead
		if i%100 == 0 {
			ex.Components.LossRecovery = d / 5
			ex.Components.Peer -= d / 5
			ex.Retransmits = 1
		}
		ex.Turns, ex.ExchangeTurns = uint32(2*(i/flows+1)), 2
		ex.CwndStart, ex.CwndEnd = 10, 20
		out[i] = ex
	}
	return out
}

// BenchmarkAdd is the steady state: exchanges on connections already
// tracked, the ring-buffer reader's hot path.
func BenchmarkAdd(b *testing.B) {
	for _, flows := range []int{100, 1000, 8000} {
		b.Run(fmt.Sprintf("flows=%d", flows), func(b *testing.B) {
			exs := workload(1<<15, flows, 50)
			a := New(Config{})
			for range 4 { // warm: entries exist, sketches have grown
				for _, ex := range exs {
					a.AddExchange(ex)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				a.AddExchange(exs[i&(len(exs)-1)])
			}
		})
	}
}

// BenchmarkAddNewFlow is connection churn: every exchange is on a new
// connection and the table is full, so each one evicts and recycles.
func BenchmarkAddNewFlow(b *testing.B) {
	exs := workload(1<<14, 1<<14, 50)
	a := New(Config{MaxFlows: 1024})
	for _, ex := range exs {
		a.AddExchange(ex)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		ex := exs[i&(len(exs)-1)]
		ex.Cookie += 1 << 20 // a new connection on a reused 4-tuple
		a.AddExchange(ex)
	}
}

// BenchmarkFlowsSnapshot is one API poll of a table of 1000 flows.
func BenchmarkFlowsSnapshot(b *testing.B) {
	exs := workload(1<<15, 1000, 50)
	a := New(Config{})
	for _, ex := range exs {
		a.AddExchange(ex)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if len(a.Flows()) != 1000 {
			b.Fatal("flows")
		}
	}
}

// BenchmarkMemory reports the heap held per flow (with its share of the
// peer pairs) after a realistic load, for sizing MaxFlows.
func BenchmarkMemory(b *testing.B) {
	for _, perFlow := range []int{1, 100} {
		b.Run(fmt.Sprintf("exchanges-per-flow=%d", perFlow), func(b *testing.B) {
			const flows = 2000
			exs := workload(flows*perFlow, flows, 50)
			var a *Aggregator
			var before, after runtime.MemStats
			for range b.N {
				runtime.GC()
				runtime.ReadMemStats(&before)
				a = New(Config{})
				for _, ex := range exs {
					a.AddExchange(ex)
				}
				// A snapshot folds what is pending into the sketches,
				// as the API's polls do.
				a.Flows()
				a.Peers()
				runtime.GC()
				runtime.ReadMemStats(&after)
			}
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/flows, "B/flow")
			b.ReportMetric(0, "ns/op")
			runtime.KeepAlive(a)
			runtime.KeepAlive(exs)
		})
	}
}
