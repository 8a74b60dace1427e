// Package scenarios proves lattrace's latency attribution on the real
// kernel: each test builds a network lab with injected delay, loss, rate or
// queue, runs the project's workload through it with a known server think
// time, traces it with the real BPF programs, and compares every component
// with the injected truth and with the workload's own app-level timestamps
// taken in the same run.
package scenarios

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/bench"
	"github.com/lattrace/lattrace/tests/labtrace"
	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/workload"
)

const port = 7000

// accuracy hands a quantity the scenario asserts, with its truth, to
// make bench's accuracy table (tests/bench); without
// LATTRACE_ACCURACY_FILE it does nothing.
func accuracy(t *testing.T, quantity, unit string, truth float64, from string, measured float64) {
	t.Helper()
	if err := bench.RecordAccuracy(bench.Accuracy{Scenario: t.Name(), Quantity: quantity, Unit: unit,
		Truth: truth, TruthFrom: from, Measured: measured}); err != nil {
		t.Errorf("recording accuracy: %v", err)
	}
}

// msf is d in milliseconds, for accuracy rows.
func msf(d time.Duration) float64 { return float64(d) / 1e6 }

// scenario is one lab with the tracer watching it.
type scenario struct {
	t              *testing.T
	lab            *netlab.Lab
	tr             *tracer.Tracer
	col            *labtrace.Collector
	netnsA, netnsB uint32
	busy           *labtrace.Busy // what the machine did beside the run
	// also receives every record the lab's namespaces produce (an exporter
	// under test); set before startTracer.
	also record.Sink
}

func newScenario(t *testing.T, cfg netlab.Config, opts tracer.Options) *scenario {
	t.Helper()
	s := newLab(t, cfg)
	s.startTracer(opts)
	return s
}

// newLab builds the lab without tracing it yet.
func newLab(t *testing.T, cfg netlab.Config) *scenario {
	t.Helper()
	lab := netlab.NewT(t, cfg)
	s := &scenario{t: t, lab: lab, netnsA: labtrace.NetnsInode(t, lab.A.Netns), netnsB: labtrace.NetnsInode(t, lab.B.Netns),
		busy: labtrace.WatchBusy(t, lab.A, lab.B)}
	s.col = labtrace.NewCollector(s.netnsA, s.netnsB)
	return s
}

func (s *scenario) startTracer(opts tracer.Options) {
	s.t.Helper()
	s.col.Also = s.also
	s.tr = labtrace.Run(s.t, opts, s.col)
}

// server starts the workload server in B, listening on both families.
func (s *scenario) server(cfg workload.ServerConfig) *workload.Server {
	s.t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = fmt.Sprintf("[::]:%d", port)
	}
	var srv *workload.Server
	err := s.lab.B.Do(func() (err error) {
		srv, err = workload.Listen(cfg)
		return err
	})
	if err != nil {
		s.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		srv.Serve(ctx)
		close(done)
	}()
	s.t.Cleanup(func() { cancel(); <-done })
	return srv
}

// client runs the workload client in A against B and returns its records.
func (s *scenario) client(cfg workload.ClientConfig) []workload.ClientRecord {
	s.t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = netip.AddrPortFrom(s.lab.B.IPv4, port).String()
	}
	var recs []workload.ClientRecord
	err := s.lab.A.Do(func() (err error) {
		recs, err = workload.RunClient(context.Background(), cfg)
		return err
	})
	if err != nil {
		s.t.Fatalf("client: %v", err)
	}
	return recs
}

// dial connects from A to B's server.
func (s *scenario) dial() net.Conn {
	s.t.Helper()
	var conn net.Conn
	if err := s.lab.A.Do(func() (err error) {
		conn, err = net.Dial("tcp", netip.AddrPortFrom(s.lab.B.IPv4, port).String())
		return err
	}); err != nil {
		s.t.Fatal(err)
	}
	return conn
}

// settle waits until the tracer has reported the close of every connection
// the client made (the last exchange of a connection is closed by it).
func (s *scenario) settle(recs []workload.ClientRecord) {
	s.t.Helper()
	want := map[netip.AddrPort]bool{}
	for _, r := range recs {
		want[netip.MustParseAddrPort(r.Local)] = true
	}
	s.waitFor(fmt.Sprintf("the close of all %d client connections", len(want)), func() bool {
		s.col.Mu.Lock()
		defer s.col.Mu.Unlock()
		seen := 0
		for _, c := range s.col.Closes {
			if want[c.Flow.Local] && c.Flow.Netns == s.netnsA {
				seen++
			}
		}
		return seen >= len(want)
	})
	time.Sleep(50 * time.Millisecond)
}

// uploadStartsWithFullWindow has A's connections to B start with a window
// of a megabyte (700 segments) and B offer one. A loss-based upload then
// fills a bottleneck's queue of that size in its first round trips: in slow
// start from 10 segments, cubic's HyStart sees the queue's delay rise and
// leaves early, and the window then grows by a segment a round trip, a
// queue's worth in the time of a whole test. The small exchanges are sent
// whole in their first flight either way.
func (s *scenario) uploadStartsWithFullWindow() {
	s.t.Helper()
	for _, c := range [][]string{
		{"-n", s.lab.A.Netns, "route", "replace", s.lab.B.IPv4.String() + "/32", "dev", s.lab.A.Ifname, "initcwnd", "700"},
		{"-n", s.lab.B.Netns, "route", "replace", s.lab.A.IPv4.String() + "/32", "dev", s.lab.B.Ifname, "initrwnd", "700"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			s.t.Fatalf("ip %v: %v: %s", c, err, out)
		}
	}
}

// waitFor waits until done reports true, looking every 10 ms; a minute
// without it fails the test.
func (s *scenario) waitFor(what string, done func() bool) {
	s.t.Helper()
	for deadline := time.Now().Add(time.Minute); !done(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("no sign of %s after a minute", what)
		}
	}
}

