package otlp

import (
	"context"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// spanQueue is the span processor between the tracer and the exporter: it
// batches spans as the SDK's BatchSpanProcessor does, with two differences
// that processor has no option for. When the queue is full the oldest
// exchange's spans make room for the newest (the SDK's drops the newest,
// and the newest are what a person looking at a problem now wants), and an
// exchange's spans stay together, in the queue, in a batch and when
// dropped, so a backend never gets half of an exchange's trace.
//
// Exchanges go in one at a time: begin says how many spans the next one
// has before they start, and they end before the next begin (Exporter's
// spanMu).
type spanQueue struct {
	exp      sdktrace.SpanExporter
	max      int // spans
	batch    int // spans, rounded up to whole exchanges
	interval time.Duration
	timeout  time.Duration // one export call
	// dropped is told of each exchange dropped to make room.
	dropped func(spans int)

	mu     sync.Mutex
	spans  []sdktrace.ReadOnlySpan // ended, oldest first
	groups []int                   // the exchanges' span counts, in the order of spans
	open   int                     // spans of the last group not ended yet

	wake    chan struct{}      // a batch is ready
	flushes chan chan struct{} // ForceFlush: closed when what was queued is out
	stop    chan struct{}
	done    chan struct{} // the loop returned
	once    sync.Once
}

func newSpanQueue(exp sdktrace.SpanExporter, cfg Config, dropped func(spans int)) *spanQueue {
	q := &spanQueue{
		exp: exp, max: cfg.MaxQueueSize, batch: cfg.MaxExportBatchSize,
		interval: cfg.BatchTimeout, timeout: cfg.ExportTimeout, dropped: dropped,
		wake: make(chan struct{}, 1), flushes: make(chan chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go q.loop()
	return q
}

// begin makes room for an exchange of n spans, dropping the oldest
// exchanges that do not fit beside it, and opens its group; false when
// the exchange alone is larger than the queue.
func (q *spanQueue) begin(n int) bool {
	if n > q.max {
		return false
	}
	q.mu.Lock()
	for len(q.groups) > 0 && len(q.spans)+n > q.max {
		k := q.groups[0]
		clear(q.spans[:k])
		q.spans = q.spans[k:]
		q.groups = q.groups[1:]
		q.dropped(k)
	}
	q.groups = append(q.groups, n)
	q.open = n
	q.mu.Unlock()
	return true
}

// OnStart does nothing: spans are queued as they end.
func (q *spanQueue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues s; a whole batch wakes the loop.
func (q *spanQueue) OnEnd(s sdktrace.ReadOnlySpan) {
	q.mu.Lock()
	q.spans = append(q.spans, s)
	q.open--
	ready := q.open <= 0 && len(q.spans) >= q.batch
	q.mu.Unlock()
	if ready {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// take removes the next batch: whole exchanges, at least one, up to the
// batch size; nil when no exchange is whole yet.
func (q *spanQueue) take() []sdktrace.ReadOnlySpan {
	q.mu.Lock()
	defer q.mu.Unlock()
	whole := len(q.groups)
	if q.open > 0 {
		whole-- // the last one is still ending
	}
	n, g := 0, 0
	for g < whole && (n == 0 || n+q.groups[g] <= q.batch) {
		n += q.groups[g]
		g++
	}
	if n == 0 {
		return nil
	}
	out := make([]sdktrace.ReadOnlySpan, n)
	copy(out, q.spans)
	clear(q.spans[:n])
	q.spans = q.spans[n:]
	q.groups = q.groups[g:]
	return out
}

// exportAll exports the whole exchanges queued, batch by batch.
func (q *spanQueue) exportAll() {
	for b := q.take(); b != nil; b = q.take() {
		ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
		_ = q.exp.ExportSpans(ctx, b) // counted by countingSpanExporter
		cancel()
	}
}

// loop exports a batch when one is full, everything every interval, and
// everything when asked (ForceFlush) or stopped.
func (q *spanQueue) loop() {
	defer close(q.done)
	t := time.NewTicker(q.interval)
	defer t.Stop()
	for {
		select {
		case <-q.wake:
		case <-t.C:
		case f := <-q.flushes:
			q.exportAll()
			close(f)
			continue
		case <-q.stop:
			q.exportAll()
			return
		}
		q.exportAll()
	}
}

// ForceFlush exports what is queued and returns once it is out, or when
// ctx ends.
func (q *spanQueue) ForceFlush(ctx context.Context) error {
	f := make(chan struct{})
	select {
	case q.flushes <- f:
	case <-q.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-f:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown exports what is queued, then shuts the exporter down.
func (q *spanQueue) Shutdown(ctx context.Context) error {
	q.once.Do(func() { close(q.stop) })
	select {
	case <-q.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return q.exp.Shutdown(ctx)
}
