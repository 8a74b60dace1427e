package tracer

import (
	"io"
	"net"
	"sort"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BenchmarkLoopbackRR runs a 100-byte request/response loop on loopback
// with every program attached and reports, from the kernel's own BPF
// statistics, the average cost of one run of each program and their sum
// per round trip. Run: go test -run - -bench LoopbackRR ./daemon/tracer/
func BenchmarkLoopbackRR(b *testing.B) {
	enableRunStats(b)
	tr, _ := openTracer(b)
	c, err := net.Dial("tcp", replyServer(b, 100, 100, 0))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 100)
	before := runStats(b, tr)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	after := runStats(b, tr)
	var names []string
	for n := range after {
		names = append(names, n)
	}
	sort.Strings(names)
	var perRT float64
	for _, n := range names {
		runs := after[n].count - before[n].count
		ns := after[n].ns - before[n].ns
		if runs == 0 {
			continue
		}
		b.ReportMetric(float64(ns)/float64(runs), n+"-ns/run")
		perRT += float64(ns) / float64(b.N)
		b.Logf("%-24s %10d runs %8.1f ns/run %6.2f runs/round-trip", n, runs, float64(ns)/float64(runs), float64(runs)/float64(b.N))
	}
	b.ReportMetric(perRT, "bpf-ns/round-trip")
}

type runStat struct{ count, ns uint64 }

// enableRunStats turns on the kernel's BPF run statistics until the test
// ends (kernel.bpf_stats_enabled; off again when no one holds it).
func enableRunStats(tb testing.TB) {
	tb.Helper()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		tb.Fatalf("enabling BPF run-time statistics: %v", err)
	}
	tb.Cleanup(func() { stats.Close() })
}

// runStats reads the run count and run time of each of tr's programs.
func runStats(tb testing.TB, tr *Tracer) map[string]runStat {
	out := map[string]runStat{}
	for name, p := range tr.Programs() {
		st, err := p.Stats()
		if err != nil {
			tb.Fatal(err)
		}
		out[name] = runStat{st.RunCount, uint64(st.Runtime)}
	}
	return out
}
