package workload

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"time"
)

// Mode selects how the client uses connections.
type Mode string

const (
	// ModePersistent runs all exchanges over one connection (reconnecting
	// only after a connection error).
	ModePersistent Mode = "persistent"
	// ModePerRequest opens a new connection for every exchange and closes
	// it after the response.
	ModePerRequest Mode = "per-request"
)

// ParseMode parses "persistent" or "per-request".
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case ModePersistent, ModePerRequest:
		return Mode(s), nil
	}
	return "", fmt.Errorf("unknown mode %q (want %q or %q)", s, ModePersistent, ModePerRequest)
}

// ServerThink as a think time asks for the server's default think time.
const ServerThink time.Duration = -1

// ExchangeSpec is what one request asks for.
type ExchangeSpec struct {
	// ReqSize is the total request size in bytes, header included.
	ReqSize int
	// RespSize is the wanted total response size, header included; 0: the
	// server's default.
	RespSize int
	// Think is the server think time to request; ServerThink: the
	// server's default.
	Think time.Duration
}

// Validate checks the sizes and think time.
func (e ExchangeSpec) Validate() error {
	if e.ReqSize < HeaderSize || e.ReqSize > MaxMessageSize {
		return fmt.Errorf("invalid request size %d: must be between the %d-byte header and %d", e.ReqSize, HeaderSize, MaxMessageSize)
	}
	if e.RespSize != 0 && (e.RespSize < HeaderSize || e.RespSize > MaxMessageSize) {
		return fmt.Errorf("invalid response size %d: must be 0 (server default) or between the %d-byte header and %d", e.RespSize, HeaderSize, MaxMessageSize)
	}
	if (e.Think < 0 && e.Think != ServerThink) || e.Think > maxThink {
		return fmt.Errorf("invalid think time %v: must be between 0 and %v", e.Think, maxThink)
	}
	return nil
}

// ClientConfig configures a request/response client. Zero values are
// defaults: HeaderSize requests, server-default response size, zero think
// time (use ServerThink for the server's), back-to-back, persistent,
// TCP_NODELAY on, one write per request, no pipelining.
type ClientConfig struct {
	// Addr is the server address, "host:port" (IPv6 in brackets).
	Addr string
	// ReqSize is the total request size in bytes, header included; 0 means
	// HeaderSize.
	ReqSize int
	// RespSize is the wanted response size, header included; 0 means the
	// server's default.
	RespSize int
	// Think is the think time requested from the server; ServerThink (-1)
	// means the server's default.
	Think time.Duration
	// PerExchange, if set, may change the spec of each exchange; it is
	// called with the id and the spec derived from the fields above.
	PerExchange func(id uint64, spec *ExchangeSpec)
	// Interval is the time between the starts of consecutive exchanges
	// (request writes; connects in per-request mode). 0: back to back. An
	// exchange late for its slot starts at once; missed slots are not
	// made up.
	Interval time.Duration
	// Count stops after this many exchanges; Duration stops starting new
	// exchanges once it has elapsed. With both 0 the client runs until ctx
	// is done.
	Count    int
	Duration time.Duration
	// Mode is ModePersistent (default) or ModePerRequest.
	Mode Mode
	// TLS runs the exchanges over TLS. TLSConfig, if set, is used as is
	// (ServerName defaults to Addr's host); otherwise certificate
	// verification is skipped.
	TLS       bool
	TLSConfig *tls.Config
	// Nagle leaves Nagle's algorithm on (TCP_NODELAY off); by default
	// TCP_NODELAY is on.
	Nagle bool
	// WriteChunks splits each request into this many write calls of
	// (nearly) equal size; ChunkGap is slept between them.
	WriteChunks int
	ChunkGap    time.Duration
	// Depth is the pipelining depth: up to Depth requests in flight on the
	// connection, a reader goroutine matching responses by id. 0 or 1: one
	// at a time. Persistent mode only.
	Depth int
	// ReadDelay is slept before reading each response; ReadChunk caps each
	// read call at this many bytes; ReadGap is slept before each read call
	// that continues a response (slow reader).
	ReadDelay time.Duration
	ReadChunk int
	ReadGap   time.Duration
	// RcvBuf and SndBuf set SO_RCVBUF/SO_SNDBUF before connecting (> 0).
	RcvBuf, SndBuf int
	// ConnectTimeout bounds connect and TLS handshake (default 5s).
	ConnectTimeout time.Duration
	// Out, if set, receives one JSON line per ClientRecord as it completes.
	Out io.Writer
	// OnRecord, if set, is called with each record as it completes, one
	// call at a time.
	OnRecord func(ClientRecord)
}

