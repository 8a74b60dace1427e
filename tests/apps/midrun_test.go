package apps

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/capture"
	"github.com/lattrace/lattrace/tests/labtrace"
)

// Mid-run: the tracer starts while the client is already running, as a
// DaemonSet installed on a busy node does. The connections it finds open
// are adopted: their ends' roles come from the kernel's listening sockets
// (RoleSource "listener"), and the first exchange seen on each end is
// partial. Of the requests that began after the tracer started, the
// tracer must say what it says of a run it saw from the start: one
// exchange per request (or pipeline) at both ends, the client's own
// latency, the path's round trip, the server's time, the roles, and no
// finding on an unimpaired run.

// beforeTracer is how long the client runs before the tracer starts;
// afterTracer how long the clients of the test's own (MariaDB's, the
// lockstep one) run once it has started. The tracer's Open takes 1.3 to
// 1.7 s on two shared cores: the clients of a fixed length
// (redis-benchmark, wrk, pgbench) run 5.5 to 6 s, 2 to 3 s of it after.
const (
	beforeTracer = 1500 * time.Millisecond
	afterTracer  = 2500 * time.Millisecond
)

// minMidRunSamples is the least number of requests a run must make after
// the tracer started for its figures to mean anything (a request takes 25
// to 40 ms here: 60 to 100 in afterTracer).
const minMidRunSamples = 40

// call is one request as the client timed it: when it began
// (CLOCK_MONOTONIC, as the tracer's points) and how long it took.
type call struct {
	start record.Mono
	dur   time.Duration
}

// monoOf is the CLOCK_MONOTONIC time of a wall-clock time.
func monoOf(w time.Time) record.Mono {
	now, mono := time.Now(), record.Now()
	return mono + record.Mono(w.Sub(now))
}

