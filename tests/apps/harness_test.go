// Package apps proves lattrace on the servers and clients people run, from
// Debian's packages: each test starts a real server in one namespace of a
// network lab and its own benchmark client in the other, through a path of
// known delay, traces both ends, and holds lattrace's exchanges against
// the client's own latency report, the injected path and the server's
// real time, under BBR (this machine's default) and cubic.
package apps

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/capture"
	"github.com/lattrace/lattrace/tests/labtrace"
	"github.com/lattrace/lattrace/tests/netlab"
)

// emulated is set (LTTEST_EMULATED=1) where the suite runs in a VM on
// an emulated CPU (tests/kernels boots Debian's kernels under qemu's TCG):
// there each segment's way through a network stack and the lab's relay
// takes about half a millisecond more, and varies by as much, so the path
// is longer and every tolerance twice as wide, at least emulatedFloor
// (README, "Kernels").
var emulated = os.Getenv("LTTEST_EMULATED") != ""

// emulatedFloor: a server's own processing, which no server here reports
// (nginx, redis: their truth is 0), takes 1-3 ms on the emulated CPU.
const emulatedFloor = 5 * time.Millisecond

// oneWay is the lab's delay each way: a 24 ms round trip, the distance of
// two regions, so that the path dominates what a client measures (50 ms
// on an emulated CPU).
var (
	oneWay = labDelay()
	rtt    = 2 * oneWay
)

// x1Tolerance and x1Outliers hold each answer's departure (x1) to the
// capture on the server's side: within 1 ms on all but one answer in 20.
// On an emulated CPU the capture's own timestamps lag by milliseconds now
// and then (tcpdump's thread is descheduled as much as the server's):
// 5 ms on all but one in 10.
var x1Tolerance, x1Outliers = time.Millisecond, 20

func init() {
	if emulated {
		x1Tolerance, x1Outliers = 5*time.Millisecond, 10
	}
}

func labDelay() time.Duration {
	if emulated {
		return 25 * time.Millisecond
	}
	return 12 * time.Millisecond
}

// congestionControls are what each application runs under: this machine's
// default, which paces, and the classic one, which does not.
var congestionControls = []string{"bbr", "cubic"}

// app is one lab with a real server in B, its client in A, and the tracer
// watching both.
type app struct {
	t              *testing.T
	lab            *netlab.Lab
	col            *labtrace.Collector
	netnsA, netnsB uint32
	dir            string // config, data and logs of this test's processes
	tr             *tracer.Tracer
	busy           *labtrace.Busy
	clients        *labtrace.Waited // the clients' cgroup
	// started is when the tracer was running (after its Open), stop
	// stops it; waited0 is what the clients had waited for a CPU by then.
	started record.Mono
	stop    func()
	waited0 time.Duration
}

func newApp(t *testing.T, cc string) *app {
	t.Helper()
	a := newLateApp(t, cc)
	a.startTracer()
	return a
}

