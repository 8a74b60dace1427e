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
			tr.Pass(now, false)
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

// BenchmarkTrackerLive: a middle tier answering 5,000 requests a second,
// each making two calls to a leaf server on the node (six exchanges), fed
// as the daemon feeds it: time advancing with the exchanges, a pass
// offered after each request (made every passEvery), trees made Settle
// after their roots.
func BenchmarkTrackerLive(b *testing.B) {
	tr := New(Config{})
	// One request's six exchanges, shifted in time and renamed for each.
	a := inbound(1, 11, 0, 5*ms)
	tmpl := []*record.Exchange{a}
	for j := range 2 {
		x := outbound(1, 11, record.Mono(j+1)*ms, record.Mono(j+2)*ms-ms/2, record.Served{Parent: read(a, record.LinkThread)})
		db := inbound(2, 21, x.Start+ms/10, x.End-ms/10)
		x.ISNLocal, x.ISNRemote, x.OutSeq = uint32(1000+j), uint32(5000+j), db.InSeq
		db.ISNLocal, db.ISNRemote = x.ISNRemote, x.ISNLocal
		tmpl = append(tmpl, x, db)
	}
	tmpl = append(tmpl, paired(a, 9, "client"))
	order := []int{1, 2, 3, 4, 0, 5} // as their records come: each as it ends
	cur := make([]record.Exchange, len(tmpl))
	const every = record.Mono(200 * time.Microsecond)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := i / len(order)
		if i%len(order) == 0 {
			d, id := record.Mono(k)*every, uint64(k)<<20
			for j, e := range tmpl {
				cur[j] = *e
				c := &cur[j]
				c.Start, c.End = c.Start+d, c.End+d
				for _, m := range []*record.Mono{&c.Timeline.W0, &c.Timeline.W1, &c.Timeline.R0, &c.Timeline.R1, &c.Timeline.D1} {
					if *m != 0 {
						*m += d
					}
				}
				c.Cookie += id
				if c.Ctx != 0 {
					c.Ctx += uint64(k) // a thread per request
				}
				if c.ISNLocal != 0 {
					c.ISNLocal, c.ISNRemote = c.ISNLocal+uint32(k)<<13, c.ISNRemote+uint32(k)<<13
				}
				c.InSeq += uint32(k) * 7
				if c.Served.Parent.Cookie != 0 {
					c.Served.Parent.Cookie += id
					c.Served.Parent.InSeq += uint32(k) * 7
				}
				if c.OutSeq > 1 {
					c.OutSeq += uint32(k) * 7
				}
			}
		}
		e := &cur[order[i%len(order)]]
		tr.Exchange(e)
		if i%len(order) == len(order)-1 {
			tr.Pass(e.End, false)
		}
	}
	b.StopTimer()
	if s := tr.Snapshot(false); b.N > 100_000 && s.Stats.Linked[record.LinkThread] == 0 {
		b.Fatalf("nothing linked: %+v", s.Stats)
	}
}
