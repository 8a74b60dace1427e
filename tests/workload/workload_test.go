package workload

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sort"
	"strings"
	"testing"
	"time"
)

// The think time the server injects is what it records, the client's app
// RTT covers it, and both sides' timestamps line up on the shared
// CLOCK_MONOTONIC.
func TestThinkTime(t *testing.T) {
	const think, defThink = 20 * time.Millisecond, 15 * time.Millisecond
	srv := startServer(t, ServerConfig{DefaultThink: defThink})
	explicit := runClient(t, ClientConfig{Addr: srv.addr, ReqSize: 100, RespSize: 200, Think: think, Count: 8})
	deflt := runClient(t, ClientConfig{Addr: srv.addr, ReqSize: 100, RespSize: 200, Think: ServerThink, Count: 4})
	recs := srv.stop()
	if len(recs) != 12 {
		t.Fatalf("server recorded %d exchanges, want 12", len(recs))
	}
	byConn := map[uint64][]ServerRecord{}
	for _, r := range recs {
		byConn[r.Conn] = append(byConn[r.Conn], r)
	}
	check := func(name string, cl []ClientRecord, sv []ServerRecord, want time.Duration) {
		t.Helper()
		if len(sv) != len(cl) {
			t.Fatalf("%s: server has %d records, client %d", name, len(sv), len(cl))
		}
		for i, s := range sv {
			c := cl[i]
			if s.ID != c.ID || s.Error != "" {
				t.Fatalf("%s: server record %+v does not match client id %d", name, s, c.ID)
			}
			if s.ThinkNs != int64(want) {
				t.Errorf("%s id %d: server think_ns %v, want %v", name, s.ID, dur(s.ThinkNs), want)
			}
			slept := time.Duration(s.ThinkEndNs - s.ThinkStartNs)
			if slept < want {
				t.Errorf("%s id %d: server slept %v < %v", name, s.ID, slept, want)
			}
			if c.ServerThinkNs != int64(want) {
				t.Errorf("%s id %d: response header think %v, want %v", name, c.ID, dur(c.ServerThinkNs), want)
			}
			if c.AppRTTNs < int64(want) || c.ServerNs < int64(want) {
				t.Errorf("%s id %d: app RTT %v / server time %v shorter than think %v", name, c.ID, dur(c.AppRTTNs), dur(c.ServerNs), want)
			}
			// Causality across processes' views of the same clock.
			if !(c.WriteStartNs <= s.FirstReqByteNs && s.FirstReqByteNs <= s.LastReqByteNs &&
				s.LastReqByteNs <= s.ThinkStartNs && s.ThinkEndNs <= s.RespWriteStartNs &&
				s.RespWriteStartNs <= c.FirstRespByteNs && c.FirstRespByteNs <= c.LastRespByteNs &&
				c.WriteStartNs <= c.WriteDoneNs) {
				t.Errorf("%s id %d: timestamps out of causal order: client %+v server %+v", name, c.ID, c, s)
			}
		}
	}
	check("explicit", explicit, byConn[1], think)
	check("server default", deflt, byConn[2], defThink)
	for _, c := range deflt {
		if c.ThinkNs != -1 {
			t.Errorf("think_ns %d for a server-default request, want -1", c.ThinkNs)
		}
	}
}

// The think time the server actually spends is the injected one within
// about 1 ms (median over a run). Timer wake-ups on a busy shared machine can
// be late, so a run is retried a couple of times before failing.
func TestThinkPrecision(t *testing.T) {
	const think = 10 * time.Millisecond
	var overs []time.Duration
	for attempt := 1; attempt <= 3; attempt++ {
		srv := startServer(t, ServerConfig{})
		runClient(t, ClientConfig{Addr: srv.addr, Think: think, Count: 9})
		overs = overs[:0]
		for _, r := range srv.stop() {
			overs = append(overs, time.Duration(r.ThinkEndNs-r.ThinkStartNs)-think)
		}
		sort.Slice(overs, func(i, j int) bool { return overs[i] < overs[j] })
		if overs[0] < 0 {
			t.Fatalf("server thought less than asked: %v", overs)
		}
		if overs[len(overs)/2] <= time.Millisecond {
			return
		}
		t.Logf("attempt %d: median overshoot %v (machine busy?), all %v", attempt, overs[len(overs)/2], overs)
	}
	t.Errorf("median think overshoot above 1ms in 3 runs; last %v", overs)
}

