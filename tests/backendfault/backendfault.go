// Package backendfault stands between an OTLP exporter and a real
// OpenTelemetry Collector and plays the faults a tracing backend has, at
// will: down (nothing listens: connections are refused), a black hole
// (connections accepted, never answered), and answers of errors (gRPC
// UNAVAILABLE, HTTP 429 or 503, each with a real grpc-go or net/http
// server). In between it relays every byte to the Collector, whose own
// count of what it received stays the truth.
//
//	p, _ := backendfault.Start(col.GRPCEndpoint())
//	defer p.Close()
//	// the exporter's endpoint is p.Addr()
//	p.Set(backendfault.Down)
//	...
//	p.Set(backendfault.Relay)
//
// Every change of mode closes the connections open, so the exporter meets
// the new mode at its next connection, as it would a backend restarted.
package backendfault

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Mode is what the backend does with a connection.
type Mode int

const (
	Relay              Mode = iota // every byte to and from the Collector
	Down                           // nothing listens: connections are refused
	BlackHole                      // accepted and read, never answered
	Unavailable                    // gRPC: every call fails with UNAVAILABLE
	TooManyRequests                // HTTP: every request gets 429 with Retry-After: 1
	ServiceUnavailable             // HTTP: every request gets 503 with Retry-After: 1
)

func (m Mode) String() string {
	switch m {
	case Relay:
		return "relay"
	case Down:
		return "down"
	case BlackHole:
		return "black hole"
	case Unavailable:
		return "gRPC UNAVAILABLE"
	case TooManyRequests:
		return "HTTP 429"
	case ServiceUnavailable:
		return "HTTP 503"
	}
	return "mode " + strconv.Itoa(int(m))
}

// Proxy is the faulty backend.
type Proxy struct {
	target string
	addr   string

	mu    sync.Mutex
	mode  Mode
	ln    net.Listener // nil while Down
	conns map[net.Conn]bool
	// accepted counts the connections taken in each mode.
	accepted map[Mode]int

	grpcConns, httpConns *connListener
	grpcSrv              *grpc.Server
	httpSrv              *http.Server
	done                 sync.WaitGroup
}

// Start listens on a free loopback port and relays to target (host:port).
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{target: target, addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]bool{}, accepted: map[Mode]int{},
		grpcConns: newConnListener(ln.Addr()), httpConns: newConnListener(ln.Addr())}
	p.grpcSrv = grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		return status.Error(codes.Unavailable, "backendfault: the backend is unavailable")
	}))
	p.httpSrv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(p.answerHTTP)}
	p.done.Add(3)
	go func() { defer p.done.Done(); _ = p.grpcSrv.Serve(p.grpcConns) }()
	go func() { defer p.done.Done(); _ = p.httpSrv.Serve(p.httpConns) }()
	go p.acceptLoop(ln)
	return p, nil
}

// Addr is the endpoint to give the exporter (host:port, no scheme).
func (p *Proxy) Addr() string { return p.addr }

// Accepted says how many connections the backend took in mode m.
func (p *Proxy) Accepted(m Mode) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted[m]
}

// Set switches to mode m: the connections open are closed, and from Down
// the port listens again (the same port: the exporter knows no other).
func (p *Proxy) Set(m Mode) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
	p.mode = m
	switch {
	case m == Down && p.ln != nil:
		err := p.ln.Close()
		p.ln = nil
		return err
	case m != Down && p.ln == nil:
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("backendfault: listening on %s again: %w", p.addr, err)
		}
		p.ln = ln
		p.done.Add(1)
		go p.acceptLoop(ln)
	}
	return nil
}

// Close stops the backend and closes every connection.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.grpcSrv.Stop()
	p.httpSrv.Close()
	p.grpcConns.Close()
	p.httpConns.Close()
	p.done.Wait()
}

func (p *Proxy) acceptLoop(ln net.Listener) {
	defer p.done.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		m := p.mode
		if p.ln != ln { // switched to Down, or listening anew, meanwhile
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.accepted[m]++
		p.conns[c] = true
		p.mu.Unlock()
		switch m {
		case Relay:
			go p.relay(c)
		case BlackHole:
			go func() { _, _ = io.Copy(io.Discard, c) }()
		case Unavailable:
			p.grpcConns.put(c)
		default:
			p.httpConns.put(c)
		}
	}
}

// relay copies bytes both ways between c and a new connection to the
// Collector until either side closes.
func (p *Proxy) relay(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if !p.conns[c] { // the mode changed meanwhile
		p.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	p.conns[up] = true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *Proxy) answerHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	p.mu.Lock()
	m := p.mode
	p.mu.Unlock()
	code := http.StatusServiceUnavailable
	if m == TooManyRequests {
		code = http.StatusTooManyRequests
	}
	w.Header().Set("Retry-After", "1")
	http.Error(w, "backendfault: "+m.String(), code)
}

// connListener is a net.Listener whose connections the proxy hands it:
// the gRPC and HTTP servers answer the connections of their modes.
type connListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newConnListener(addr net.Addr) *connListener {
	return &connListener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

func (l *connListener) put(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.closed:
		c.Close()
	}
}

func (l *connListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, errors.New("backendfault: closed")
	}
}

func (l *connListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *connListener) Addr() net.Addr { return l.addr }
