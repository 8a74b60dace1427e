package apps

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/grpcapp"
)

// HTTP/2 mid-run: grpc-go (unary, eight callers at once, a server stream)
// and h2load (one stream at a time, ten at once) already calling when the
// tracer starts. Their connections' preface went by unseen: the framing
// is found from frame headers (bpf/h2_resync.bpf.h), after which each
// call is one exchange at both ends, held to the client's own timing of
// the calls that began after the tracer started, as on a connection seen
// from its start. Before the framing is found the connection's own
// exchanges are no latency samples.
func TestMidRunHTTP2(t *testing.T) {
	bin, err := grpcapp.Binary()
	if err != nil {
		t.Fatal(err)
	}
	const think = 13 * time.Millisecond
	cases := []struct {
		name string
		port uint16
		// client: the client's argv for the server at addr, logging to
		// log; calls reads that log.
		client func(a *app, addr, log string) []string
		calls  func(t *testing.T, log string) []call
		server func(a *app, addr string) []string
		// concurrency: calls in flight at once, some of which the
		// framing's discovery finds under way (partial).
		concurrency int
	}{
		{"grpc-go unary", 50051,
			func(a *app, addr, log string) []string {
				return []string{bin, "client", "-addr", addr, "-mode", "unary", "-n", "110", "-log", log}
			}, grpcCalls,
			func(a *app, addr string) []string {
				return []string{bin, "server", "-addr", addr, "-think", think.String()}
			}, 1},
		{"grpc-go 8 callers", 50051,
			func(a *app, addr, log string) []string {
				return []string{bin, "client", "-addr", addr, "-mode", "concurrent", "-c", "8", "-n", "800", "-log", log}
			}, grpcCalls,
			func(a *app, addr string) []string {
				return []string{bin, "server", "-addr", addr, "-think", think.String()}
			}, 8},
		{"grpc-go server stream", 50051,
			func(a *app, addr, log string) []string {
				return []string{bin, "client", "-addr", addr, "-mode", "stream", "-n", "8", "-log", log}
			}, grpcCalls,
			func(a *app, addr string) []string {
				return []string{bin, "server", "-addr", addr, "-think", think.String(), "-stream-messages", "10", "-stream-every", "100ms"}
			}, 1},
		{"h2load -m 1", 8081,
			func(a *app, addr, log string) []string {
				return []string{"h2load", "-n", "200", "-c", "1", "-m", "1", "--log-file=" + log, "http://" + addr + "/1024.bin"}
			}, h2loadCalls,
			func(a *app, addr string) []string {
				host, port, _ := strings.Cut(addr, ":")
				return []string{"nghttpd", "--no-tls", "-d", filepath.Join(a.dir, "www"), "-a", host, port}
			}, 1},
		{"h2load -m 10", 8081,
			func(a *app, addr, log string) []string {
				return []string{"h2load", "-n", "2000", "-c", "1", "-m", "10", "--log-file=" + log, "http://" + addr + "/1024.bin"}
			}, h2loadCalls,
			func(a *app, addr string) []string {
				host, port, _ := strings.Cut(addr, ":")
				return []string{"nghttpd", "--no-tls", "-d", filepath.Join(a.dir, "www"), "-a", host, port}
			}, 10},
	}
	for _, cc := range congestionControls {
		for _, c := range cases {
			t.Run(cc+" "+c.name, func(t *testing.T) {
				a := newLateApp(t, cc)
				a.file("www/1024.bin", strings.Repeat("x", 1024))
				addr := fmt.Sprintf("%s:%d", a.server(), c.port)
				a.serve(c.port, c.server(a, addr)...)
				log := filepath.Join(a.dir, "calls.log")
				wait := a.background(c.client(a, addr, log)...)
				a.midRun()
				wait()
				client, server := a.ends(c.port)
				a.midStreams(fmt.Sprintf("%s mid-run (%s)", c.name, cc), client, server, c.calls(t, log), c.concurrency)
			})
		}
	}
}

