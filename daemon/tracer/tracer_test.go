package tracer

import (
	"context"
	"github.com/cilium/ebpf/btf"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/daemon/pipeline"
	"github.com/lattrace/lattrace/record"
)

// collector gathers records from the reading goroutine.
type collector struct {
	mu        sync.Mutex
	conns     []record.ConnClose
	opens     []record.ConnOpen
	exchanges []*record.Exchange
}

func (c *collector) Exchange(e *record.Exchange) {
	c.mu.Lock()
	x := *e // the tracer reuses e
	c.exchanges = append(c.exchanges, &x)
	c.mu.Unlock()
}

func (c *collector) ConnOpen(o record.ConnOpen) {
	c.mu.Lock()
	c.opens = append(c.opens, o)
	c.mu.Unlock()
}

func (c *collector) ConnClose(r record.ConnClose) {
	c.mu.Lock()
	c.conns = append(c.conns, r)
	c.mu.Unlock()
}

func (c *collector) Flush() {}

// connExchanges are the exchanges of the connection with an end at addr,
// both sides.
func (c *collector) connExchanges(addr netip.AddrPort) []*record.Exchange {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*record.Exchange
	for _, e := range c.exchanges {
		if e.Flow.Local == addr || e.Flow.Remote == addr {
			out = append(out, e)
		}
	}
	return out
}

// find waits until a close record for the local address shows up.
func (c *collector) find(t testing.TB, local netip.AddrPort) record.ConnClose {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, r := range c.conns {
			if r.Flow.Local == local {
				c.mu.Unlock()
				return r
			}
		}
		c.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no close record for %v among %+v", local, c.conns)
	return record.ConnClose{}
}

func openTracer(t testing.TB) (*Tracer, *collector) {
	t.Helper()
	col := &collector{}
	tr, _ := openTracerWith(t, Options{DrainInterval: 20 * time.Millisecond}, col)
	return tr, col
}

// openTracerWith opens a tracer with opts and drains it into sink until
// the returned stop, or the test's end.
func openTracerWith(t testing.TB, opts Options, sink record.Sink) (*Tracer, func()) {
	t.Helper()
	tr, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v (this test loads BPF programs: run it as root)", err)
	}
	stop := sync.OnceFunc(runCollector(t, tr, sink))
	t.Cleanup(stop)
	return tr, stop
}

// waitExchanges waits until the connection with an end at local has want
// exchanges in col, or until deadline, and returns how many it has.
func waitExchanges(col *collector, local netip.AddrPort, want int, deadline time.Time) int {
	for {
		got := len(col.connExchanges(local))
		if got >= want || !time.Now().Before(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runCollector drains tr through the pipeline (which attributes each
// exchange's components) into col until the returned stop is called.
func runCollector(t testing.TB, tr *Tracer, col record.Sink) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx, pipeline.New(pipeline.Config{}, col)) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		tr.Close()
	}
}

// TestSendCountsLoopback makes a known number of sends on both ends of real
// loopback connections and checks the kernel counted each one, for IPv4 and
// IPv6.
func TestSendCountsLoopback(t *testing.T) {
	tr, col := openTracer(t)
	checkHooks(t, tr.Hooks())
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			testSendCounts(t, col, network)
			c, _ := tr.Counters()
			t.Logf("counters %+v", c)
		})
	}
	c, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.RingbufFull != 0 || c.StorageFail != 0 || c.DecodeErrors != 0 {
		t.Errorf("drops counted on an idle ring: %+v", c)
	}
	if c.Decoded < 4 || c.Submitted < c.Decoded {
		t.Errorf("counters inconsistent with the records read: %+v", c)
	}
}

