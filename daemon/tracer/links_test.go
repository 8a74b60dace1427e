package tracer

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/daemon/requests"
	"github.com/lattrace/lattrace/record"
)

// serveEach listens on loopback and serves each connection with handle, on
// a goroutine of its own, until the test ends.
func serveEach(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// backendServer answers every connection's 50-byte requests with 60 bytes
// after think.
func backendServer(t *testing.T, think time.Duration) string {
	return serveEach(t, func(c net.Conn) {
		in := make([]byte, 50)
		for {
			if _, err := io.ReadFull(c, in); err != nil {
				return
			}
			time.Sleep(think)
			if _, err := c.Write(make([]byte, 60)); err != nil {
				return
			}
		}
	})
}

// frontServer is a thread-per-connection server: each connection's
// handler runs on its own thread (a locked goroutine), reads a request,
// makes calls round trips to backend on a connection of its own, and
// answers. Each handler reports its thread id on tids.
func frontServer(t *testing.T, backend string, calls, req, resp int, tids chan<- int) string {
	return serveEach(t, func(c net.Conn) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tids <- unix.Gettid()
		b, err := net.Dial("tcp", backend)
		if err != nil {
			return
		}
		defer b.Close()
		in, out := make([]byte, req), make([]byte, resp)
		for {
			if _, err := io.ReadFull(c, in); err != nil {
				return
			}
			for range calls {
				if _, err := b.Write(make([]byte, 50)); err != nil {
					return
				}
				if _, err := io.ReadFull(b, make([]byte, 60)); err != nil {
					return
				}
			}
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	})
}

// TestRequestLinks: two clients at once ask a thread-per-connection
// server, whose handlers each call a backend three times per request.
// Every call's record names the request its handler was serving (the
// inbound exchange's socket and first byte, read by the same goroutine:
// this test is a Go program, followed by goroutine), and
// the trees of package requests hang each call under its own request: both
// requests are open at once, so the window alone could not tell.
func TestRequestLinks(t *testing.T) {
	const clients, perClient, calls, req, resp = 2, 6, 3, 100, 200
	backend := backendServer(t, time.Millisecond)
	tids := make(chan int, clients)
	front := frontServer(t, backend, calls, req, resp, tids)
	col := &collector{}
	tr, _ := openTracerWith(t, Options{DrainInterval: 20 * time.Millisecond}, col)
	waitGoFollowed(t, tr, os.Getpid())

	// The clients are another process: in this one, the Go runtime's
	// threads wake each other for their own reasons, and a client's
	// goroutine may run on a thread a handler's wake-up reached.
	client := exec.Command("/usr/bin/python3", "-c", `
import socket, sys, threading
host, port = sys.argv[1].rsplit(":", 1)
def run():
    c = socket.create_connection((host, int(port)))
    for _ in range(int(sys.argv[2])):
        c.sendall(b"q" * int(sys.argv[3]))
        n = int(sys.argv[4])
        while n > 0:
            n -= len(c.recv(n))
    c.close()
ts = [threading.Thread(target=run) for _ in range(int(sys.argv[5]))]
for t in ts: t.start()
for t in ts: t.join()
`, front, fmt.Sprint(perClient), fmt.Sprint(req), fmt.Sprint(resp), fmt.Sprint(clients))
	if out, err := client.CombinedOutput(); err != nil {
		t.Fatalf("clients: %v\n%s", err, out)
	}
	handlers := map[uint64]bool{}
	for range clients {
		handlers[uint64(<-tids)] = true
	}
	// This test is a Go program: once the tracer has found it (at its
	// start), its goroutines are the contexts.
	goroutines := false
	frontPort := netip.MustParseAddrPort(front).Port()
	backendPort := netip.MustParseAddrPort(backend).Port()
	deadline := time.Now().Add(10 * time.Second)
	var exs []*record.Exchange
	for {
		exs = col.all()
		n := 0
		for _, e := range exs {
			if e.Role == record.Requester && e.Flow.Remote.Port() == backendPort {
				n++
			}
		}
		if n >= clients*perClient*calls || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The kernel's evidence, record by record.
	inbound := map[[2]uint64]*record.Exchange{}
	for _, e := range exs {
		if e.Role == record.Responder && e.Flow.Local.Port() == frontPort {
			switch {
			case e.Ctx&record.CtxGoroutine != 0:
				goroutines = true
			case !handlers[e.Ctx]:
				t.Errorf("front request read by context %d, not a handler thread %v", e.Ctx, handlers)
			}
			inbound[[2]uint64{e.Cookie, uint64(e.InSeq)}] = e
		}
	}
	// The test binary keeps its DWARF: the tracer follows its goroutines.
	if !goroutines {
		t.Errorf("requests read by threads, not goroutines: the tracer did not follow this Go program's goroutines")
	}
	calledOut := 0
	for _, e := range exs {
		if e.Role != record.Requester || e.Flow.Remote.Port() != backendPort {
			continue
		}
		calledOut++
		p := e.Served.Parent
		parent := inbound[[2]uint64{p.Cookie, uint64(p.InSeq)}]
		switch {
		case parent == nil:
			t.Errorf("call at %d names request %+v, not a front request", e.Start, p)
		case p.Method != ownRead(goroutines) || e.Ctx != parent.Ctx:
			t.Errorf("call by context %d linked by %q to a request read by %d", e.Ctx, p.Method, parent.Ctx)
		case e.Timeline.W0 < parent.Timeline.R0 || e.Timeline.D1 > parent.Timeline.W1:
			t.Errorf("call [%d, %d] outside its request [%d, %d]", e.Timeline.W0, e.Timeline.D1, parent.Timeline.R0, parent.Timeline.W1)
		}
	}
	if want := clients * perClient * calls; calledOut != want {
		t.Errorf("%d calls recorded, want %d", calledOut, want)
	}

	// The trees: one per client request, its calls under it.
	res := requests.Assemble(exs, 0)
	trees := 0
	for _, r := range res.Requests {
		if r.Root.Server == nil || r.Root.Server.Flow.Local.Port() != frontPort {
			continue
		}
		trees++
		if len(r.Root.Children) != calls {
			t.Errorf("request %s has %d calls under it, want %d", r.ID, len(r.Root.Children), calls)
		}
		for _, c := range r.Root.Children {
			if c.Link != ownRead(goroutines) || c.Client.Served.Parent.Cookie != r.Root.Server.Cookie || c.Client.Served.Parent.InSeq != r.Root.Server.InSeq {
				t.Errorf("request %s: call linked %q to %+v", r.ID, c.Link, c.Client.Served.Parent)
			}
			if !c.Critical || c.Parallel {
				t.Errorf("request %s: sequential call critical=%v parallel=%v", r.ID, c.Critical, c.Parallel)
			}
		}
		if r.CriticalTurns < uint32(2*(calls+1)) {
			t.Errorf("request %s: %d turns on its critical path, want %d at least", r.ID, r.CriticalTurns, 2*(calls+1))
		}
	}
	if trees != clients*perClient {
		t.Errorf("%d trees rooted at the front server, want %d", trees, clients*perClient)
	}
	if len(res.Ambiguous) != 0 {
		t.Errorf("%d calls ambiguous, want 0", len(res.Ambiguous))
	}
	if t.Failed() {
		for _, e := range exs {
			t.Logf("%s %v ctx %d served %+v w0 %d r0 %d d1 %d w1 %d", e.Role, e.Flow, e.Ctx, e.Served, e.Timeline.W0, e.Timeline.R0, e.Timeline.D1, e.Timeline.W1)
		}
	}
}

// waitGoFollowed waits until the tracer follows the goroutines of the Go
// program pid (its first look runs as it starts).
func waitGoFollowed(t *testing.T, tr *Tracer, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !tr.goFollowed(uint32(pid)); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the tracer did not find the Go program %d in 10 s", pid)
		}
	}
}