// background starts a client in A (in the clients' cgroup); wait waits for
// its end, then for the tracer's records of it, and returns its standard
// output.
func (a *app) background(argv ...string) (wait func() string) {
	a.t.Helper()
	var out, errb bytes.Buffer
	cmd := a.lab.A.Command(context.Background(), argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := a.clients.Start(cmd); err != nil {
		a.t.Fatalf("%s: %v", strings.Join(argv, " "), err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var mu sync.Mutex
	waited := false
	a.t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if !waited {
			cmd.Process.Kill()
			<-done
		}
	})
	return func() string {
		a.t.Helper()
		mu.Lock()
		err := <-done
		waited = true
		mu.Unlock()
		if err != nil {
			a.t.Fatalf("%s: %v\n%s%s", strings.Join(argv, " "), err, out.String(), errb.String())
		}
		a.quiesce()
		return out.String()
	}
}

// midRun lets the client run beforeTracer, then starts the tracer.
func (a *app) midRun() {
	a.t.Helper()
	time.Sleep(beforeTracer)
	opened := time.Now()
	a.startTracer()
	a.t.Logf("tracer started %v into the client's run (its Open took %v)", beforeTracer, time.Since(opened).Round(time.Millisecond))
}

// midEnds is what one tracer saw of the requests that began after it
// started: both ends' exchanges of them, and how many there were on the
// wire.
type midEnds struct {
	client, server []*record.Exchange
	samples        int
}

// seqOf is where an exchange's request starts, relative to the client's
// initial sequence number (as capture.Request names it), at either end.
func (a *app) seqOf(e *record.Exchange) uint32 {
	if e.Flow.Netns == a.netnsA {
		return e.OutSeq - e.ISNLocal
	}
	return e.InSeq - e.ISNRemote
}

// adopted holds the exchanges a tracer started at started made of the
// connections to port (collector col) to what an adopted connection must
// show, and returns those of the requests that began after it started:
//
//   - every connection was open before the tracer (adopted): every
//     exchange of both its ends has its role from the listener, and each
//     end exactly one partial exchange, its first;
//   - the requests kept are those from the first one, at either end, that
//     began after the tracer started and is not the partial one, up to
//     the first exchange unanswered or unfinished (a client's last request
//     in flight at its stop or closing message, what a stopped tracer was
//     in the middle of), which must be at the end: at most tail requests
//     (answered, on the wire) come after it, unless the tracer was stopped
//     mid-run (tail < 0);
//   - each of those requests on the wire (the capture of the server's side,
//     wire) is one exchange at each end, and each exchange one request:
//     none missed, split or merged.
//
// conns is how many of the client's connections must be seen.
func (a *app) adopted(workload string, col *labtrace.Collector, started record.Mono, port uint16, wire map[capture.Request]time.Duration, conns, tail int) midEnds {
	t := a.t
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(workload+": "+format, args...)
	}
	type ends [2][]*record.Exchange // client's, server's
	byPort := map[uint16]*ends{}
	get := func(p uint16) *ends {
		if byPort[p] == nil {
			byPort[p] = &ends{}
		}
		return byPort[p]
	}
	for _, e := range col.Of(a.netnsA, func(e *record.Exchange) bool { return e.Flow.Remote.Port() == port }) {
		get(e.Flow.Local.Port())[0] = append(get(e.Flow.Local.Port())[0], e)
	}
	for _, e := range col.Of(a.netnsB, func(e *record.Exchange) bool { return e.Flow.Local.Port() == port }) {
		get(e.Flow.Remote.Port())[1] = append(get(e.Flow.Remote.Port())[1], e)
	}
	if len(byPort) != conns {
		fail("%d connections seen, want %d", len(byPort), conns)
	}
	var out midEnds
	names := [2]string{"client", "server"}
	wantRole := [2]record.ExchangeRole{record.Requester, record.Responder}
	wantConn := [2]record.Role{record.RoleClient, record.RoleServer}
	for p, es := range byPort {
		lo, hi := uint32(0), uint32(math.MaxUint32)
		for i, exs := range es {
			if len(exs) == 0 {
				fail("the %s end of the connection from port %d: no exchange", names[i], p)
				continue
			}
			// The order the tracer wrote them in is the end's order.
			partials := 0
			bad := 0
			for j, e := range exs {
				if (e.RoleSource != record.RoleFromListener || e.Role != wantRole[i] || e.ConnRole != wantConn[i]) && bad < 3 {
					bad++
					fail("%s end (port %d), exchange %d of %d: %s exchange on a %s connection, role source %q; want %s on a %s one, from the listener: %s",
						names[i], p, j, len(exs), e.Role, e.ConnRole, e.RoleSource, wantRole[i], wantConn[i], a.dump(e))
				}
				if e.Partial {
					partials++
					if j != 0 {
						fail("%s end (port %d): exchange %d of %d is partial, want only the first: %s", names[i], p, j, len(exs), a.dump(e))
					}
				}
			}
			if partials != 1 {
				fail("%s end (port %d): %d partial exchanges, want 1 (the first, %s)", names[i], p, partials, a.dump(exs[0]))
			}
			first := uint32(math.MaxUint32)
			for _, e := range exs {
				if !e.Partial && e.Start >= started {
					first = min(first, a.seqOf(e))
				}
				if e.Unanswered || e.Unfinished {
					hi = min(hi, a.seqOf(e))
				}
			}
			lo = max(lo, first)
			if tail < 0 {
				// A tracer stopped mid-run leaves what it was in the
				// middle of to its successor: one end may be a request
				// ahead of the other (the client read its answer and
				// wrote the next; the server had not read it yet).
				last := uint32(0)
				for _, e := range exs {
					last = max(last, a.seqOf(e))
				}
				hi = min(hi, last+1)
			}
		}
		for i, exs := range es {
			if len(exs) == 0 {
				continue
			}
			before, untimed, tailN := 0, 0, 0
			for _, e := range exs[1:] {
				switch s := a.seqOf(e); {
				case s < lo:
					before++
					if !e.Timed() {
						untimed++
					}
					if os.Getenv("APPS_DEBUG") != "" && e.Duration > 30*time.Millisecond {
						t.Logf("%s: %s end (port %d): before the tracer's start: %s", workload, names[i], p, a.dump(e))
					}
				case s >= hi:
					tailN++
				}
			}
			t.Logf("%s: %s end (port %d): %d exchanges; the partial %s; %d more before the first kept (sequence %d; %d of them no latency sample), %d from the first unanswered or unfinished (%d)",
				workload, names[i], p, len(exs), a.dump(exs[0]), before, lo, untimed, tailN, int64(hi))
			// A tracer stopped mid-run: what it was in the middle of at
			// its stop is not judged (its successor's exchanges are).
			if tailN > 1 && tail >= 0 {
				fail("%s end (port %d): %d exchanges from the first unanswered or unfinished (at sequence %d) on, want 1 at most (a closing message, the request in flight at the client's stop, or what a stopped tracer was in the middle of)",
					names[i], p, tailN, hi)
			}
		}
		onWire := map[uint32]bool{}
		after := 0
		for r := range wire {
			switch {
			case r.ClientPort != p || r.Seq < lo:
			case r.Seq < hi:
				onWire[r.Seq] = true
			default:
				after++
			}
		}
		if tail >= 0 && after > tail {
			fail("connection from port %d: %d requests answered on the wire after the first exchange unanswered or unfinished (at %d), want %d at most",
				p, after, hi, tail)
		}
		for i, exs := range es {
			got := map[uint32][]*record.Exchange{}
			for _, e := range exs {
				if s := a.seqOf(e); s >= lo && s < hi {
					got[s] = append(got[s], e)
					out.client, out.server = appendEnd(i, out.client, out.server, e)
				}
			}
			shown := 0
			for s, g := range got {
				if (len(g) != 1 || !onWire[s]) && shown < 5 {
					shown++
					fail("%s end (port %d): %d exchanges at sequence %d, of a request on the wire %v, want one each: %s", names[i], p, len(g), s, onWire[s], a.dump(g[0]))
				}
			}
			missed := []uint32{}
			for s := range onWire {
				if got[s] == nil {
					missed = append(missed, s)
				}
			}
			if len(missed) > 0 {
				slices.Sort(missed)
				fail("%s end (port %d): %d of %d requests on the wire after the tracer started have no exchange (at sequence %v...)",
					names[i], p, len(missed), len(onWire), missed[:min(len(missed), 5)])
			}
		}
		out.samples += len(onWire)
	}
	if out.samples < minMidRunSamples {
		fail("%d requests after the tracer started, want %d at least: a client too short, or a tracer too slow to start", out.samples, minMidRunSamples)
	}
	return out
}

