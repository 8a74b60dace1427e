package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/tests/bench"
)

// TestEveryConnectionListed holds 20,000 connections open from a cgroup
// of its own, each after one 100-byte round trip, under a daemon with the
// default table settings that watches that cgroup: `lattrace flows --json`
// lists both ends of every one (40,000 flows, most of them packed), each
// with its exchange counted, none evicted and no record lost.
func TestEveryConnectionListed(t *testing.T) {
	const conns = 20000
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cg, removeCg, err := bench.Cgroup(fmt.Sprintf("lattrace-e2e-scale-%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(removeCg)
	sock := filepath.Join(t.TempDir(), "api.sock")
	startDaemon(t, "daemon", "--output", "none", "--metrics-addr", "", "--api-socket", sock, "--cgroup", cg)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var held int
	for left := conns; left > 0; left -= bench.MaxHoldPerProcess {
		g, err := bench.StartLoad(self, bench.LoadConfig{Mode: "hold", Conns: min(left, bench.MaxHoldPerProcess), Size: 100}, cg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Close() })
		r, err := g.Result(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if r.Error != "" || uint64(r.Conns) != r.RoundTrips {
			t.Fatalf("load generator: %+v", r)
		}
		held += r.Conns
	}
	if held != conns {
		t.Fatalf("%d connections held, want %d", held, conns)
	}

	// Each connection's exchange is written once its connection has been
	// quiet for --idle-write (500 ms): poll until all 40,000 are in.
	type list struct {
		Total int      `json:"total"`
		Flows []listed `json:"flows"`
	}
	var got list
	var last error
	var took time.Duration
	var size int
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		t0 := time.Now()
		code, out, stderr := run(t, nil, "flows", "--api", sock, "--json")
		took, size = time.Since(t0), len(out)
		if code != 0 {
			t.Fatalf("flows --json: exit %d: %s", code, stderr)
		}
		got = list{}
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("flows --json: %v", err)
		}
		last = check(got.Total, got.Flows, 2*conns)
		if last == nil {
			break
		}
	}
	if last != nil {
		t.Fatal(last)
	}
	// What `top` asks for each second: the first 1,000 by p99.
	t0 := time.Now()
	if code, _, stderr := run(t, nil, "flows", "--api", sock, "--json", "--limit", "1000"); code != 0 {
		t.Fatalf("flows --limit 1000: exit %d: %s", code, stderr)
	}
	t.Logf("the first 1,000 flows by p99 in %v", time.Since(t0).Round(time.Millisecond))
	c, err := api.NewClient(sock)
	if err != nil {
		t.Fatal(err)
	}
	health, err := c.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d flows listed (%.0f MB of JSON in %v), %d of them packed; %d records decoded",
		got.Total, float64(size)/1e6, took.Round(time.Millisecond), health.Aggregate.PackedFlows, health.Kernel.Decoded)
	if a := health.Aggregate; a.FlowsEvicted != 0 || a.PackedFlows < 2*conns-aggregate.DefaultActiveFlows || a.PackErrors != 0 {
		t.Errorf("aggregate: %+v", a)
	}
	if k := health.Kernel; k.RingbufFull != 0 || k.StorageFail != 0 || k.DecodeErrors != 0 {
		t.Errorf("records lost: %+v", k)
	}
}

// listed is the part of a flow in `flows --json` the test reads.
type listed struct {
	ID        string `json:"id"`
	ConnRole  string `json:"conn_role"`
	Exchanges uint64 `json:"exchanges"`
	Duration  struct {
		Count uint64 `json:"count"`
	} `json:"duration"`
	// Why an exchange is not timed.
	Partial     uint64 `json:"partial"`
	Unanswered  uint64 `json:"unanswered"`
	Multiplexed uint64 `json:"multiplexed"`
	Pushes      uint64 `json:"pushes"`
	Unfinished  uint64 `json:"unfinished"`
}

// check wants n flows, each listed once: a client and a server end per
// connection, each with one timed exchange.
func check(total int, flows []listed, n int) error {
	if total != n || len(flows) != n {
		return fmt.Errorf("%d flows listed (total %d), want %d", len(flows), total, n)
	}
	seen := make(map[string]bool, n)
	roles := map[string]int{}
	var errs []error
	for _, f := range flows {
		if seen[f.ID] {
			errs = append(errs, fmt.Errorf("flow %s listed twice", f.ID))
		}
		seen[f.ID] = true
		roles[f.ConnRole]++
		if f.Exchanges != 1 || f.Duration.Count != 1 {
			errs = append(errs, fmt.Errorf("flow %s (%s): %d exchanges, %d timed (partial %d, unanswered %d, multiplexed %d, pushes %d, unfinished %d), want 1",
				f.ID, f.ConnRole, f.Exchanges, f.Duration.Count, f.Partial, f.Unanswered, f.Multiplexed, f.Pushes, f.Unfinished))
		}
		if len(errs) > 5 {
			break
		}
	}
	if roles["client"] != n/2 || roles["server"] != n/2 {
		errs = append(errs, fmt.Errorf("roles %v, want %d clients and %d servers", roles, n/2, n/2))
	}
	return errors.Join(errs...)
}
