package apps

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/requests"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/goreqapp"
	"github.com/lattrace/lattrace/tests/netlab"
)

// The services of TestRequestTrees as their hops name them (each process's
// command).
const (
	curlComm  = "curl"
	nginxComm = "nginx"
	appComm   = "python3" // /usr/bin/python3, which names no thread of its own
	pgComm    = "postgres"
	redisComm = "redis-server"
)

// Each request of the application makes reqQueries PostgreSQL queries and
// then reqRedis redis calls, one after the other; a run is reqRuns
// requests, one at a time.
const (
	reqQueries = 5
	reqRedis   = 3
	reqRuns    = 20
	reqWorkers = 4
	// reqMove is the what-if's distance: the database's round trips
	// each this much longer.
	reqMove = 20 * time.Millisecond
)

// Request trees across services on one node (daemon/requests), held
// against the application's own account of each request: curl in A asks
// nginx in A, which proxies over a kept-alive connection to a Python
// application in A (testdata/reqapp.py), which answers each request with 5
// PostgreSQL queries and 3 redis calls to servers in B, through the lab's
// link. Only the application's calls to the databases cross the link. The
// application logs, for each request, its thread, when it had read the
// request and when it was about to answer (CLOCK_MONOTONIC, the records'
// clock) and the calls it made: each of them must be in exactly one tree,
// under that request's hop and no other; curl's own time for each request
// must be its tree's root; and the what-if of moving the databases 20 ms
// further must predict what raising the link's delay by as much does to
// curl's time. The handler's own thread makes the calls (the kernel's
// evidence: the thread that read the request), or one of a pool of workers
// it hands each request to through a queue (the evidence: the reader's
// futex wake-up of the worker). The control: two clients at once on one
// host, each asking a plain server, make trees of one hop each.
func TestRequestTrees(t *testing.T) {
	if out, err := osexec.Command("/usr/bin/python3", "-c", "import psycopg2, redis").CombinedOutput(); err != nil {
		t.Fatalf("the application needs Debian's python3-psycopg2 and python3-redis (APP_PKGS): %v\n%s", err, out)
	}
	t.Run("threads bbr", func(t *testing.T) {
		start := time.Now()
		a := newApp(t, "bbr")
		x := a.requestApp(0)
		x.warm()
		base := x.run("/req", record.LinkThread)
		// The move: every round trip between A and B, where PostgreSQL
		// and redis are, reqMove longer (half of it each way).
		if err := a.lab.SetLink(netlab.Both, netlab.Link{Delay: oneWay + reqMove/2}); err != nil {
			t.Fatal(err)
		}
		moved := x.run("/moved", record.LinkThread)
		var predicted []time.Duration
		for _, r := range base.trees {
			if r == nil {
				continue
			}
			// The link's delay grows for both databases: both
			// services' round trips take longer.
			predicted = append(predicted, requests.WhatIf(r, requests.Move{Service: pgComm, Extra: reqMove}).Added+
				requests.WhatIf(r, requests.Move{Service: redisComm, Extra: reqMove}).Added)
		}
		got, want := median(moved.curl)-median(base.curl), median(predicted)
		if !within(got, want, 0.10, 2*time.Millisecond) {
			t.Errorf("moving %s and %s %v further: curl's median went from %v to %v (+%v), the what-if predicted +%v (median of %d requests' predictions, %d round trips each expected)",
				pgComm, redisComm, reqMove, median(base.curl), median(moved.curl), got, want, len(predicted), reqQueries+reqRedis)
		}
		t.Logf("what-if %s and %s +%v: predicted +%v, curl's median +%v (%v -> %v); wall time %v",
			pgComm, redisComm, reqMove, want, got, median(base.curl), median(moved.curl), time.Since(start).Round(time.Millisecond))
	})
	t.Run("pool cubic", func(t *testing.T) {
		start := time.Now()
		a := newApp(t, "cubic")
		x := a.requestApp(reqWorkers)
		x.warm()
		x.run("/req", record.LinkHandoff)
		t.Logf("wall time %v", time.Since(start).Round(time.Millisecond))
	})
	t.Run("control bbr", func(t *testing.T) {
		start := time.Now()
		a := newApp(t, "bbr")
		// One nginx in B with two plain ports, each asked by a curl of
		// its own in A at the same time.
		conf := a.nginxConf(fmt.Sprintf("listen %[1]s:8080; listen %[1]s:8082;", a.server()))
		a.file("www/1024.bin", strings.Repeat("x", 1024))
		a.serve(8080, "nginx", "-c", conf, "-p", a.dir)
		from := record.Now()
		var cmds []*curlRun
		for _, port := range []int{8080, 8082} {
			cmds = append(cmds, a.startCurl(fmt.Sprintf("http://%s:%d", a.server(), port), "/1024.bin?", reqRuns))
		}
		var curls int
		for _, c := range cmds {
			curls += len(c.wait())
		}
		to := record.Now()
		a.quiesce()
		res := requests.Assemble(a.all(), 0)
		roots := 0
		for _, r := range res.Requests {
			if r.Root.Start < from || r.Root.Start > to {
				continue
			}
			roots++
			if r.Hops != 1 || r.Root.From != curlComm || r.Root.To != nginxComm {
				t.Errorf("control: a tree of %d hops rooted at %s -> %s (%s), want every tree one hop curl -> nginx:\n%s",
					r.Hops, r.Root.From, r.Root.To, r.ID, dumpTree(r.Root, ""))
			}
		}
		if roots != curls {
			t.Errorf("control: %d trees for the %d requests of the two curls", roots, curls)
		}
		if len(res.Ambiguous) != 0 || len(res.Waiting) != 0 {
			t.Errorf("control: %d outbound exchanges ambiguous and %d waiting, want none: %s", len(res.Ambiguous), len(res.Waiting),
				dumpExchanges(append(res.Ambiguous, res.Waiting...)))
		}
		t.Logf("control: %d trees of one hop for %d requests of two clients at once; wall time %v", roots, curls, time.Since(start).Round(time.Millisecond))
	})
}