// midStreams holds the exchanges of an HTTP/2 connection adopted mid-run
// to the calls the client began after the tracer started: one stream
// exchange per call at each end (short of those under way as the framing
// was found, which are partial, and those before it), the client's
// timing, the path's round trip, the roles from the listener, the two
// ends joined, no latency sample among the connection's own exchanges
// and no finding on the unimpaired run.
func (a *app) midStreams(workload string, client, server []*record.Exchange, calls []call, concurrency int) {
	t := a.t
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(workload+": "+format, args...)
	}
	var after []time.Duration
	for _, c := range calls {
		if c.start > a.started {
			after = append(after, c.dur)
		}
	}
	if len(after) < 3 {
		t.Fatalf("%s: %d calls after the tracer started: the run is too short", workload, len(after))
	}
	// The calls are the client's: a server's exchange is of one when it
	// is the same stream as a client's exchange that began after the
	// tracer, or when it began a round trip after the tracer.
	type key struct{ client, server, seq uint32 }
	keys := map[key]int{}
	var durs, nets []time.Duration
	counts := [2]int{}
	for i, end := range [][]*record.Exchange{client, server} {
		name := [2]string{"client", "server"}[i]
		wantRole := [2]record.ExchangeRole{record.Requester, record.Responder}[i]
		wantConn := [2]record.Role{record.RoleClient, record.RoleServer}[i]
		for _, e := range end {
			if e.RoleSource != record.RoleFromListener || e.ConnRole != wantConn {
				fail("%s end: a %s exchange on a %s connection, role source %q: %s", name, e.Role, e.ConnRole, e.RoleSource, a.dump(e))
			}
			for _, d := range e.Diagnoses {
				if d.Severity != record.SeverityInfo {
					fail("%s end: %s %s on an unimpaired run: %s", name, d.Severity, d.Name, d.Summary)
				}
			}
			if e.Stream == nil {
				if e.Timed() && !e.Partial {
					fail("%s end: a connection-level exchange is a latency sample: %s", name, a.dump(e))
				}
				continue
			}
			if e.Role != wantRole {
				fail("%s end: stream %d is a %s exchange: %s", name, e.Stream.ID, e.Role, a.dump(e))
			}
			if e.Partial {
				continue
			}
			var k key
			if i == 0 {
				if e.Start < a.started {
					continue
				}
				k = key{e.ISNLocal, e.ISNRemote, e.OutSeq}
				keys[k]++
			} else {
				k = key{e.ISNRemote, e.ISNLocal, e.InSeq}
				if _, ok := keys[k]; !ok && e.Start < a.started+record.Mono(rtt) {
					continue
				}
				keys[k]--
			}
			counts[i]++
			if !e.Timed() || e.Unanswered {
				fail("%s end: stream %d is no latency sample: %s", name, e.Stream.ID, a.dump(e))
				continue
			}
			if i == 0 {
				durs = append(durs, e.Duration)
				nets = append(nets, e.Components.Network)
			}
		}
	}
	// The framing is confirmed after three frame headers each way, and
	// the calls under way then are partial. One call may straddle the
	// tracer's start: begun on the client's clock just before it, written
	// just after.
	lost := 3 + concurrency
	for i, n := range counts {
		if n > len(after)+1 || n < len(after)-lost {
			fail("%s end: %d stream exchanges for the %d calls begun after the tracer started (up to %d may come before the framing is found)",
				[2]string{"client", "server"}[i], n, len(after), lost)
		}
	}
	unjoined := 0
	for k, v := range keys {
		if v != 0 {
			if unjoined++; unjoined <= 3 {
				fail("the stream at sequence %d is %d more at the client's end than at the server's", k.seq, v)
			}
		}
	}
	if unjoined > 3 {
		fail("%d streams not joined between the ends", unjoined)
	}
	// As the suite's runs from the start: the client's time waiting for
	// a CPU is inside its own clock, not lattrace's.
	waited := a.clients.Total() - a.waited0
	p50, want := quantile(durs, 0.5), quantile(after, 0.5)
	if !near(p50, want, waited, 0.01, 200*time.Microsecond) {
		fail("median %v of the streams, the client's %v (it waited %v for a CPU)", p50, want, waited)
	}
	if p99, want99 := quantile(durs, 0.99), quantile(after, 0.99); !near(p99, want99, waited, 0.05, time.Millisecond) {
		fail("p99 %v of the streams, the client's %v (it waited %v for a CPU)", p99, want99, waited)
	}
	if n := quantile(nets, 0.5); !within(n, rtt, 0.05, 0) {
		fail("median network %v, the path's round trip %v", n, rtt)
	}
	c, _ := a.tr.Counters()
	t.Logf("%s: %d calls after the tracer started, %d/%d stream exchanges (client/server), median %.2f ms (client %.2f ms), network %.2f ms; HTTP/2 framing found %d, not confirmed %d, lost %d",
		workload, len(after), counts[0], counts[1], ms(p50), ms(want), ms(quantile(nets, 0.5)), c.H2Resynced, c.H2ResyncLost, c.H2Unsynced)
}

// grpcCalls reads grpcapp's log: each call's duration and its start, both
// in microseconds (the start since the Unix epoch).
func grpcCalls(t *testing.T, path string) []call {
	t.Helper()
	return loggedCalls(t, path, 1, 0)
}

// h2loadCalls reads h2load's --log-file: start (microseconds since the
// Unix epoch), status, duration (microseconds).
func h2loadCalls(t *testing.T, path string) []call {
	t.Helper()
	return loggedCalls(t, path, 0, 2)
}

// loggedCalls reads a log of calls, one a line, start and duration in
// microseconds in the given columns (start since the Unix epoch).
func loggedCalls(t *testing.T, path string, startCol, durCol int) []call {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []call
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) <= max(startCol, durCol) {
			continue
		}
		start, err1 := strconv.ParseInt(f[startCol], 10, 64)
		dur, err2 := strconv.ParseInt(f[durCol], 10, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: line %q", path, line)
		}
		out = append(out, call{start: monoOf(time.UnixMicro(start)), dur: time.Duration(dur) * time.Microsecond})
	}
	if len(out) == 0 {
		t.Fatalf("%s: no calls", path)
	}
	return out
}

// TestMidRunHTTP2Restart: grpc-go's calls go on while one tracer starts
// mid-run, stops (no pinning: its maps go) and another starts: the second
// finds the framing anew, and each call begun after it started is one
// exchange at each end, as under the first.
func TestMidRunHTTP2Restart(t *testing.T) {
	bin, err := grpcapp.Binary()
	if err != nil {
		t.Fatal(err)
	}
	a := newLateApp(t, "bbr")
	const port = 50051
	addr := fmt.Sprintf("%s:%d", a.server(), port)
	a.serve(port, bin, "server", "-addr", addr, "-think", "13ms")
	log := filepath.Join(a.dir, "calls.log")
	wait := a.background(bin, "client", "-addr", addr, "-mode", "unary", "-n", "300", "-log", log)
	a.midRun()
	time.Sleep(2 * time.Second)
	a.stop()
	a.startTracer()
	wait()
	client, server := a.ends(port)
	a.midStreams("grpc-go unary, the second tracer (bbr)", client, server, grpcCalls(t, log), 1)
}
