package tracer

import (
	"sync/atomic"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Durable is an output whose records outlive the daemon: a file, a tracing
// backend. After a kill, the next daemon re-reads the records the killed one
// had read but not released; such an output must not take them twice.
type Durable interface {
	record.Sink
	// Sync asks the output to make everything it took so far durable
	// (written to its file, acknowledged by its backend) and to call done
	// once it is, or with the error that kept it from being. Sync must not
	// wait for that: it is called on the ring buffer's reader, and while
	// the reader waits for a backend's round trip the kernel drops records
	// (a Collector slow to answer once held a drain for a second and lost
	// 97,000 records). done may run on another goroutine, before or after
	// Sync returns; an output completes its Syncs in the order they were
	// asked for.
	Sync(done func(error))
}

// Resume wraps out so that it takes every record exactly once across
// daemons sharing a pin directory: after each flush, once out has synced,
// the ring position it reached is stored in the pinned state map, and a
// daemon started after a kill hands out only the records past it. Records
// are released to the kernel only once every output synced them (see
// release), so a kill loses none of them: the next daemon re-reads what
// was not released, and the cursor tells each output which of those it
// already has.
//
// Between handing records to out and the cursor's store lies out's
// confirmation: an OTLP backend that took a batch whose answer is in
// flight at the kill has records past the cursor. No output protocol lets
// the next daemon ask, so before out gets a record past it, a second mark,
// sent, is stored: an upper bound of what out may have. The next daemon
// gives out the records between the cursor and that mark again and counts
// their exchanges (ReplayedUnsure): the bound on what out may hold twice.
//
// Without a pin directory there is no next daemon, and Resume returns out
// as it is.
func (t *Tracer) Resume(name string, out Durable) record.Sink {
	if t.state == nil {
		return out
	}
	r := &resumed{t: t, name: name, out: out}
	// A cursor past what the kernel produced cannot have been synced (a
	// state map written by hand, or by a daemon gone wrong): followed,
	// it would withhold every record from out until the ring got there.
	if c := t.loadCursor(name); c.ringID == t.ringID && c.pos > t.ring.committed() && c.pos <= t.ring.produced() {
		r.skipTo = c.pos
	}
	if m := t.loadMark(name); m.ringID == t.ringID && m.pos > max(r.skipTo, t.ring.committed()) {
		r.unsureTo = min(m.pos, t.ring.produced())
	}
	r.done.Store(t.ring.committed())
	t.relMu.Lock()
	t.durable = append(t.durable, r)
	t.relMu.Unlock()
	return r
}

type resumed struct {
	t      *Tracer
	name   string
	out    Durable
	skipTo uint64 // records ending at or before this position were taken
	// unsureTo: records ending past skipTo and at or before it may have
	// reached out from the killed daemon; sent is the mark stored last,
	// and markFailed says a failed store was logged.
	unsureTo, sent uint64
	markFailed     bool
	// done is the ring position up to which out is finished with the
	// records: synced, or given up on (a failing backend is not waited
	// for; its spans wait in its own bounded queue).
	done atomic.Uint64
}

// taken tells whether the record being delivered reached out before; a
// record it does not have is about to reach it, and the sent mark is
// moved past it first.
func (r *resumed) taken() bool {
	if r.t.pos <= r.skipTo {
		r.t.replaySkipped.Add(1)
		return true
	}
	if r.t.pos > r.sent {
		r.markSent()
	}
	return false
}

// markSent stores the sent mark at what the kernel has produced: past the
// record being delivered and the ones the drain reads after it, so that
// the mark moves about once a drain rather than once a record.
func (r *resumed) markSent() {
	pos := r.t.ring.produced()
	if err := r.t.storeMark(r.name, cursor{ringID: r.t.ringID, pos: pos}); err != nil {
		if !r.markFailed {
			r.markFailed = true
			r.t.opts.Logger.Warn("storing output mark; after a kill, records this output may have are not counted as possibly repeated", "output", r.name, "err", err)
		}
		return
	}
	r.sent = pos
}

func (r *resumed) Exchange(e *record.Exchange) {
	if r.taken() {
		return
	}
	if r.t.pos <= r.unsureTo {
		r.t.replayedUnsure.Add(1)
	}
	r.out.Exchange(e)
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
	// While a restarted daemon replays what out already has, out's
	// position stays where the killed daemon left it.
	pos := max(r.t.ring.pending(), r.skipTo)
	r.out.Sync(func(err error) { r.synced(pos, err) })
}

// synced is out's answer to the Sync of the records before pos: on
// success its cursor moves there. Either way out is done with them, and
// they may be released.
func (r *resumed) synced(pos uint64, err error) {
	t := r.t
	t.relMu.Lock()
	defer t.relMu.Unlock()
	if t.released {
		return // the maps are closed; the next daemon reads on from the last cursor
	}
	if err == nil {
		if err := t.storeCursor(r.name, cursor{ringID: t.ringID, pos: pos}); err != nil {
			t.opts.Logger.Warn("storing output cursor; a kill now may repeat these records on this output", "output", r.name, "err", err)
		}
	}
	r.done.Store(pos)
	t.releaseLocked(false)
}

// release gives the kernel back the space of the records every sink has
// flushed and every durable output has synced. With all, it releases
// everything flushed, synced or not, and counts it when some was not: the
// reader does that when the records held for a slow output reach half the
// ring, rather than let the kernel drop new ones; a kill before that output
// syncs loses what it had not made durable.
func (t *Tracer) release(all bool) {
	t.relMu.Lock()
	defer t.relMu.Unlock()
	t.releaseLocked(all)
}

func (t *Tracer) releaseLocked(all bool) {
	if t.released {
		return // the ring is unmapped; a late sync changes nothing
	}
	flushed := t.flushed.Load()
	to := flushed
	for _, r := range t.durable {
		to = min(to, r.done.Load())
	}
	if all && to < flushed {
		to = flushed
		t.releasedUnsynced.Add(1)
	}
	if to > t.ring.committed() {
		t.ring.commitTo(to)
	}
}

// holdingTooMuch says whether the records read and not yet released take
// half the ring.
func (t *Tracer) holdingTooMuch() bool {
	return t.ring.pending()-t.ring.committed() > (t.ring.mask+1)/2
}

// awaitSynced waits, at most timeout, until the durable outputs synced
// everything flushed, and releases it: at exit, so that the next daemon
// does not repeat the last drain. An output that did not sync in time is
// left to its own shutdown (the OTLP exporter's flushes its queue and
// counts what fails), as it would be while running.
func (t *Tracer) awaitSynced(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for t.release(false); t.ring.committed() < t.flushed.Load(); t.release(false) {
		if time.Now().After(deadline) {
			t.release(true)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
