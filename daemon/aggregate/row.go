package aggregate

import (
	"time"

	"github.com/lattrace/lattrace/record"
)

// FlowRow is what a list filters and orders a flow by: its key, owner and
// pair, and the numbers of the orders it may be asked for. A packed flow
// gives it without decoding its sketches (the quantiles are kept beside
// its bytes), so a pass over every flow of a node costs microseconds a
// flow: the API answers top's question every second, during a connection
// storm too. The rest of the flow's statistics are FlowByCookie's.
type FlowRow struct {
	record.FlowKey
	Owner record.Owner
	Peer  record.PeerKey
	// P50 and P99 are the duration's, as in Metrics.Duration.
	P50, P99    time.Duration
	Exchanges   uint64
	Retransmits uint64
	// Bytes is what the flow's exchanges moved, both ways (Metrics' Out
	// and In).
	Bytes uint64
	// TurnsPerExchange is Metrics.Turns.PerExchangeMean.
	TurnsPerExchange float64
	rate             rateWindow
}

// RateAt is the flow's exchanges per second, as FlowStats.RateAt.
func (r *FlowRow) RateAt(now record.Mono) float64 { return r.rate.at(now) }

// setScalars takes the row's counts from the flow's scalars.
func (r *FlowRow) setScalars(sc *scalars) {
	r.Exchanges, r.Retransmits, r.Bytes = sc.exchanges, sc.retransmits, sc.bytesOut+sc.bytesIn
	r.TurnsPerExchange = 0
	if sc.exchanges > 0 {
		r.TurnsPerExchange = float64(sc.turnsSum) / float64(sc.exchanges)
	}
}

// EachFlowRow calls fn with the row of every flow, packed ones included,
// in no particular order, until fn returns false. The row is reused: what
// fn keeps of it, it copies.
func (a *Aggregator) EachFlowRow(fn func(*FlowRow) bool) {
	var row FlowRow
	for _, c := range a.cookies() {
		if a.rowInto(c, &row) && !fn(&row) {
			return
		}
	}
}

// cookies are the flows' cookies now.
func (a *Aggregator) cookies() []uint64 {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make([]uint64, 0, len(a.flows)+len(a.packed))
	for c := range a.flows {
		out = append(out, c)
	}
	for c := range a.packed {
		out = append(out, c)
	}
	return out
}

// rowInto makes the row of the flow of a cookie; false when there is none
// any longer.
func (a *Aggregator) rowInto(cookie uint64, row *FlowRow) bool {
	for {
		a.mu.RLock()
		e := a.flows[cookie]
		var gen uint64
		if e != nil {
			gen = e.gen
		}
		p, packed := a.packed[cookie]
		a.mu.RUnlock()
		switch {
		case e != nil:
			if e.rowLocked(gen, &a.flowSC, row) {
				return true
			}
			// Packed or removed since: look again.
		case packed:
			if err := p.row(row); err != nil {
				// Counted as such when the writer meets it (unpackFlow);
				// left out of lists until then.
				return false
			}
			return true
		default:
			return false
		}
	}
}

// rowLocked fills row from the entry if it is still the generation gen.
func (f *flowEntry) rowLocked(gen uint64, c *sketchCfg, row *FlowRow) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gen != gen {
		return false
	}
	f.m.fold(c)
	row.FlowKey, row.Owner, row.Peer, row.rate = f.key, f.owner, f.peerKey, f.rate
	row.setScalars(&f.m.sc)
	row.P50, row.P99 = f.m.durationQuantiles(c)
	return true
}
