package e2e

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/bench"
	"github.com/lattrace/lattrace/tests/otelcol"
)

// TestStalledBackendKeepsTracing: a tracing backend that accepts
// connections and never answers (a Collector stopped with SIGSTOP) must not
// hold up the ring buffer's reader. With pinned maps a drain's records are
// released only once the backend has its spans; while it does not answer,
// the reader reads on and, when the records held reach half the ring,
// releases them anyway and counts it. Paced traffic through a 3-s stall on
// a 4 MiB ring loses no record (before, the reader waited up to a second
// for the backend, and a second of this traffic is 20,000 records, half as
// many again as the ring holds: the kernel dropped thousands), and the
// spans reach the Collector once it answers again. The ring's 600 ms of
// slack is what a busy machine may keep the reader off its CPU.
func TestStalledBackendKeepsTracing(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	col := otelcol.Start(t)
	cg, removeCg, err := bench.Cgroup(fmt.Sprintf("lattrace-e2e-stall-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(removeCg)
	pins := fmt.Sprintf("/sys/fs/bpf/lattrace-e2e-stall-%d", os.Getpid())
	dm, err := bench.StartDaemon(bench.DaemonConfig{Bin: lattrace, Dir: t.TempDir(), OTLP: col.GRPCEndpoint(),
		PinPath: pins, Cgroup: cg, RingMiB: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := dm.Stop(); err != nil {
			t.Error(err)
		}
	}()

	if err := col.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	const conns = 2
	l, err := bench.StartLoad(self, bench.LoadConfig{Mode: "rr", Conns: conns, Rate: 10000, Duration: 3 * time.Second, Size: 100}, cg)
	if err != nil {
		col.Signal(syscall.SIGCONT)
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := l.Result(ctx)
	l.Close()
	if err := col.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	made := 2*r.RoundTrips + 4*uint64(r.Conns)
	m, err := dm.Settled(ctx)
	if err != nil {
		t.Fatal(err)
	}
	decoded, lost := uint64(m["lattrace_records_decoded_total"]), uint64(m["lattrace_ringbuf_full_total"])
	t.Logf("%d round trips while the Collector was stopped: %d records made, %d decoded, %d lost; released before the backend had them %.0f times",
		r.RoundTrips, made, decoded, lost, m["lattrace_released_unsynced_total"])
	// A record is about 350 bytes: 4 MiB hold 12,000, which a second
	// of 6,000 round trips (two records each) overflows.
	if r.RoundTrips < 18000 {
		t.Fatalf("only %d round trips in 3 s: too few to fill a 4 MiB ring in the second a blocking reader would wait", r.RoundTrips)
	}
	if lost != 0 || decoded != made {
		t.Errorf("%d records made, %d decoded, %d lost to a full ring: the stalled backend held up the reader", made, decoded, lost)
	}
	if m["lattrace_released_unsynced_total"] == 0 {
		t.Errorf("no release before the stalled backend had the records was counted (lattrace_released_unsynced_total): the backend did not stall, or the release went uncounted")
	}
	// The spans sampled during the stall are not lost: the exporter sends
	// them once the Collector answers.
	col.WaitForSpans(t, 1, 30*time.Second, func(s otelcol.Span) bool { return s.Name == "tcp exchange" })
	if !dm.Alive() {
		t.Errorf("the daemon died:\n%s", dm.Log())
	}
}