func appendEnd(i int, client, server []*record.Exchange, e *record.Exchange) ([]*record.Exchange, []*record.Exchange) {
	if i == 0 {
		return append(client, e), server
	}
	return client, append(server, e)
}

// dump shows an exchange for a failure: its points from its start, its
// parts and its flags.
func (a *app) dump(e *record.Exchange) string {
	tl := e.Timeline
	at := func(m record.Mono) string {
		if m == 0 {
			return "-"
		}
		return m.Sub(e.Start).String()
	}
	return fmt.Sprintf("{%s %s (%s) seq %d, %d B out %d B in, start %v after the tracer, duration %v; from start: w0 %s w1 %s x1 %s a1 %s r0 %s r1 %s d1 %s; %+v; partial %v unanswered %v multiplexed %v push %v unfinished %v rejected %q tx %v x1transmit %v path rtt %v min rtt %v}",
		e.Role, e.ConnRole, e.RoleSource, a.seqOf(e), e.BytesOut, e.BytesIn, e.Start.Sub(a.started), e.Duration,
		at(tl.W0), at(tl.W1), at(tl.X1), at(tl.A1), at(tl.R0), at(tl.R1), at(tl.D1), e.Components,
		e.Partial, e.Unanswered, e.Multiplexed, e.Push, e.Unfinished, e.Rejected, e.TxTimestamps, e.X1Transmit, e.PathRTT, e.MinRTT)
}

// through keeps the requests of m that the client began by at, at both
// ends: a client that stops at a deadline (wrk -d) may send a last
// request whose answer comes back but that it never times.
func (a *app) through(m midEnds, at record.Mono) midEnds {
	keep := map[uint32]bool{}
	var out midEnds
	for _, e := range m.client {
		if e.Start <= at {
			keep[a.seqOf(e)] = true
			out.client = append(out.client, e)
		}
	}
	for _, e := range m.server {
		if keep[a.seqOf(e)] {
			out.server = append(out.server, e)
		}
	}
	out.samples = m.samples - (len(m.client) - len(out.client))
	return out
}

