package tracer

import (
	"github.com/lattrace/lattrace/daemon/record"
)

// Durable is an output whose records outlive the daemon: a file, a tracing
// backend. After a kill, the next daemon re-reads the records the killed one
// had read but not released; such an output must not take them twice.
type Durable interface {
	Sink
	// Sync makes everything the output took so far durable (written to
	// its file, acknowledged by its backend). An error leaves the output's
	// cursor where it was.
	Sync() error
}

// Resume wraps out so that it takes every record exactly once across
// daemons sharing a pin directory: after each drain, once out has synced,
// the ring position it reached is stored in the pinned state map, and a
// daemon started after a kill hands out only the records past it. The
// records are released to the kernel after every output's Flush, so the
// only records seen twice are those of the drain a kill interrupted, and
// the cursor tells each output which of them it already has.
//
// Without a pin directory there is no next daemon, and Resume returns out
// as it is.
func (t *Tracer) Resume(name string, out Durable) Sink {
	if t.state == nil {
		return out
	}
	r := &resumed{t: t, name: name, out: out}
	if c := t.loadCursor(name); c.ringID == t.ringID && c.pos > t.ring.committed() {
		r.skipTo = c.pos
	}
	return r
}

type resumed struct {
	t      *Tracer
	name   string
	out    Durable
	skipTo uint64 // records ending at or before this position were taken
}

// taken tells whether the record being delivered reached out before.
func (r *resumed) taken() bool {
	if r.t.pos > r.skipTo {
		return false
	}
	r.t.replaySkipped.Add(1)
	return true
}

func (r *resumed) Exchange(e *record.Exchange) {
	if !r.taken() {
		r.out.Exchange(e)
	}
}

func (r *resumed) ConnOpen(o record.ConnOpen) {
	if !r.taken() {
		r.out.ConnOpen(o)
	}
}

func (r *resumed) ConnClose(c record.ConnClose) {
	if !r.taken() {
		r.out.ConnClose(c)
	}
}

func (r *resumed) Flush() {
	r.out.Flush()
	if err := r.out.Sync(); err != nil {
		return
	}
	if err := r.t.storeCursor(r.name, cursor{ringID: r.t.ringID, pos: r.t.ring.pending()}); err != nil {
		r.t.opts.Logger.Warn("storing output cursor; a kill now may repeat this drain's records", "output", r.name, "err", err)
	}
}