// Validate checks the configuration.
func (c *ClientConfig) Validate() error {
	if c.Addr == "" {
		return errors.New("missing server address")
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("invalid address %q: want host:port (IPv6 as [addr]:port)", c.Addr)
	}
	spec := c.spec()
	if err := spec.Validate(); err != nil {
		return err
	}
	if c.Interval < 0 {
		return fmt.Errorf("invalid interval %v: must not be negative", c.Interval)
	}
	if c.Count < 0 {
		return fmt.Errorf("invalid count %d: must not be negative", c.Count)
	}
	if c.Duration < 0 {
		return fmt.Errorf("invalid duration %v: must not be negative", c.Duration)
	}
	if c.Mode != "" {
		if _, err := ParseMode(string(c.Mode)); err != nil {
			return err
		}
	}
	if c.WriteChunks < 0 {
		return fmt.Errorf("invalid write chunk count %d: must not be negative", c.WriteChunks)
	}
	if c.ChunkGap < 0 {
		return fmt.Errorf("invalid chunk gap %v: must not be negative", c.ChunkGap)
	}
	if c.Depth < 0 {
		return fmt.Errorf("invalid pipelining depth %d: must not be negative", c.Depth)
	}
	if c.Depth > 1 && c.Mode == ModePerRequest {
		return fmt.Errorf("pipelining depth %d needs mode %s", c.Depth, ModePersistent)
	}
	if c.ReadDelay < 0 || c.ReadGap < 0 {
		return errors.New("invalid slow-read setting: delays must not be negative")
	}
	if c.ReadChunk < 0 {
		return fmt.Errorf("invalid read chunk %d: must not be negative", c.ReadChunk)
	}
	if c.RcvBuf < 0 || c.SndBuf < 0 {
		return fmt.Errorf("invalid socket buffer size (rcvbuf %d, sndbuf %d): must not be negative", c.RcvBuf, c.SndBuf)
	}
	if c.ConnectTimeout < 0 {
		return fmt.Errorf("invalid connect timeout %v: must not be negative", c.ConnectTimeout)
	}
	return nil
}

func (c *ClientConfig) spec() ExchangeSpec {
	s := ExchangeSpec{ReqSize: c.ReqSize, RespSize: c.RespSize, Think: c.Think}
	if s.ReqSize == 0 {
		s.ReqSize = HeaderSize
	}
	return s
}

// ErrExchangesFailed is wrapped by RunClient's error when exchanges failed.
var ErrExchangesFailed = errors.New("exchanges failed")

// RunClient runs the exchanges described by cfg and returns one record per
// exchange, sorted by id. The error is non-nil when cfg is invalid or when
// an exchange failed (wrapping ErrExchangesFailed; the records are still
// returned). Ending ctx stops the run: exchanges in flight are recorded as
// canceled and do not count as failures.
func RunClient(ctx context.Context, cfg ClientConfig) ([]ClientRecord, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Mode == "" {
		cfg.Mode = ModePersistent
	}
	if cfg.Depth < 1 {
		cfg.Depth = 1
	}
	if cfg.WriteChunks < 1 {
		cfg.WriteChunks = 1
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	c := &client{
		cfg:    cfg,
		out:    &jsonlWriter{w: cfg.Out},
		dialer: net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: -1, Control: sockControl(cfg.RcvBuf, cfg.SndBuf, 0)},
		next:   time.Now(),
	}
	if cfg.TLS {
		c.tlsConf = clientTLSConfig(cfg.TLSConfig, cfg.Addr)
	}
	if cfg.Duration > 0 {
		c.deadline = c.next.Add(cfg.Duration)
	}
	switch cfg.Mode {
	case ModePerRequest:
		for {
			id, ok := c.nextID(ctx, nil)
			if !ok {
				break
			}
			conn, info, err := c.dial(ctx)
			if err != nil {
				c.connectFailed(ctx, id, info, err)
				continue
			}
			used := false
			newSession(ctx, c, conn, info).run(func() (uint64, bool) {
				if used {
					return 0, false
				}
				used = true
				return id, true
			})
		}
	default:
		for c.waitSlot(ctx, nil) {
			conn, info, err := c.dial(ctx)
			if err != nil {
				id, ok := c.nextID(ctx, nil)
				if !ok {
					break
				}
				c.connectFailed(ctx, id, info, err)
				continue
			}
			s := newSession(ctx, c, conn, info)
			if s.run(func() (uint64, bool) { return c.nextID(ctx, s.dead) }) != nil {
				c.backoff()
			}
		}
	}
	c.mu.Lock()
	recs := c.records
	failed := c.failed
	c.mu.Unlock()
	sort.Slice(recs, func(i, j int) bool { return recs[i].ID < recs[j].ID })
	if failed > 0 {
		first := ""
		for _, r := range recs {
			if r.Failed() {
				first = fmt.Sprintf("id %d: %s", r.ID, r.Error)
				break
			}
		}
		return recs, fmt.Errorf("%w: %d of %d (first: %s)", ErrExchangesFailed, failed, len(recs), first)
	}
	return recs, nil
}