// during is the client's own times of the requests the client end's
// exchanges m.client are of: for each, the last call the client began
// before the exchange's start (its first byte handed to the kernel; the
// client reads its clock before it writes), 1 ms of clocks' slack after
// it at most and half the path's round trip before it at most (the call
// before began a round trip earlier at least), each call one exchange's.
func (a *app) during(workload string, calls []call, m midEnds) []time.Duration {
	a.t.Helper()
	const slack = record.Mono(time.Millisecond)
	sorted := slices.Clone(calls)
	slices.SortFunc(sorted, func(x, y call) int { return cmp.Compare(x.start, y.start) })
	used := map[int]bool{}
	var out []time.Duration
	for _, e := range m.client {
		i, _ := slices.BinarySearchFunc(sorted, e.Start+slack+1, func(c call, t record.Mono) int { return cmp.Compare(c.start, t) })
		i-- // the last call begun by then
		if i < 0 || used[i] || e.Start.Sub(sorted[i].start) > rtt/2 {
			a.t.Errorf("%s: no request the client timed for %s", workload, a.dump(e))
			continue
		}
		used[i] = true
		out = append(out, sorted[i].dur)
	}
	return out
}

// midCheck holds the exchanges of the requests after the tracer started
// (adopted's) against the run's truth as check does, and then the
// client's latency closer: lattrace's median within 1 % of the client's
// own (less what the client waited for a CPU), where check allows 5 %,
// and so its 99th percentile where the client's own times are of the
// same requests (perRequest); a client's report of its whole run (its
// percentiles) takes in the tracer's start, which slows the machine.
func (a *app) midCheck(workload string, m midEnds, tr truth, perRequest bool) {
	a.t.Helper()
	tr.samples = m.samples
	if tr.requests == 0 {
		tr.requests = m.samples
	}
	a.check(workload, m.client, m.server, tr)
	var durs []time.Duration
	rejected := map[record.Rejection]int{}
	for _, e := range m.client {
		if e.Rejected != "" {
			rejected[e.Rejected]++
		}
		if e.Timed() {
			durs = append(durs, e.Duration-e.Components.Handshake)
		}
	}
	for _, e := range m.server {
		if e.Rejected != "" {
			rejected[e.Rejected]++
		}
	}
	if len(rejected) > 0 {
		a.t.Errorf("%s: exchanges of requests after the tracer started rejected as latency samples: %v", workload, rejected)
		for _, e := range m.client {
			if e.Rejected != "" {
				a.t.Logf("rejected: %s", a.dump(e))
				break
			}
		}
	}
	if tr.corrected != nil {
		durs = tr.corrected(durs)
	}
	p50, p99 := quantile(durs, 0.5), quantile(durs, 0.99)
	waited := a.clients.Total() - a.waited0
	if !near(p50, tr.p50, waited, 0.01, 0) {
		a.t.Errorf("%s: client end p50 %v, the client's own %v: off by %.2f %% (it waited %v for a CPU), want 1 %% at most",
			workload, p50, tr.p50, 100*float64(p50-tr.p50)/float64(tr.p50), waited)
	}
	if perRequest && !near(p99, tr.p99, waited, 0.01, 0) {
		a.t.Errorf("%s: client end p99 %v, the client's own %v of the same requests: off by %.2f %% (it waited %v for a CPU), want 1 %% at most",
			workload, p99, tr.p99, 100*float64(p99-tr.p99)/float64(tr.p99), waited)
	}
	a.t.Logf("%s: %d requests after the tracer started; p50 %v (client %v, %+.2f %%), p99 %v (client %v, %+.2f %%); the client waited %v for a CPU", workload, m.samples,
		p50, tr.p50, 100*float64(p50-tr.p50)/float64(tr.p50), p99, tr.p99, 100*float64(p99-tr.p99)/float64(tr.p99), waited)
}