// ownRead is the method of a link by what the writer read itself.
func ownRead(goroutines bool) record.LinkMethod {
	if goroutines {
		return record.LinkGoroutine
	}
	return record.LinkThread
}

// TestRequestLinksOff: with the evidence off, no record names a request.
func TestRequestLinksOff(t *testing.T) {
	backend := backendServer(t, time.Millisecond)
	tids := make(chan int, 1)
	front := frontServer(t, backend, 2, 100, 200, tids)
	col := &collector{}
	openTracerWith(t, Options{DrainInterval: 20 * time.Millisecond, NoRequestLinks: true}, col)
	c, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	for range 3 {
		c.Write(make([]byte, 100))
		io.ReadFull(c, make([]byte, 200))
	}
	c.Close()
	col.find(t, local)
	time.Sleep(time.Second)
	for _, e := range col.all() {
		if e.Ctx != 0 || e.Served != (record.Served{}) {
			t.Errorf("evidence with links off: %v ctx %d served %s", e.Flow, e.Ctx, fmt.Sprint(e.Served))
		}
	}
}

// all returns every exchange collected so far.
func (c *collector) all() []*record.Exchange {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*record.Exchange(nil), c.exchanges...)
}

// goParentServer is a Go program built with its DWARF (so the tracer reads
// its goroutine ids): each request's handler starts a goroutine per call
// to backend and waits for it, as handlers fanning out do.
const goParentServer = `package main

import (
	"fmt"
	"io"
	"net"
	"os"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			b, err := net.Dial("tcp", os.Args[1])
			if err != nil {
				return
			}
			for {
				if _, err := io.ReadFull(c, make([]byte, 100)); err != nil {
					return
				}
				for range 2 {
					done := make(chan error)
					go func() {
						_, err := b.Write(make([]byte, 50))
						if err == nil {
							_, err = io.ReadFull(b, make([]byte, 60))
						}
						done <- err
					}()
					if <-done != nil {
						return
					}
				}
				c.Write(make([]byte, 200))
			}
		}()
	}
}
`

