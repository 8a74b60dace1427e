package e2e

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// chain is a thread-per-connection front server that answers each request
// after three sequential calls to a backend, and a client that makes its
// requests one at a time: one process, started after the daemon.
const chain = `
import ctypes, socket, sys, threading, socketserver

def name(n):  # the thread's comm: the service lattrace names
    ctypes.CDLL(None).prctl(15, n, 0, 0, 0)

class Backend(socketserver.BaseRequestHandler):
    def handle(self):
        name(b"backend")
        while True:
            if not self.request.recv(64):
                return
            self.request.sendall(b"b" * 80)

class Front(socketserver.BaseRequestHandler):
    def handle(self):
        name(b"front")
        b = socket.create_connection(("127.0.0.1", backend.server_address[1]))
        while True:
            if not self.request.recv(100):
                return
            for _ in range(3):
                b.sendall(b"q" * 50)
                b.recv(80)
            self.request.sendall(b"r" * 200)

socketserver.ThreadingTCPServer.allow_reuse_address = True
backend = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Backend)
front = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Front)
for s in (backend, front):
    threading.Thread(target=s.serve_forever, daemon=True).start()
c = socket.create_connection(("127.0.0.1", front.server_address[1]))
for _ in range(int(sys.argv[1])):
    c.sendall(b"x" * 100)
    n = 200
    while n > 0:
        n -= len(c.recv(n))
    threading.Event().wait(0.01)
c.close()
print(front.server_address[1])
`

// TestRequestsShown: a daemon makes request trees of a front server's
// requests and its calls, and `lattrace requests` shows them: the
// endpoint's requests, three children and eight turns on the critical
// path each, the edge's exchanges per request, one request's tree and
// what moving its backend would cost, and the counts on /metrics.
func TestRequestsShown(t *testing.T) {
	metrics := freeAddr(t)
	sock := t.TempDir() + "/api.sock"
	startDaemon(t, "daemon", "--output", "none", "--metrics-addr", metrics, "--api-socket", sock, "--drain-interval", "20ms")
	const n = 6
	out, err := exec.Command("/usr/bin/python3", "-c", chain, fmt.Sprint(n)).CombinedOutput()
	if err != nil {
		t.Fatalf("chain: %v\n%s", err, out)
	}
	endpoint := "front:" + strings.TrimSpace(string(out))

	type endpointJSON struct {
		Endpoint           string  `json:"endpoint"`
		Requests           int     `json:"requests"`
		ChildrenPerRequest float64 `json:"children_per_request"`
		CriticalTurns      float64 `json:"critical_turns_per_request"`
		P50                int64   `json:"p50_ns"`
	}
	type edgeJSON struct {
		Endpoint            string `json:"endpoint"`
		From, To            string
		ExchangesPerRequest float64 `json:"exchanges_per_request"`
	}
	var list struct {
		Endpoints []endpointJSON `json:"endpoints"`
		Edges     []edgeJSON     `json:"edges"`
		Recent    []struct {
			ID       string `json:"id"`
			Endpoint string `json:"endpoint"`
		} `json:"recent"`
		Stats struct {
			Ambiguous int `json:"ambiguous"`
		} `json:"stats"`
	}
	var got *endpointJSON
	var last string
	for deadline := time.Now().Add(20 * time.Second); got == nil; time.Sleep(300 * time.Millisecond) {
		code, out, stderr := run(t, nil, "requests", "--api", sock, "--json", "--trees")
		if code != 0 {
			t.Fatalf("requests: exit %d: %s", code, stderr)
		}
		last = out
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("requests --json: %v\n%s", err, out)
		}
		for i, e := range list.Endpoints {
			if e.Endpoint == endpoint && e.Requests == n {
				got = &list.Endpoints[i]
			}
		}
		if got == nil && time.Now().After(deadline) {
			t.Fatalf("no %d requests to %s after 20 s:\n%s", n, endpoint, last)
		}
	}
	if got.ChildrenPerRequest != 3 || got.CriticalTurns != 8 || got.P50 <= 0 {
		t.Errorf("%s: %+v; want 3 children and 8 turns on the critical path per request", endpoint, *got)
	}
	edge := false
	for _, e := range list.Edges {
		if e.Endpoint == endpoint && e.From == "front" && e.To == "backend" && e.ExchangesPerRequest == 3 {
			edge = true
		}
	}
	if !edge {
		t.Errorf("no front -> backend edge with 3 exchanges per request:\n%s", last)
	}
	if list.Stats.Ambiguous != 0 {
		t.Errorf("%d exchanges ambiguous", list.Stats.Ambiguous)
	}
	id := ""
	for _, r := range list.Recent {
		if r.Endpoint == endpoint {
			id = r.ID
		}
	}
	code, tree, stderr := run(t, nil, "requests", "--api", sock, id)
	if code != 0 || strings.Count(tree, "(linked by thread)") != 3 {
		t.Errorf("requests %s: exit %d, want a tree with its 3 calls linked by thread:\n%s%s", id, code, tree, stderr)
	}
	// The backend moved 20 ms away: its three calls are on the critical
	// path, one round trip each.
	code, js, stderr := run(t, nil, "explain", "--api", sock, "--request", id, "--what-if", "backend=+20ms", "--json")
	var w struct {
		WhatIf struct {
			RoundTrips float64 `json:"round_trips"`
			Added      int64   `json:"added_ns"`
		} `json:"what_if"`
	}
	if err := json.Unmarshal([]byte(js), &w); code != 0 || err != nil || w.WhatIf.RoundTrips != 3 || w.WhatIf.Added != int64(60*time.Millisecond) {
		t.Errorf("explain --request %s --what-if backend=+20ms: exit %d %v %+v, want 3 round trips, +60ms:\n%s%s", id, code, err, w, js, stderr)
	}
	if code, _, stderr := run(t, nil, "explain", "--api", sock, "--request", id, "--what-if", "backend"); code != 2 || !strings.Contains(stderr, "SERVICE=+DURATION") {
		t.Errorf("a what-if without its delay: exit %d, %q", code, stderr)
	}
	// flows, below its table, has the edge's turns per request too.
	if code, flows, stderr := run(t, nil, "flows", "--api", sock); code != 0 || !strings.Contains(flows, "TURNS/REQ") || !strings.Contains(flows, "front -> backend") {
		t.Errorf("flows: exit %d, want the front -> backend edge's turns per request below the table:\n%s%s", code, flows, stderr)
	}
	if code, _, stderr := run(t, nil, "requests", "--api", sock, "nope"); code != 1 || !strings.Contains(stderr, "no recent request") {
		t.Errorf("an unknown request: exit %d, %q", code, stderr)
	}
	m := scrape(t, metrics)
	edgeSeries := fmt.Sprintf(`{endpoint=%q,from="front",to="backend"}`, endpoint)
	if x, tu := m["lattrace_request_edge_exchanges_per_request"+edgeSeries], m["lattrace_request_edge_turns_per_request"+edgeSeries]; x != 3 || tu != 6 {
		t.Errorf("/metrics: front -> backend %v exchanges and %v turns per request, want 3 and 6", x, tu)
	}
	if m["lattrace_requests_total"] < n || m[`lattrace_request_hops_linked_total{method="thread"}`] < 3*n {
		t.Errorf("/metrics: %v requests, %v hops linked by thread; want %d and %d at least",
			m["lattrace_requests_total"], m[`lattrace_request_hops_linked_total{method="thread"}`], n, 3*n)
	}
}