// Sizes are exact on both sides, including responses larger than one read
// and header-only messages.
func TestSizesExact(t *testing.T) {
	srv := startServer(t, ServerConfig{DefaultRespSize: 777})
	sizes := []ExchangeSpec{
		{ReqSize: HeaderSize, RespSize: HeaderSize},
		{ReqSize: 1000, RespSize: 200_000},
		{ReqSize: 300_000, RespSize: 41},
		{ReqSize: 100, RespSize: 0}, // server default
	}
	recs := runClient(t, ClientConfig{Addr: srv.addr, Count: len(sizes), Think: 0,
		PerExchange: func(id uint64, s *ExchangeSpec) { *s = sizes[id-1] }})
	sv := byID(srv.stop())
	for _, c := range recs {
		spec := sizes[c.ID-1]
		wantResp := int64(spec.RespSize)
		if wantResp == 0 {
			wantResp = 777
		}
		s := sv[c.ID]
		if c.ReqBytes != int64(spec.ReqSize) || s.ReqBytes != int64(spec.ReqSize) {
			t.Errorf("id %d: request bytes client %d server %d, want %d", c.ID, c.ReqBytes, s.ReqBytes, spec.ReqSize)
		}
		if c.RespBytes != wantResp || s.RespBytes != wantResp || s.RespSize != wantResp {
			t.Errorf("id %d: response bytes client %d server %d (size %d), want %d", c.ID, c.RespBytes, s.RespBytes, s.RespSize, wantResp)
		}
		if c.ReqSize != spec.ReqSize || c.RespSize != spec.RespSize {
			t.Errorf("id %d: record sizes %d/%d, want %d/%d", c.ID, c.ReqSize, c.RespSize, spec.ReqSize, spec.RespSize)
		}
	}
}