// TestGoParentLinks: in a Go program whose DWARF gives its goroutines' ids,
// a call made by a goroutine the request's handler started is linked to
// the request by the parent goroutine (go_parent), and the handler's own
// read names it by its goroutine.
func TestGoParentLinks(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(goParentServer), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "goparent")
	build := exec.Command("go", "build", "-o", bin, "main.go")
	build.Dir, build.Env = dir, append(os.Environ(), "GOFLAGS=", "GO111MODULE=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	backend := backendServer(t, time.Millisecond)
	srv := exec.Command(bin, backend)
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	var front string
	if _, err := fmt.Fscanln(stdout, &front); err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	tr, _ := openTracerWith(t, Options{DrainInterval: 20 * time.Millisecond}, col)
	waitGoFollowed(t, tr, srv.Process.Pid)
	c, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	const n = 5
	for range n {
		c.Write(make([]byte, 100))
		io.ReadFull(c, make([]byte, 200))
	}
	c.Close()
	col.find(t, local)
	time.Sleep(time.Second)
	exs := col.all()
	backendPort := netip.MustParseAddrPort(backend).Port()
	calls, byParent := 0, 0
	for _, e := range exs {
		if e.Owner.PID != uint32(srv.Process.Pid) || e.Role != record.Requester || e.Flow.Remote.Port() != backendPort {
			continue
		}
		calls++
		h := e.Served.Handoff
		if e.Ctx&record.CtxGoroutine != 0 && h.Method == record.LinkGoParent && e.Served.Parent.Cookie == 0 {
			byParent++
		}
	}
	res := requests.Assemble(exs, 0)
	linked := 0
	for _, r := range res.Requests {
		if r.Root.Server == nil || r.Root.Server.Owner.PID != uint32(srv.Process.Pid) {
			continue
		}
		for _, h := range r.Root.Children {
			if h.Link == record.LinkGoParent {
				linked++
			}
		}
	}
	if calls != 2*n || byParent != calls || linked != calls {
		t.Errorf("%d calls, %d naming their handler's request by the parent goroutine, %d linked so in the trees; want %d each", calls, byParent, linked, 2*n)
		for _, e := range exs {
			if e.Owner.PID == uint32(srv.Process.Pid) {
				t.Logf("%s %v ctx %x served %+v", e.Role, e.Flow, e.Ctx, e.Served)
			}
		}
	}
}