// TestMidRunRedis: redis-benchmark on one connection, a request at a time
// and pipelines of 16, the tracer started in the middle of its run.
func TestMidRunRedis(t *testing.T) {
	for _, cc := range congestionControls {
		for _, pipeline := range []int{1, 16} {
			t.Run(fmt.Sprintf("%s P%d", cc, pipeline), func(t *testing.T) {
				a := newLateApp(t, cc)
				const port = 6379
				a.serve(port, "redis-server", "--port", strconv.Itoa(port), "--bind", a.server().String(),
					"--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", a.dir)
				// 220 requests (pipelines) of 24.5 ms: 5.4 s.
				n := 220 * pipeline
				wire := a.capture(port)
				wait := a.background("redis-benchmark", "-h", a.server().String(), "-p", strconv.Itoa(port),
					"-c", "1", "-n", strconv.Itoa(n), "-t", "get", "-P", strconv.Itoa(pipeline), "--csv")
				a.midRun()
				p50, p99 := redisLatency(t, wait())
				// redis-benchmark's percentiles are of its whole run, the
				// tracer's start included: what it waited for a CPU
				// counts from its own start.
				a.waited0 = 0
				dep := departures(t, wire, port)
				name := fmt.Sprintf("mid-run redis-benchmark -P %d (%s)", pipeline, cc)
				m := a.adopted(name, a.col, a.started, port, dep, 1, 0)
				a.midCheck(name, m, truth{requests: m.samples * pipeline, p50: p50, p99: p99, departures: dep}, false)
			})
		}
	}
}

// TestMidRunNginx: wrk on one keep-alive connection to nginx on port 80,
// 1 KB answers, the tracer started in the middle of its run.
func TestMidRunNginx(t *testing.T) {
	for _, cc := range congestionControls {
		t.Run(cc, func(t *testing.T) {
			a := newLateApp(t, cc)
			const port = 80
			a.file("www/1024.bin", strings.Repeat("x", 1024))
			conf := a.nginxConf(fmt.Sprintf("listen %s:%d;", a.server(), port))
			a.serve(port, "nginx", "-c", conf, "-p", a.dir)
			calls := filepath.Join(a.dir, "calls.log")
			script := a.file("latencies.lua", wrkLatencies+fmt.Sprintf(wrkCalls, calls))
			wire := a.capture(port)
			wait := a.background("wrk", "-t1", "-c1", "-d6s", "-s", script, fmt.Sprintf("http://%s:%d/1024.bin", a.server(), port))
			a.midRun()
			w := wrkReport(t, wait())
			dep := departures(t, wire, port)
			name := "mid-run nginx + wrk (" + cc + ")"
			// wrk's last request, in flight when it stops, may be
			// answered on the wire after the client closed.
			m := a.adopted(name, a.col, a.started, port, dep, 1, 1)
			// wrk's own report is of its whole run, the tracer's start
			// included, which slows the server now and then (a request
			// read 50 ms late while the tracer loads), and corrected
			// for coordinated omission, which makes one such request
			// many: each request's time as wrk's thread saw it, of the
			// requests after the tracer started, is the truth.
			own := wrkCallTimes(t, calls)
			// wrk stops at its deadline: its last request may be
			// answered and never timed.
			last := record.Mono(0)
			for _, c := range own {
				last = max(last, c.start)
			}
			m = a.through(m, last+record.Mono(time.Millisecond))
			lats := a.during(name, own, m)
			all := make([]time.Duration, len(own))
			for i, c := range own {
				all[i] = c.dur
			}
			t.Logf("%s: wrk's own p50 %v p99 %v (corrected), its requests' times p50 %v p99 %v (%d of %d requests)", name,
				quantile(w.latencies, 0.5), quantile(w.latencies, 0.99), quantile(all, 0.5), quantile(all, 0.99), len(own), w.requests)
			if len(lats) != m.samples {
				t.Errorf("%s: wrk timed %d requests over the %d after the tracer started", name, len(lats), m.samples)
			}
			a.midCheck(name, m, truth{requests: len(lats), p50: quantile(lats, 0.5), p99: quantile(lats, 0.99), departures: dep}, true)
		})
	}
}

