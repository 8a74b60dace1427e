package workload

import (
	"context"
	"sort"
	"testing"
	"time"
)

// testServer runs a server for one test; stop cancels it and returns its
// records.
type testServer struct {
	*Server
	addr string
	stop func() []ServerRecord
}

func startServer(t *testing.T, cfg ServerConfig) *testServer {
	t.Helper()
	srv, err := Listen(cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		recs []ServerRecord
		err  error
	}
	done := make(chan result, 1)
	go func() {
		recs, err := srv.Serve(ctx)
		done <- result{recs, err}
	}()
	var recs []ServerRecord
	stopped := false
	stop := func() []ServerRecord {
		if stopped {
			return recs
		}
		stopped = true
		cancel()
		select {
		case r := <-done:
			if r.err != nil {
				t.Errorf("Serve: %v", r.err)
			}
			recs = r.recs
		case <-time.After(5 * time.Second):
			t.Fatalf("server did not stop within 5s of cancel")
		}
		sort.Slice(recs, func(i, j int) bool {
			if recs[i].Conn != recs[j].Conn {
				return recs[i].Conn < recs[j].Conn
			}
			return recs[i].ID < recs[j].ID
		})
		return recs
	}
	t.Cleanup(func() { stop() })
	return &testServer{Server: srv, addr: srv.Addr().String(), stop: stop}
}

// runClient runs a client with a test timeout and fails on any error.
func runClient(t *testing.T, cfg ClientConfig) []ClientRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := RunClient(ctx, cfg)
	if err != nil {
		t.Fatalf("RunClient: %v", err)
	}
	if cfg.Count > 0 && len(recs) != cfg.Count {
		t.Fatalf("got %d records, want %d", len(recs), cfg.Count)
	}
	for i, r := range recs {
		if r.Error != "" {
			t.Fatalf("record %d: %s", i, r.Error)
		}
	}
	return recs
}

func byID(recs []ServerRecord) map[uint64]ServerRecord {
	m := map[uint64]ServerRecord{}
	for _, r := range recs {
		if r.Kind == "exchange" {
			m[r.ID] = r
		}
	}
	return m
}

// maxOverlap returns the largest number of [start, end) intervals that
// contain a common instant.
func maxOverlap(starts, ends []int64) int {
	type ev struct {
		t int64
		d int
	}
	var evs []ev
	for i := range starts {
		evs = append(evs, ev{starts[i], +1}, ev{ends[i], -1})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].t != evs[j].t {
			return evs[i].t < evs[j].t
		}
		return evs[i].d < evs[j].d // ends before starts at the same instant
	})
	cur, best := 0, 0
	for _, e := range evs {
		cur += e.d
		best = max(best, cur)
	}
	return best
}

func dur(d int64) time.Duration { return time.Duration(d) }
