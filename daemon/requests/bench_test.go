package requests

import (
	"testing"

	"github.com/lattrace/lattrace/record"
)

// BenchmarkTracker: what the Tracker costs per exchange on a node where
// most exchanges are single hops (a client and a leaf server, both ends
// on the node), passes included.
func BenchmarkTracker(b *testing.B) {
	tr := New(Config{})
	var exs []*record.Exchange
	for i := range 1000 {
		a := inbound(uint32(1+i%7), uint64(i), record.Mono(i)*ms, record.Mono(i)*ms+ms/2)
		exs = append(exs, a, paired(a, 9, "client"))
	}
	b.ResetTimer()
	now := base
	for i := 0; i < b.N; i++ {
		e := exs[i%len(exs)]
		tr.Exchange(e)
		if i%1000 == 0 {
			now += 10 * ms
			tr.Pass(now+record.Mono(tr.cfg.Settle)*0, false)
		}
	}
}
