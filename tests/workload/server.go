package workload

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ServerConfig configures a workload server. The zero value listens on
// 127.0.0.1 on an ephemeral port, thinks 0 and answers 40-byte responses by
// default.
type ServerConfig struct {
	// Listen is the listen address ("host:port", IPv6 in brackets, e.g.
	// "[::]:7000"); "" means "127.0.0.1:0".
	Listen string
	// DefaultThink is applied when a request asks for the server default.
	DefaultThink time.Duration
	// DefaultRespSize (bytes, header included) is used when a request's
	// resp_len is 0; 0 means HeaderSize.
	DefaultRespSize int
	// TLS serves TLS. TLSCert is used if set, otherwise a self-signed
	// certificate is generated (see Server.SelfSigned).
	TLS     bool
	TLSCert *tls.Certificate
	// Nagle leaves Nagle's algorithm on (TCP_NODELAY off) on accepted
	// connections; the default is TCP_NODELAY on.
	Nagle bool
	// RcvBuf and SndBuf set SO_RCVBUF/SO_SNDBUF on the listener (inherited
	// by accepted connections) when > 0.
	RcvBuf, SndBuf int
	// PacingRate, when > 0, caps the pacing rate of accepted connections
	// (SO_MAX_PACING_RATE on the listener, in bytes per second): TCP then
	// paces their data by itself, whatever the congestion control.
	PacingRate int64
	// SplitResponse writes each response in two calls, its header and then
	// the rest, as nginx writes a header and then the body.
	SplitResponse bool
	// ReadDelay makes the server sleep before reading each request.
	ReadDelay time.Duration
	// ReadChunk caps each read call at this many bytes (slow reader).
	ReadChunk int
	// ReadGap makes the server sleep before each read call that continues a
	// message.
	ReadGap time.Duration
	// Serial processes a connection's requests one at a time in arrival
	// order (think and respond before reading the next). By default each
	// request read is handled concurrently, so pipelined requests overlap
	// on the server and responses may leave out of order.
	Serial bool
	// MaxInFlight bounds concurrently handled requests per connection
	// (default 256); the server stops reading while the bound is reached.
	MaxInFlight int
	// Out, if set, receives one JSON line per ServerRecord as it completes.
	Out io.Writer
	// OnRecord, if set, is called with each record as it completes, one
	// call at a time.
	OnRecord func(ServerRecord)
	// DiscardRecords stops the server from keeping records in memory (for
	// long runs with Out set); Serve then returns none.
	DiscardRecords bool
	// Hold, if set, is called with each request's id after the think
	// time, and its response is written when Hold returns: a test holds
	// an answer until something it waits for has happened.
	Hold func(id uint64)
}

// Validate checks the configuration.
func (c *ServerConfig) Validate() error {
	if c.DefaultThink < 0 || c.DefaultThink > maxThink {
		return fmt.Errorf("invalid think time %v: must be between 0 and %v", c.DefaultThink, maxThink)
	}
	if c.DefaultRespSize != 0 && (c.DefaultRespSize < HeaderSize || c.DefaultRespSize > MaxMessageSize) {
		return fmt.Errorf("invalid response size %d: must be between the %d-byte header and %d", c.DefaultRespSize, HeaderSize, MaxMessageSize)
	}
	if c.PacingRate < 0 {
		return fmt.Errorf("invalid pacing rate %d: must not be negative", c.PacingRate)
	}
	if c.RcvBuf < 0 || c.SndBuf < 0 {
		return fmt.Errorf("invalid socket buffer size (rcvbuf %d, sndbuf %d): must not be negative", c.RcvBuf, c.SndBuf)
	}
	if c.ReadDelay < 0 || c.ReadGap < 0 {
		return errors.New("invalid slow-read setting: delays must not be negative")
	}
	if c.ReadChunk < 0 {
		return fmt.Errorf("invalid read chunk %d: must not be negative", c.ReadChunk)
	}
	if c.MaxInFlight < 0 {
		return fmt.Errorf("invalid max in flight %d: must not be negative", c.MaxInFlight)
	}
	return nil
}