// TestRefusedConnectClose: a connect the peer refuses never reaches
// ESTABLISHED, where the flow is read once its local port is chosen. Its
// close record has the flow all the same: as read when the connect began
// for a socket bound beforehand, read at the close for one whose port the
// connect chose.
func TestRefusedConnectClose(t *testing.T) {
	_, col := openTracer(t)
	for _, c := range []struct {
		family int
		host   string
		bind   bool
	}{{unix.AF_INET, "127.0.0.1", true}, {unix.AF_INET, "127.0.0.1", false}, {unix.AF_INET6, "::1", true}, {unix.AF_INET6, "::1", false}} {
		// A port nothing listens on: bound and closed again.
		ln, err := net.Listen("tcp", net.JoinHostPort(c.host, "0"))
		if err != nil {
			t.Fatal(err)
		}
		target := ln.Addr().(*net.TCPAddr).AddrPort()
		ln.Close()
		fd, err := unix.Socket(c.family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		var sa, to unix.Sockaddr
		if c.family == unix.AF_INET {
			sa, to = &unix.SockaddrInet4{Addr: target.Addr().As4()}, &unix.SockaddrInet4{Addr: target.Addr().As4(), Port: int(target.Port())}
		} else {
			sa, to = &unix.SockaddrInet6{Addr: target.Addr().As16()}, &unix.SockaddrInet6{Addr: target.Addr().As16(), Port: int(target.Port())}
		}
		if c.bind {
			if err := unix.Bind(fd, sa); err != nil {
				t.Fatal(err)
			}
		}
		if err := unix.Connect(fd, to); err != unix.ECONNREFUSED {
			t.Fatalf("connect to %v: %v, want connection refused", target, err)
		}
		bound, err := unix.Getsockname(fd)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		var local netip.AddrPort
		switch b := bound.(type) {
		case *unix.SockaddrInet4:
			local = netip.AddrPortFrom(netip.AddrFrom4(b.Addr), uint16(b.Port))
		case *unix.SockaddrInet6:
			local = netip.AddrPortFrom(netip.AddrFrom16(b.Addr), uint16(b.Port))
		}
		if local.Port() == 0 {
			t.Fatalf("%s bound=%v: the socket's port is gone after the refused connect: nothing to find its record by", c.host, c.bind)
		}
		// A failed connect resets the socket's own address (getsockname
		// says 0.0.0.0), not its port: the record has the address the
		// connect used.
		want := netip.AddrPortFrom(target.Addr(), local.Port())
		got := col.find(t, want)
		if got.Flow.Remote != target || got.Established != 0 {
			t.Errorf("%s bound=%v: close record %+v, want the flow %v -> %v and no establishment", c.host, c.bind, got, want, target)
		}
	}
}

func testSendCounts(t *testing.T, col *collector, network string) {
	const requests, reqSize, respSize = 50, 100, 300
	host := "127.0.0.1"
	if network == "tcp6" {
		host = "::1"
	}
	ln, err := net.Listen(network, net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	serverLocal := make(chan netip.AddrPort, 1)
	serverErr := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			serverErr <- err
			return
		}
		defer conn.Close()
		serverLocal <- conn.LocalAddr().(*net.TCPAddr).AddrPort()
		req, resp := make([]byte, reqSize), make([]byte, respSize)
		for i := 0; i < requests; i++ {
			if _, err := io.ReadFull(conn, req); err != nil {
				serverErr <- err
				return
			}
			if _, err := conn.Write(resp); err != nil {
				serverErr <- err
				return
			}
		}
		serverErr <- nil
	}()

	conn, err := net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	clientLocal := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	req, resp := make([]byte, reqSize), make([]byte, respSize)
	for i := 0; i < requests; i++ {
		if _, err := conn.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, resp); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	if err := <-serverErr; err != nil {
		t.Fatal(err)
	}

	client := col.find(t, clientLocal)
	server := col.find(t, <-serverLocal)
	comm := filepath.Base(os.Args[0])
	if len(comm) > 15 {
		comm = comm[:15]
	}
	for _, c := range []struct {
		name  string
		got   record.ConnClose
		role  record.Role
		bytes uint64
	}{
		{"client", client, record.RoleClient, requests * reqSize},
		{"server", server, record.RoleServer, requests * respSize},
	} {
		g := c.got
		if g.SendCalls != requests || g.BytesSent != c.bytes {
			t.Errorf("%s: %d sends of %d bytes counted, want %d of %d", c.name, g.SendCalls, g.BytesSent, requests, c.bytes)
		}
		if g.SendSKBs < requests {
			t.Errorf("%s: %d skbs for %d separate sends", c.name, g.SendSKBs, requests)
		}
		if g.Role != c.role {
			t.Errorf("%s: role %q", c.name, g.Role)
		}
		if g.Owner.PID != uint32(os.Getpid()) || g.Owner.Comm != comm {
			t.Errorf("%s: owner %+v, want pid %d comm %q", c.name, g.Owner, os.Getpid(), comm)
		}
		if g.Flow.IPv6() != (network == "tcp6") {
			t.Errorf("%s: flow %v has the wrong family", c.name, g.Flow)
		}
		if g.Established == 0 || g.Lifetime() <= 0 || g.Lifetime() > 10*time.Second {
			t.Errorf("%s: lifetime %v from established %d to close %d", c.name, g.Lifetime(), g.Established, g.Time)
		}
		if g.Cookie == 0 {
			t.Errorf("%s: no socket cookie", c.name)
		}
	}
	if client.Flow.Remote != server.Flow.Local || server.Flow.Remote != client.Flow.Local {
		t.Errorf("the two ends disagree: client %v, server %v", client.Flow, server.Flow)
	}
	if client.Flow.Netns == 0 || client.Flow.Netns != server.Flow.Netns {
		t.Errorf("netns: client %d, server %d", client.Flow.Netns, server.Flow.Netns)
	}
}