// wrkCalls makes wrk (whose Lua is LuaJIT's) log each request's own time
// to a file (%q): when its thread made the request (CLOCK_MONOTONIC, just
// before wrk's own clock starts) and how long until its thread had the
// response (just after wrk's clock stops), in ns.
const wrkCalls = `
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } lt_timespec;
int clock_gettime(int clk, lt_timespec *ts);
]]
local ts = ffi.new("lt_timespec")
local function mono()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1000000000 + tonumber(ts.tv_nsec)
end
local calls, sent
request = function()
  sent = mono()
  return wrk.format()
end
response = function(status, headers, body)
  local now = mono()
  if not calls then
    calls = io.open(%q, "w")
    calls:setvbuf("line")
  end
  calls:write(string.format("%%d %%d\n", sent, now - sent))
end
`

// wrkCallTimes reads what wrkCalls logged.
func wrkCallTimes(t *testing.T, path string) []call {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []call
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var start, dur int64
		if _, err := fmt.Sscan(line, &start, &dur); err != nil {
			t.Fatalf("%s: line %q: %v", path, line, err)
		}
		out = append(out, call{record.Mono(start), time.Duration(dur)})
	}
	return out
}

// TestMidRunPostgres: pgbench on one connection, each transaction a
// pg_sleep of 13 ms on the server, the tracer started in the middle of its
// run; pgbench's own per-transaction log is restricted to the requests
// the tracer saw whole.
func TestMidRunPostgres(t *testing.T) {
	for _, cc := range congestionControls {
		t.Run(cc, func(t *testing.T) {
			a := newLateApp(t, cc)
			const port = 5432
			a.postgres(port)
			script := a.file("sleep.sql", "SELECT pg_sleep(0.013);\n")
			wire := a.capture(port)
			wait := a.background("pgbench", "-h", a.server().String(), "-p", strconv.Itoa(port), "-U", "postgres", "-n",
				"-c", "1", "-t", "150", "-f", script, "-l", "--log-prefix", filepath.Join(a.dir, "pgbench"), "postgres")
			a.midRun()
			wait()
			byNumber := pgbenchTransactions(t, a.dir)
			think := median(statementDurations(t, a.log("runuser")))
			dep := departures(t, wire, port)
			name := "mid-run pgbench, pg_sleep 13 ms (" + cc + ")"
			m := a.adopted(name, a.col, a.started, port, dep, 1, 0)
			lats := a.transactions(name, byNumber, m, dep)
			a.midCheck(name, m, truth{requests: len(lats), p50: quantile(lats, 0.5), p99: quantile(lats, 0.99), think: &think, departures: dep}, true)
		})
	}
}

// transactions is pgbench's own latency of each transaction the client
// end's exchanges m.client are of, by its number: on pgbench's connection
// the requests are the SSLRequest, the start-up message and then the
// transactions' queries in turn (each answered; the closing Terminate is
// not), so the request's place on the wire (dep) is its transaction's.
// pgbench's epochs in its log are its own clock's (CLOCK_MONOTONIC plus a
// shift it takes once), up to several ms off the host's wall clock: no
// match by time.
func (a *app) transactions(workload string, byNumber map[int]time.Duration, m midEnds, dep map[capture.Request]time.Duration) []time.Duration {
	a.t.Helper()
	const setup = 2
	if len(m.client) == 0 {
		return nil
	}
	port := m.client[0].Flow.Local.Port()
	var seqs []uint32
	for r := range dep {
		if r.ClientPort == port {
			seqs = append(seqs, r.Seq)
		}
	}
	slices.Sort(seqs)
	if len(seqs) != setup+len(byNumber) {
		a.t.Errorf("%s: %d requests answered on pgbench's connection for %d transactions in its log, want %d more (its start-up)", workload, len(seqs), len(byNumber), setup)
		return nil
	}
	var out []time.Duration
	for _, e := range m.client {
		i, ok := slices.BinarySearch(seqs, a.seqOf(e))
		lat, logged := byNumber[i-setup]
		if !ok || !logged {
			a.t.Errorf("%s: no transaction in pgbench's log for %s", workload, a.dump(e))
			continue
		}
		out = append(out, lat)
	}
	return out
}