// pair is one exchange as the workload and as lattrace saw it.
type pair struct {
	app workload.ClientRecord
	ex  *record.Exchange
}

// match finds, for each client record, the requester exchange in A on the
// same connection whose first write falls inside the record's write.
func (s *scenario) match(recs []workload.ClientRecord) []pair {
	s.t.Helper()
	s.col.Mu.Lock()
	defer s.col.Mu.Unlock()
	var out []pair
	for _, r := range recs {
		local := netip.MustParseAddrPort(r.Local)
		var found *record.Exchange
		for _, e := range s.col.Exchanges {
			if e.Role != record.Requester || e.Flow.Netns != s.netnsA || e.Flow.Local != local {
				continue
			}
			w0 := int64(e.Timeline.W0)
			if w0 >= r.WriteStartNs && w0 <= r.WriteDoneNs {
				found = e
				break
			}
		}
		if found == nil {
			s.t.Errorf("no requester exchange for client exchange %d on %s", r.ID, r.Local)
			continue
		}
		out = append(out, pair{r, found})
	}
	return out
}

// responders returns B's responder exchanges.
func (s *scenario) responders() []*record.Exchange {
	s.col.Mu.Lock()
	defer s.col.Mu.Unlock()
	var out []*record.Exchange
	for _, e := range s.col.Exchanges {
		if e.Role == record.Responder && e.Flow.Netns == s.netnsB {
			out = append(out, e)
		}
	}
	return out
}

// emulated is set (LTTEST_EMULATED=1) where the suite runs in a VM on
// an emulated CPU (tests/kernels boots Debian's kernels under qemu's TCG).
// There each segment's way through a network stack and the lab's relay
// takes about half a millisecond more, and varies by as much from one
// exchange to the next: the path is made longer and the tolerance wider
// (README, "Kernels").
var emulated = os.Getenv("LTTEST_EMULATED") != ""

// tolerance is the model's accuracy target: max(5 %, 300 us) of the truth;
// on an emulated CPU max(10 %, 2 ms).
func tolerance(truth time.Duration) time.Duration {
	if emulated {
		return max(time.Duration(math.Abs(float64(truth))*0.10), 2*time.Millisecond)
	}
	return max(time.Duration(math.Abs(float64(truth))*0.05), 300*time.Microsecond)
}

func near(got, truth time.Duration) bool {
	d := got - truth
	return d.Abs() <= tolerance(truth)
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func mean(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// checkSums asserts rule 1 of the model on every pair, and that lattrace's
// exchange is the one the app made: it starts inside the app's first call
// for it (its connect, or else the write of its request) and ends inside
// the read call that returned the response's last byte. The app's clock
// brackets each of those calls, so the bounds hold however long its thread
// waits for a CPU around them on a busy machine, and they are tens of
// microseconds apart when it does not wait: lattrace's duration is the
// app's own, less the two calls' edges.
func checkSums(t *testing.T, pairs []pair) {
	t.Helper()
	for _, p := range pairs {
		c, e := p.ex.Components, p.ex
		if c.Sum() != e.Duration {
			t.Errorf("exchange %d: components sum to %v, duration %v", p.app.ID, c.Sum(), e.Duration)
		}
		for name, v := range map[string]time.Duration{"network": c.Network, "send_wait": c.SendWait, "loss": c.LossRecovery,
			"handshake": c.Handshake, "receive": c.Receive, "peer": c.Peer, "local_read": c.LocalRead, "think": c.Think} {
			if v < 0 {
				t.Errorf("exchange %d: %s negative: %v", p.app.ID, name, v)
			}
		}
		first, from, to := "write", p.app.WriteStartNs, p.app.WriteDoneNs
		if p.app.NewConn && e.Timeline.Connect != 0 {
			first, from, to = "connect", p.app.ConnectStartNs, p.app.ConnectDoneNs
		}
		if start := int64(e.Start); start < from || start > to {
			t.Errorf("exchange %d: lattrace starts %v after the app's %s call began, which returned after %v",
				p.app.ID, time.Duration(start-from), first, time.Duration(to-from))
		}
		if end := int64(e.End); end < p.app.LastReadCallNs || end > p.app.LastRespByteNs {
			t.Errorf("exchange %d: lattrace ends %v after the app's last read call began, which returned after %v",
				p.app.ID, time.Duration(end-p.app.LastReadCallNs), time.Duration(p.app.LastRespByteNs-p.app.LastReadCallNs))
		}
		if app := time.Duration(p.app.LastRespByteNs - from); app-e.Duration > max(app/100, time.Millisecond) {
			t.Logf("exchange %d: lattrace duration %v, the app's %v: its thread waited %v around its calls", p.app.ID, e.Duration, app, app-e.Duration)
		}
	}
}

func componentMedians(pairs []pair, skipFirst bool) map[string]time.Duration {
	vals := map[string][]time.Duration{}
	for _, p := range pairs {
		if skipFirst && p.ex.First {
			continue
		}
		c := p.ex.Components
		for k, v := range map[string]time.Duration{"network": c.Network, "propagation": c.Propagation, "queueing": c.Queueing,
			"send_wait": c.SendWait, "loss": c.LossRecovery, "handshake": c.Handshake, "receive": c.Receive,
			"peer": c.Peer, "local_read": c.LocalRead, "duration": p.ex.Duration} {
			vals[k] = append(vals[k], v)
		}
	}
	out := map[string]time.Duration{}
	for k, v := range vals {
		out[k] = median(v)
	}
	return out
}

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "scenarios: these tests load BPF programs and build network namespaces: run them as root")
		os.Exit(1)
	}
	os.Exit(m.Run())
}