// Server is a listening workload server.
type Server struct {
	cfg      ServerConfig
	ln       net.Listener
	tlsConf  *tls.Config
	selfSign *SelfSigned
	out      *jsonlWriter

	connSeq atomic.Uint64
	served  atomic.Bool
	cbMu    sync.Mutex // serialises OnRecord calls

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	closed  bool
	records []ServerRecord
	done    chan struct{} // closed on shutdown
}

// Listen validates cfg and opens the listening socket, so that Addr is known
// before Serve runs.
func Listen(cfg ServerConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.DefaultRespSize == 0 {
		cfg.DefaultRespSize = HeaderSize
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 256
	}
	s := &Server{cfg: cfg, conns: map[net.Conn]struct{}{}, done: make(chan struct{}), out: &jsonlWriter{w: cfg.Out}}
	if cfg.TLS {
		cert := cfg.TLSCert
		if cert == nil {
			host, _, _ := net.SplitHostPort(cfg.Listen)
			ss, err := NewSelfSigned(host)
			if err != nil {
				return nil, fmt.Errorf("generating TLS certificate: %w", err)
			}
			s.selfSign = ss
			cert = &ss.Cert
		}
		s.tlsConf = &tls.Config{Certificates: []tls.Certificate{*cert}}
	}
	lc := net.ListenConfig{Control: sockControl(cfg.RcvBuf, cfg.SndBuf, cfg.PacingRate), KeepAlive: -1}
	ln, err := lc.Listen(context.Background(), "tcp", cfg.Listen)
	if err != nil {
		return nil, err
	}
	s.ln = ln
	return s, nil
}

// RunServer listens and serves until ctx is done, then returns the records.
func RunServer(ctx context.Context, cfg ServerConfig) ([]ServerRecord, error) {
	s, err := Listen(cfg)
	if err != nil {
		return nil, err
	}
	return s.Serve(ctx)
}

// Addr is the listening address (with the real port when Listen had port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// SelfSigned returns the generated certificate (TLS without TLSCert), or nil.
func (s *Server) SelfSigned() *SelfSigned { return s.selfSign }

// CertPool returns a pool trusting the generated certificate, or nil.
func (s *Server) CertPool() *x509.CertPool {
	if s.selfSign == nil {
		return nil
	}
	return s.selfSign.Pool
}

// Records returns a copy of the records completed so far.
func (s *Server) Records() []ServerRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ServerRecord(nil), s.records...)
}

// Close stops the server: it closes the listener and every connection. Serve
// returns after its handlers have finished.
func (s *Server) Close() error {
	s.shutdown()
	return nil
}

func (s *Server) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	close(s.done)
	s.ln.Close()
	for c := range s.conns {
		c.Close()
	}
}

// Serve accepts connections until ctx is done or Close is called, waits for
// the connection handlers to finish and returns the records (in completion
// order). Cancellation is a normal stop and returns a nil error.
func (s *Server) Serve(ctx context.Context) ([]ServerRecord, error) {
	if s.served.Swap(true) {
		return nil, errors.New("workload: Serve called twice")
	}
	stop := context.AfterFunc(ctx, s.shutdown)
	defer stop()
	var wg sync.WaitGroup
	var retErr error
	for {
		c, err := s.ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if !closed {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				retErr = err
				s.shutdown()
			}
			break
		}
		acceptNs := MonoNow()
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			break
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.handle(ctx, c, acceptNs)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
	wg.Wait()
	return s.Records(), retErr
}

func (s *Server) emit(r ServerRecord) {
	if s.cfg.OnRecord != nil {
		s.cbMu.Lock()
		s.cfg.OnRecord(r)
		s.cbMu.Unlock()
	}
	s.out.write(r)
	if s.cfg.DiscardRecords {
		return
	}
	s.mu.Lock()
	s.records = append(s.records, r)
	s.mu.Unlock()
}

// connState is one accepted connection.
type connState struct {
	s    *Server
	ctx  context.Context
	conn net.Conn
	tr   *timedReader
	base ServerRecord

	wmu     sync.Mutex // serialises response writes
	wbuf    []byte
	once    sync.Once
	closing atomic.Bool // we closed the connection ourselves
}

