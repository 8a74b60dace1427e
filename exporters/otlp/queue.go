package otlp

import (
	"context"
	"regexp"
	"strings"
	"sync"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// spanQueue is the span processor between the tracer and the exporter: it
// batches spans as the SDK's BatchSpanProcessor does, with what that
// processor has no option for.
//
//   - An exchange's spans stay together, in the queue, in a batch and when
//     dropped, so a backend never gets half of an exchange's trace.
//   - A batch the backend did not take (down, not answering, answering
//     429, 503 or UNAVAILABLE) goes back to the queue and is tried again
//     after a backoff, as often as it takes: an outage of minutes loses
//     only what the bounded queue cannot hold.
//   - When the queue is full, the exchanges of the lowest priority waiting
//     make room, the oldest first: the rate sample's before the slow ones,
//     and those before the diagnosed ones, as a gateway's tail sampling
//     keeps its traces. An exchange whose priority is below everything
//     waiting is the one dropped.
//
// Every exchange that enters leaves by one door, counted (queueEvents):
// exported, dropped for room, rejected by the backend, or still waiting at
// shutdown.
//
// Exchanges go in one at a time: begin says how many spans the next one
// has before they start, and they end before the next begin (Exporter's
// spanMu).
type spanQueue struct {
	exp      sdktrace.SpanExporter
	max      int // spans, waiting and being exported
	batch    int // spans, rounded up to whole exchanges
	interval time.Duration
	timeout  time.Duration // one export call, the SDK's retries inside it
	events   queueEvents

	mu sync.Mutex
	// waiting holds the exchanges by priority, oldest first; the one being
	// filled (open) is the last of its priority's.
	waiting [numPriorities][]*group
	open    *group
	queued  int // spans of the waiting exchanges (the open one's all counted)
	// sending and sendingExchanges are the batch being exported.
	sending, sendingExchanges int
	retryAt                   time.Time
	backoff                   time.Duration
	complete                  int // spans of waiting exchanges whose spans have all ended

	wake    chan struct{}      // a batch is ready
	flushes chan chan struct{} // ForceFlush: closed when what was queued is out
	stop    chan struct{}
	done    chan struct{} // the loop returned
	once    sync.Once
	// shutdownErr is the first Shutdown's.
	shutdownErr error
	// stopCtx is cancelled when Shutdown's deadline passes: the export in
	// progress gives up, and what waits is counted as lost at shutdown.
	stopCtx    context.Context
	stopCancel context.CancelFunc
}

// priority orders exchanges for the queue's room (spanQueue).
type priority uint8

const (
	prioRate      priority = iota // drawn by the rate sample
	prioSlow                      // at or above the slow threshold
	prioDiagnosed                 // a warning or critical diagnosis
	numPriorities
)

// group is one exchange's spans, or one request tree's.
type group struct {
	spans []sdktrace.ReadOnlySpan
	n     int // spans it has once all have ended
	prio  priority
	// exchanges is 1 for an exchange's group and 0 for a request tree's,
	// which the exchange counts leave out (its spans count).
	exchanges int
}

// exchangesIn counts the exchanges of groups.
func exchangesIn(gs []*group) int {
	n := 0
	for _, g := range gs {
		n += g.exchanges
	}
	return n
}

// dropReason says why an exchange was not exported; it is the reason label
// of lattrace_exchanges_unexported_total.
type dropReason int

const (
	dropNotSampled dropReason = iota // the sampler passed it over
	dropSlowBudget                   // slow or diagnosed beyond the slow budget
	dropNoTimeline                   // sampled, with no start to place spans at
	dropQueueFull                    // made room for a newer or more important one
	dropRejected                     // the backend refused its content (retrying cannot help)
	dropShutdown                     // still waiting when the exporter shut down
	numDropReasons
)

// DropReasons name the reasons in the order of their values, as the label
// values of the metric.
var DropReasons = [numDropReasons]string{"not_sampled", "slow_budget", "no_timeline", "queue_full", "rejected", "shutdown"}

func (r dropReason) String() string { return DropReasons[r] }

// queueEvents hears of each exchange's fate and of each failed attempt.
type queueEvents interface {
	exported(exchanges, spans int)
	dropped(why dropReason, exchanges, spans int)
	exportFailed(err error)
}

// Backoff between the attempts to export to a failing backend.
const (
	retryFirst = 500 * time.Millisecond
	retryMax   = 5 * time.Second
)

func newSpanQueue(exp sdktrace.SpanExporter, cfg Config, events queueEvents) *spanQueue {
	q := &spanQueue{
		exp: exp, max: cfg.MaxQueueSize, batch: cfg.MaxExportBatchSize,
		interval: cfg.BatchTimeout, timeout: cfg.ExportTimeout, events: events,
		wake: make(chan struct{}, 1), flushes: make(chan chan struct{}),
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	q.stopCtx, q.stopCancel = context.WithCancel(context.Background())
	go q.loop()
	return q
}

// begin makes room for an exchange of n spans of priority p and opens its
// group; false when it does not fit (larger than the queue, or everything
// waiting ranks above it), which the caller counts.
func (q *spanQueue) begin(n int, p priority) bool { return q.beginGroup(n, p, 1) }

// beginRequest is begin for a request tree's spans (Exporter.Request).
func (q *spanQueue) beginRequest(n int, p priority) bool { return q.beginGroup(n, p, 0) }

func (q *spanQueue) beginGroup(n int, p priority, exchanges int) bool {
	if n > q.max {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.makeRoom(n, p) {
		return false
	}
	g := &group{n: n, prio: p, spans: make([]sdktrace.ReadOnlySpan, 0, n), exchanges: exchanges}
	q.waiting[p] = append(q.waiting[p], g)
	q.queued += n
	q.open = g
	return true
}

// makeRoom drops waiting exchanges, of the lowest priority first and the
// oldest first, until n spans fit beside what is queued and being sent,
// as long as they rank no higher than p; false, dropping nothing, when
// that is not enough.
func (q *spanQueue) makeRoom(n int, p priority) bool {
	if q.queued+q.sending+n <= q.max {
		return true
	}
	free := q.max - q.queued - q.sending
	for low := range min(p+1, numPriorities) {
		for _, g := range q.waiting[low] {
			if g != q.open {
				free += g.n
			}
		}
	}
	if free < n {
		return false
	}
	for q.queued+q.sending+n > q.max {
		low := priority(0)
		for low < numPriorities && len(q.waiting[low]) == 0 {
			low++
		}
		if low == numPriorities || low > p || q.waiting[low][0] == q.open {
			return false
		}
		g := q.waiting[low][0]
		q.waiting[low][0] = nil
		q.waiting[low] = q.waiting[low][1:]
		q.queued -= g.n
		q.complete -= g.n
		q.events.dropped(dropQueueFull, g.exchanges, g.n)
	}
	return true
}

// OnStart does nothing: spans are queued as they end.
func (q *spanQueue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues s in the open exchange; a whole batch wakes the loop.
func (q *spanQueue) OnEnd(s sdktrace.ReadOnlySpan) {
	q.mu.Lock()
	g := q.open
	if g == nil { // a span of an exchange made no room for: not ours to keep
		q.mu.Unlock()
		return
	}
	g.spans = append(g.spans, s)
	if len(g.spans) == g.n {
		q.open = nil
		q.complete += g.n
	}
	ready := q.complete >= q.batch
	q.mu.Unlock()
	if ready {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
}

// take removes the next batch to send: whole exchanges, at least one, up
// to the batch size, the highest priority first and the oldest first
// within one; nil when no exchange is whole.
func (q *spanQueue) take() []*group {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*group
	n := 0
	for p := numPriorities; p > 0; p-- {
		w := q.waiting[p-1]
		k := 0
		for k < len(w) && w[k] != q.open && (n == 0 || n+w[k].n <= q.batch) {
			out = append(out, w[k])
			n += w[k].n
			k++
		}
		clear(w[:k])
		q.waiting[p-1] = w[k:]
		if n >= q.batch {
			break
		}
	}
	q.queued -= n
	q.complete -= n
	q.sending, q.sendingExchanges = n, exchangesIn(out)
	return out
}

// requeue puts a batch the backend did not take back where it came from,
// as the oldest of each priority: its spans were counted against the
// bound while it was sent, so it fits.
func (q *spanQueue) requeue(b []*group) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sending, q.sendingExchanges = 0, 0
	for p := range numPriorities {
		var back []*group
		for _, g := range b {
			if g.prio == p {
				back = append(back, g)
				q.queued += g.n
				q.complete += g.n
			}
		}
		if len(back) > 0 {
			q.waiting[p] = append(back, q.waiting[p]...)
		}
	}
}

// settle ends a batch that left the queue: exported, or dropped for why.
// It is counted under mu, so that a look at the counters and the depth
// together finds every exchange in one place.
func (q *spanQueue) settle(b []*group, exported bool, why dropReason) {
	q.mu.Lock()
	defer q.mu.Unlock()
	spans := q.sending
	q.sending, q.sendingExchanges = 0, 0
	if exported {
		q.events.exported(exchangesIn(b), spans)
	} else {
		q.events.dropped(why, exchangesIn(b), spans)
	}
}

// depth is the exchanges and spans in the queue, the batch being sent
// included.
func (q *spanQueue) depth() (exchanges, spans int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, w := range q.waiting {
		exchanges += exchangesIn(w)
	}
	return exchanges + q.sendingExchanges, q.queued + q.sending
}

// exportAll sends the whole exchanges queued, batch by batch, until the
// queue is empty or the backend fails; then it waits out a backoff before
// the next try, unless forced (a flush, the shutdown).
func (q *spanQueue) exportAll(force bool) {
	q.mu.Lock()
	backingOff := time.Now().Before(q.retryAt)
	q.mu.Unlock()
	if backingOff && !force {
		return
	}
	for b := q.take(); b != nil; b = q.take() {
		spans := make([]sdktrace.ReadOnlySpan, 0, q.batch)
		for _, g := range b {
			spans = append(spans, g.spans...)
		}
		ctx, cancel := context.WithTimeout(q.stopCtx, q.timeout)
		err := q.exp.ExportSpans(ctx, spans)
		cancel()
		switch {
		case err == nil || partialSuccess(err):
			// A partial success was delivered: the backend kept what
			// it could, and the same batch again would be stored
			// twice. The SDK hands its message to the error handler.
			q.settle(b, true, 0)
			q.mu.Lock()
			q.backoff, q.retryAt = 0, time.Time{}
			q.mu.Unlock()
		case rejected(err):
			q.events.exportFailed(err)
			q.settle(b, false, dropRejected)
		default:
			q.events.exportFailed(err)
			q.requeue(b)
			q.mu.Lock()
			q.backoff = min(max(2*q.backoff, retryFirst), retryMax)
			q.retryAt = time.Now().Add(q.backoff)
			q.mu.Unlock()
			return
		}
	}
}

// partialSuccess tells the SDK's error for an answer that took the batch
// but reported spans it rejected, or a warning (OTLP's partial_success):
// the exporters of both protocols return it as an error of this text.
func partialSuccess(err error) bool {
	return strings.Contains(err.Error(), "OTLP partial success")
}

// httpRejected matches the error of the SDK's HTTP exporter for a status
// it does not retry, of those that refuse the request's content.
var httpRejected = regexp.MustCompile(`failed to send to \S+: (400|413) `)

// rejected tells a failure that retrying the same batch cannot mend: the
// backend refused its content (gRPC INVALID_ARGUMENT, HTTP 400 or 413).
// Everything else (refused connections, timeouts, 429, 503, UNAVAILABLE,
// also 401 and 403, which a credential's renewal mends) is retried.
func rejected(err error) bool {
	if s, ok := status.FromError(err); ok && s.Code() == codes.InvalidArgument {
		return true
	}
	return httpRejected.MatchString(err.Error())
}

// loop exports a batch when one is full, everything every interval, and
// everything when asked (ForceFlush) or stopped; what is left at the stop
// is counted as lost at shutdown.
func (q *spanQueue) loop() {
	defer close(q.done)
	t := time.NewTicker(q.interval)
	defer t.Stop()
	for {
		select {
		case <-q.wake:
		case <-t.C:
		case f := <-q.flushes:
			q.exportAll(true)
			close(f)
			continue
		case <-q.stop:
			q.exportAll(true)
			q.dropWaiting(dropShutdown)
			return
		}
		q.exportAll(false)
	}
}

// dropWaiting empties the queue, counting every exchange as lost for why.
func (q *spanQueue) dropWaiting(why dropReason) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for p := range q.waiting {
		for _, g := range q.waiting[p] {
			q.events.dropped(why, g.exchanges, g.n)
		}
		q.waiting[p] = nil
	}
	q.queued, q.complete, q.open = 0, 0, nil
}

// ForceFlush exports what is queued, the backoff notwithstanding, and
// returns once it is out or the backend failed, or when ctx ends.
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

// Shutdown exports what is queued, then shuts the exporter down. When ctx
// ends first, the export in progress is abandoned and what is left is
// counted as lost at shutdown. Calls after the first return its error.
func (q *spanQueue) Shutdown(ctx context.Context) error {
	q.once.Do(func() {
		close(q.stop)
		select {
		case <-q.done:
		case <-ctx.Done():
			q.stopCancel()
			<-q.done
		}
		q.stopCancel()
		q.shutdownErr = q.exp.Shutdown(ctx)
	})
	return q.shutdownErr
}