// A hand-written request gets exactly the bytes it asked for: a well-formed
// header, padding, and nothing after it.
func TestWireFormat(t *testing.T) {
	srv := startServer(t, ServerConfig{})
	conn, err := net.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := make([]byte, 123)
	Header{Kind: KindRequest, ID: 42, ReqLen: 123, RespLen: 5000, ThinkMicros: 1500}.Put(req)
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	resp := make([]byte, 5000)
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(conn, resp); err != nil {
		t.Fatal(err)
	}
	h, err := ParseHeader(resp)
	if err != nil {
		t.Fatal(err)
	}
	if h.Kind != KindResponse || h.ID != 42 || h.ReqLen != 123 || h.RespLen != 5000 || h.ThinkMicros != 1500 || h.Aux < 1_500_000 {
		t.Errorf("response header %+v", h)
	}
	want := make([]byte, 5000)
	fillPadding(want) // the pattern is indexed by offset in the message
	if !bytes.Equal(resp[HeaderSize:], want[HeaderSize:]) {
		t.Errorf("padding differs")
	}
	_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := conn.Read(make([]byte, 1)); n != 0 || !isTimeout(err) {
		t.Errorf("extra bytes after the response: n=%d err=%v", n, err)
	}
	// A bad magic makes the server drop the connection and record an error.
	bad := bytes.Repeat([]byte{0xff}, HeaderSize)
	c2, err := net.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	c2.Write(bad)
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c2.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Errorf("bad magic: read n=%d err=%v, want EOF", n, err)
	}
	recs := srv.stop()
	found := false
	for _, r := range recs {
		if strings.Contains(r.Error, "magic") {
			found = true
		}
	}
	if !found {
		t.Errorf("no server record for the bad magic: %+v", recs)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Per-request mode opens a connection per exchange, persistent mode one.
func TestModes(t *testing.T) {
	srv := startServer(t, ServerConfig{})
	const n = 5
	per := runClient(t, ClientConfig{Addr: srv.addr, Count: n, Mode: ModePerRequest})
	pers := runClient(t, ClientConfig{Addr: srv.addr, Count: n, Mode: ModePersistent})
	sv := srv.stop()

	ports := map[string]bool{}
	for _, r := range per {
		ports[r.Local] = true
		if !r.NewConn || r.ConnectStartNs == 0 || r.ConnectDoneNs < r.ConnectStartNs || r.WriteStartNs < r.ConnectDoneNs {
			t.Errorf("per-request id %d: new_conn=%v connect %d..%d write %d", r.ID, r.NewConn, r.ConnectStartNs, r.ConnectDoneNs, r.WriteStartNs)
		}
	}
	if len(ports) != n {
		t.Errorf("per-request: %d distinct local addresses, want %d: %v", len(ports), n, ports)
	}
	ports = map[string]bool{}
	for i, r := range pers {
		ports[r.Local] = true
		if r.NewConn != (i == 0) || (i > 0 && r.ConnectStartNs != 0) {
			t.Errorf("persistent id %d: new_conn=%v connect_start=%d", r.ID, r.NewConn, r.ConnectStartNs)
		}
	}
	if len(ports) != 1 {
		t.Errorf("persistent: %d local addresses, want 1", len(ports))
	}
	peers := map[string]int{}
	for _, r := range sv {
		peers[r.Peer]++
	}
	if len(peers) != n+1 {
		t.Errorf("server saw %d peers, want %d", len(peers), n+1)
	}
	if peers[pers[0].Local] != n {
		t.Errorf("server saw %d exchanges from the persistent client, want %d", peers[pers[0].Local], n)
	}
}

// Depth-4 pipelining keeps four requests in flight, the server works on
// them concurrently, responses come back out of order and are matched by id.
func TestPipelining(t *testing.T) {
	srv := startServer(t, ServerConfig{})
	think := func(id uint64) time.Duration {
		if id%4 == 1 {
			return 60 * time.Millisecond
		}
		return 20 * time.Millisecond
	}
	const n = 12
	start := time.Now()
	recs := runClient(t, ClientConfig{Addr: srv.addr, Count: n, Depth: 4, ReqSize: 64,
		PerExchange: func(id uint64, s *ExchangeSpec) {
			s.Think = think(id)
			s.RespSize = HeaderSize + int(id)
		}})
	elapsed := time.Since(start)
	sv := srv.stop()

	var serial time.Duration
	for id := uint64(1); id <= n; id++ {
		serial += think(id)
	}
	if elapsed > serial*4/5 {
		t.Errorf("pipelined run took %v, serial think alone is %v", elapsed, serial)
	}
	var cs, ce []int64
	for _, r := range recs {
		if r.ServerThinkNs != int64(think(r.ID)) || r.RespBytes != int64(HeaderSize+r.ID) {
			t.Errorf("id %d matched a wrong response: think %v resp %d", r.ID, dur(r.ServerThinkNs), r.RespBytes)
		}
		cs, ce = append(cs, r.WriteStartNs), append(ce, r.LastRespByteNs)
	}
	if got := maxOverlap(cs, ce); got != 4 {
		t.Errorf("client had at most %d exchanges in flight, want 4", got)
	}
	var ss, se []int64
	for _, r := range sv {
		if r.Error != "" {
			t.Fatalf("server record error: %s", r.Error)
		}
		// A new request can only be sent after a response was written, so
		// [first request byte, response write start] overlaps at most 4.
		ss, se = append(ss, r.FirstReqByteNs), append(se, r.RespWriteStartNs)
	}
	if got := maxOverlap(ss, se); got != 4 {
		t.Errorf("server saw at most %d overlapping requests, want 4", got)
	}
	// Completion order differs from id order.
	order := append([]ClientRecord(nil), recs...)
	sort.Slice(order, func(i, j int) bool { return order[i].LastRespByteNs < order[j].LastRespByteNs })
	inOrder := true
	for i := range order {
		if order[i].ID != uint64(i+1) {
			inOrder = false
		}
	}
	if inOrder {
		t.Errorf("responses arrived in id order; expected the slow ones to be overtaken")
	}
}

// With Serial the server answers pipelined requests in order.
func TestSerialServer(t *testing.T) {
	srv := startServer(t, ServerConfig{Serial: true, DefaultThink: 5 * time.Millisecond})
	recs := runClient(t, ClientConfig{Addr: srv.addr, Count: 6, Depth: 3, Think: ServerThink})
	sv := srv.stop()
	for i := 1; i < len(recs); i++ {
		if recs[i].LastRespByteNs < recs[i-1].LastRespByteNs {
			t.Errorf("serial server answered id %d before id %d", recs[i].ID, recs[i-1].ID)
		}
	}
	for i := 1; i < len(sv); i++ {
		if sv[i].ThinkStartNs < sv[i-1].RespWriteDoneNs {
			t.Errorf("serial server overlapped exchanges %d and %d", sv[i-1].ID, sv[i].ID)
		}
	}
}

func TestTLS(t *testing.T) {
	srv := startServer(t, ServerConfig{TLS: true})
	for _, tc := range []struct {
		name string
		mode Mode
		conf *tls.Config
	}{
		{"persistent-trusted", ModePersistent, &tls.Config{RootCAs: srv.CertPool()}},
		{"per-request-insecure", ModePerRequest, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs := runClient(t, ClientConfig{Addr: srv.addr, Count: 3, Mode: tc.mode, TLS: true, TLSConfig: tc.conf,
				ReqSize: 500, RespSize: 70_000, Think: 2 * time.Millisecond})
			for _, r := range recs {
				if r.NewConn && !(r.TLSDoneNs > r.ConnectDoneNs && r.WriteStartNs >= r.TLSDoneNs) {
					t.Errorf("id %d: tls_done %d connect_done %d write_start %d", r.ID, r.TLSDoneNs, r.ConnectDoneNs, r.WriteStartNs)
				}
				if r.ReqBytes != 500 || r.RespBytes != 70_000 || r.AppRTTNs < int64(2*time.Millisecond) {
					t.Errorf("id %d: %d/%d bytes, rtt %v", r.ID, r.ReqBytes, r.RespBytes, dur(r.AppRTTNs))
				}
			}
		})
	}
	// A client that verifies against the wrong pool fails cleanly.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	other, err := NewSelfSigned()
	if err != nil {
		t.Fatal(err)
	}
	recs, err := RunClient(ctx, ClientConfig{Addr: srv.addr, Count: 1, TLS: true, TLSConfig: &tls.Config{RootCAs: other.Pool}})
	if !errors.Is(err, ErrExchangesFailed) || len(recs) != 1 || !strings.Contains(recs[0].Error, "tls") {
		t.Errorf("untrusted server: err=%v recs=%+v", err, recs)
	}
	for _, r := range srv.stop() {
		if r.TLSDoneNs == 0 {
			t.Errorf("server record without tls_done_ns: %+v", r)
		}
	}
}