// reqApp is the application of one subtest, its nginx in front and its
// databases.
type reqApp struct {
	a   *app
	url string
	log string // the application's account of its requests
}

// requestApp starts PostgreSQL and redis in B, and in A the application
// (workers > 0: with a pool of that many workers) and nginx proxying to it
// over kept-alive connections.
func (a *app) requestApp(workers int) *reqApp {
	a.t.Helper()
	const pgPort, redisPort, appPort, nginxPort = 5432, 6379, 8000, 8080
	a.postgres(pgPort)
	a.serve(redisPort, "redis-server", "--port", strconv.Itoa(redisPort), "--bind", a.server().String(),
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", a.dir)
	script, err := filepath.Abs("testdata/reqapp.py")
	if err != nil {
		a.t.Fatal(err)
	}
	x := &reqApp{a: a, url: fmt.Sprintf("http://127.0.0.1:%d", nginxPort), log: filepath.Join(a.dir, "reqapp.requests")}
	argv := []string{"/usr/bin/python3", script, "--listen", "127.0.0.1", "--port", strconv.Itoa(appPort),
		"--pg-host", a.server().String(), "--pg-port", strconv.Itoa(pgPort),
		"--redis-host", a.server().String(), "--redis-port", strconv.Itoa(redisPort),
		"--n", strconv.Itoa(reqQueries), "--m", strconv.Itoa(reqRedis), "--log", x.log}
	if workers > 0 {
		argv = append(argv, "--pool", strconv.Itoa(workers))
	}
	a.startA("reqapp", netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", appPort)), argv...)
	a.proxy(appPort, nginxPort, 4)
	return x
}

// proxy starts nginx in A on nginxPort, proxying every request to the
// application on appPort over kept-alive connections (keepalive of them
// idle at most).
func (a *app) proxy(appPort, nginxPort, keepalive int) {
	a.t.Helper()
	conf := a.file("proxy.conf", fmt.Sprintf(`daemon off;
user root;
worker_processes 1;
pid %[1]s/proxy.pid;
error_log stderr warn;
events { worker_connections 64; }
http {
	access_log off;
	client_body_temp_path %[1]s/body;
	proxy_temp_path %[1]s/proxy;
	fastcgi_temp_path %[1]s/fastcgi;
	uwsgi_temp_path %[1]s/uwsgi;
	scgi_temp_path %[1]s/scgi;
	keepalive_requests 1000000;
	upstream app {
		server 127.0.0.1:%[2]d;
		keepalive %[4]d;
		keepalive_requests 1000000;
	}
	server {
		listen 127.0.0.1:%[3]d;
		location / {
			proxy_pass http://app;
			proxy_http_version 1.1;
			proxy_set_header Connection "";
		}
	}
}
`, a.dir, appPort, nginxPort, keepalive))
	a.startA("nginx", netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", nginxPort)), "nginx", "-c", conf, "-p", a.dir)
}

// warm makes two requests before the runs: the first one's handler
// connects to the databases (its calls are inside it, not the runs').
func (x *reqApp) warm() {
	c := x.a.startCurl(x.url, "/warm/", 2)
	c.wait()
	x.a.settle()
}

// reqRun is one run's truth and trees: curl's time for each request, and
// the tree of each (in the order of their start; nil where none).
type reqRun struct {
	curl  []time.Duration
	trees []*record.Request
}

// run makes reqRuns requests under prefix, one at a time from one curl,
// then holds the trees of every exchange on the node against the
// application's log and curl's times: each calling hop linked by method.
func (x *reqApp) run(prefix string, method record.LinkMethod) reqRun {
	a, t := x.a, x.a.t
	t.Helper()
	from := record.Now()
	c := a.startCurl(x.url, prefix+"/", reqRuns)
	times := c.wait()
	to := record.Now()
	a.settle()
	var logged []appReq
	for _, l := range readAppLog(t, x.log) {
		if strings.HasPrefix(l.path, prefix+"/") && l.t0 >= from && l.t1 <= to {
			logged = append(logged, l)
		}
	}
	if len(logged) != reqRuns || len(times) != reqRuns {
		t.Fatalf("%s: the application logged %d requests and curl timed %d, for %d", prefix, len(logged), len(times), reqRuns)
	}
	for _, l := range logged {
		if l.pg != reqQueries || l.redis != reqRedis {
			t.Fatalf("%s: the application made %d queries and %d redis calls for %s, want %d and %d", prefix, l.pg, l.redis, l.path, reqQueries, reqRedis)
		}
	}
	res := requests.Assemble(a.all(), 0)
	trees := checkTrees(t, prefix, res, logged, times, from, to, method)
	return reqRun{curl: times, trees: trees}
}

// appReq is one line of the application's log.
type appReq struct {
	path          string
	handler, doer uint32 // the handler's thread and the one that made the calls
	t0, t1        record.Mono
	pg, redis     int
}

func readAppLog(t *testing.T, path string) []appReq {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []appReq
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 8 || f[0] != "req" {
			t.Fatalf("the application's log: line %q", line)
		}
		n := make([]uint64, 6)
		for i := range n {
			if n[i], err = strconv.ParseUint(f[2+i], 10, 64); err != nil {
				t.Fatalf("the application's log: line %q: %v", line, err)
			}
		}
		out = append(out, appReq{path: f[1], handler: uint32(n[0]), t0: record.Mono(n[1]), t1: record.Mono(n[2]),
			pg: int(n[3]), redis: int(n[4]), doer: uint32(n[5])})
	}
	return out
}

// span is where a hop is busy for its parent: its requester's first write
// to its answer read (as daemon/requests counts it).
func span(h *record.Hop) (lo, hi record.Mono) {
	if e := h.Client; e != nil {
		lo = cmpOr(e.Timeline.W0, e.Start)
		hi = cmpOr(e.Timeline.D1, e.Timeline.R1, e.End)
		return lo, hi
	}
	return h.Start, h.End
}

// serving is where the responder of a hop holds its request: from its
// first byte arriving to the last write of its answer.
func serving(h *record.Hop) (lo, hi record.Mono) {
	e := h.Server
	if e == nil {
		return 0, 0
	}
	return cmpOr(e.Timeline.R0, e.Start), cmpOr(e.Timeline.W1, e.End)
}

func cmpOr(v ...record.Mono) record.Mono {
	for _, m := range v {
		if m != 0 {
			return m
		}
	}
	return 0
}

// brackets: hop h (nginx -> the application) is the one of logged request
// l: its responder read the request before l began and answered after l
// ended.
func brackets(h *record.Hop, l appReq) bool {
	lo, hi := serving(h)
	return lo != 0 && lo <= l.t0 && l.t1 <= hi
}

// inside: hop h ran within logged request l.
func inside(h *record.Hop, l appReq) bool {
	lo, hi := span(h)
	return l.t0 <= lo && hi <= l.t1
}

// walk calls fn for every hop under h, with its parent (nil for h).
func walk(h, parent *record.Hop, fn func(h, parent *record.Hop)) {
	fn(h, parent)
	for _, c := range h.Children {
		walk(c, h, fn)
	}
}

// checkTrees holds the trees of one run against the application's log
// (logged: the run's requests, in order) and curl's times, and returns
// each request's tree in order (nil where none).
func checkTrees(t *testing.T, run string, res *requests.Result, logged []appReq, curl []time.Duration, from, to record.Mono, method record.LinkMethod) []*record.Request {
	t.Helper()
	during := func(e *record.Exchange) bool { return e.Start >= from && e.Start <= to }
	// The subtest runs one request at a time from its start: nothing is
	// ambiguous, and after the run's records nothing waits.
	if len(res.Ambiguous) != 0 || len(res.Waiting) != 0 {
		t.Errorf("%s: %d outbound exchanges ambiguous and %d waiting at concurrency 1, want none:%s",
			run, len(res.Ambiguous), len(res.Waiting), dumpExchanges(append(slices.Clone(res.Ambiguous), res.Waiting...)))
	}
	// The trees rooted at curl, and in each the hops nginx -> the
	// application.
	var roots []*record.Request
	appHops := map[*record.Hop]*record.Request{}
	for _, r := range res.Requests {
		if r.Root.From != curlComm || r.Root.To != nginxComm {
			continue
		}
		if during(r.Root.Client) {
			roots = append(roots, r)
		}
		walk(r.Root, nil, func(h, _ *record.Hop) {
			if h.From == nginxComm && h.To == appComm {
				appHops[h] = r
			}
		})
	}
	// 1. Each logged request in exactly one tree, with its calls under
	// its hop, each linked, each within the request.
	out := make([]*record.Request, len(logged))
	methods := map[record.LinkMethod]int{}
	for i, l := range logged {
		var found []*record.Hop
		for h := range appHops {
			if brackets(h, l) {
				found = append(found, h)
			}
		}
		if len(found) != 1 {
			t.Errorf("%s: request %s (logged %d..%d by thread %d) is in %d trees rooted at curl -> nginx, want 1%s",
				run, l.path, l.t0, l.t1, l.handler, len(found), dumpAround(res, l))
			continue
		}
		h := found[0]
		out[i] = appHops[h]
		var pg, rd int
		var bad []string
		for _, c := range h.Children {
			if c.From != appComm {
				bad = append(bad, fmt.Sprintf("a hop %s -> %s", c.From, c.To))
				continue
			}
			switch c.To {
			case pgComm:
				pg++
			case redisComm:
				rd++
			default:
				bad = append(bad, fmt.Sprintf("a hop %s -> %s", c.From, c.To))
			}
			methods[c.Link]++
			lo, hi := span(c)
			if c.Link != method {
				bad = append(bad, fmt.Sprintf("%s -> %s linked by %q, want %q", c.From, c.To, c.Link, method))
			}
			if !inside(c, l) {
				bad = append(bad, fmt.Sprintf("%s -> %s at %d..%d, outside the request's %d..%d", c.From, c.To, lo, hi, l.t0, l.t1))
			}
			if c.Client != nil && c.Client.Ctx != uint64(l.doer) {
				bad = append(bad, fmt.Sprintf("%s -> %s written by context %d, the application's calls made by thread %d", c.From, c.To, c.Client.Ctx, l.doer))
			}
		}
		if pg != l.pg || rd != l.redis || len(bad) > 0 {
			t.Errorf("%s: request %s (handler thread %d, calls by thread %d): %d hops %s -> %s and %d %s -> %s under it, the application made %d and %d; %s\n%s",
				run, l.path, l.handler, l.doer, pg, appComm, pgComm, rd, appComm, redisComm, l.pg, l.redis, strings.Join(bad, "; "), dumpTree(appHops[h].Root, ""))
		}
	}
	// No call linked under a request it was not made for, nor left out
	// of the one it was.
	wrong, unlinked := 0, 0
	for _, r := range res.Requests {
		walk(r.Root, nil, func(h, parent *record.Hop) {
			if h.From != appComm {
				return
			}
			var mine *appReq
			for i, l := range logged {
				if inside(h, l) {
					mine = &logged[i]
				}
			}
			if mine == nil {
				return
			}
			lo, hi := span(h)
			switch {
			case parent == nil:
				unlinked++
				t.Errorf("%s: %s -> %s at %d..%d, inside request %s, is a root of its own%s", run, h.From, h.To, lo, hi, mine.path, dumpExchanges([]*record.Exchange{h.Client}))
			case !brackets(parent, *mine):
				wrong++
				plo, phi := serving(parent)
				t.Errorf("%s: %s -> %s at %d..%d, inside request %s (%d..%d), linked (%s) under %s -> %s serving %d..%d%s",
					run, h.From, h.To, lo, hi, mine.path, mine.t0, mine.t1, h.Link, parent.From, parent.To, plo, phi, dumpExchanges([]*record.Exchange{h.Client, parent.Server}))
			}
		})
	}
	// 2. curl's own time for each request is its tree's root. curl
	// times a request from before its connection was set up (the first
	// one; the others reuse it) to its answer read, as the root's
	// requester does (from connect on a connection's first exchange):
	// the URLs are addresses, so no name is resolved, and one curl makes
	// every request, so no process start is in any of them.
	if len(roots) != len(curl) {
		t.Errorf("%s: %d trees rooted at curl -> nginx for the %d requests curl timed", run, len(roots), len(curl))
	} else {
		for i, r := range roots {
			if !within(r.Duration, curl[i], 0.05, time.Millisecond) {
				t.Errorf("%s: request %d: its tree's root took %v, curl's own time %v", run, i+1, r.Duration, curl[i])
			}
		}
	}
	var durs []time.Duration
	for _, r := range roots {
		durs = append(durs, r.Duration)
	}
	t.Logf("%s: %d requests, %d trees rooted at curl, hops linked by %v, %d wrong links, %d left unlinked, %d ambiguous; root median %v, curl's %v",
		run, len(logged), len(roots), methods, wrong, unlinked, len(res.Ambiguous), median(durs), median(curl))
	return out
}

// dumpTree draws a tree with each hop's evidence, for a failure message.
func dumpTree(h *record.Hop, indent string) string {
	var b strings.Builder
	lo, hi := span(h)
	fmt.Fprintf(&b, "%s%s -> %s link %q span %d..%d turns %d critical %v", indent, h.From, h.To, h.Link, lo, hi, h.Turns, h.Critical)
	if e := h.Client; e != nil {
		fmt.Fprintf(&b, " client{ctx %d served %+v}", e.Ctx, e.Served)
	}
	if e := h.Server; e != nil {
		slo, shi := serving(h)
		fmt.Fprintf(&b, " server{ctx %d cookie %d in_seq %d serving %d..%d}", e.Ctx, e.Cookie, e.InSeq, slo, shi)
	}
	b.WriteString("\n")
	for _, c := range h.Children {
		b.WriteString(dumpTree(c, indent+"  "))
	}
	return b.String()
}

func dumpExchanges(exs []*record.Exchange) string {
	var b strings.Builder
	for _, e := range exs {
		if e == nil {
			continue
		}
		fmt.Fprintf(&b, "\n  %s pid %d %s %s -> %s cookie %d start %d w0 %d d1 %d r0 %d w1 %d ctx %d served %+v",
			e.Owner.Comm, e.Owner.PID, e.Role, e.Flow.Local, e.Flow.Remote, e.Cookie, e.Start, e.Timeline.W0, e.Timeline.D1, e.Timeline.R0, e.Timeline.W1, e.Ctx, e.Served)
	}
	return b.String()
}

// dumpAround lists the application's exchanges around a logged request.
func dumpAround(res *requests.Result, l appReq) string {
	var exs []*record.Exchange
	for e := range res.Members {
		if e.Owner.Comm == appComm && e.End >= l.t0-record.Mono(50*time.Millisecond) && e.Start <= l.t1+record.Mono(50*time.Millisecond) {
			exs = append(exs, e)
		}
	}
	slices.SortFunc(exs, func(a, b *record.Exchange) int { return int(int64(a.Start) - int64(b.Start)) })
	if len(exs) == 0 {
		return "; no exchange of the application near it"
	}
	return "; the application's exchanges near it:" + dumpExchanges(exs)
}

// startA starts a process in A (app.start).
func (a *app) startA(name string, addr netip.AddrPort, argv ...string) {
	a.t.Helper()
	a.start(a.lab.A, name, addr, argv...)
}

// curlRun is one curl in A fetching n URLs one after the other over one
// connection, printing each one's time.
type curlRun struct {
	a        *app
	cmd      *osexec.Cmd
	out, err bytes.Buffer
}

func (a *app) startCurl(base, prefix string, n int) *curlRun {
	a.t.Helper()
	argv := []string{"-sS", "--fail", "-w", "%{time_total}\n"}
	for i := 1; i <= n; i++ {
		argv = append(argv, "-o", "/dev/null", fmt.Sprintf("%s%s%d", base, prefix, i))
	}
	c := &curlRun{a: a, cmd: a.lab.A.Command(context.Background(), "curl", argv...)}
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.err
	if err := a.clients.Start(c.cmd); err != nil {
		a.t.Fatalf("curl: %v", err)
	}
	return c
}

// wait returns curl's time for each request.
func (c *curlRun) wait() []time.Duration {
	t := c.a.t
	t.Helper()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("curl: %v\n%s%s", err, c.out.String(), c.err.String())
	}
	var out []time.Duration
	for _, f := range strings.Fields(c.out.String()) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			t.Fatalf("curl's times: %q: %v", c.out.String(), err)
		}
		out = append(out, time.Duration(v*float64(time.Second)))
	}
	return out
}