type client struct {
	cfg     ClientConfig
	tlsConf *tls.Config
	dialer  net.Dialer
	out     *jsonlWriter

	// Scheduling state, used by one goroutine at a time.
	issued   int
	next     time.Time
	deadline time.Time
	connSeq  uint64

	cbMu    sync.Mutex // serialises OnRecord calls
	mu      sync.Mutex
	records []ClientRecord
	failed  int
}

// more reports whether another exchange may start (ignoring the schedule).
func (c *client) more(ctx context.Context) bool {
	if ctx.Err() != nil || (c.cfg.Count > 0 && c.issued >= c.cfg.Count) {
		return false
	}
	return c.deadline.IsZero() || time.Now().Before(c.deadline)
}

// waitSlot waits until the next exchange may start; false when the run is
// over or stop was closed.
func (c *client) waitSlot(ctx context.Context, stop <-chan struct{}) bool {
	if !c.more(ctx) {
		return false
	}
	if wait := time.Until(c.next); wait > 0 {
		if !c.deadline.IsZero() && !c.next.Before(c.deadline) {
			return false
		}
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return false
		case <-stop:
			return false
		}
		return c.more(ctx)
	}
	return true
}

// nextID waits for the next exchange's slot and returns its id; false when
// the run is over or stop was closed.
func (c *client) nextID(ctx context.Context, stop <-chan struct{}) (uint64, bool) {
	if !c.waitSlot(ctx, stop) {
		return 0, false
	}
	c.issued++
	now := time.Now()
	c.next = c.next.Add(c.cfg.Interval)
	if c.next.Before(now) {
		c.next = now
	}
	return uint64(c.issued), true
}

// backoff keeps failed connects from spinning.
func (c *client) backoff() {
	if t := time.Now().Add(100 * time.Millisecond); c.next.Before(t) {
		c.next = t
	}
}

func (c *client) emit(r ClientRecord) {
	if r.Error == "" {
		r.AppRTTNs = r.LastRespByteNs - r.WriteStartNs
	}
	c.out.write(r)
	if c.cfg.OnRecord != nil {
		c.cbMu.Lock()
		c.cfg.OnRecord(r)
		c.cbMu.Unlock()
	}
	c.mu.Lock()
	c.records = append(c.records, r)
	if r.Failed() {
		c.failed++
	}
	c.mu.Unlock()
}

func (c *client) exchangeSpec(id uint64) ExchangeSpec {
	s := c.cfg.spec()
	if c.cfg.PerExchange != nil {
		c.cfg.PerExchange(id, &s)
	}
	return s
}

func (c *client) newRecord(id uint64, info connInfo, spec ExchangeSpec) ClientRecord {
	return ClientRecord{
		Type:     "client",
		ID:       id,
		Conn:     info.id,
		Local:    info.local,
		Remote:   info.remote,
		ReqSize:  spec.ReqSize,
		RespSize: spec.RespSize,
		ThinkNs:  int64(spec.Think),
	}
}

func (c *client) connectFailed(ctx context.Context, id uint64, info connInfo, err error) {
	r := c.newRecord(id, info, c.exchangeSpec(id))
	r.NewConn = true
	r.ConnectStartNs = info.start
	r.Wall = info.wall
	r.Error = err.Error()
	r.Canceled = ctx.Err() != nil
	c.emit(r)
	c.backoff()
}

// connInfo describes a new connection; it is attached to the first exchange
// that uses it.
type connInfo struct {
	id            uint64
	local, remote string
	start, done   int64
	tlsDone       int64
	wall          time.Time
}