// TestInFlight: a transfer still running is visible with its owner and
// the bytes so far, before any record of it exists, through the iterator
// the kernel takes and through the TCP iterator that stands in where it
// refuses the one over socket storage (it sees the daemon's namespace,
// this test's).
func TestInFlight(t *testing.T) {
	forEachIterator(t, testInFlight)
}

func testInFlight(t *testing.T, opts Options) {
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	tr, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	checkHooks(t, tr.Hooks())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	stop := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// A slow reader keeps the sender's exchange open.
		buf := make([]byte, 4096)
		for {
			select {
			case <-stop:
				return
			default:
			}
			c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			c.Read(buf)
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	defer close(stop)
	chunk := make([]byte, 64<<10)
	for range 16 { // 1 MiB, one message
		if _, err := c.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	local := c.LocalAddr().String()
	ins, err := tr.InFlight()
	if err != nil {
		t.Fatal(err)
	}
	var found *record.InFlight
	for i := range ins {
		if ins[i].Flow.Local.String() == local {
			found = &ins[i]
		}
	}
	if found == nil {
		t.Fatalf("the sending socket %s is not among %d in flight", local, len(ins))
	}
	if found.BytesOut != 16*64<<10 || found.Owner.PID != uint32(os.Getpid()) || found.Role != record.Requester ||
		found.Start == 0 || found.Cwnd == 0 || found.ConnRole != record.RoleClient {
		t.Errorf("in flight: %+v", *found)
	}
}

// forEachIterator runs test with the iterators the kernel takes, then
// with the TCP iterators forced, as on a kernel that refuses those over
// socket storage; checkHooks logs which alternative each run checked.
func forEachIterator(t *testing.T, test func(*testing.T, Options)) {
	t.Run("kernel's choice", func(t *testing.T) { test(t, Options{}) })
	t.Run("TCP iterator", func(t *testing.T) { test(t, Options{noStorageIters: true}) })
}

// checkHooks wants, for every hook, the alternative this kernel should
// take attached: the first one whose attach point its BTF has (and whose
// arguments fit). The iterators over socket storage are the exception:
// some kernels with them in their BTF refuse them (the verifier, with no
// log), and a program as small as one instruction fares no better than
// lattrace's, so no independent probe can tell beforehand. There either
// the iterator is attached, or it was refused with a reason and its
// alternative, the TCP iterator, stands in; which one is logged, and the
// tests of what each sees assert it.
func checkHooks(t *testing.T, got []HookStatus) {
	t.Helper()
	kernel, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]HookStatus{}
	for _, h := range got {
		status[h.Program] = h
	}
	want := map[string]string{} // the hook's program → the alternative that should run
	for _, h := range hooks {
		primary := h.program
		if h.fallbackFor != "" {
			primary = h.fallbackFor
		}
		if _, chosen := want[primary]; chosen || (h.only != nil && !h.only(kernel)) {
			continue
		}
		if h.iterator && h.fallbackFor == "" {
			st, tried := status[h.program]
			switch {
			case st.Attached:
				want[primary] = h.program
				t.Logf("%s: %s attached", h.program, h.hook)
			case tried && st.Error == "":
				t.Errorf("%s: %s not attached, and no reason given", h.program, h.hook)
			case tried:
				t.Logf("%s: the kernel refused %s (%s); its alternative stands in", h.program, h.hook, st.Error)
			default:
				t.Logf("%s: %s left out by the options; its alternative stands in", h.program, h.hook)
			}
			continue
		}
		if attachPointIn(kernel, h) {
			want[primary] = h.program
		}
	}
	for primary, program := range want {
		st, ok := status[program]
		if !ok || !st.Attached {
			t.Errorf("hook %s: this kernel has %s, which is not attached: %s", primary, program, st.Error)
		}
	}
	for _, h := range got {
		if h.Attached && want[h.FallbackFor] != h.Program && want[h.Program] != h.Program {
			t.Errorf("%s attached although this kernel should use %s", h.Hook, want[h.FallbackFor])
		}
	}
}

// attachPointIn tells whether the kernel's BTF has h's attach point.
func attachPointIn(kernel *btf.Spec, h hook) bool {
	if h.fits != nil {
		return h.fits(kernel) == nil
	}
	kind, target, _ := strings.Cut(h.hook, "/")
	switch kind {
	case "tp_btf":
		var td *btf.Typedef
		return kernel.TypeByName("btf_trace_"+target, &td) == nil
	case "fentry", "fexit":
		var fn *btf.Func
		return kernel.TypeByName(target, &fn) == nil
	}
	return true
}

// TestHooksOnThisKernel: every hook runs through the alternative this
// kernel's BTF calls for (tests/kernels runs it on 6.1 and 6.12, where
// several tracepoints are missing), and the one line at start says which.
func TestHooksOnThisKernel(t *testing.T) {
	tr, _ := openTracer(t)
	checkHooks(t, tr.Hooks())
	for _, h := range tr.Hooks() {
		t.Logf("%s: attached %v %s", h.Hook, h.Attached, h.Error)
	}
}

// TestHTTP2FramingOff: --http2-framing=false leaves the two programs that
// read HTTP/2's frame headers unattached, and says nothing is missing.
func TestHTTP2FramingOff(t *testing.T) {
	tr, err := Open(Options{NoHTTP2Framing: true})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, h := range tr.Hooks() {
		if strings.HasPrefix(h.Program, "lattrace_h2_") {
			t.Errorf("%s (%s) is in the hooks with HTTP/2 framing off: attached %v", h.Program, h.Hook, h.Attached)
		}
	}
	if off := FeaturesOff(tr.Hooks()); len(off) != 0 {
		t.Errorf("features off: %v", off)
	}
}

// TestRingBufferSize: the ring buffer is as large as asked, and a size
// the kernel would refuse is one line before anything loads.
func TestRingBufferSize(t *testing.T) {
	tr, err := Open(Options{RingBufferBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	info, err := tr.maps.Maps["events"].Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.MaxEntries != 1<<20 {
		t.Errorf("ring buffer of %d bytes, asked for 1 MiB", info.MaxEntries)
	}
	if _, err := Open(Options{RingBufferBytes: 3 << 20}); err == nil || !strings.Contains(err.Error(), "power of two") {
		t.Errorf("a 3 MiB ring buffer: %v", err)
	}
}

// TestBurstWakesReader: records wait in the ring buffer for the drain
// timer, except that a backlog rising past WakeupBytes wakes the reader at
// once. With a timer of a minute, a burst of several times WakeupBytes
// must arrive within seconds, and what is left below the level (the
// burst's tail) must wait for the timer.
func TestBurstWakesReader(t *testing.T) {
	col := &collector{}
	openTracerWith(t, Options{WakeupBytes: 64 << 10, DrainInterval: time.Minute}, col)
	const n = 1000 // 2,000 records of about 350 bytes: about 11 levels
	start := time.Now()
	local := pingPong(t, n, 100, 100, 0)
	got := waitExchanges(col, local, n, start.Add(5*time.Second))
	t.Logf("%d of %d exchanges read %v after the burst began", got, 2*n, time.Since(start).Round(time.Millisecond))
	if got < n {
		t.Fatalf("only %d of %d exchanges read within 5 s: the burst did not wake the reader", got, 2*n)
	}
	// The last records (under one level) wait for the timer: the reader is
	// not woken per record.
	if got >= 2*n {
		t.Errorf("all %d exchanges read with a one-minute timer: the reader was woken below the level", got)
	}
}

// batchSink counts the ring bytes of the records a sink is handed between
// two Flushes (other tests' connections add their records to the ring too,
// and theirs are smaller than an exchange's).
type batchSink struct {
	*collector
	bytes, max, flushes int // touched by the tracer's goroutine only
}

// ringLen is what a record of a C type takes in the ring buffer.
func ringLen[T any]() int {
	var v T
	return (int(unsafe.Sizeof(v)) + ringHdrSize + 7) &^ 7
}

func (b *batchSink) Exchange(e *record.Exchange) {
	b.bytes += ringLen[lattraceLtExchange]()
	b.collector.Exchange(e)
}

func (b *batchSink) ConnOpen(o record.ConnOpen) {
	b.bytes += ringLen[lattraceLtConnOpen]()
	b.collector.ConnOpen(o)
}

func (b *batchSink) ConnClose(c record.ConnClose) {
	b.bytes += ringLen[lattraceLtConnClose]()
	b.collector.ConnClose(c)
}

func (b *batchSink) Flush() {
	b.max = max(b.max, b.bytes)
	b.bytes = 0
	b.flushes++
}

// TestDrainFlushesInBatches: a drain woken at a backlog of a megabyte
// hands its records over in batches of flushBytes, each followed by a
// Flush (an output buffers a batch) and the space's return to the kernel.
func TestDrainFlushesInBatches(t *testing.T) {
	sink := &batchSink{collector: &collector{}}
	_, stop := openTracerWith(t, Options{WakeupBytes: 1 << 20, DrainInterval: time.Minute}, sink)
	const n = 2000 // 4,000 exchange records: past the wakeup level once
	local := pingPong(t, n, 100, 100, 0)
	// The wakeup level's worth of exchange records, less room for the
	// other records in the ring.
	want := (1 << 20) / ringLen[lattraceLtExchange]() * 9 / 10
	got := waitExchanges(sink.collector, local, want, time.Now().Add(5*time.Second))
	stop()
	// A batch ends with the record that takes it to flushBytes or past.
	most := flushBytes + ringLen[lattraceLtExchange]()
	t.Logf("%d exchanges read after the wakeup; at most %d bytes of records between flushes (bound %d), %d flushes",
		got, sink.max, most, sink.flushes)
	if got < want {
		t.Fatalf("only %d exchanges read: the megabyte backlog did not wake the reader", got)
	}
	if sink.max > most || sink.flushes < 3 {
		t.Errorf("%d bytes of records between two flushes, %d flushes: want batches of about %d bytes", sink.max, sink.flushes, flushBytes)
	}
}

// TestRingWrapsIntact: the ring buffer's data is mapped once, so a record
// that wraps its end is put together from two pieces. Through a small ring
// that wraps every few hundred records, every exchange of a known
// conversation must arrive whole.
func TestRingWrapsIntact(t *testing.T) {
	col := &collector{}
	tr, _ := openTracerWith(t, Options{RingBufferBytes: 256 << 10, WakeupBytes: 4 << 10, DrainInterval: 2 * time.Millisecond}, col)
	const n, reqSize, respSize = 1500, 100, 300
	// The server thinks 1 ms per request, so the reader has to fall ~400 ms
	// behind before the ring fills: the test is about wrapping, not about a
	// reader starved on a busy machine.
	local := pingPong(t, n, reqSize, respSize, time.Millisecond)
	col.find(t, local)

	cnt, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if cnt.RingbufFull != 0 || cnt.DecodeErrors != 0 {
		t.Fatalf("ring full %d, decode errors %d: want none", cnt.RingbufFull, cnt.DecodeErrors)
	}
	count := map[record.ExchangeRole]int{}
	for _, e := range col.connExchanges(local) {
		count[e.Role]++
		out, in := uint64(reqSize), uint64(respSize)
		if e.Role == record.Responder {
			out, in = in, out
		}
		if e.BytesOut != out || e.BytesIn != in || e.Components.Sum() != e.Duration || e.Owner.Comm == "" {
			t.Errorf("%s exchange garbled: bytes out %d in %d, components %v for duration %v, comm %q",
				e.Role, e.BytesOut, e.BytesIn, e.Components.Sum(), e.Duration, e.Owner.Comm)
		}
	}
	if count[record.Requester] != n || count[record.Responder] != n {
		t.Errorf("exchanges by role %v, want %d each", count, n)
	}
	// 2n records of ~350 bytes through 256 KiB: a few laps.
	if tr.ring.wraps.Load() == 0 {
		t.Error("no record wrapped the ring's end: the test did not test it")
	}
	t.Logf("%d records wrapped the end of the ring", tr.ring.wraps.Load())
}