// pgbenchTransactions reads pgbench's per-transaction log (-l) of its one
// client: each line is "client transaction latency_us script epoch
// epoch_us"; it returns the latencies by transaction number.
func pgbenchTransactions(t *testing.T, dir string) map[int]time.Duration {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "pgbench.*"))
	out := map[int]time.Duration{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			fs := strings.Fields(line)
			if len(fs) < 3 {
				continue
			}
			client, err1 := strconv.Atoi(fs[0])
			n, err2 := strconv.Atoi(fs[1])
			us, err3 := strconv.ParseInt(fs[2], 10, 64)
			if err1 != nil || err2 != nil || err3 != nil || client != 0 {
				t.Fatalf("%s: line %q: not of one client", f, line)
			}
			out[n] = time.Duration(us) * time.Microsecond
		}
	}
	if len(out) == 0 {
		t.Fatalf("no transactions in pgbench's log (%v)", files)
	}
	return out
}

// TestMidRunMariaDB: a client that times its own queries (SELECT SLEEP,
// 13 ms on the server) on one persistent connection, the tracer started
// in the middle of its run.
func TestMidRunMariaDB(t *testing.T) {
	for _, cc := range congestionControls {
		t.Run(cc, func(t *testing.T) {
			a := newLateApp(t, cc)
			const port = 3306
			a.mariadb(port)
			wire := a.capture(port)
			stop := make(chan struct{})
			done := a.mysqlBackground(port, stop)
			a.midRun()
			time.Sleep(afterTracer)
			close(stop)
			calls := <-done
			a.quiesce()
			think := median(slowLogTimes(t, filepath.Join(a.dir, "slow.log")))
			dep := departures(t, wire, port)
			name := "mid-run MariaDB, SELECT SLEEP(0.013), one connection (" + cc + ")"
			m := a.adopted(name, a.col, a.started, port, dep, 1, 0)
			lats := a.during(name, calls, m)
			a.midCheck(name, m, truth{requests: len(lats), p50: quantile(lats, 0.5), p99: quantile(lats, 0.99), think: &think, departures: dep}, true)
		})
	}
}

// mysqlBackground connects to MariaDB from A and runs SELECT SLEEP(0.013)
// on that connection, timing each, until stop; then it closes it and
// sends its calls.
func (a *app) mysqlBackground(port uint16, stop <-chan struct{}) <-chan []call {
	a.t.Helper()
	db := a.mysqlDB(port)
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		a.t.Fatal(err)
	}
	out := make(chan []call, 1)
	go func() {
		var calls []call
		// The connection closed (its last records made) before the
		// calls are sent.
		defer func() { out <- calls }()
		defer db.Close()
		defer conn.Close()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var v int
			start, t0 := record.Now(), time.Now()
			if err := conn.QueryRowContext(ctx, "SELECT SLEEP(0.013)").Scan(&v); err != nil {
				a.t.Errorf("query: %v", err)
				return
			}
			calls = append(calls, call{start, time.Since(t0)})
		}
	}()
	return out
}

// lockstep is a small request/response server of the test's own: a
// request of reqSize bytes, think, an answer of respSize.
const (
	reqSize       = 100
	respSize      = 1000
	lockstepThink = 2 * time.Millisecond
)

// lockstepServer serves lockstep on port in B, keeping its own time per
// request (the request read to the answer's write); thinks returns them.
func (a *app) lockstepServer(port uint16) (thinks func() []time.Duration) {
	a.t.Helper()
	ln, err := a.lab.B.Listen("tcp", net.JoinHostPort(a.server().String(), strconv.Itoa(int(port))))
	if err != nil {
		a.t.Fatal(err)
	}
	var mu sync.Mutex
	var own []time.Duration
	var wg sync.WaitGroup
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				req, resp := make([]byte, reqSize), make([]byte, respSize)
				for {
					if _, err := io.ReadFull(c, req); err != nil {
						return
					}
					read := time.Now()
					time.Sleep(lockstepThink)
					mu.Lock()
					own = append(own, time.Since(read))
					mu.Unlock()
					if _, err := c.Write(resp); err != nil {
						return
					}
				}
			}()
		}
	}()
	a.t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(own)
	}
}