// settle waits until the tracer has reported nothing new for two seconds:
// the exchanges of connections that stay open (nginx's to the application,
// the application's to the databases) are written by the idle sweep within
// about a second of their end.
func (a *app) settle() {
	a.t.Helper()
	last, since := -1, time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		a.col.Mu.Lock()
		n := len(a.col.Exchanges)
		a.col.Mu.Unlock()
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > 2*time.Second {
			return
		}
	}
	a.t.Fatal("the tracer kept reporting exchanges for 30 s after the client's end")
}

// all is every exchange collected so far, both hosts.
func (a *app) all() []*record.Exchange {
	a.col.Mu.Lock()
	defer a.col.Mu.Unlock()
	return slices.Clone(a.col.Exchanges)
}

// The Go application of TestRequestTreesGo as its hops name it: the name
// of the link it is started by (tests/goreqapp).
const goAppComm = "goreqapp"

// TestRequestTreesGo's runs: goRuns requests one at a time, then goClients
// clients at once, goClientRuns requests each.
const (
	goRuns       = 20
	goClients    = 8
	goClientRuns = 12
)

// Request trees through a Go application (tests/goreqapp): curl in A asks
// nginx in A, which proxies over kept-alive connections to a Go HTTP server
// in A (net/http: a goroutine per connection), whose handler's goroutine
// answers each request with 5 PostgreSQL queries (database/sql and lib/pq)
// and 3 redis calls (go-redis) to servers in B, over pools of connections
// opened before it listens. The application logs, for each request, when
// its handler began and ended (CLOCK_MONOTONIC, the records' clock), the
// connection it came on, and each call's write to its database with the
// connection it went on: each of the application's exchanges with the
// databases is known to be one request's, however many run at once.
//
// One request at a time, every call is linked under its request's hop and
// no other, and each request is one tree rooted at curl with curl's time.
// Eight at once (eight curls), the requests' goroutines share the
// runtime's threads: what a thread read, or was woken by, says nothing of
// the request a goroutine on it serves, so the evidence must follow the
// goroutines (bpf/request_links.bpf.h), and where it names no single
// request a call is left ambiguous (or waiting), never guessed. Every call
// linked must be under its own request (none under
// another, none a root of its own), every call not linked is counted
// ambiguous or waiting, and no request's tree holds more than its own
// calls. The same holds of nginx's hops to the application, an event loop
// serving eight clients. The calls' links are checked twice: in the trees
// of every exchange on the node, and in those of the application alone
// (nginx's side of its hops left out, so that a call linked under a hop of
// nginx's left ambiguous is still seen).
func TestRequestTreesGo(t *testing.T) {
	bin, err := goreqapp.Binary()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a := newApp(t, "bbr")
	x := a.goRequestApp(bin)
	x.warm()
	x.run("/one", 1, goRuns)
	x.run("/eight", goClients, goClientRuns)
	t.Logf("wall time %v", time.Since(start).Round(time.Millisecond))
}