func TestIPv6(t *testing.T) {
	srv, err := Listen(ServerConfig{Listen: "[::1]:0"})
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	srv.Close()
	ts := startServer(t, ServerConfig{Listen: "[::1]:0", DefaultThink: time.Millisecond})
	recs := runClient(t, ClientConfig{Addr: ts.addr, Count: 3, Think: ServerThink, Mode: ModePerRequest})
	for _, r := range recs {
		if !strings.HasPrefix(r.Remote, "[::1]:") || !strings.HasPrefix(r.Local, "[::1]:") {
			t.Errorf("addresses %s -> %s are not IPv6 loopback", r.Local, r.Remote)
		}
	}
	for _, r := range ts.stop() {
		if !strings.HasPrefix(r.Peer, "[::1]:") {
			t.Errorf("server peer %s", r.Peer)
		}
	}
}

func TestBulk(t *testing.T) {
	srv := startServer(t, ServerConfig{TLS: true})
	plain := startServer(t, ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	cases := []BulkConfig{
		{Addr: plain.addr, Direction: BulkUp, Duration: 300 * time.Millisecond},
		{Addr: plain.addr, Direction: BulkDown, Bytes: 10 << 20, ID: 7},
		{Addr: plain.addr, Direction: BulkDown, Duration: 200 * time.Millisecond, ID: 8},
		{Addr: srv.addr, Direction: BulkUp, Bytes: 3_000_001, TLS: true, WriteSize: 10_000},
		{Addr: srv.addr, Direction: BulkDown, Duration: 200 * time.Millisecond, TLS: true},
	}
	var results []BulkResult
	for _, cfg := range cases {
		res, err := RunBulk(ctx, cfg)
		if err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
		if res.Bytes <= 0 || res.GoodputBps <= 0 || res.EndNs <= res.StartNs {
			t.Errorf("%s: %d bytes, goodput %.0f bit/s, %d..%d", cfg.Direction, res.Bytes, res.GoodputBps, res.StartNs, res.EndNs)
		}
		if cfg.Bytes > 0 && res.Bytes != cfg.Bytes {
			t.Errorf("%s: moved %d bytes, want %d", cfg.Direction, res.Bytes, cfg.Bytes)
		}
		if cfg.Direction == BulkUp && res.AckedBytes != res.Bytes {
			t.Errorf("up: acked %d of %d", res.AckedBytes, res.Bytes)
		}
		if cfg.Duration > 0 {
			if d := time.Duration(res.EndNs - res.StartNs); d < cfg.Duration*9/10 || d > cfg.Duration+2*time.Second {
				t.Errorf("%s: stream lasted %v for duration %v", cfg.Direction, d, cfg.Duration)
			}
		}
		t.Logf("bulk %s tls=%v: %d bytes, %.0f Mbit/s", res.Direction, cfg.TLS, res.Bytes, res.GoodputBps/1e6)
		results = append(results, res)
	}
	sv := plain.stop()
	if len(sv) != 3 {
		t.Fatalf("plain server: %d records, want 3: %+v", len(sv), sv)
	}
	if sv[0].Kind != "bulk-up" || sv[0].ReqBytes != HeaderSize+results[0].Bytes || sv[0].Error != "" {
		t.Errorf("bulk-up server record %+v", sv[0])
	}
	if sv[1].Kind != "bulk-down" || sv[1].ID != 7 || sv[1].RespBytes != 10<<20 || sv[1].Error != "" {
		t.Errorf("bulk-down server record %+v", sv[1])
	}
	if sv[2].Kind != "bulk-down" || sv[2].RespBytes < results[2].Bytes || sv[2].Error != "" {
		t.Errorf("duration bulk-down server record %+v (client read %d)", sv[2], results[2].Bytes)
	}
	if _, err := RunBulk(ctx, BulkConfig{Addr: plain.addr, Direction: "sideways"}); err == nil {
		t.Errorf("bad direction accepted")
	}
}

// Chunked writes take as many write calls as asked, with the gaps visible
// on the server; slow readers read in small chunks.
func TestChunkingAndSlowReaders(t *testing.T) {
	srv := startServer(t, ServerConfig{ReadChunk: 300, ReadGap: time.Millisecond, RcvBuf: 64 << 10})
	recs := runClient(t, ClientConfig{Addr: srv.addr, Count: 2, ReqSize: 4000, RespSize: 1000,
		WriteChunks: 4, ChunkGap: 5 * time.Millisecond, Nagle: true,
		ReadChunk: 100, ReadGap: time.Millisecond, ReadDelay: 10 * time.Millisecond, RcvBuf: 32 << 10})
	// Socket buffer options reach the socket (the kernel doubles them).
	d := net.Dialer{Control: sockControl(32<<10, 48<<10, 0)}
	c, err := d.Dial("tcp", srv.addr)
	if err != nil {
		t.Fatal(err)
	}
	rcv, snd, err := socketBufs(c)
	if err != nil || rcv != 64<<10 || snd != 96<<10 {
		t.Errorf("SO_RCVBUF %d SO_SNDBUF %d (%v), want 65536 and 98304", rcv, snd, err)
	}
	c.Close()
	sv := byID(srv.stop())
	for _, r := range recs {
		if r.WriteCalls != 4 || r.ReqBytes != 4000 || r.RespBytes != 1000 {
			t.Errorf("id %d: %d write calls, %d/%d bytes", r.ID, r.WriteCalls, r.ReqBytes, r.RespBytes)
		}
		if d := time.Duration(r.WriteDoneNs - r.WriteStartNs); d < 15*time.Millisecond {
			t.Errorf("id %d: chunked write took %v, want >= 3 gaps of 5ms", r.ID, d)
		}
		// 1000 bytes in reads of at most 100: at least 9 gaps of 1ms.
		if d := time.Duration(r.LastRespByteNs - r.FirstRespByteNs); d < 9*time.Millisecond {
			t.Errorf("id %d: slow read of the response took %v", r.ID, d)
		}
		if r.AppRTTNs < int64(10*time.Millisecond+15*time.Millisecond) {
			t.Errorf("id %d: app RTT %v does not include the write gaps and read delay", r.ID, dur(r.AppRTTNs))
		}
		s := sv[r.ID]
		if d := time.Duration(s.LastReqByteNs - s.FirstReqByteNs); d < 15*time.Millisecond {
			t.Errorf("id %d: server read the request in %v", r.ID, d)
		}
	}
}

// Interval spaces exchange starts; Duration stops starting new ones.
func TestIntervalAndDuration(t *testing.T) {
	srv := startServer(t, ServerConfig{})
	// The grid starts when the client does, just after this; the first
	// exchange starts after its connect, which a busy machine delays.
	before := MonoNow()
	recs := runClient(t, ClientConfig{Addr: srv.addr, Interval: 40 * time.Millisecond, Duration: 190 * time.Millisecond})
	if len(recs) < 4 || len(recs) > 5 {
		t.Errorf("%d exchanges in 190ms at 40ms intervals, want 4 or 5", len(recs))
	}
	// Starts follow a fixed grid (a late start does not shift later ones):
	// never before their slot, and within it.
	for i, r := range recs {
		off := time.Duration(r.WriteStartNs - before)
		want := time.Duration(i) * 40 * time.Millisecond
		if off < want || off > want+40*time.Millisecond {
			t.Errorf("id %d started %v after the client, want %v to %v", r.ID, off, want, want+40*time.Millisecond)
		}
	}
}

// Cancelling the client stops it promptly; the exchange in flight is
// recorded as canceled, not failed. Cancelling the server stops it too.
func TestCancel(t *testing.T) {
	srv := startServer(t, ServerConfig{DefaultThink: 5 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	recs, err := RunClient(ctx, ClientConfig{Addr: srv.addr, Think: ServerThink})
	if err != nil {
		t.Fatalf("canceled run returned %v", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("client took %v to stop", time.Since(start))
	}
	if len(recs) != 1 || !recs[0].Canceled || recs[0].Failed() {
		t.Errorf("records %+v, want one canceled", recs)
	}
	stopStart := time.Now()
	srv.stop()
	if d := time.Since(stopStart); d > time.Second {
		t.Errorf("server took %v to stop with an exchange thinking", d)
	}
}

func TestClientFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	recs, err := RunClient(context.Background(), ClientConfig{Addr: addr, Count: 2, Mode: ModePerRequest})
	if !errors.Is(err, ErrExchangesFailed) || len(recs) != 2 {
		t.Fatalf("err=%v, %d records", err, len(recs))
	}
	for _, r := range recs {
		if !r.Failed() || !strings.Contains(r.Error, "connect") {
			t.Errorf("record %+v", r)
		}
	}
	if s := Summarize(recs); s.Errors != 2 || s.Count != 2 {
		t.Errorf("summary %+v", s)
	}
}

// Records stream out as JSON lines that decode back to the same records.
func TestJSONL(t *testing.T) {
	var sbuf, cbuf bytes.Buffer
	srv := startServer(t, ServerConfig{Out: &sbuf})
	recs := runClient(t, ClientConfig{Addr: srv.addr, Count: 3, Out: &cbuf})
	srecs := srv.stop()
	gotC, err := ReadJSONL[ClientRecord](&cbuf)
	if err != nil || len(gotC) != 3 {
		t.Fatalf("client JSONL: %d records, %v", len(gotC), err)
	}
	sort.Slice(gotC, func(i, j int) bool { return gotC[i].ID < gotC[j].ID })
	for i := range gotC {
		if !gotC[i].Wall.Equal(recs[i].Wall) {
			t.Errorf("wall clock did not round-trip")
		}
		gotC[i].Wall = recs[i].Wall
		if gotC[i] != recs[i] {
			t.Errorf("JSONL record %+v != %+v", gotC[i], recs[i])
		}
	}
	gotS, err := ReadJSONL[ServerRecord](&sbuf)
	if err != nil || len(gotS) != len(srecs) {
		t.Fatalf("server JSONL: %d records, %v", len(gotS), err)
	}
	for _, line := range []string{`"type":"client"`, `"write_start_ns"`, `"last_resp_byte_ns"`, `"app_rtt_ns"`} {
		var b bytes.Buffer
		(&jsonlWriter{w: &b}).write(recs[0])
		if !strings.Contains(b.String(), line) {
			t.Errorf("client JSON lacks %s: %s", line, b.String())
		}
	}
}

func TestValidation(t *testing.T) {
	ok := ClientConfig{Addr: "127.0.0.1:1"}
	for _, tc := range []struct {
		mod  func(*ClientConfig)
		want string
	}{
		{func(c *ClientConfig) { c.Addr = "" }, "missing server address"},
		{func(c *ClientConfig) { c.Addr = "127.0.0.1" }, "invalid address"},
		{func(c *ClientConfig) { c.ReqSize = -5 }, "invalid request size -5"},
		{func(c *ClientConfig) { c.ReqSize = 39 }, "invalid request size 39"},
		{func(c *ClientConfig) { c.RespSize = 10 }, "invalid response size 10"},
		{func(c *ClientConfig) { c.RespSize = -1 }, "invalid response size -1"},
		{func(c *ClientConfig) { c.Think = -2 }, "invalid think time"},
		{func(c *ClientConfig) { c.Mode = "burst" }, `unknown mode "burst"`},
		{func(c *ClientConfig) { c.Mode = ModePerRequest; c.Depth = 2 }, "pipelining depth 2 needs mode persistent"},
		{func(c *ClientConfig) { c.Count = -1 }, "invalid count -1"},
		{func(c *ClientConfig) { c.Interval = -time.Second }, "invalid interval"},
		{func(c *ClientConfig) { c.RcvBuf = -1 }, "invalid socket buffer size"},
	} {
		c := ok
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want %q", c, err, tc.want)
		}
		if _, rerr := RunClient(context.Background(), c); rerr == nil || rerr.Error() != err.Error() {
			t.Errorf("RunClient did not reject %+v: %v", c, rerr)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Errorf("valid config rejected: %v", err)
	}
	if _, err := Listen(ServerConfig{DefaultRespSize: 3}); err == nil || !strings.Contains(err.Error(), "invalid response size 3") {
		t.Errorf("server resp size 3: %v", err)
	}
	if _, err := Listen(ServerConfig{DefaultThink: -time.Millisecond}); err == nil {
		t.Errorf("negative server think accepted")
	}
	if _, err := RunBulk(context.Background(), BulkConfig{Addr: "127.0.0.1:1", Bytes: -1}); err == nil {
		t.Errorf("negative bulk bytes accepted")
	}
}

func TestSummarize(t *testing.T) {
	var recs []ClientRecord
	for i := 1; i <= 100; i++ {
		recs = append(recs, ClientRecord{ID: uint64(i), AppRTTNs: int64(i) * int64(time.Millisecond)})
	}
	recs = append(recs, ClientRecord{ID: 101, Error: "boom"}, ClientRecord{ID: 102, Error: "x", Canceled: true})
	s := Summarize(recs)
	if s.Count != 102 || s.Errors != 1 || s.Canceled != 1 || s.Min != time.Millisecond || s.P50 != 50*time.Millisecond ||
		s.P99 != 99*time.Millisecond || s.Max != 100*time.Millisecond {
		t.Errorf("summary %+v", s)
	}
	if !strings.Contains(s.String(), "p99 99ms") {
		t.Errorf("summary string %q", s.String())
	}
}

func TestMonoNowMatchesRuntimeClock(t *testing.T) {
	// Go's monotonic clock on Linux is CLOCK_MONOTONIC too: intervals agree.
	a, t0 := MonoNow(), time.Now()
	time.Sleep(20 * time.Millisecond)
	b, el := MonoNow(), time.Since(t0)
	if diff := time.Duration(b-a) - el; diff > time.Millisecond || diff < -time.Millisecond {
		t.Errorf("MonoNow interval differs from time.Since by %v", diff)
	}
}
