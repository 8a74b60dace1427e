package requests

import (
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
)

// BenchmarkTracker: what the Tracker costs per exchange on a node where
// every exchange is a single hop (a client and a leaf server, both ends
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

// BenchmarkTrackerTiers: the same through a middle tier: each request to
// it makes two calls to a leaf server, all four exchanges' ends on the
// node (a client's and the leaf's kept aside).
func BenchmarkTrackerTiers(b *testing.B) {
	tr := New(Config{})
	var exs []*record.Exchange
	for i := range 500 {
		at := record.Mono(i) * 10 * ms
		a := inbound(1, 11, at, at+5*ms)
		for j := range 2 {
			x := outbound(1, 11, at+record.Mono(j+1)*ms, at+record.Mono(j+2)*ms-ms/2, record.Served{Parent: read(a, record.LinkThread)})
			db := inbound(2, 21, x.Start+ms/10, x.End-ms/10)
			x.ISNLocal, x.ISNRemote, x.OutSeq = uint32(1000+i*2+j), uint32(5000+i*2+j), db.InSeq
			db.ISNLocal, db.ISNRemote = x.ISNRemote, x.ISNLocal
			exs = append(exs, x, db)
		}
		exs = append(exs, a, paired(a, 9, "client"))
	}
	b.ResetTimer()
	now := base
	for i := 0; i < b.N; i++ {
		tr.Exchange(exs[i%len(exs)])
		if i%len(exs) == len(exs)-1 {
			// The same exchanges again, a window later: as new ones.
			now += 5 * record.Mono(time.Second)
			tr.Pass(now, true)
		}
	}
}
