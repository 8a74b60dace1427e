package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/bench"
)

// TestRingBufferOverflowCounted starves the daemon (SIGSTOP) while a
// cgroup of its own makes request/response traffic, until the ring buffer
// overflows. Nothing is lost silently: every record the traffic made is
// decoded or counted in lattrace_ringbuf_full_total, the daemon stays up,
// says so in one warning line, and /healthz names the loss. (make bench
// runs the same measurement and reports it.)
func TestRingBufferOverflowCounted(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	o, log, err := bench.MeasureOverload(ctx, &bench.Env{Lattrace: lattrace, Dir: t.TempDir()}, self, 4, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d round trips on %d connections: %d records made, %d decoded, %d counted lost", o.RoundTrips, o.Conns, o.Made, o.Decoded, o.Lost)
	if o.Lost == 0 {
		t.Fatalf("the ring buffer never overflowed (%d records made in 3 s): the test proves nothing", o.Made)
	}
	if !o.Exact() {
		t.Errorf("%d records made, %d decoded + %d counted lost = %d: some vanished or were counted twice", o.Made, o.Decoded, o.Lost, o.Decoded+o.Lost)
	}
	if !o.Alive {
		t.Errorf("the daemon died:\n%s", log)
	}
	if want := fmt.Sprintf("%d records lost: the ring buffer was full", o.Lost); !strings.Contains(o.Reported, want) {
		t.Errorf("/healthz does not say %q: %s", want, o.Reported)
	}
	var warns []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "level=WARN") && strings.Contains(l, "records lost") {
			warns = append(warns, l)
		}
	}
	if len(warns) == 0 || !strings.Contains(warns[len(warns)-1], fmt.Sprintf("ringbuf_full=%d", o.Lost)) {
		t.Errorf("no warning line with ringbuf_full=%d in the daemon's log:\n%s", o.Lost, log)
	}
}
