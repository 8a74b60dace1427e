// Package faults holds the tests of what lattrace promises under faults,
// pressure and floods (docs/reliability.md): a tracing backend down, not
// answering or answering errors for a minute; the daemon under a memory
// limit below what it would use; connect and SYN floods; more exchanges
// in progress at its stop than its ring holds. Each drives the real
// daemon binary against real servers and takes its truth from outside
// lattrace: the Collector's own count of what it received, the load
// generators' own counts of what they did, the kernel's memory cgroup.
//
// make test runs the short versions; LTTEST_SOAK=1 (make soak) the long
// ones, whose figures go into docs/reliability.md.
package faults

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/bench"
)

// lattrace is the daemon binary under test, built by TestMain.
var lattrace string

func TestMain(m *testing.M) {
	// The load generators are this binary, started again.
	bench.LoadgenMain()
	bench.RunWithLattrace(m, "lattrace-faults-", &lattrace)
}

// soak tells the long versions (LTTEST_SOAK=1, make soak).
func soak() bool {
	ok, _ := strconv.ParseBool(os.Getenv("LTTEST_SOAK"))
	return ok
}

// length is short in make test, long in the soak.
func length(short, long time.Duration) time.Duration {
	if soak() {
		return long
	}
	return short
}
