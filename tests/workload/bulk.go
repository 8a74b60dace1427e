package workload

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Bulk directions.
const (
	BulkUp   = "up"   // client streams to the server
	BulkDown = "down" // server streams to the client
)

// BulkConfig configures a one-way bulk stream (background traffic). The
// server needs no special mode: it recognises the bulk header.
type BulkConfig struct {
	// Addr is the server address, "host:port".
	Addr string
	// Direction is BulkUp (default) or BulkDown.
	Direction string
	// Duration and Bytes bound the stream (payload bytes, header
	// excluded); whichever is reached first ends it. With both 0 it runs
	// until ctx is done.
	Duration time.Duration
	Bytes    int64
	// WriteSize is the size of each write call (up; default 64 KiB).
	WriteSize int
	// ID is carried in the bulk header (default 1).
	ID uint64
	// TLS, TLSConfig, Nagle, RcvBuf, SndBuf, ConnectTimeout: as in
	// ClientConfig.
	TLS            bool
	TLSConfig      *tls.Config
	Nagle          bool
	RcvBuf, SndBuf int
	ConnectTimeout time.Duration
}

// Validate checks the configuration.
func (c *BulkConfig) Validate() error {
	if c.Addr == "" {
		return errors.New("missing server address")
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("invalid address %q: want host:port (IPv6 as [addr]:port)", c.Addr)
	}
	switch c.Direction {
	case "", BulkUp, BulkDown:
	default:
		return fmt.Errorf("unknown bulk direction %q (want %q or %q)", c.Direction, BulkUp, BulkDown)
	}
	if c.Duration < 0 {
		return fmt.Errorf("invalid duration %v: must not be negative", c.Duration)
	}
	if c.Bytes < 0 {
		return fmt.Errorf("invalid byte count %d: must not be negative", c.Bytes)
	}
	if c.WriteSize < 0 {
		return fmt.Errorf("invalid write size %d: must not be negative", c.WriteSize)
	}
	if c.RcvBuf < 0 || c.SndBuf < 0 {
		return fmt.Errorf("invalid socket buffer size (rcvbuf %d, sndbuf %d): must not be negative", c.RcvBuf, c.SndBuf)
	}
	if c.ConnectTimeout < 0 {
		return fmt.Errorf("invalid connect timeout %v: must not be negative", c.ConnectTimeout)
	}
	return nil
}

// RunBulk runs one bulk stream and reports its goodput. Ending ctx ends the
// stream normally (like reaching Duration).
func RunBulk(ctx context.Context, cfg BulkConfig) (BulkResult, error) {
	if err := cfg.Validate(); err != nil {
		return BulkResult{}, err
	}
	if cfg.Direction == "" {
		cfg.Direction = BulkUp
	}
	if cfg.WriteSize == 0 {
		cfg.WriteSize = 64 << 10
	}
	if cfg.ID == 0 {
		cfg.ID = 1
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	c := &client{
		cfg: ClientConfig{Addr: cfg.Addr, Nagle: cfg.Nagle, ConnectTimeout: cfg.ConnectTimeout},
		dialer: net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: -1,
			Control: sockControl(cfg.RcvBuf, cfg.SndBuf, 0)},
	}
	if cfg.TLS {
		c.tlsConf = clientTLSConfig(cfg.TLSConfig, cfg.Addr)
	}
	res := BulkResult{Type: "bulk", Direction: cfg.Direction, ID: cfg.ID}
	conn, info, err := c.dial(ctx)
	res.ConnectStartNs, res.ConnectDoneNs, res.TLSDoneNs = info.start, info.done, info.tlsDone
	res.Local, res.Remote = info.local, info.remote
	if err != nil {
		res.Wall = info.wall
		res.Error = err.Error()
		return res, err
	}
	defer conn.Close()

	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = time.Now().Add(cfg.Duration)
	}
	if cfg.Direction == BulkUp {
		err = bulkUp(ctx, conn, &cfg, deadline, &res)
	} else {
		err = bulkDown(ctx, conn, &cfg, deadline, &res)
	}
	if err != nil {
		res.Error = err.Error()
	}
	if d := res.EndNs - res.StartNs; err == nil && d > 0 {
		b := res.Bytes
		if cfg.Direction == BulkUp {
			b = res.AckedBytes
		}
		res.GoodputBps = float64(b) * 8 / (float64(d) / 1e9)
	}
	return res, err
}