// lockstepClient connects to port from A's localPort and makes one
// request at a time, timing each, until stop; then it closes the
// connection and sends its calls.
func (a *app) lockstepClient(port, localPort uint16, stop <-chan struct{}) <-chan []call {
	a.t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: a.lab.A.IPv4.AsSlice(), Port: int(localPort)}}
	c, err := a.lab.A.Dial(context.Background(), d, "tcp", net.JoinHostPort(a.server().String(), strconv.Itoa(int(port))))
	if err != nil {
		a.t.Fatal(err)
	}
	out := make(chan []call, 1)
	go func() {
		var calls []call
		defer func() { out <- calls }()
		defer c.Close()
		req, resp := make([]byte, reqSize), make([]byte, respSize)
		for {
			select {
			case <-stop:
				return
			default:
			}
			start, t0 := record.Now(), time.Now()
			if _, err := c.Write(req); err != nil {
				a.t.Errorf("request: %v", err)
				return
			}
			if _, err := io.ReadFull(c, resp); err != nil {
				a.t.Errorf("answer: %v", err)
				return
			}
			calls = append(calls, call{start, time.Since(t0)})
		}
	}()
	return out
}

// lockstepPort is the test server's port, inside the ephemeral range
// (32768-60999), where the order of the ports says nothing of the roles.
const lockstepPort = 50051

// TestMidRunEphemeralPorts: a server on a port inside the ephemeral range,
// its client's port (bound) below it and above it, the tracer started in
// the middle of the run: where the ports would make the client the
// server, the listener tells the roles.
func TestMidRunEphemeralPorts(t *testing.T) {
	for _, local := range []uint16{40000, 55000} {
		t.Run(fmt.Sprintf("client port %d", local), func(t *testing.T) {
			a := newLateApp(t, "bbr")
			thinks := a.lockstepServer(lockstepPort)
			wire := a.capture(lockstepPort)
			stop := make(chan struct{})
			done := a.lockstepClient(lockstepPort, local, stop)
			a.midRun()
			time.Sleep(afterTracer)
			close(stop)
			calls := <-done
			a.quiesce()
			dep := departures(t, wire, lockstepPort)
			name := fmt.Sprintf("mid-run lockstep on %d from %d (bbr)", lockstepPort, local)
			m := a.adopted(name, a.col, a.started, lockstepPort, dep, 1, 0)
			lats := a.during(name, calls, m)
			think := median(thinks())
			a.midCheck(name, m, truth{p50: quantile(lats, 0.5), p99: quantile(lats, 0.99), think: &think, departures: dep}, true)
		})
	}
}

// TestMidRunRestart: the tracer started in the middle of a run is stopped
// (no pinning: its programs and maps go with it) and a new one started,
// as a daemon restarted by a rollout: the second adopts the connection
// afresh, and what it says of the requests after its start is held as
// the first's is. The workload is the lockstep client on a port below
// the server's, both inside the ephemeral range.
func TestMidRunRestart(t *testing.T) {
	const local = 40000
	a := newLateApp(t, "bbr")
	thinks := a.lockstepServer(lockstepPort)
	wire := a.capture(lockstepPort)
	stop := make(chan struct{})
	done := a.lockstepClient(lockstepPort, local, stop)
	a.midRun()
	first := *a
	time.Sleep(2 * time.Second)
	a.stop()
	stopped := record.Now()
	opened := time.Now()
	a.startTracer()
	t.Logf("second tracer started %v after the first stopped (its Open took %v)", a.started.Sub(stopped).Round(time.Millisecond), time.Since(opened).Round(time.Millisecond))
	time.Sleep(afterTracer)
	close(stop)
	calls := <-done
	a.quiesce()
	dep := departures(t, wire, lockstepPort)
	think := median(thinks())

	for _, tc := range []struct {
		name string
		view *app
		tail int
	}{
		{"the first tracer", &first, -1},
		{"the second tracer", a, 0},
	} {
		name := fmt.Sprintf("mid-run lockstep on %d from %d (bbr), %s", lockstepPort, local, tc.name)
		m := tc.view.adopted(name, tc.view.col, tc.view.started, lockstepPort, dep, 1, tc.tail)
		if tc.view == &first {
			for _, e := range m.client {
				if e.Start >= stopped {
					t.Errorf("%s: an exchange begun after it stopped: %s", name, a.dump(e))
				}
			}
		}
		lats := a.during(name, calls, m)
		tc.view.midCheck(name, m, truth{p50: quantile(lats, 0.5), p99: quantile(lats, 0.99), think: &think, departures: dep}, true)
	}
}
