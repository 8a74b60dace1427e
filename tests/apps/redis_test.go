package apps

import (
	"encoding/csv"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Redis with redis-benchmark on one connection: a request at a time, and
// pipelines of 16, each pipeline one exchange (its requests leave in one
// write and its replies come back together).
func TestRedis(t *testing.T) {
	for _, cc := range congestionControls {
		for _, pipeline := range []int{1, 16} {
			t.Run(fmt.Sprintf("%s P%d", cc, pipeline), func(t *testing.T) {
				a := newApp(t, cc)
				const port = 6379
				a.serve(port, "redis-server", "--port", strconv.Itoa(port), "--bind", a.server().String(),
					"--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", a.dir)
				n := 100 * pipeline
				wire := a.capture(port)
				out := a.client("redis-benchmark", "-h", a.server().String(), "-p", strconv.Itoa(port),
					"-c", "1", "-n", strconv.Itoa(n), "-t", "get", "-P", strconv.Itoa(pipeline), "--csv")
				p50, p99 := redisLatency(t, out)
				client, server := a.ends(port)
				// redis-benchmark first asks the server for its
				// configuration on connections of its own.
				a.check(fmt.Sprintf("redis-benchmark -P %d (%s)", pipeline, cc), client, server,
					truth{requests: n, samples: n / pipeline, extra: 4, p50: p50, p99: p99, departures: departures(t, wire, port)})
			})
		}
	}
}

// redisLatency reads redis-benchmark's --csv report: its p50 and p99 in ms.
func redisLatency(t *testing.T, out string) (p50, p99 time.Duration) {
	t.Helper()
	rows, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil || len(rows) < 2 {
		t.Fatalf("redis-benchmark's report: %v\n%s", err, out)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	get := func(name string) time.Duration {
		v, err := strconv.ParseFloat(rows[1][col[name]], 64)
		if err != nil {
			t.Fatalf("redis-benchmark's %s: %v\n%s", name, err, out)
		}
		return time.Duration(v * float64(time.Millisecond))
	}
	return get("p50_latency_ms"), get("p99_latency_ms")
}
