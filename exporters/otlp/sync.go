package otlp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
)

// errBackendFailing: a sync does not wait for a backend whose last export
// failed; its spans wait in the bounded queue (drops counted) and the
// exporter goes on retrying.
var errBackendFailing = errors.New("otlp: the backend's last export failed; spans wait in the queue")

// errShutdown answers the syncs still waiting when the exporter shuts down.
var errShutdown = errors.New("otlp: the exporter shut down")

// syncState is the Sync protocol's: the Syncs waiting for syncLoop, and
// how far the backend has acknowledged.
type syncState struct {
	// waiters, closed and the closing of kick are under mu, so that a Sync
	// racing Shutdown never sends on a closed channel; kick wakes syncLoop.
	mu      sync.Mutex
	waiters []syncWaiter
	closed  bool
	kick    chan struct{}
	done    chan struct{} // closed when syncLoop returns
	// synced is spansQueued at the last sync that saw them exported;
	// only syncLoop touches it.
	synced uint64
}

// syncWaiter is a Sync to answer once the spans queued before it are out.
type syncWaiter struct {
	queued uint64
	done   func(error)
}

// Sync asks that the spans queued so far be acknowledged by the backend and
// returns at once; done is called once they are, or with the reason they
// are not: the backend did not answer within SyncTimeout, or its last
// export failed (then it is not waited for again until an export gets
// through). A pinned daemon releases a drain's records only after that
// (tracer.Resume); the wait happens on the exporter's own goroutine, so the
// ring buffer's reader never waits for the network. Syncs asked while one
// is in progress are answered together by the next.
func (x *Exporter) Sync(done func(error)) {
	if x.tp == nil {
		done(nil)
		return
	}
	s := &x.syncs
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		done(errShutdown)
		return
	}
	s.waiters = append(s.waiters, syncWaiter{queued: x.spansQueued.Load(), done: done})
	select {
	case s.kick <- struct{}{}:
	default: // a kick is pending: it will see this waiter
	}
	s.mu.Unlock()
}

// startSync starts the goroutine that answers Syncs.
func (x *Exporter) startSync() {
	x.syncs.kick, x.syncs.done = make(chan struct{}, 1), make(chan struct{})
	go x.syncLoop()
}

// stopSync refuses further Syncs and waits until syncLoop has answered
// the waiting ones.
func (x *Exporter) stopSync() {
	s := &x.syncs
	s.mu.Lock()
	s.closed = true
	close(s.kick)
	s.mu.Unlock()
	<-s.done
}

// syncLoop answers Syncs, one backend round trip for all those waiting.
// A round trip exports whatever is queued when it starts, so the Syncs
// asked during it whose spans it covered are answered with it rather than
// after one more: a daemon killed in between would send those spans again.
func (x *Exporter) syncLoop() {
	defer close(x.syncs.done)
	for range x.syncs.kick {
		waiters := x.syncs.take(math.MaxUint64)
		if len(waiters) == 0 {
			continue
		}
		err := x.syncNow()
		if err == nil {
			waiters = append(waiters, x.syncs.take(x.syncs.synced)...)
		}
		for _, w := range waiters {
			w.done(err)
		}
	}
	for _, w := range x.syncs.take(math.MaxUint64) {
		w.done(errShutdown)
	}
}

// take removes the waiting Syncs whose spans were queued by the time upTo
// spans were, and returns them.
func (s *syncState) take(upTo uint64) []syncWaiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	var taken, left []syncWaiter
	for _, w := range s.waiters {
		if w.queued <= upTo {
			taken = append(taken, w)
		} else {
			left = append(left, w)
		}
	}
	s.waiters = left
	return taken
}

// syncNow waits, at most SyncTimeout, until the spans queued so far are
// exported.
func (x *Exporter) syncNow() error {
	queued := x.spansQueued.Load()
	if queued == x.syncs.synced {
		return nil
	}
	if x.failing.Load() {
		return errBackendFailing
	}
	ctx, cancel := context.WithTimeout(context.Background(), x.cfg.SyncTimeout)
	defer cancel()
	errs := x.exportErrors.Load()
	if err := x.tp.ForceFlush(ctx); err != nil {
		// A backend that does not answer in time is failing until an
		// export gets through: the next syncs do not wait for it.
		x.failing.Store(true)
		return fmt.Errorf("otlp: waiting for the backend: %w", err)
	}
	if x.exportErrors.Load() != errs {
		return errBackendFailing
	}
	x.syncs.synced = queued
	return nil
}
