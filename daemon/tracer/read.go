package tracer

import (
	"context"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Run drains the ring buffer until ctx is done, then drains what is left and
// returns. The kernel submits without waking us (a wakeup costs microseconds
// per record), so we drain every DrainInterval; past WakeupBytes of backlog
// the kernel wakes us itself.
//
// Each drain ends with sink.Flush and only then gives the records back to
// the kernel: a daemon killed mid-drain leaves them in the ring for the next
// one (see Resume for outputs that must not take them twice).
func (t *Tracer) Run(ctx context.Context, sink record.Sink) error {
	stop := context.AfterFunc(ctx, t.ring.interrupt)
	defer stop()
	// The look for Go programs reads /proc and binaries' DWARF: never in
	// the way of a drain.
	wctx, cancel := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); t.watchGoroutines(wctx) }()
	defer func() { cancel(); <-watched }()
	for {
		stopping := ctx.Err() != nil
		switch {
		case stopping && t.opts.PinPath == "":
			// Detach first, so nothing is submitted after the last drain:
			// what the kernel holds then is all read, and the exchanges
			// in progress, written by the last sweeps, with it. Pinned
			// programs stay attached for the next daemon, which reads on
			// from here and writes them itself.
			t.detach(false)
			t.sweepAtStop(sink)
		case !stopping && t.opts.IdleWrite > 0 && time.Since(t.lastSweep) >= t.opts.IdleWrite:
			t.sweepNow()
			t.pruneListeners()
			t.drain(sink)
		default:
			t.drain(sink)
		}
		if stopping {
			// HTTP/2 streams in progress are written as they stand:
			// their events are released with this drain.
			t.streams.Stop(sink.Exchange)
			t.flush(sink)
			t.awaitSynced(exitSyncTimeout)
			return nil
		}
		if err := t.ring.wait(t.opts.DrainInterval); err != nil {
			return err
		}
	}
}

// drain hands every record the kernel has submitted to sink, then releases
// them. A drain is bounded by what was there when it started, plus what
// arrives while it runs, so a busy kernel cannot keep it from flushing:
// it stops after one ring's worth.
func (t *Tracer) drain(sink record.Sink) {
	limit := t.ring.pending() + t.ring.mask + 1
	flushed := t.ring.pending()
	for t.ring.pending() < limit {
		raw, end, ok := t.ring.next()
		if !ok {
			break
		}
		t.pos = end
		t.decode(raw, sink)
		if end-flushed >= flushBytes {
			t.flush(sink)
			flushed = end
		}
	}
	t.streams.Expire(record.Now(), sink.Exchange)
	t.flush(sink)
}

// flush ends a batch: the sinks flush, and the kernel gets back what every
// output has made durable (see release).
func (t *Tracer) flush(sink record.Sink) {
	sink.Flush()
	t.flushed.Store(t.ring.pending())
	t.release(t.holdingTooMuch())
}

// exitSyncTimeout bounds how long a stopping daemon waits for its outputs
// to sync the last drain: the OTLP exporter's sync in progress and the
// one after it, each bounded by its SyncTimeout (1 s), and a margin.
const exitSyncTimeout = 3 * time.Second

// flushBytes bounds the records a sink takes between two Flushes. A drain
// woken at WakeupBytes (an eighth of the ring) holds megabytes of records:
// in one batch, the JSON lines output buffered all of it (twice the CPU
// of batches of this size, from growing and dropping its buffer), and the
// kernel got none of the space back until the end.
const flushBytes = 256 << 10

func (t *Tracer) decode(raw []byte, sink record.Sink) {
	hdr, ok := view[lattraceLtHeader](raw)
	if !ok || lattraceLtLayout(hdr.Layout) != lattraceLtLayoutLT_LAYOUT {
		// Too short, or written by programs of another version (a pinned
		// ring outlives the daemon): counted, never guessed at.
		t.decodeErrors.Add(1)
		return
	}
	switch lattraceLtRecordKind(hdr.Kind) {
	case lattraceLtRecordKindLT_RECORD_EXCHANGE:
		var x *lattraceLtExchange
		if x, ok = view[lattraceLtExchange](raw); ok {
			t.sweepNetns.saw(x.Flow.Netns)
			if x.Progress.Flags&uint32(lattraceLtExchangeFlagLT_EX_H2STREAMS) != 0 {
				// Its streams make the exchanges (LT_RECORD_H2).
				t.h2Replaced.Add(1)
				break
			}
			exchange(x, &t.ex, &t.comms, &t.congs)
			sink.Exchange(&t.ex)
		}
	case lattraceLtRecordKindLT_RECORD_H2:
		var x *lattraceLtH2Event
		if x, ok = view[lattraceLtH2Event](raw); ok {
			h2Event(x, &t.h2ev, &t.comms)
			t.streams.Add(&t.h2ev, sink.Exchange)
		}
	case lattraceLtRecordKindLT_RECORD_CONN_OPEN:
		var x *lattraceLtConnOpen
		if x, ok = view[lattraceLtConnOpen](raw); ok {
			t.sweepNetns.saw(x.Flow.Netns)
			sink.ConnOpen(connOpen(x))
		}
	case lattraceLtRecordKindLT_RECORD_CONN_CLOSE:
		var x *lattraceLtConnClose
		if x, ok = view[lattraceLtConnClose](raw); ok {
			t.streams.Close(x.Cookie, sink.Exchange)
			sink.ConnClose(connClose(x, &t.comms))
		}
	default:
		ok = false
	}
	if ok {
		t.decoded.Add(1)
	} else {
		t.decodeErrors.Add(1)
	}
}