func (c *client) dial(ctx context.Context) (net.Conn, connInfo, error) {
	c.connSeq++
	info := connInfo{id: c.connSeq, wall: time.Now(), start: MonoNow()}
	conn, err := c.dialer.DialContext(ctx, "tcp", c.cfg.Addr)
	if err != nil {
		return nil, info, fmt.Errorf("connect: %w", err)
	}
	info.done = MonoNow()
	info.local, info.remote = conn.LocalAddr().String(), conn.RemoteAddr().String()
	if err := setNoDelay(conn, !c.cfg.Nagle); err != nil {
		conn.Close()
		return nil, info, fmt.Errorf("setting TCP_NODELAY: %w", err)
	}
	if c.tlsConf != nil {
		tc := tls.Client(conn, c.tlsConf)
		hctx, cancel := context.WithTimeout(ctx, c.cfg.ConnectTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		info.tlsDone = MonoNow()
		if err != nil {
			conn.Close()
			return nil, info, fmt.Errorf("tls handshake: %w", err)
		}
		conn = tc
	}
	return conn, info, nil
}

// session runs exchanges over one connection: the caller's goroutine
// writes requests, a reader goroutine reads responses and matches them to
// pending exchanges by id.
type session struct {
	ctx      context.Context
	c        *client
	conn     net.Conn
	info     connInfo
	infoUsed bool
	tr       *timedReader
	slots    chan struct{} // one token per exchange in flight
	dead     chan struct{} // closed on failure
	wbuf     []byte

	mu       sync.Mutex
	pending  map[uint64]*inflight
	err      error
	finished bool
}

type inflight struct {
	rec         ClientRecord
	wrote, read bool
}

func newSession(ctx context.Context, c *client, conn net.Conn, info connInfo) *session {
	s := &session{
		ctx:     ctx,
		c:       c,
		conn:    conn,
		info:    info,
		slots:   make(chan struct{}, c.cfg.Depth),
		dead:    make(chan struct{}),
		pending: map[uint64]*inflight{},
	}
	s.tr = newTimedReader(newSyscallReader(conn), c.cfg.ReadChunk, c.cfg.ReadGap, s.dead)
	return s
}

// fail records the first error and tears the connection down.
func (s *session) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil || s.finished {
		return
	}
	s.err = err
	close(s.dead)
	s.conn.Close()
}

// run performs exchanges with ids from next until it reports false or the
// connection fails; it returns the connection's error, if any.
func (s *session) run(next func() (uint64, bool)) error {
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		s.readLoop()
	}()
	stop := context.AfterFunc(s.ctx, func() { s.fail(s.ctx.Err()) })
	defer stop()

send:
	for {
		select {
		case s.slots <- struct{}{}:
		case <-s.dead:
			break send
		}
		id, ok := next()
		if !ok {
			<-s.slots
			break
		}
		if !s.send(id) {
			break
		}
	}
	// Wait until every exchange in flight has completed (all slots free).
drain:
	for i := 0; i < cap(s.slots); i++ {
		select {
		case s.slots <- struct{}{}:
		case <-s.dead:
			break drain
		}
	}
	s.mu.Lock()
	s.finished = true
	err := s.err
	left := s.pending
	s.pending = nil
	s.mu.Unlock()
	s.conn.Close()
	<-readerDone
	ids := make([]uint64, 0, len(left))
	for id := range left {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		in := left[id]
		in.rec.Error = err.Error()
		in.rec.Canceled = s.ctx.Err() != nil
		s.c.emit(in.rec)
	}
	return err
}

func (s *session) attachInfo(r *ClientRecord) {
	if s.infoUsed {
		return
	}
	s.infoUsed = true
	r.NewConn = true
	r.ConnectStartNs, r.ConnectDoneNs, r.TLSDoneNs = s.info.start, s.info.done, s.info.tlsDone
}

// complete emits a finished exchange and frees its slot.
func (s *session) complete(in *inflight) {
	s.c.emit(in.rec)
	<-s.slots
}