// goReqApp is the Go application with its nginx in front and its
// databases.
type goReqApp struct {
	a   *app
	url string
	log string // the application's account of its requests
}

const goPGPort, goRedisPort, goAppPort, goNginxPort = 5432, 6379, 8000, 8080

// goRequestApp starts PostgreSQL and redis in B, and in A the Go
// application bin and nginx proxying to it.
func (a *app) goRequestApp(bin string) *goReqApp {
	a.t.Helper()
	a.postgres(goPGPort)
	a.serve(goRedisPort, "redis-server", "--port", strconv.Itoa(goRedisPort), "--bind", a.server().String(),
		"--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", a.dir)
	// Started by a link of its name, which its processes take as their
	// command (the binary's own is goreqapp-<hash>).
	link := filepath.Join(a.dir, goAppComm)
	if err := os.Symlink(bin, link); err != nil {
		a.t.Fatal(err)
	}
	x := &goReqApp{a: a, url: fmt.Sprintf("http://127.0.0.1:%d", goNginxPort), log: filepath.Join(a.dir, "goreqapp.requests")}
	a.startA(goAppComm, netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", goAppPort)), link,
		"-listen", fmt.Sprintf("127.0.0.1:%d", goAppPort),
		"-pg", fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", a.server(), goPGPort),
		"-redis", netip.AddrPortFrom(a.server(), goRedisPort).String(),
		"-n", strconv.Itoa(reqQueries), "-m", strconv.Itoa(reqRedis), "-conns", strconv.Itoa(goClients+2), "-log", x.log)
	a.proxy(goAppPort, goNginxPort, 2*goClients)
	return x
}