func bulkUp(ctx context.Context, conn net.Conn, cfg *BulkConfig, deadline time.Time, res *BulkResult) error {
	buf := messageBuf(new([]byte), max(cfg.WriteSize, HeaderSize))
	Header{Kind: KindBulkUp, ID: cfg.ID}.Put(buf)
	if _, err := conn.Write(buf[:HeaderSize]); err != nil {
		return fmt.Errorf("writing bulk header: %w", err)
	}
	fillPadding(buf[:HeaderSize])
	buf = buf[:cfg.WriteSize]
	res.Wall = time.Now()
	res.StartNs = MonoNow()
	for ctx.Err() == nil && (deadline.IsZero() || time.Now().Before(deadline)) &&
		(cfg.Bytes == 0 || res.Bytes < cfg.Bytes) {
		chunk := buf
		if cfg.Bytes > 0 && cfg.Bytes-res.Bytes < int64(len(chunk)) {
			chunk = chunk[:cfg.Bytes-res.Bytes]
		}
		n, err := conn.Write(chunk)
		res.Bytes += int64(n)
		if err != nil {
			return fmt.Errorf("writing bulk stream: %w", err)
		}
	}
	var err error
	switch c := conn.(type) {
	case *tls.Conn:
		err = c.CloseWrite()
	case *net.TCPConn:
		err = c.CloseWrite()
	}
	if err != nil {
		return fmt.Errorf("shutting down the write side: %w", err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	tr := newTimedReader(conn, 0, 0, nil)
	hdr, _, err := tr.readHeader()
	res.EndNs = tr.fillNs
	if err != nil {
		return fmt.Errorf("reading bulk ack: %w", err)
	}
	if hdr.Kind != KindBulkAck || hdr.ID != cfg.ID {
		return fmt.Errorf("reading bulk ack: unexpected %v for id %d", hdr.Kind, hdr.ID)
	}
	res.AckedBytes = int64(hdr.Aux)
	if res.AckedBytes != res.Bytes {
		return fmt.Errorf("server acknowledged %d bytes, sent %d", res.AckedBytes, res.Bytes)
	}
	return nil
}

func bulkDown(ctx context.Context, conn net.Conn, cfg *BulkConfig, deadline time.Time, res *BulkResult) error {
	var hb [HeaderSize]byte
	Header{Kind: KindBulkDown, ID: cfg.ID, Aux: uint64(cfg.Bytes)}.Put(hb[:])
	if _, err := conn.Write(hb[:]); err != nil {
		return fmt.Errorf("writing bulk header: %w", err)
	}
	res.Wall = time.Now()
	res.StartNs = MonoNow()
	res.EndNs = res.StartNs
	if !deadline.IsZero() {
		_ = conn.SetReadDeadline(deadline)
	}
	// Ending ctx ends the stream like reaching the deadline.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()
	if ctx.Err() != nil {
		return nil
	}
	tr := newTimedReader(conn, 0, 0, nil)
	for cfg.Bytes == 0 || res.Bytes < cfg.Bytes {
		if err := tr.fill(); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil // duration reached or ctx ended
			}
			if err == io.EOF && cfg.Bytes == 0 {
				return nil
			}
			return fmt.Errorf("reading bulk stream after %d bytes: %w", res.Bytes, err)
		}
		res.Bytes += int64(tr.e - tr.s)
		res.EndNs = tr.fillNs
		tr.s = tr.e
	}
	return nil
}