// newLateApp is newApp without the tracer: startTracer starts it, in the
// middle of the client's run (a DaemonSet installed on a busy node).
func newLateApp(t *testing.T, cc string) *app {
	t.Helper()
	l := netlab.Link{Delay: oneWay}
	lab := netlab.NewT(t, netlab.Config{AtoB: l, BtoA: l})
	for _, h := range []*netlab.Host{lab.A, lab.B} {
		if err := h.Sysctl("net.ipv4.tcp_congestion_control", cc); err != nil {
			t.Fatal(err)
		}
	}
	a := &app{t: t, lab: lab, netnsA: labtrace.NetnsInode(t, lab.A.Netns), netnsB: labtrace.NetnsInode(t, lab.B.Netns), dir: t.TempDir()}
	// Servers that drop privileges must be able to read their files.
	if err := os.Chmod(a.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	a.col = labtrace.NewCollector(a.netnsA, a.netnsB)
	a.busy = labtrace.WatchBusy(t, lab.A, lab.B)
	a.clients = labtrace.NewWaited(t, "clients")
	return a
}

// startTracer starts a tracer (at its defaults: no pinning) with a
// collector of its own, which a.col becomes, and the machine's accounts
// of the run (Busy, the clients' waits) from then on.
func (a *app) startTracer() {
	a.t.Helper()
	a.col = labtrace.NewCollector(a.netnsA, a.netnsB)
	a.tr, a.stop = labtrace.Start(a.t, tracer.Options{}, a.col)
	a.started = record.Now()
	a.busy = labtrace.WatchBusy(a.t, a.lab.A, a.lab.B)
	a.waited0 = a.clients.Total()
}

// server is B's address.
func (a *app) server() netip.Addr { return a.lab.B.IPv4 }

// file writes a file under the test's directory and returns its path.
func (a *app) file(name, content string) string {
	a.t.Helper()
	p := filepath.Join(a.dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		a.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		a.t.Fatal(err)
	}
	return p
}

// serve starts a server process in B (argv[0] is the program), logging to
// the test's directory, and stops it when the test ends. It returns once
// the server accepts connections on port.
func (a *app) serve(port uint16, argv ...string) {
	a.t.Helper()
	tries := a.start(a.lab.B, filepath.Base(argv[0]), netip.AddrPortFrom(a.server(), port), argv...)
	// The probe connections are not the client's: wait for their records,
	// the refused ones' closes too, which no open announces (when a
	// tracer runs: a mid-run test starts it later).
	for deadline := time.Now().Add(20 * time.Second); a.tr != nil && a.probeCloses(port) < tries && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	a.quiesce()
	a.col.Mu.Lock()
	a.col.Exchanges, a.col.Opens, a.col.Closes = nil, nil, nil
	a.col.Mu.Unlock()
}

// probeCloses counts the close records of A's connections to port.
func (a *app) probeCloses(port uint16) int {
	a.col.Mu.Lock()
	defer a.col.Mu.Unlock()
	n := 0
	for _, c := range a.col.Closes {
		if c.Flow.Netns == a.netnsA && c.Flow.Remote.Port() == port {
			n++
		}
	}
	return n
}

// start starts a process in host h, logging to the test's directory as
// name, stopped when the test ends, and returns once it accepts
// connections on addr (a connection from A), with how many connections it
// tried.
func (a *app) start(h *netlab.Host, name string, addr netip.AddrPort, argv ...string) (tries int) {
	a.t.Helper()
	logf, err := os.Create(filepath.Join(a.dir, name+".log"))
	if err != nil {
		a.t.Fatal(err)
	}
	cmd := h.Command(context.Background(), argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		a.t.Fatalf("%s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	a.t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		logf.Close()
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-exited:
			a.t.Fatalf("%s exited at start: %s", name, tail(a.log(name)))
		default:
		}
		var c net.Conn
		tries++
		err := a.lab.A.Do(func() (err error) {
			c, err = net.DialTimeout("tcp", addr.String(), time.Second)
			return err
		})
		if err == nil {
			c.Close()
			return tries
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("%s does not accept on %s: %v; log: %s", name, addr, err, tail(a.log(name)))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// log returns a process's log.
func (a *app) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(a.dir, name+".log"))
	return string(b)
}

// tail is the end of s, for an error message.
func tail(s string) string {
	if len(s) > 2000 {
		return s[len(s)-2000:]
	}
	return s
}

// client runs a client in A and returns its standard output.
func (a *app) client(argv ...string) string {
	a.t.Helper()
	var out, errb bytes.Buffer
	cmd := a.lab.A.Command(context.Background(), argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := a.clients.Start(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		a.t.Fatalf("%s: %v\n%s%s", strings.Join(argv, " "), err, out.String(), errb.String())
	}
	a.quiesce()
	return out.String()
}

// quiesce waits until the tracer has reported the close of every
// connection the client's end opened (the client has exited, so they have
// closed), and nothing new for half a second after.
func (a *app) quiesce() {
	last, since := -1, time.Now()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		a.col.Mu.Lock()
		n := len(a.col.Exchanges) + len(a.col.Opens) + len(a.col.Closes)
		open := map[uint64]bool{}
		for _, o := range a.col.Opens {
			if o.Flow.Netns == a.netnsA {
				open[o.Cookie] = true
			}
		}
		for _, c := range a.col.Closes {
			delete(open, c.Cookie)
		}
		a.col.Mu.Unlock()
		if n != last || len(open) > 0 {
			last, since = n, time.Now()
		} else if time.Since(since) > 500*time.Millisecond {
			return
		}
	}
	a.t.Fatal("the tracer did not report the close of the client's connections within a minute")
}

// capture records the server's side of the link (B's interface) for
// connections to port, until stopped.
func (a *app) capture(port uint16) *capture.Capture {
	a.t.Helper()
	return capture.StartT(a.t, a.lab.B, a.lab.B.Ifname, fmt.Sprintf("tcp port %d", port))
}

// departures reads a capture of the server's side (capture.Departures).
func departures(t *testing.T, c *capture.Capture, port uint16) map[capture.Request]time.Duration {
	t.Helper()
	pcap, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	out, err := capture.Departures(pcap, port)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ends returns the exchanges of the connections to port: the client's end
// (in A) and the server's (in B).
func (a *app) ends(port uint16) (client, server []*record.Exchange) {
	client = a.col.Of(a.netnsA, func(e *record.Exchange) bool { return e.Flow.Remote.Port() == port })
	server = a.col.Of(a.netnsB, func(e *record.Exchange) bool { return e.Flow.Local.Port() == port })
	return client, server
}

// truth is what the run's own sources say about it.
type truth struct {
	// requests is how many requests the client completed; samples how
	// many latency samples lattrace should make of them on the client's
	// end (requests, or pipelines).
	requests, samples int
	// extra is how many more exchanges the protocol makes around them
	// (TLS handshakes, a protocol's start-up queries).
	extra int
	// p50 and p99 are the client's own latency report.
	p50, p99 time.Duration
	// think is the server's own time per request (its median), when
	// known (nil: an immediate server).
	think *time.Duration
	// diagnoses that are really there (a connection per request).
	expected []record.DiagnosisName
	// corrected, if set, is applied to lattrace's latencies before their
	// quantiles are compared: what the client does to its own (wrk).
	corrected func([]time.Duration) []time.Duration
	// departures are the server's answers as its side of the link saw
	// them (departures of a capture), for lockstep protocols; unnamed is
	// how many requests the capture's lockstep cut cannot name (HTTP/2's
	// first two share a turn with the preface and the SETTINGS
	// acknowledgement).
	departures map[capture.Request]time.Duration
	unnamed    int
	// setup: each connection's first exchange is the protocol's set-up
	// (a login), which the client does not count as a request.
	setup bool
	// multiplexed: requests overlap on the connection (HTTP/2 streams
	// whose framing lattrace cannot read), so its cuts are no requests:
	// lattrace must say so, and its latency samples are not the client's.
	multiplexed bool
	// connectTimed: the client times a call from before its connection
	// was set up (grpc-go connects at the first calls), so lattrace's
	// handshake part counts.
	connectTimed bool
	// streams: cleartext HTTP/2, one exchange per stream at both ends:
	// exactly one per request, each end's joined to the other's.
	streams bool
	// fallback: HTTP/2 over TLS, whose framing is hidden: the
	// connection's own exchanges are no requests, but still sum, keep
	// the network at or above the path and diagnose nothing.
	fallback bool
}

// row is one line of the suite's table, logged by check.
type row struct {
	workload                     string
	requests, samples, exchanges int
	clientP50, clientP99         time.Duration
	p50, p99, network, peer      time.Duration
	think, ownThink              time.Duration
	multiplexed                  int
	roles, verdict               string
}

func (r row) String() string {
	return fmt.Sprintf("| %s | %d | %d | %d (%d multiplexed) | %.1f / %.1f | %.1f / %.1f | %.1f | %.2f / %.2f (%.2f) | %s | %s |",
		r.workload, r.requests, r.samples, r.exchanges, r.multiplexed, ms(r.clientP50), ms(r.clientP99), ms(r.p50), ms(r.p99),
		ms(r.network), ms(r.peer), ms(r.think), ms(r.ownThink), r.roles, r.verdict)
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// within reports whether got is within max(frac, floor) of want.
func within(got, want time.Duration, frac float64, floor time.Duration) bool {
	if emulated {
		frac, floor = 2*frac, max(2*floor, emulatedFloor)
	}
	return (got - want).Abs() <= max(time.Duration(frac*float64(want)), floor)
}

// between reports whether got is within [lo, hi], each end widened by
// within's tolerance of it.
func between(got, lo, hi time.Duration, frac float64, floor time.Duration) bool {
	return got >= lo && got <= hi || within(got, lo, frac, floor) || within(got, hi, frac, floor)
}

// near reports whether got is within within's tolerance of want once a
// difference of slack at most, either way, is set aside.
func near(got, want, slack time.Duration, frac float64, floor time.Duration) bool {
	switch {
	case got < want:
		got = min(got+slack, want)
	case got > want:
		got = max(got-slack, want)
	}
	return within(got, want, frac, floor)
}

// quantile is the q-quantile of ds (nearest rank).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// check holds both ends' exchanges of one run against its truth.
func (a *app) check(workload string, client, server []*record.Exchange, tr truth) {
	t := a.t
	t.Helper()
	r := row{workload: workload, requests: tr.requests, samples: tr.samples, exchanges: len(client),
		clientP50: tr.p50, clientP99: tr.p99, roles: "ok", verdict: "ok"}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(workload+": "+format, args...)
		r.verdict = "FAIL"
	}
	// How long the clients waited for a CPU (their cgroup's pressure).
	waited := a.clients.Total() - a.waited0
	var durs, nets, peers, thinks []time.Duration
	latency, mux := 0, 0
	for _, e := range client {
		if e.Role != record.Requester || e.ConnRole != record.RoleClient {
			r.roles = "wrong"
			fail("client end: %s exchange on a %s connection, want requester on a client one", e.Role, e.ConnRole)
		}
		if e.Components.Sum() != e.Duration {
			fail("client end: components sum to %v, duration %v", e.Components.Sum(), e.Duration)
		}
		if e.Multiplexed {
			mux++
			if e.Components.Network != 0 {
				fail("client end: a multiplexed cut reports a network part of %v", e.Components.Network)
			}
		}
		if !e.Timed() {
			continue
		}
		latency++
		if e.Components.Network < rtt-100*time.Microsecond {
			tl := e.Timeline
			fail("client end: network %v below the path's %v (from w0: w1 %v x1 %v r0 %v, tx timestamps %v, loss %v, out %d B)",
				e.Components.Network, rtt, tl.W1.Sub(tl.W0), tl.X1.Sub(tl.W0), tl.R0.Sub(tl.W0), e.TxTimestamps, e.Components.LossRecovery, e.BytesOut)
		}
		if e.First && tr.setup {
			continue
		}
		// Most clients time a request from its write: the first one's
		// handshake is not in their figures.
		if tr.connectTimed {
			durs = append(durs, e.Duration)
		} else {
			durs = append(durs, e.Duration-e.Components.Handshake)
		}
		nets = append(nets, e.Components.Network)
		peers = append(peers, e.Components.Peer)
	}
	matched, late := 0, 0
	var xerr []time.Duration
	for _, e := range server {
		// x1 is when the answer's last byte left: within 1 ms of the
		// capture on the server's side, counted from the request's last
		// byte at both. Two shared vCPUs (the lab's relay, two captures,
		// a server and a client) delay a thread now and then by a few
		// ms between the kernel's hook and the capture: one answer in
		// twenty may miss, as in tests/scenarios' wire comparisons.
		if wire, ok := tr.departures[capture.Request{ClientPort: e.Flow.Remote.Port(), Seq: e.InSeq - e.ISNRemote}]; ok && e.Timeline.X1 != 0 && e.Timeline.R1 != 0 {
			matched++
			got := e.Timeline.X1.Sub(e.Timeline.R1)
			xerr = append(xerr, got-wire)
			if (got - wire).Abs() > x1Tolerance {
				late++
				t.Logf("%s: server end: the answer's last byte left %v after the request's on the wire, x1 - r1 is %v (tx timestamps %v)",
					workload, wire, got, e.TxTimestamps)
			}
		}
		if e.Role != record.Responder || e.ConnRole != record.RoleServer {
			r.roles = "wrong"
			fail("server end: %s exchange on a %s connection, want responder on a server one", e.Role, e.ConnRole)
		}
		if e.Components.Sum() != e.Duration {
			fail("server end: components sum to %v, duration %v", e.Components.Sum(), e.Duration)
		}
		if !e.Unanswered && !e.Multiplexed && !e.First {
			thinks = append(thinks, e.Components.Think)
		}
	}
	if tr.corrected != nil {
		durs = tr.corrected(durs)
	}
	r.p50, r.p99 = quantile(durs, 0.5), quantile(durs, 0.99)
	if tr.departures != nil {
		if matched < tr.samples-tr.unnamed {
			fail("%d of the server's answers found on the wire for %d requests", matched, tr.samples)
		}
		if m := quantile(xerr, 0.5); late*x1Outliers > matched || !within(m, 0, 0, 200*time.Microsecond) {
			fail("x1 off the wire by more than %v on %d of %d answers, by %v at the median", x1Tolerance, late, matched, m)
		}
	}
	if os.Getenv("APPS_DEBUG") != "" {
		for i, e := range client {
			if i < 4 || e.Duration-e.Components.Handshake > 40*time.Millisecond {
				t.Logf("client %d first %v unanswered %v dur %v hs %v out %d in %d %+v", i, e.First, e.Unanswered, e.Duration, e.Components.Handshake, e.BytesOut, e.BytesIn, e.Components)
			}
		}
		for i, e := range server {
			if tl := e.Timeline; tl.R0 != 0 && tl.X1 != 0 && tl.X1.Sub(tl.R1) > 10*time.Millisecond {
				t.Logf("server %d turns %d out %d in %d x1 transmit %v from r0: r1 %v d1 %v w0 %v w1 %v x1 %v a1 %v; send wait %v think %v",
					i, e.Turns, e.BytesOut, e.BytesIn, e.X1Transmit, tl.R1.Sub(tl.R0), tl.D1.Sub(tl.R0), tl.W0.Sub(tl.R0), tl.W1.Sub(tl.R0), tl.X1.Sub(tl.R0), tl.A1.Sub(tl.R0),
					e.Components.SendWait, e.Components.Think)
			}
		}
	}
	r.network, r.peer, r.think = quantile(nets, 0.5), quantile(peers, 0.5), quantile(thinks, 0.5)
	r.multiplexed = mux
	think := time.Duration(0)
	if tr.think != nil {
		think = *tr.think
	}
	r.ownThink = think
	if tr.streams {
		a.checkStreams(fail, client, server, tr.requests)
	}
	switch {
	case tr.fallback:
		r.verdict = "fallback"
	case tr.multiplexed:
		// Overlapping requests: what lattrace can say is that they
		// overlap, and never a network part below the path.
		if mux == 0 {
			fail("no exchange marked multiplexed on a connection of overlapping requests")
		}
		r.verdict = "multiplexed"
	default:
		// A control message sent while an answer arrives (HTTP/2's
		// WINDOW_UPDATE) cuts it, and the cut after it is marked
		// multiplexed: each such cut may take one request's sample.
		if latency < tr.samples-mux || latency > tr.samples+tr.extra+1 || mux > max(2, tr.samples/20) {
			fail("%d latency samples (and %d multiplexed cuts) on the client's end for %d (+%d around them)", latency, mux, tr.samples, tr.extra)
		}
		// The client's own latency is lattrace's, but on a busy machine
		// for the client's waits for a CPU, at most all it waited: outside
		// the calls lattrace times but inside the client's clock (the
		// client's clock longer), or between two writes of one message
		// lattrace times as one, before the client's clock starts (TLS
		// 1.3's Finished and the request: lattrace longer).
		if !near(r.p50, tr.p50, waited, 0.05, time.Millisecond) || !near(r.p99, tr.p99, waited, 0.05, time.Millisecond) {
			fail("client end p50 %v p99 %v, the client's own %v and %v (it waited %v for a CPU)", r.p50, r.p99, tr.p50, tr.p99, waited)
		}
		if !within(r.network, rtt, 0.05, 0) {
			fail("network %v (median) on a %v path", r.network, rtt)
		}
		// The server's own time is the least the peer (client end) and
		// the think (server end) can be; the most is what the client
		// waited less the path, which a busy machine stretches with them.
		most := max(think, tr.p50-rtt)
		if !between(r.peer, think, most, 0.10, time.Millisecond) || !between(r.think, think, most, 0.10, time.Millisecond) {
			fail("peer %v (client end) and think %v (server end), the server's own %v, the client's less the path %v", r.peer, r.think, think, tr.p50-rtt)
		}
	}
	// What the machine did beside the run: a finding of slow applications
	// or of loss is real when its accounts cover it (labtrace.Busy).
	excuses := a.busy.Excuses()
	excuses.Requester(waited)
	excused := false
	for _, end := range []struct {
		name string
		exs  []*record.Exchange
	}{{"client", client}, {"server", server}} {
		// What the test made the blamed application take: the server's
		// time, as the client's peer and the server's think.
		own := func(n record.DiagnosisName) time.Duration {
			if end.name == "client" && n == diagnose.PeerThink || end.name == "server" && n == diagnose.LocalThink {
				return think
			}
			return 0
		}
		agg := aggregate.New(aggregate.Config{})
		perConn := map[uint64]int{}
		for _, e := range end.exs {
			perConn[e.Cookie]++
		}
		for _, e := range end.exs {
			agg.AddExchange(e)
			for _, d := range diagnose.Exchange(e) {
				// A connection that carried one request (a client's
				// side query on a connection of its own) really is a
				// connection per request.
				really := d.Name == diagnose.ConnPerRequest && perConn[e.Cookie] == 1
				// An answer the server really held back (the send
				// buffer or the window of a young connection, a cork
				// pulled late by a thread the emulated CPU of the
				// kernel matrix descheduled): the capture shows it
				// leaving that late.
				if held, ok := tr.departures[capture.Request{ClientPort: e.Flow.Remote.Port(), Seq: e.InSeq - e.ISNRemote}]; ok && end.name == "server" &&
					e.Components.SendWait >= 5*time.Millisecond && held >= e.Components.SendWait/2 &&
					slices.Contains([]record.DiagnosisName{diagnose.CwndLimited, diagnose.SndbufLimited, diagnose.RwndLimited, diagnose.SendStall}, d.Name) {
					t.Logf("%s on an answer held %v, which left %v after its request on the wire", d.Name, e.Components.SendWait, held)
					really = true
				}
				if d.Severity != record.SeverityInfo && !really && !slices.Contains(tr.expected, d.Name) && excuses.Exchange(e, d.Name, own(d.Name)) {
					excused = true
					continue
				}
				if d.Severity != record.SeverityInfo && !really && !slices.Contains(tr.expected, d.Name) {
					fail("%s end: %s %s on an exchange (first %v, %d out, %d in, cwnd %d..%d, rwnd %d..%d, turns %d) of an unimpaired run: %s", end.name, d.Severity, d.Name, e.First, e.BytesOut, e.BytesIn, e.CwndStart, e.CwndEnd, e.RwndStart, e.RwndEnd, e.Turns, d.Summary)
				}
			}
		}
		for _, p := range agg.Peers() {
			for _, d := range diagnose.OfPair(&p) {
				if d.Severity != record.SeverityInfo && !slices.Contains(tr.expected, d.Name) && excuses.Pair(&p, end.exs, d.Name, own(d.Name)) {
					excused = true
					continue
				}
				if d.Severity != record.SeverityInfo && !slices.Contains(tr.expected, d.Name) {
					fail("%s end: %s %s on an unimpaired run: %s", end.name, d.Severity, d.Name, d.Summary)
				}
			}
		}
	}
	if excused {
		t.Logf("%s: findings of a busy machine: %v", workload, excuses)
	}
	t.Log(r)
}

// checkStreams holds both ends of HTTP/2 connections to one exchange per
// stream: requests of them at each end, none unanswered, each client's
// exchange named as the server's is (the trace's join), and every frame
// placed in its write and stream.
func (a *app) checkStreams(fail func(string, ...any), client, server []*record.Exchange, requests int) {
	if c, err := a.tr.Counters(); err != nil {
		fail("tracer counters: %v", err)
	} else if c.H2Unplaced != 0 || c.H2Ignored != 0 || c.H2Streams == 0 {
		fail("HTTP/2 frames: %d placed without their write, %d ignored, %d streams", c.H2Unplaced, c.H2Ignored, c.H2Streams)
	}
	type key struct{ client, server, seq uint32 }
	keys := map[key]int{}
	for _, end := range []struct {
		name string
		exs  []*record.Exchange
	}{{"client", client}, {"server", server}} {
		n := 0
		for _, e := range end.exs {
			if e.Stream == nil {
				fail("%s end: an exchange of the connection (%d out, %d in), not of a stream", end.name, e.BytesOut, e.BytesIn)
				continue
			}
			n++
			// Small messages never fill a window: the control of
			// TestGRPCFlowControl.
			if e.Components.SendWaitFlowControl != 0 {
				fail("%s end: stream %d waited %v for the flow-control window", end.name, e.Stream.ID, e.Components.SendWaitFlowControl)
			}
			if e.Unanswered || e.Partial || e.Multiplexed {
				fail("%s end: stream %d unanswered %v partial %v multiplexed %v", end.name, e.Stream.ID, e.Unanswered, e.Partial, e.Multiplexed)
			}
			if end.name == "client" {
				keys[key{e.ISNLocal, e.ISNRemote, e.OutSeq}]++
			} else {
				keys[key{e.ISNRemote, e.ISNLocal, e.InSeq}]--
			}
		}
		if n != requests {
			fail("%s end: %d exchanges of streams for %d requests", end.name, n, requests)
		}
	}
	for k, v := range keys {
		if v != 0 {
			fail("the stream at sequence %d is %d more at the client's end than at the server's", k.seq, v)
		}
	}
}