// warm makes two requests from each of goClients clients at once, so that
// nginx has its connections to the application open before the runs.
func (x *goReqApp) warm() {
	var cs []*curlRun
	for i := 1; i <= goClients; i++ {
		cs = append(cs, x.a.startCurl(x.url, fmt.Sprintf("/warm/%d/", i), 2))
	}
	for _, c := range cs {
		c.wait()
	}
	x.a.settle()
}

// goReq is one request of the Go application's log; goCall one of its
// calls' writes.
type goReq struct {
	path      string
	goid      uint64
	tid       uint32
	t0, t1    record.Mono
	pg, redis int
	peer      uint16
	calls     []goCall
}

type goCall struct {
	svc    string // "pg" or "redis"
	port   uint16 // the application's end of the connection
	tid    uint32
	w0, w1 record.Mono
}

// readGoAppLog reads the application's log (tests/goreqapp): its requests,
// and the writes to the databases no request made.
func readGoAppLog(t *testing.T, path string) (reqs []goReq, orphans []goCall) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	num := func(line, s string) uint64 {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("the application's log: line %q: %v", line, err)
		}
		return v
	}
	call := func(line, svc, port, tid, w0, w1 string) goCall {
		return goCall{svc: svc, port: uint16(num(line, port)), tid: uint32(num(line, tid)), w0: record.Mono(num(line, w0)), w1: record.Mono(num(line, w1))}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 10 && f[0] == "req":
			r := goReq{path: f[1], goid: num(line, f[2]), tid: uint32(num(line, f[3])), t0: record.Mono(num(line, f[4])), t1: record.Mono(num(line, f[5])),
				pg: int(num(line, f[6])), redis: int(num(line, f[7])), peer: uint16(num(line, f[8]))}
			if f[9] != "-" {
				for _, c := range strings.Split(f[9], ",") {
					p := strings.Split(c, ":")
					if len(p) != 5 {
						t.Fatalf("the application's log: line %q: call %q", line, c)
					}
					r.calls = append(r.calls, call(line, p[0], p[1], p[2], p[3], p[4]))
				}
			}
			reqs = append(reqs, r)
		case len(f) == 7 && f[0] == "orphan":
			orphans = append(orphans, call(line, f[1], f[2], f[4], f[5], f[6]))
		default:
			t.Fatalf("the application's log: line %q", line)
		}
	}
	return reqs, orphans
}

