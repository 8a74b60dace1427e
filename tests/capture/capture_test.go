package capture

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/workload"
)

// The lab tests need root, tcpdump and tshark, and run on the real kernel.
// They are timing tests on a shared machine, so none runs in parallel.

const port = 7000

// serve runs a workload server in h until the test ends. The listener is
// opened inside h's namespace; accepted connections belong to it whichever
// goroutine serves them.
func serve(t *testing.T, h *netlab.Host) string {
	t.Helper()
	addr := net.JoinHostPort(h.IPv4.String(), "7000")
	var srv *workload.Server
	err := h.Do(func() (err error) {
		srv, err = workload.Listen(workload.ServerConfig{Listen: addr})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return addr
}

// exchange runs request/response exchanges from h. RunClient dials on the
// calling goroutine, so inside Do the connection is h's.
func exchange(t *testing.T, ctx context.Context, h *netlab.Host, cfg workload.ClientConfig) {
	t.Helper()
	var recs []workload.ClientRecord
	err := h.Do(func() (err error) {
		recs, err = workload.RunClient(ctx, cfg)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != cfg.Count {
		t.Fatalf("client: %d exchanges, want %d", len(recs), cfg.Count)
	}
	for _, r := range recs {
		if r.Error != "" {
			t.Fatalf("client: exchange %d: %s", r.ID, r.Error)
		}
	}
}

// waitSendsDone waits until no socket in h can still send or retransmit:
// only TIME-WAIT and FIN-WAIT-2 (our FIN acknowledged) may remain. Stopping
// the capture or reading counters earlier would miss, say, a lost FIN's
// retransmission in one of the two.
func waitSendsDone(t *testing.T, h *netlab.Host) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := h.Command(context.Background(), "ss", "-tanH").Output()
		if err != nil {
			t.Fatalf("ss in %s: %v", h.Netns, err)
		}
		busy := ""
		for line := range strings.Lines(string(out)) {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case "TIME-WAIT", "FIN-WAIT-2", "LISTEN", "CLOSED":
			default:
				busy += line
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sockets in %s still busy:\n%s", h.Netns, busy)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func stop(t *testing.T, c *Capture) string {
	t.Helper()
	p, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestACKRTT checks that tshark's ack_rtt on A's interface is the path RTT,
// and shows the capture-point trap on B's interface.
func TestACKRTT(t *testing.T) {
	const delay = 10 * time.Millisecond
	lab := netlab.NewT(t, netlab.Config{AtoB: netlab.Link{Delay: delay}, BtoA: netlab.Link{Delay: delay}})
	capA := StartT(t, lab.A, lab.A.Ifname, "tcp")
	capB := StartT(t, lab.B, lab.B.Ifname, "tcp")
	addr := serve(t, lab.B)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Think 0: the server answers at once, so B's ACK of each request goes
	// out immediately (quickack or on the response) and no delayed ACK
	// inflates the samples. Back to back, so A's ACKs ride on requests.
	const count = 150
	exchange(t, ctx, lab.A, workload.ClientConfig{Addr: addr, ReqSize: 100, RespSize: 100, Count: count})
	waitSendsDone(t, lab.A)
	pathA, pathB := stop(t, capA), stop(t, capB)
	t.Logf("tcpdump a0: %+v, b0: %+v", capA.Stats(), capB.Stats())

	// At A: frames sent by B acknowledge A's data after a full round trip.
	atA, err := ACKRTTs(pathA, SentBy(lab.B.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	// One sample per request at least, plus SYN and FIN.
	if len(atA) < count {
		t.Fatalf("%d ack_rtt samples on frames from B at a0, want >= %d", len(atA), count)
	}
	rtts := RTTs(atA)
	med := Median(rtts)
	t.Logf("a0, frames from B: %d samples, median %v, min %v, max %v", len(atA), med, minOf(rtts), maxOf(rtts))
	if want := 2 * delay; med < want-time.Millisecond || med > want+time.Millisecond {
		t.Errorf("median ack_rtt at a0 = %v, want %v +- 1ms", med, want)
	}
	for _, s := range atA {
		if s.Src.Addr() != lab.B.IPv4 || s.Dst.Addr() != lab.A.IPv4 || s.AcksFrame == 0 || s.AcksFrame >= s.Frame {
			t.Fatalf("bad sample %+v", s)
		}
	}

	// The trap: at B, B's own ACKs follow A's data by B's turnaround only.
	atB, err := ACKRTTs(pathB, SentBy(lab.B.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	medB := Median(RTTs(atB))
	t.Logf("b0, frames from B: %d samples, median %v", len(atB), medB)
	if medB > time.Millisecond {
		t.Errorf("median ack_rtt of B's frames at b0 = %v, want < 1ms (B's turnaround)", medB)
	}

	streams, err := Streams(pathA)
	if err != nil {
		t.Fatal(err)
	}
	if len(streams) != 1 {
		t.Fatalf("%d streams at a0, want 1: %+v", len(streams), streams)
	}
	s := streams[0]
	t.Logf("stream: %+v", s)
	if s.A.Addr() != lab.A.IPv4 || s.B != netip.AddrPortFrom(lab.B.IPv4, port) {
		t.Errorf("stream endpoints %v -> %v, want A -> B:%d", s.A, s.B, port)
	}
	if s.AtoB.PayloadBytes != 100*count || s.BtoA.PayloadBytes != 100*count {
		t.Errorf("payload bytes %d / %d, want %d each way", s.AtoB.PayloadBytes, s.BtoA.PayloadBytes, 100*count)
	}
	if s.AtoB.Retransmissions != 0 || s.BtoA.Retransmissions != 0 {
		t.Errorf("retransmissions on a lossless path: %+v", s)
	}
}

// TestRetransmissions checks tshark's count of A's retransmissions against
// A's kernel counter, with 2 % loss on A->B.
func TestRetransmissions(t *testing.T) {
	const delay = 10 * time.Millisecond
	lab := netlab.NewT(t, netlab.Config{
		AtoB: netlab.Link{Delay: delay, Loss: 0.02},
		BtoA: netlab.Link{Delay: delay},
	})
	capA := StartT(t, lab.A, lab.A.Ifname, "tcp")
	addr := serve(t, lab.B)
	before := retransSegs(t, lab.A)

	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	// Requests of three segments: losses hit the start, middle and tail
	// of a flight, i.e. fast retransmits, RACK and tail loss probes/RTOs.
	exchange(t, ctx, lab.A, workload.ClientConfig{Addr: addr, ReqSize: 4000, RespSize: 100, Count: 150})
	// A short upload adds SACK recovery with many holes, where tshark says
	// "out-of-order". Bytes-bound with a small send buffer, so the end is
	// not minutes of draining a 4 MB buffer through a lossy cwnd.
	err := lab.A.Do(func() error {
		_, err := workload.RunBulk(ctx, workload.BulkConfig{Addr: addr, Bytes: 1 << 20, Duration: 5 * time.Second, SndBuf: 128 << 10})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	waitSendsDone(t, lab.A)
	kernel := retransSegs(t, lab.A) - before
	path := stop(t, capA)
	atob, _ := lab.Stats()

	c, err := CountRetransmissions(path, SentBy(lab.A.IPv4))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("A->B frames lost by the link: %d; A Tcp.RetransSegs delta %d; tshark %+v; tcpdump %+v", atob.LossDrops, kernel, c, capA.Stats())
	if c.Total == 0 || kernel == 0 {
		t.Fatalf("no retransmissions (tshark %d, kernel %d) with 2%% loss", c.Total, kernel)
	}
	// Every retransmission the kernel counts went through a0 (the counter
	// moves only after a successful transmit), tcpdump dropped nothing (Stop
	// checks), nothing was sent before the capture or after the counter was
	// read (waitSendsDone), and netlab never reorders: the counts agreed
	// exactly in every run here. One of slack is for the case tshark cannot
	// classify: a retransmission of just the last byte before snd_nxt looks
	// like a keep-alive to it, and keep-alives are not retransmissions.
	if d := int64(c.Total) - kernel; d < -1 || d > 1 {
		t.Errorf("tshark counts %d retransmissions from A, kernel %d", c.Total, kernel)
	}

	// Streams agrees with the direct count.
	streams, err := Streams(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, s := range streams {
		if s.A.Addr() == lab.A.IPv4 {
			sum += s.AtoB.Retransmissions
		} else {
			sum += s.BtoA.Retransmissions
		}
		t.Logf("stream %d %v -> %v: A->B %+v, B->A %+v", s.Index, s.A, s.B, s.AtoB, s.BtoA)
	}
	if len(streams) != 2 || sum != c.Total {
		t.Errorf("%d streams with %d retransmissions from A, want 2 with %d", len(streams), sum, c.Total)
	}
}

func retransSegs(t *testing.T, h *netlab.Host) int64 {
	t.Helper()
	st, err := h.NetStats()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := st["Tcp.RetransSegs"]
	if !ok {
		t.Fatal("no Tcp.RetransSegs in NetStats")
	}
	return v
}

func minOf(v []time.Duration) time.Duration {
	m := v[0]
	for _, x := range v {
		m = min(m, x)
	}
	return m
}

func maxOf(v []time.Duration) time.Duration {
	m := v[0]
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// Parsing tests need neither root nor the tools.

func TestParseNanos(t *testing.T) {
	for s, want := range map[string]int64{
		"0.020104312":          20104312,
		"0.02":                 20000000,
		"1795426560.845612377": 1795426560845612377,
		"1795426560.845612":    1795426560845612000,
		"3":                    3e9,
		"0.0000000019":         1,
	} {
		got, err := parseNanos(s)
		if err != nil || got != want {
			t.Errorf("parseNanos(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	if _, err := parseNanos("x.1"); err == nil {
		t.Error("parseNanos(x.1): no error")
	}
}

func TestParseFrame(t *testing.T) {
	// A line as tshark 4.0 prints it for fields: a fast retransmission
	// carries both flags, values "1".
	line := "76\t1795426560.845612377\t1514\t0\t10.99.0.1\t\t48184\t10.99.0.2\t\t5001\t0x0010\t33305\t1\t1448\t\t\t1\t1\t\t"
	f, err := parseFrame(strings.Split(line, "\t"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Number != 76 || f.Src != netip.MustParseAddrPort("10.99.0.1:48184") || f.Dst.Port() != 5001 ||
		f.Flags != 0x10 || f.Seq != 33305 || f.Len != 1448 || f.FrameLen != 1514 || f.ACKRTT != 0 ||
		!f.Retransmission || !f.FastRetransmission || f.SpuriousRetransmission || f.OutOfOrder {
		t.Errorf("parsed %+v", f)
	}
	if c := countFrames([]Frame{f, {OutOfOrder: true}, {}}); c != (Counts{Total: 2, Retransmission: 1, Fast: 1, OutOfOrder: 1}) {
		t.Errorf("counts %+v", c)
	}
	line6 := "3\t1.5\t66\t2\t\tfd6c:6174:7472::2\t7000\t\tfd6c:6174:7472::1\t40000\t0x0010\t1\t101\t0\t0.020104312\t2\t\t\t\t"
	f, err = parseFrame(strings.Split(line6, "\t"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Src.Addr() != netip.MustParseAddr("fd6c:6174:7472::2") || f.ACKRTT != 20104312*time.Nanosecond || f.AcksFrame != 2 || f.Stream != 2 {
		t.Errorf("parsed %+v", f)
	}
}

func TestParseStats(t *testing.T) {
	s := parseStats("tcpdump: listening on a0, link-type EN10MB (Ethernet), snapshot length 128 bytes\n12 packets captured\n24 packets received by filter\n0 packets dropped by kernel\n")
	if s != (Stats{Captured: 12, ReceivedByFilter: 24}) {
		t.Errorf("stats %+v", s)
	}
}

func TestMedian(t *testing.T) {
	if m := Median([]time.Duration{3, 1, 2}); m != 2 {
		t.Errorf("odd: %v", m)
	}
	if m := Median([]float64{4, 1, 2, 3}); m != 2.5 {
		t.Errorf("even: %v", m)
	}
	if m := Median[int](nil); m != 0 {
		t.Errorf("empty: %v", m)
	}
	if got := SentBy(netip.MustParseAddr("::ffff:10.0.0.1")); got != "ip.src==10.0.0.1" {
		t.Errorf("SentBy mapped: %s", got)
	}
	if got := SentFrom(netip.MustParseAddrPort("[fd00::1]:80")); got != "ipv6.src==fd00::1 && tcp.srcport==80" {
		t.Errorf("SentFrom: %s", got)
	}
}

// TestStartErrors checks that a tcpdump that cannot capture is reported at
// Start, with its message, rather than as an empty pcap at Stop. It runs in
// the root namespace but captures nothing there.
func TestStartErrors(t *testing.T) {
	for _, tc := range []struct{ iface, filter, want string }{
		{"nosuch0", "", "nosuch0"},
		{"lo", "tcp port notaport", "notaport"},
	} {
		c, err := Start(context.Background(), nil, tc.iface, tc.filter, t.TempDir())
		if err == nil {
			c.Stop()
			t.Errorf("Start(%s, %q): no error", tc.iface, tc.filter)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start(%s, %q): %v, want tcpdump's message about %s", tc.iface, tc.filter, err, tc.want)
		}
		t.Log(err)
	}

	// A cancelled ctx ends tcpdump with SIGINT, not SIGKILL: the file is
	// a complete (here empty) pcap, and Stop says why it ended.
	ctx, cancel := context.WithCancel(context.Background())
	c, err := Start(ctx, nil, "lo", "tcp port 9 and host 127.0.0.9", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	path, err := c.Stop()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Stop after cancel: %v, want context.Canceled", err)
	}
	if frames, err := Frames(path, ""); err != nil || len(frames) != 0 {
		t.Errorf("Frames of the cancelled capture: %d, %v", len(frames), err)
	}
}
