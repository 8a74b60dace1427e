package tracer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/lattrace/lattrace/daemon/record"
)

// Sink receives decoded records, on the reading goroutine: it must not block
// for long, or the ring buffer fills and the kernel counts drops.
type Sink interface {
	// Exchange gets a record the sink may keep: it is not reused.
	Exchange(*record.Exchange)
	ConnOpen(record.ConnOpen)
	ConnClose(record.ConnClose)
	// Flush is called after each drain of the ring buffer, so a sink can
	// batch its output per drain instead of per record.
	Flush()
}

// Run drains the ring buffer until ctx is done, then drains what is left and
// returns. The kernel submits without waking us (a wakeup costs microseconds
// per record), so a ticker flushes the reader; past WakeupBytes of backlog
// the kernel wakes us itself.
func (t *Tracer) Run(ctx context.Context, sink Sink) error {
	ticker := time.NewTicker(t.opts.DrainInterval)
	defer ticker.Stop()
	stopped := make(chan struct{})
	defer close(stopped)
	var done atomic.Bool
	go func() {
		for {
			select {
			case <-ctx.Done():
				// Detach first, so nothing is submitted after the last
				// drain: what the kernel holds then is all read.
				t.detach()
				done.Store(true)
				t.reader.Flush()
				return
			case <-stopped:
				return
			case <-ticker.C:
				t.reader.Flush()
			}
		}
	}()

	var rec ringbuf.Record
	for {
		err := t.reader.ReadInto(&rec)
		switch {
		case err == nil:
			t.decode(rec.RawSample, sink)
		case errors.Is(err, ringbuf.ErrFlushed):
			// Everything submitted before the flush has been read.
			sink.Flush()
			if done.Load() {
				return nil
			}
		case errors.Is(err, ringbuf.ErrClosed):
			return nil
		default:
			return fmt.Errorf("reading ring buffer: %w", err)
		}
	}
}

func (t *Tracer) decode(raw []byte, sink Sink) {
	hdr, ok := view[lattraceLtHeader](raw)
	if !ok {
		t.decodeErrors.Add(1)
		return
	}
	switch lattraceLtRecordKind(hdr.Kind) {
	case lattraceLtRecordKindLT_RECORD_EXCHANGE:
		ok = deliver(raw, exchange, sink.Exchange)
	case lattraceLtRecordKindLT_RECORD_CONN_OPEN:
		ok = deliver(raw, connOpen, sink.ConnOpen)
	case lattraceLtRecordKindLT_RECORD_CONN_CLOSE:
		ok = deliver(raw, connClose, sink.ConnClose)
	default:
		ok = false
	}
	if ok {
		t.decoded.Add(1)
	} else {
		t.decodeErrors.Add(1)
	}
}

// deliver reads raw as the kernel's type K, converts it and hands it on;
// false when raw is too short to be a K.
func deliver[K, R any](raw []byte, convert func(*K) R, to func(R)) bool {
	k, ok := view[K](raw)
	if ok {
		to(convert(k))
	}
	return ok
}