// run makes n requests under prefix from each of clients curls at once
// (prefix/i/ for the i-th), then holds the trees of every exchange on the
// node against the application's log and curl's times.
func (x *goReqApp) run(prefix string, clients, n int) {
	a, t := x.a, x.a.t
	t.Helper()
	start := time.Now()
	from := record.Now()
	var cs []*curlRun
	for i := 1; i <= clients; i++ {
		cs = append(cs, a.startCurl(x.url, fmt.Sprintf("%s/%d/", prefix, i), n))
	}
	times := make([][]time.Duration, clients)
	pids := make([]uint32, clients)
	for i, c := range cs {
		times[i] = c.wait()
		pids[i] = uint32(c.cmd.Process.Pid)
		if len(times[i]) != n {
			t.Fatalf("%s: curl %d timed %d requests, for %d", prefix, i+1, len(times[i]), n)
		}
	}
	to := record.Now()
	a.settle()
	reqs, orphans := readGoAppLog(t, x.log)
	var logged []goReq
	for _, l := range reqs {
		if strings.HasPrefix(l.path, prefix+"/") && l.t0 >= from && l.t1 <= to {
			logged = append(logged, l)
		}
	}
	if len(logged) != clients*n {
		t.Fatalf("%s: the application logged %d requests, for %d", prefix, len(logged), clients*n)
	}
	for _, l := range logged {
		if l.pg != reqQueries || l.redis != reqRedis || len(l.calls) != reqQueries+reqRedis {
			t.Fatalf("%s: the application made %d queries and %d redis calls (%d writes) for %s, want %d and %d, one write each",
				prefix, l.pg, l.redis, len(l.calls), l.path, reqQueries, reqRedis)
		}
	}
	for _, o := range orphans {
		if o.w0 >= from && o.w0 <= to {
			t.Errorf("%s: the application wrote to %s on its port %d, in no request, at %d", prefix, o.svc, o.port, o.w0)
		}
	}
	x.check(prefix, clients, logged, pids, times, from, to)
	t.Logf("%s: %d requests from %d clients at once; wall time %v", prefix, len(logged), clients, time.Since(start).Round(time.Millisecond))
}

// exSpan and exServing are span and serving of one exchange.
func exSpan(e *record.Exchange) (lo, hi record.Mono) {
	return cmpOr(e.Timeline.W0, e.Start), cmpOr(e.Timeline.D1, e.Timeline.R1, e.End)
}

func exServing(e *record.Exchange) (lo, hi record.Mono) {
	return cmpOr(e.Timeline.R0, e.Start), cmpOr(e.Timeline.W1, e.End)
}