func (cs *connState) close() {
	cs.once.Do(func() {
		cs.closing.Store(true)
		cs.conn.Close()
	})
}

func (s *Server) handle(ctx context.Context, c net.Conn, acceptNs int64) {
	defer c.Close()
	cs := &connState{s: s, ctx: ctx, conn: c, base: ServerRecord{
		Type:     "server",
		Conn:     s.connSeq.Add(1),
		Local:    c.LocalAddr().String(),
		Peer:     c.RemoteAddr().String(),
		AcceptNs: acceptNs,
	}}
	_ = setNoDelay(c, !s.cfg.Nagle)
	if s.tlsConf != nil {
		tc := tls.Server(c, s.tlsConf)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		err := tc.HandshakeContext(ctx)
		cs.base.TLSDoneNs = MonoNow()
		_ = c.SetDeadline(time.Time{})
		if err != nil {
			r := cs.base
			r.Kind = "exchange"
			r.Wall = time.Now()
			r.Error = "tls handshake: " + err.Error()
			s.emit(r)
			return
		}
		cs.conn = tc
	}
	defer cs.close()
	cs.tr = newTimedReader(newSyscallReader(cs.conn), s.cfg.ReadChunk, s.cfg.ReadGap, s.done)

	sem := make(chan struct{}, s.cfg.MaxInFlight)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for {
		if s.cfg.ReadDelay > 0 && !sleepChan(s.done, s.cfg.ReadDelay) {
			return
		}
		hdr, firstNs, err := cs.tr.readHeader()
		if err != nil {
			if err == io.EOF || s.isClosed() || cs.closing.Load() || errors.Is(err, errClosing) {
				return
			}
			r := cs.base
			r.Kind, r.FirstReqByteNs, r.Wall = "exchange", firstNs, time.Now()
			r.ReqBytes = cs.tr.consumed
			r.Error = "reading request header: " + err.Error()
			s.emit(r)
			return
		}
		wall := time.Now()
		switch hdr.Kind {
		case KindRequest:
		case KindBulkUp:
			cs.bulkUp(hdr, firstNs, wall)
			return
		case KindBulkDown:
			cs.bulkDown(hdr, firstNs, wall)
			return
		default:
			r := cs.base
			r.Kind, r.ID, r.FirstReqByteNs, r.Wall = "exchange", hdr.ID, firstNs, wall
			r.Error = fmt.Sprintf("unexpected message kind %v", hdr.Kind)
			s.emit(r)
			return
		}
		start := cs.tr.consumed - HeaderSize
		r := cs.base
		r.Kind, r.ID, r.FirstReqByteNs, r.Wall = "exchange", hdr.ID, firstNs, wall
		if hdr.ReqLen < HeaderSize || hdr.ReqLen > MaxMessageSize {
			r.ReqBytes = HeaderSize
			r.Error = fmt.Sprintf("bad request length %d", hdr.ReqLen)
			s.emit(r)
			return
		}
		lastNs, err := cs.tr.discard(int64(hdr.ReqLen) - HeaderSize)
		r.ReqBytes = cs.tr.consumed - start
		if err != nil {
			if !s.isClosed() && !cs.closing.Load() {
				r.Error = "reading request: " + err.Error()
				s.emit(r)
			}
			return
		}
		r.LastReqByteNs, r.LastReadCallNs = lastNs, cs.tr.callNs
		r.RespSize = int64(hdr.RespLen)
		if hdr.RespLen == 0 {
			r.RespSize = int64(s.cfg.DefaultRespSize)
		}
		if r.RespSize < HeaderSize || r.RespSize > MaxMessageSize {
			r.Error = fmt.Sprintf("bad response length %d", hdr.RespLen)
			s.emit(r)
			return
		}
		think := s.cfg.DefaultThink
		if hdr.ThinkMicros != ThinkServerDefault {
			think = time.Duration(hdr.ThinkMicros) * time.Microsecond
		}
		r.ThinkNs = int64(think)
		if s.cfg.Serial {
			if !cs.respond(r, think) {
				return
			}
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-s.done:
			return
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer func() { <-sem }()
			if !cs.respond(r, think) {
				cs.close() // unblocks the reader
			}
		}()
	}
}