// send writes one request; it reports whether the session can go on.
func (s *session) send(id uint64) bool {
	spec := s.c.exchangeSpec(id)
	in := &inflight{rec: s.c.newRecord(id, s.info, spec)}
	s.attachInfo(&in.rec)
	if err := spec.Validate(); err != nil {
		in.rec.Wall = time.Now()
		in.rec.Error = err.Error()
		s.complete(in)
		return true
	}
	buf := messageBuf(&s.wbuf, spec.ReqSize)
	Header{
		Kind:        KindRequest,
		ID:          id,
		ReqLen:      uint32(spec.ReqSize),
		RespLen:     uint32(spec.RespSize),
		ThinkMicros: thinkToMicros(spec.Think),
	}.Put(buf)

	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		in.rec.Wall = time.Now()
		in.rec.Error = err.Error()
		in.rec.Canceled = s.ctx.Err() != nil
		s.complete(in)
		return false
	}
	s.pending[id] = in
	s.mu.Unlock()

	wall := time.Now()
	start := MonoNow()
	n, calls, err := s.write(buf)
	done := MonoNow()

	s.mu.Lock()
	in.rec.Wall = wall
	in.rec.WriteStartNs = start
	in.rec.WriteDoneNs = done
	in.rec.ReqBytes = n
	in.rec.WriteCalls = calls
	in.wrote = true
	complete := in.read && s.pending != nil
	if complete {
		delete(s.pending, id)
	}
	s.mu.Unlock()
	if complete {
		s.complete(in)
	}
	if err != nil {
		s.fail(fmt.Errorf("writing request: %w", err))
		return false
	}
	return true
}

// write writes buf in WriteChunks calls separated by ChunkGap.
func (s *session) write(buf []byte) (n int64, calls int, err error) {
	chunks := s.c.cfg.WriteChunks
	if chunks > len(buf) {
		chunks = len(buf)
	}
	size, rem := len(buf)/chunks, len(buf)%chunks
	off := 0
	for i := 0; i < chunks; i++ {
		sz := size
		if i < rem {
			sz++
		}
		if i > 0 && s.c.cfg.ChunkGap > 0 && !sleepChan(s.dead, s.c.cfg.ChunkGap) {
			return n, calls, errClosing
		}
		m, err := s.conn.Write(buf[off : off+sz])
		n += int64(m)
		off += m
		calls++
		if err != nil {
			return n, calls, err
		}
	}
	return n, calls, nil
}

func (s *session) readLoop() {
	for {
		if s.c.cfg.ReadDelay > 0 && !sleepChan(s.dead, s.c.cfg.ReadDelay) {
			return
		}
		hdr, firstNs, err := s.tr.readHeader()
		if err != nil {
			if err == io.EOF {
				err = errors.New("server closed the connection")
			}
			s.fail(fmt.Errorf("reading response: %w", err))
			return
		}
		startConsumed := s.tr.consumed - HeaderSize
		if hdr.Kind != KindResponse {
			s.fail(fmt.Errorf("reading response: unexpected message kind %v", hdr.Kind))
			return
		}
		if hdr.RespLen < HeaderSize || hdr.RespLen > MaxMessageSize {
			s.fail(fmt.Errorf("reading response: bad response length %d", hdr.RespLen))
			return
		}
		s.mu.Lock()
		in := s.pending[hdr.ID]
		if in != nil {
			in.rec.FirstRespByteNs = firstNs
		}
		s.mu.Unlock()
		if in == nil {
			s.fail(fmt.Errorf("reading response: response for unknown exchange id %d", hdr.ID))
			return
		}
		lastNs, err := s.tr.discard(int64(hdr.RespLen) - HeaderSize)
		s.mu.Lock()
		in.rec.RespBytes = s.tr.consumed - startConsumed
		if err != nil {
			s.mu.Unlock()
			s.fail(fmt.Errorf("reading response: %w", err))
			return
		}
		in.rec.LastRespByteNs = lastNs
		in.rec.LastReadCallNs = s.tr.callNs
		in.rec.ServerThinkNs = int64(hdr.ThinkMicros) * int64(time.Microsecond)
		in.rec.ServerNs = int64(hdr.Aux)
		switch {
		case in.rec.RespSize != 0 && int(hdr.RespLen) != in.rec.RespSize:
			in.rec.Error = fmt.Sprintf("response length %d, asked for %d", hdr.RespLen, in.rec.RespSize)
		case int(hdr.ReqLen) != in.rec.ReqSize:
			in.rec.Error = fmt.Sprintf("server read a %d-byte request, sent %d", hdr.ReqLen, in.rec.ReqSize)
		}
		in.read = true
		complete := in.wrote
		if complete {
			delete(s.pending, hdr.ID)
		}
		s.mu.Unlock()
		if complete {
			s.complete(in)
		}
	}
}