// check holds one run's trees against the truth of the application's log
// (logged: the run's requests) and its curls' (pids, the times of each).
func (x *goReqApp) check(run string, clients int, logged []goReq, pids []uint32, curl [][]time.Duration, from, to record.Mono) {
	a, t := x.a, x.a.t
	t.Helper()
	all := a.all()
	during := func(e *record.Exchange) bool { return e.Start >= from && e.Start <= to }
	byPath := map[string]int{}
	for i, l := range logged {
		byPath[l.path] = i
	}
	// The truth, from the log: each request's exchange at the
	// application (the connection it came on, and its time); each call's
	// exchange (the connection it went on, and its first write); each
	// curl's requests in order (one connection each).
	type ref struct{ req, call int }
	callsOn := map[uint16][]ref{}
	for i, l := range logged {
		for k, c := range l.calls {
			callsOn[c.port] = append(callsOn[c.port], ref{i, k})
		}
	}
	served := make([]*record.Exchange, len(logged)) // the application's responder exchange of each request
	reqOf := map[*record.Exchange]int{}             // and back
	callOf := map[*record.Exchange]int{}            // a call's exchange: its request
	callUsed := map[ref]int{}
	var calls []*record.Exchange // the application's exchanges with the databases
	curlOf := map[int]*record.Exchange{}
	var curlEx [][]*record.Exchange = make([][]*record.Exchange, clients)
	pidIdx := map[uint32]int{}
	for i, p := range pids {
		pidIdx[p] = i
	}
	for _, e := range all {
		if !during(e) {
			continue
		}
		if ci, ok := pidIdx[e.Owner.PID]; ok && e.Owner.Comm == curlComm && e.Role == record.Requester {
			curlEx[ci] = append(curlEx[ci], e)
		}
		if e.Owner.Comm != goAppComm {
			continue
		}
		switch {
		case e.Role == record.Responder && e.Flow.Local.Port() == goAppPort:
			lo, hi := exServing(e)
			for i, l := range logged {
				if e.Flow.Remote.Port() == l.peer && lo <= l.t0 && l.t1 <= hi {
					if served[i] != nil {
						t.Errorf("%s: request %s in two exchanges of the application:%s", run, l.path, dumpExchanges([]*record.Exchange{served[i], e}))
					}
					served[i] = e
					reqOf[e] = i
				}
			}
		case e.Role == record.Requester && (e.Flow.Remote.Port() == goPGPort || e.Flow.Remote.Port() == goRedisPort):
			calls = append(calls, e)
			svc := "pg"
			if e.Flow.Remote.Port() == goRedisPort {
				svc = "redis"
			}
			w, _ := exSpan(e)
			var found []ref
			for _, r := range callsOn[e.Flow.Local.Port()] {
				if c := logged[r.req].calls[r.call]; c.svc == svc && c.w0 <= w && w <= c.w1 {
					found = append(found, r)
				}
			}
			if len(found) != 1 {
				t.Errorf("%s: the application's exchange with %s from port %d at %d is %d of its logged calls' writes, want 1:%s",
					run, svc, e.Flow.Local.Port(), w, len(found), dumpExchanges([]*record.Exchange{e}))
				continue
			}
			callOf[e] = found[0].req
			callUsed[found[0]]++
		}
	}
	for i, l := range logged {
		if served[i] == nil {
			t.Errorf("%s: request %s (logged %d..%d on nginx's port %d) in no exchange of the application", run, l.path, l.t0, l.t1, l.peer)
		}
		for k, c := range l.calls {
			if n := callUsed[ref{i, k}]; n != 1 {
				t.Errorf("%s: request %s: its call to %s from port %d, written at %d..%d, is %d exchanges, want 1", run, l.path, c.svc, c.port, c.w0, c.w1, n)
			}
		}
	}
	if want := len(logged) * (reqQueries + reqRedis); len(calls) != want {
		t.Errorf("%s: %d exchanges of the application with the databases for %d calls", run, len(calls), want)
	}
	// curl's j-th exchange is its j-th request.
	for ci, exs := range curlEx {
		slices.SortFunc(exs, func(a, b *record.Exchange) int { return int(int64(a.Start) - int64(b.Start)) })
		if len(exs) != len(curl[ci]) {
			t.Errorf("%s: curl %d made %d exchanges for its %d requests%s", run, ci+1, len(exs), len(curl[ci]), dumpExchanges(exs))
			continue
		}
		for j, e := range exs {
			p := fmt.Sprintf("%s/%d/%d", run, ci+1, j+1)
			if i, ok := byPath[p]; ok {
				curlOf[i] = e
			}
		}
	}
	// The context that wrote each call (Exchange.Ctx: a thread, or in a Go
	// program whose goroutines lattrace follows, a goroutine), against the
	// one that read its request: the handler's goroutine does both.
	sameCtx, goCtx := 0, 0
	for e, i := range callOf {
		if e.Ctx&record.CtxGoroutine != 0 {
			goCtx++
		}
		if s := served[i]; s != nil && e.Ctx != 0 && e.Ctx == s.Ctx {
			sameCtx++
		}
	}

	// tally is what one set of trees made of the calls (and of nginx's
	// hops to the application).
	type tally struct {
		linked                   map[record.LinkMethod]int
		ambiguous, waiting, lost int
		wrong, roots             int
		nginx                    map[record.LinkMethod]int
		nginxAmbiguous           int
		nginxWaiting             int
	}
	views := []struct {
		name string
		exs  []*record.Exchange
	}{{"node", all}, {"application", slices.DeleteFunc(slices.Clone(all), func(e *record.Exchange) bool {
		return e.Owner.Comm == nginxComm && e.Role == record.Requester && e.Flow.Remote.Port() == goAppPort
	})}}
	for _, v := range views {
		res := requests.Assemble(v.exs, 0)
		tl := tally{linked: map[record.LinkMethod]int{}, nginx: map[record.LinkMethod]int{}}
		// The first few failures of a view in full, the rest counted.
		shown, more := 0, 0
		fail := func(format string, args ...any) {
			t.Helper()
			if shown++; shown > 8 {
				more++
				return
			}
			t.Errorf(format, args...)
		}
		seen := map[*record.Exchange]bool{}
		kids := map[*record.Exchange]map[string]int{}
		var roots []*record.Request
		for _, r := range res.Requests {
			if r.Root.Client != nil && r.Root.From == curlComm && during(r.Root.Client) {
				roots = append(roots, r)
			}
			walk(r.Root, nil, func(h, parent *record.Hop) {
				// nginx's hop to the application: under curl's request
				// of the same path.
				if i, ok := reqOf[h.Server]; ok && h.Client != nil {
					l := logged[i]
					switch {
					case parent == nil && r.Detached && h == r.Root:
						// Ambiguous (counted below): it roots a detached
						// request, its calls under it.
					case parent == nil:
						tl.roots++
						fail("%s (%s trees): nginx -> %s of request %s is a root of its own%s", run, v.name, goAppComm, l.path, dumpExchanges([]*record.Exchange{h.Client}))
					case curlOf[i] == nil:
					case parent.Client != curlOf[i]:
						tl.wrong++
						fail("%s (%s trees): nginx -> %s of request %s linked (%s) under curl's exchange %s, not its own%s\n%s",
							run, v.name, goAppComm, l.path, h.Link, dumpExchanges([]*record.Exchange{parent.Client}), dumpExchanges([]*record.Exchange{h.Client, curlOf[i]}), dumpTree(r.Root, ""))
					default:
						tl.nginx[h.Link]++
					}
				}
				if h.Client == nil {
					return
				}
				i, ok := callOf[h.Client]
				if !ok {
					return
				}
				seen[h.Client] = true
				l := logged[i]
				lo, hi := span(h)
				switch {
				case parent == nil:
					tl.roots++
					fail("%s (%s trees): %s -> %s at %d..%d, a call of request %s (%d..%d), is a root of its own%s",
						run, v.name, h.From, h.To, lo, hi, l.path, l.t0, l.t1, dumpExchanges([]*record.Exchange{h.Client}))
				case parent.Server == nil || parent.Server != served[i]:
					tl.wrong++
					other := "an exchange of no logged request"
					if j, ok := reqOf[parent.Server]; ok {
						other = fmt.Sprintf("request %s (%d..%d)", logged[j].path, logged[j].t0, logged[j].t1)
					}
					fail("%s (%s trees): %s -> %s at %d..%d (ctx %d, served %+v), a call of request %s (%d..%d, goroutine %d, thread %d at its start), linked (%s) under %s -> %s of %s%s",
						run, v.name, h.From, h.To, lo, hi, h.Client.Ctx, h.Client.Served, l.path, l.t0, l.t1, l.goid, l.tid, h.Link, parent.From, parent.To, other,
						dumpExchanges([]*record.Exchange{h.Client, parent.Server}))
				default:
					tl.linked[h.Link]++
					if !(l.t0 <= lo && hi <= l.t1) {
						fail("%s (%s trees): %s -> %s at %d..%d, outside its request %s's %d..%d", run, v.name, h.From, h.To, lo, hi, l.path, l.t0, l.t1)
					}
				}
				if parent != nil && parent.Server != nil {
					if kids[parent.Server] == nil {
						kids[parent.Server] = map[string]int{}
					}
					kids[parent.Server][h.To]++
				}
			})
		}
		ambiguous, waiting := map[*record.Exchange]bool{}, map[*record.Exchange]bool{}
		for _, e := range res.Ambiguous {
			ambiguous[e] = true
			if e.Owner.Comm == nginxComm && e.Flow.Remote.Port() == goAppPort && during(e) {
				tl.nginxAmbiguous++
			}
		}
		for _, e := range res.Waiting {
			waiting[e] = true
			if e.Owner.Comm == nginxComm && e.Flow.Remote.Port() == goAppPort && during(e) {
				tl.nginxWaiting++
			}
		}
		var left []*record.Exchange // the calls ambiguous or waiting
		for _, e := range calls {
			switch {
			case seen[e]:
			case ambiguous[e]:
				tl.ambiguous++
				left = append(left, e)
			case waiting[e]:
				tl.waiting++
				left = append(left, e)
			case v.name == "node":
				// Linked under a hop of nginx's left out of every
				// tree (ambiguous or waiting itself).
				tl.lost++
			default:
				fail("%s (%s trees): a call of the application in no tree, neither ambiguous nor waiting:%s", run, v.name, dumpExchanges([]*record.Exchange{e}))
			}
		}
		linked := 0
		for _, n := range tl.linked {
			linked += n
		}
		if tl.wrong+tl.roots > 0 {
			t.Errorf("%s (%s trees): %d hops linked under another request than their own, %d calls roots of their own", run, v.name, tl.wrong, tl.roots)
		}
		if linked+tl.ambiguous+tl.waiting+tl.lost+tl.roots+tl.wrong != len(calls) {
			t.Errorf("%s (%s trees): %d calls linked, %d ambiguous, %d waiting, %d under a hop left out, %d roots, %d wrong: not the %d calls",
				run, v.name, linked, tl.ambiguous, tl.waiting, tl.lost, tl.roots, tl.wrong, len(calls))
		}
		// No request holds more than its own calls; one at a time, every
		// request holds them all, and every tree is one request of curl's.
		for i, l := range logged {
			k := kids[served[i]]
			if k[pgComm] > l.pg || k[redisComm] > l.redis || len(k) > 2 || clients == 1 && (k[pgComm] != l.pg || k[redisComm] != l.redis) {
				fail("%s (%s trees): request %s holds %v, it made %d queries and %d redis calls", run, v.name, l.path, k, l.pg, l.redis)
			}
		}
		if more > 0 {
			t.Errorf("%s (%s trees): %d more failures like those above", run, v.name, more)
		}
		if clients == 1 {
			if tl.ambiguous+tl.waiting+tl.lost+tl.nginxAmbiguous+tl.nginxWaiting != 0 {
				t.Errorf("%s (%s trees): one request at a time, %d calls ambiguous, %d waiting and %d under a hop left out, %d of nginx's hops ambiguous and %d waiting: want none%s",
					run, v.name, tl.ambiguous, tl.waiting, tl.lost, tl.nginxAmbiguous, tl.nginxWaiting, dumpExchanges(left[:min(len(left), 8)]))
			}
			if v.name == "node" {
				if len(roots) != len(curl[0]) {
					t.Errorf("%s: %d trees rooted at curl for the %d requests curl timed", run, len(roots), len(curl[0]))
				} else {
					for j, r := range roots {
						if !within(r.Duration, curl[0][j], 0.05, time.Millisecond) {
							t.Errorf("%s: request %d: its tree's root took %v, curl's own time %v", run, j+1, r.Duration, curl[0][j])
						}
					}
				}
			}
		}
		t.Logf("%s (%s trees): %d calls: linked %v, %d ambiguous, %d waiting, %d under a hop of nginx's left out, %d roots, %d wrong; nginx's hops to the application linked %v, %d ambiguous, %d waiting; %d trees rooted at curl",
			run, v.name, len(calls), tl.linked, tl.ambiguous, tl.waiting, tl.lost, tl.roots, tl.wrong, tl.nginx, tl.nginxAmbiguous, tl.nginxWaiting, len(roots))
	}
	t.Logf("%s: %d of the %d calls written by the context that read their request (%d by a goroutine)", run, sameCtx, len(calls), goCtx)
}