func (s *Server) isClosed() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// respond thinks, then writes the response; it reports success.
func (cs *connState) respond(r ServerRecord, think time.Duration) bool {
	s := cs.s
	r.ThinkStartNs = MonoNow()
	err := SleepCtx(cs.ctx, think)
	r.ThinkEndNs = MonoNow()
	if err != nil {
		r.Error = "canceled during think time"
		s.emit(r)
		return false
	}
	if s.cfg.Hold != nil {
		s.cfg.Hold(r.ID)
	}
	cs.wmu.Lock()
	buf := messageBuf(&cs.wbuf, int(r.RespSize))
	r.RespWriteStartNs = MonoNow()
	Header{
		Kind:        KindResponse,
		ID:          r.ID,
		ReqLen:      uint32(r.ReqBytes),
		RespLen:     uint32(r.RespSize),
		ThinkMicros: thinkToMicros(think),
		Aux:         uint64(r.RespWriteStartNs - r.LastReqByteNs),
	}.Put(buf)
	var n int
	if s.cfg.SplitResponse && len(buf) > HeaderSize {
		n, err = cs.conn.Write(buf[:HeaderSize])
		if err == nil {
			var m int
			m, err = cs.conn.Write(buf[HeaderSize:])
			n += m
		}
	} else {
		n, err = cs.conn.Write(buf)
	}
	r.RespWriteDoneNs = MonoNow()
	cs.wmu.Unlock()
	r.RespBytes = int64(n)
	if err != nil {
		r.Error = "writing response: " + err.Error()
	}
	s.emit(r)
	return err == nil
}

func (cs *connState) bulkUp(hdr Header, firstNs int64, wall time.Time) {
	r := cs.base
	r.Kind, r.ID, r.FirstReqByteNs, r.Wall = "bulk-up", hdr.ID, firstNs, wall
	n, lastNs, err := cs.tr.drain()
	r.ReqBytes = HeaderSize + n
	r.LastReqByteNs = lastNs
	if lastNs == 0 {
		r.LastReqByteNs = firstNs
	}
	if err != io.EOF {
		if !cs.s.isClosed() {
			r.Error = "reading bulk stream: " + err.Error()
		} else {
			r.Error = "server closed"
		}
		cs.s.emit(r)
		return
	}
	var b [HeaderSize]byte
	r.RespSize = HeaderSize
	r.RespWriteStartNs = MonoNow()
	Header{Kind: KindBulkAck, ID: hdr.ID, Aux: uint64(n)}.Put(b[:])
	m, err := cs.conn.Write(b[:])
	r.RespWriteDoneNs = MonoNow()
	r.RespBytes = int64(m)
	if err != nil {
		r.Error = "writing bulk ack: " + err.Error()
	}
	cs.s.emit(r)
}

func (cs *connState) bulkDown(hdr Header, firstNs int64, wall time.Time) {
	r := cs.base
	r.Kind, r.ID, r.FirstReqByteNs, r.LastReqByteNs, r.Wall = "bulk-down", hdr.ID, firstNs, cs.tr.fillNs, wall
	r.ReqBytes = HeaderSize
	r.RespSize = int64(hdr.Aux)
	limit := int64(hdr.Aux)
	buf := messageBuf(&cs.wbuf, 64<<10)
	r.RespWriteStartNs = MonoNow()
	var err error
	for limit == 0 || r.RespBytes < limit {
		chunk := buf
		if limit > 0 && limit-r.RespBytes < int64(len(chunk)) {
			chunk = chunk[:limit-r.RespBytes]
		}
		var n int
		n, err = cs.conn.Write(chunk)
		r.RespBytes += int64(n)
		if err != nil {
			break
		}
	}
	r.RespWriteDoneNs = MonoNow()
	if err != nil && !(limit == 0 && peerGone(err)) && !cs.s.isClosed() {
		r.Error = "writing bulk stream: " + err.Error()
	}
	cs.s.emit(r)
}

// peerGone reports errors that mean the peer closed the connection.
func peerGone(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}
