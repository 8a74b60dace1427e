package workload

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// MonoNow returns CLOCK_MONOTONIC in nanoseconds, the clock that the
// kernel's bpf_ktime_get_ns reads, so the *_ns fields of the records can be
// compared directly with timestamps taken by eBPF programs on the same host
// (network namespaces share it).
func MonoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC cannot fail on Linux; keep a value anyway.
		panic("workload: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// SleepCtx sleeps for d or until ctx is done, returning ctx.Err() in the
// latter case.
func SleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sleepChan sleeps for d or until done is closed; it reports whether the full
// sleep happened.
func sleepChan(done <-chan struct{}, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}
