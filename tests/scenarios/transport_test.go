package scenarios

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/capture"
	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/workload"
)

// Scenario 3: 1 % loss both ways. Retransmissions lattrace counts on each
// side equal the kernel's own SNMP counter of that namespace, and the
// exchanges whose request was retransmitted carry loss recovery.
func TestLoss(t *testing.T) {
	l := netlab.Link{Delay: 10 * time.Millisecond, Loss: 0.01}
	s := newScenario(t, netlab.Config{AtoB: l, BtoA: l, Seed: 7}, tracer.Options{})
	s.server(workload.ServerConfig{})
	before, err := s.lab.A.NetStats()
	if err != nil {
		t.Fatal(err)
	}
	beforeB, err := s.lab.B.NetStats()
	if err != nil {
		t.Fatal(err)
	}
	w := s.captureBoth()
	recs := s.client(workload.ClientConfig{ReqSize: 3000, RespSize: 3000, Count: 300, Interval: 5 * time.Millisecond})
	s.settle(recs)
	w.stop()
	after, _ := s.lab.A.NetStats()
	afterB, _ := s.lab.B.NetStats()
	pairs := s.match(recs)
	checkSums(t, pairs)

	var retransA, lostReq, recovered int
	for _, p := range pairs {
		retransA += int(p.ex.Retransmits)
		if p.ex.Retransmits > 0 && p.ex.Raw.LossOut > 0 {
			lostReq++
			if p.ex.Components.LossRecovery > 0 {
				recovered++
			}
		}
		if p.ex.Raw.LossIn > 0 && p.ex.Components.LossRecovery == 0 {
			t.Errorf("exchange %d: a receive hole of %v but no loss recovery", p.app.ID, p.ex.Raw.LossIn)
		}
	}
	var retransB, lostAnswers int
	for _, e := range s.responders() {
		retransB += int(e.Retransmits)
		// An answer retransmitted after it first left: the responder's
		// exchange runs to the retransmission, as loss recovery.
		if e.Raw.LossOut > 0 {
			lostAnswers++
			if e.Components.LossRecovery < e.Raw.LossOut || e.Components.Sum() != e.Duration {
				t.Errorf("responder: answer retransmitted %v after it left, loss recovery %v", e.Raw.LossOut, e.Components.LossRecovery)
			}
		}
	}
	if lostAnswers == 0 {
		t.Error("1 % loss on the way back made no answer retransmitted after it left")
	}
	kernelA := after["Tcp.RetransSegs"] - before["Tcp.RetransSegs"]
	kernelB := afterB["Tcp.RetransSegs"] - beforeB["Tcp.RetransSegs"]
	t.Logf("retransmissions: A lattrace %d kernel %d; B lattrace %d kernel %d; requests lost %d, with loss recovery %d; answers lost %d",
		retransA, kernelA, retransB, kernelB, lostReq, recovered, lostAnswers)
	// tshark on each sender's own interface sees every retransmission it
	// sent (the lab drops after the capture point).
	wireA, err := capture.Retransmissions(w.pa, capture.SentBy(s.lab.A.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	wireB, err := capture.Retransmissions(w.pb, capture.SentBy(s.lab.B.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tshark: A sent %d retransmissions, B %d", wireA, wireB)
	accuracy(t, "retransmissions at A", "segments", float64(wireA), "tshark, capture at A", float64(retransA))
	accuracy(t, "retransmissions at B", "segments", float64(wireB), "tshark, capture at B", float64(retransB))
	if retransA != wireA || retransB != wireB {
		t.Errorf("lattrace counted A %d B %d retransmissions, tshark A %d B %d", retransA, retransB, wireA, wireB)
	}
	if kernelA == 0 || kernelB == 0 {
		t.Fatalf("1 %% loss made no retransmissions (A %d, B %d)", kernelA, kernelB)
	}
	// The connection's handshake and close are outside exchanges; anything
	// else must be counted.
	if int64(retransA) != kernelA || int64(retransB) != kernelB {
		t.Errorf("lattrace counted A %d B %d retransmissions, the kernel A %d B %d", retransA, retransB, kernelA, kernelB)
	}
	if lostReq == 0 || recovered != lostReq {
		t.Errorf("%d exchanges lost request bytes after sending them, %d show loss recovery", lostReq, recovered)
	}
}

// Scenario 4: 100 KB every second over 20 ms with cubic. With
// tcp_slow_start_after_idle=1 the window restarts after each idle second
// and the request waits for it (send wait, cwnd); with =0 it does not.
func TestSlowStartAfterIdle(t *testing.T) {
	res := map[string]time.Duration{}
	for _, ssai := range []string{"1", "0"} {
		t.Run("ssai="+ssai, func(t *testing.T) {
			s := newScenario(t, symmetric(10*time.Millisecond), tracer.Options{})
			for k, v := range map[string]string{"net.ipv4.tcp_congestion_control": "cubic", "net.ipv4.tcp_slow_start_after_idle": ssai} {
				if err := s.lab.A.Sysctl(k, v); err != nil {
					t.Fatal(err)
				}
			}
			s.server(workload.ServerConfig{})
			recs := s.client(workload.ClientConfig{ReqSize: 100_000, RespSize: 100, Count: 6, Interval: time.Second})
			s.settle(recs)
			pairs := s.match(recs)
			checkSums(t, pairs)
			var waits, cwndWaits []time.Duration
			restarts := 0
			for _, p := range pairs {
				if p.ex.First {
					continue
				}
				waits = append(waits, p.ex.Components.SendWait)
				cwndWaits = append(cwndWaits, p.ex.Components.SendWaitCwnd)
				if p.ex.CwndRestart {
					restarts++
				}
				if p.ex.SlowStartAfterIdle != (ssai == "1") {
					t.Errorf("exchange %d: slow_start_after_idle %v, sysctl %s", p.app.ID, p.ex.SlowStartAfterIdle, ssai)
				}
				t.Logf("exchange %d: send wait %v (cwnd %v) cwnd %d->%d restart %v idle %v", p.app.ID, p.ex.Components.SendWait,
					p.ex.Components.SendWaitCwnd, p.ex.CwndStart, p.ex.CwndEnd, p.ex.CwndRestart, p.ex.IdleGap)
			}
			res[ssai] = median(waits)
			if ssai == "1" {
				if restarts != len(waits) {
					t.Errorf("cwnd restart flagged on %d of %d exchanges after 1 s idle", restarts, len(waits))
				}
				// 100 KB from a restarted window of 10 segments takes 3
				// more round trips of slow start: at least 2 RTTs waiting.
				if m := median(cwndWaits); m < 40*time.Millisecond {
					t.Errorf("cwnd-limited send wait %v, want >= 2 RTTs (40 ms)", m)
				}
			} else {
				if restarts != 0 {
					t.Errorf("cwnd restart flagged %d times with slow start after idle off", restarts)
				}
			}
		})
	}
	if res["1"] < 3*res["0"] {
		t.Errorf("send wait with slow start after idle %v, without %v: want a clear difference", res["1"], res["0"])
	}
}

// Scenario 5: bufferbloat. A 10 Mbit/s bottleneck with a 1 MB queue: a
// small request/response flow's queueing rises while a bulk upload runs
// beside it, its minimum RTT does not, and its network component follows
// what ping measures through the same queue.
func TestBufferbloat(t *testing.T) {
	bottleneck := netlab.Link{Delay: 10 * time.Millisecond, RateBitsPerSec: 10_000_000, QueueLimitBytes: 1 << 20}
	s := newScenario(t, netlab.Config{AtoB: bottleneck, BtoA: netlab.Link{Delay: 10 * time.Millisecond}}, tracer.Options{})
	if err := s.lab.A.Sysctl("net.ipv4.tcp_congestion_control", "cubic"); err != nil {
		t.Fatal(err)
	}
	s.uploadStartsWithFullWindow()
	s.server(workload.ServerConfig{})
	rr := workload.ClientConfig{ReqSize: 1000, RespSize: 1000, Count: 40, Interval: 50 * time.Millisecond}
	quiet := s.client(rr)

	ctx, cancel := context.WithCancel(context.Background())
	bulkDone := make(chan error, 1)
	go func() {
		bulkDone <- s.lab.A.Do(func() error {
			_, err := workload.RunBulk(ctx, workload.BulkConfig{Addr: netip.AddrPortFrom(s.lab.B.IPv4, port).String(),
				Direction: workload.BulkUp, Duration: time.Minute})
			return err
		})
	}()
	// The queue in front of the bottleneck fills first.
	s.waitFor("the upload to fill half the bottleneck's queue", func() bool {
		atob, _ := s.lab.Stats()
		return atob.QueueBytes >= bottleneck.QueueLimitBytes/2
	})
	pingOut := make(chan []time.Duration, 1)
	// Pings through the same queue for as long as the exchanges run
	// (a dozen of up to 0.85 s), so both see the same queue.
	go func() { pingOut <- ping(t, s.lab.A, s.lab.B.IPv4, 80) }()
	// Each exchange waits a queue's worth (up to 0.85 s): a dozen, all
	// while the upload runs (it ends when cancelled).
	busy := rr
	busy.Count = 12
	loaded := s.client(busy)
	pings := <-pingOut
	cancel()
	<-bulkDone

	s.settle(append(quiet, loaded...))
	q, l := s.match(quiet), s.match(loaded)
	checkSums(t, q)
	checkSums(t, l)
	mq, ml := componentMedians(q, true), componentMedians(l, true)
	pingMed := median(pings)
	t.Logf("quiet: %v", mq)
	t.Logf("loaded: %v; ping median %v", ml, pingMed)
	if mq["queueing"] > 2*time.Millisecond {
		t.Errorf("queueing %v on a quiet path", mq["queueing"])
	}
	if ml["queueing"] < 50*time.Millisecond {
		t.Errorf("queueing %v behind a bulk upload into a 1 MB queue at 10 Mbit/s, want > 50 ms", ml["queueing"])
	}
	if d := ml["propagation"] - mq["propagation"]; d.Abs() > time.Millisecond {
		t.Errorf("min RTT moved from %v to %v: it must stay flat", mq["propagation"], ml["propagation"])
	}
	accuracy(t, "network under load (median)", "ms", msf(pingMed), "ping through the same queue", msf(ml["network"]))
	accuracy(t, "propagation (median)", "ms", 20, "injected: 10 ms each way", msf(ml["propagation"]))
	if d := ml["network"] - pingMed; d.Abs() > pingMed/4 {
		t.Errorf("network %v under load, ping through the same queue %v", ml["network"], pingMed)
	}
}

// ping returns n RTTs measured by ping from h to dst.
func ping(t *testing.T, h *netlab.Host, dst netip.Addr, n int) []time.Duration {
	out, err := h.Command(context.Background(), "ping", "-n", "-c", fmt.Sprint(n), "-i", "0.1", dst.String()).Output()
	if err != nil {
		t.Errorf("ping: %v", err)
		return nil
	}
	return parsePing(string(out))
}

// Scenario 6: a connection per request: the handshake is about one RTT of
// every exchange, and the connect latency lattrace reports matches it.
func TestConnectionPerRequest(t *testing.T) {
	s := newScenario(t, symmetric(10*time.Millisecond), tracer.Options{})
	s.server(workload.ServerConfig{})
	recs := s.client(workload.ClientConfig{ReqSize: 200, RespSize: 2000, Count: 20, Interval: 60 * time.Millisecond, Mode: workload.ModePerRequest})
	s.settle(recs)
	pairs := s.match(recs)
	checkSums(t, pairs)
	var hs []time.Duration
	for _, p := range pairs {
		if !p.ex.First || p.ex.Timeline.Connect == 0 {
			t.Errorf("exchange %d on a new connection is not marked first with a connect time", p.app.ID)
			continue
		}
		hs = append(hs, p.ex.Components.Handshake)
		app := time.Duration(p.app.WriteStartNs - p.app.ConnectStartNs)
		if h := p.ex.Components.Handshake; h < 20*time.Millisecond-tolerance(20*time.Millisecond) || h > app+300*time.Microsecond {
			t.Errorf("exchange %d: handshake %v, want between one RTT and the app's connect-to-write %v", p.app.ID, h, app)
		}
	}
	// The truth is the app's own connect(): one injected round trip and
	// what the hosts' kernels and the relay add to it in this run.
	connect := map[netip.AddrPort]time.Duration{}
	var appConnects []time.Duration
	for _, r := range recs {
		d := time.Duration(r.ConnectDoneNs - r.ConnectStartNs)
		connect[netip.MustParseAddrPort(r.Local)] = d
		appConnects = append(appConnects, d)
	}
	appConnect := median(appConnects)
	accuracy(t, "handshake (median)", "ms", msf(appConnect), "the app's connect() (median)", msf(median(hs)))
	if m := median(hs); !near(m, appConnect) {
		t.Errorf("handshake median %v, the app's connect() %v", m, appConnect)
	}
	const rtt = 20 * time.Millisecond
	if appConnect < rtt-tolerance(rtt) {
		t.Errorf("the app's connect() took %v, less than the injected round trip %v: the lab is wrong", appConnect, rtt)
	}
	// Each connection's open record: its connect latency is what the
	// app's connect() took, give or take the two system calls.
	s.col.Mu.Lock()
	defer s.col.Mu.Unlock()
	opens := 0
	var lats []time.Duration
	for _, o := range s.col.Opens {
		app, ok := connect[o.Flow.Local]
		if !ok || o.Flow.Netns != s.netnsA {
			continue
		}
		opens++
		lats = append(lats, o.ConnectLatency)
		// The app's connect() brackets the kernel's SYN-to-ESTABLISHED
		// (its wake-up after the handshake can take milliseconds here).
		if o.Role != record.RoleClient || o.ConnectLatency < rtt-tolerance(rtt) || o.ConnectLatency > app+300*time.Microsecond {
			t.Errorf("%v: role %s, connect latency %v, want between %v and the app's connect() %v", o.Flow.Local, o.Role, o.ConnectLatency, rtt, app)
		}
	}
	if m := median(lats); !near(m, appConnect) {
		t.Errorf("connect latency median %v, the app's connect() %v", m, appConnect)
	}
	if opens != len(recs) {
		t.Errorf("%d connection opens for %d connections", opens, len(recs))
	}
}

// Scenario 7: a slow reader. (a) The client reads each response 50 ms
// after it arrived: app.local_read on the client. (b) A reader with a
// small receive buffer drains a large response slowly: the server's send
// wait is rwnd-limited.
func TestSlowReader(t *testing.T) {
	t.Run("read delay", func(t *testing.T) {
		const oneWay, delay = 5 * time.Millisecond, 50 * time.Millisecond
		s := newScenario(t, symmetric(oneWay), tracer.Options{})
		s.server(workload.ServerConfig{})
		// Back to back: the reader starts its 50 ms sleep as it finishes
		// one response, the next request leaves at once, and its response
		// waits in the socket for the rest of the sleep.
		recs := s.client(workload.ClientConfig{ReqSize: 100, RespSize: 1000, Count: 15, ReadDelay: delay})
		s.settle(recs)
		pairs := s.match(recs)
		checkSums(t, pairs)
		var errs, truths, reads []time.Duration
		for _, p := range pairs[1:] {
			// The truth: the app's read returned at FirstRespByteNs; the
			// response had arrived one RTT plus the server's time after
			// the request was written.
			arrived := p.app.WriteDoneNs + int64(2*oneWay) + p.app.ServerNs
			truth := time.Duration(p.app.FirstRespByteNs - arrived)
			if truth < 20*time.Millisecond {
				t.Fatalf("exchange %d: the response waited only %v: the scenario did not make a slow reader", p.app.ID, truth)
			}
			errs = append(errs, p.ex.Components.LocalRead-truth)
			truths, reads = append(truths, truth), append(reads, p.ex.Components.LocalRead)
		}
		accuracy(t, "app.local_read (median)", "ms", msf(median(truths)), "the reader's own timestamps", msf(median(reads)))
		if m := median(errs); m.Abs() > 2*time.Millisecond {
			t.Errorf("local read off the truth by %v (median)", m)
		}
	})
	t.Run("rwnd-limited server", func(t *testing.T) {
		s := newScenario(t, symmetric(5*time.Millisecond), tracer.Options{})
		s.server(workload.ServerConfig{})
		recs := s.client(workload.ClientConfig{ReqSize: 100, RespSize: 512 << 10, Count: 4, Interval: 50 * time.Millisecond,
			RcvBuf: 16 << 10, ReadChunk: 8 << 10, ReadGap: 5 * time.Millisecond})
		s.settle(recs)
		checkSums(t, s.match(recs))
		for _, e := range s.responders() {
			if e.First {
				continue
			}
			c := e.Components
			t.Logf("responder: send wait %v (rwnd %v cwnd %v sndbuf %v other %v)", c.SendWait, c.SendWaitRwnd, c.SendWaitCwnd, c.SendWaitSndbuf, c.SendWaitOther)
			if c.SendWait < 100*time.Millisecond || c.SendWaitRwnd < c.SendWait/2 {
				t.Errorf("server send wait %v with rwnd part %v: want mostly rwnd-limited", c.SendWait, c.SendWaitRwnd)
			}
		}
	})
}
