package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The load generator runs in child processes of the benchmark (the same
// binary, `bench loadgen`), so that it can be placed in a cgroup of its own
// and so that each process stays under this machine's limit of open files
// (RLIMIT_NOFILE 20000, and no CAP_SYS_RESOURCE to lift it).

// LoadConfig is a load generator's job.
type LoadConfig struct {
	// Mode "rr": Conns connections doing request/response round trips
	// for Duration, paced to Rate round trips/s in all (0: as fast as
	// they go). Mode "hold": Conns connections, one round trip each, then
	// held open idle until stdin closes. Mode "pend": Conns connections
	// each sending one request of Size bytes, held open until stdin
	// closes (a server with a long Think leaves them all unanswered).
	// Mode "churn": Conns workers
	// each opening a connection, making one round trip and closing it,
	// again and again for Duration, as fast as they go. Mode "flood":
	// Conns threads each connecting and closing at once with a reset (no
	// TIME_WAIT to run out of ports), as fast as they go, or at Rate
	// connections/s in all (flood).
	Mode     string        `json:"mode"`
	Conns    int           `json:"conns"`
	Rate     float64       `json:"rate"`
	Duration time.Duration `json:"duration"`
	Size     int           `json:"size"`
	// Think is how long the server waits before each answer (0: none).
	Think time.Duration `json:"think,omitempty"`
	// CPU, if set, pins the whole generator (both ends) to that CPU, as
	// pinned does.
	CPU *int `json:"cpu,omitempty"`
}

// LoadResult is what a load generator did.
type LoadResult struct {
	Conns      int    `json:"conns"`
	RoundTrips uint64 `json:"round_trips"`
	Error      string `json:"error,omitempty"`
}

// MaxHoldPerProcess keeps a holding process's two sockets per connection
// under RLIMIT_NOFILE.
const MaxHoldPerProcess = 9000

// RunLoad is the child's side: it does the job and writes the result as
// one JSON line on out. In hold mode it writes the line once every
// connection is open, then waits for in to close.
func RunLoad(cfg LoadConfig, in io.Reader, out io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	var served sync.WaitGroup
	stop := make(chan struct{})
	go accept(ln, cfg.Size, cfg.Think, stop, &served)
	conns := make([]net.Conn, 0, cfg.Conns)
	defer func() {
		close(stop)
		for _, c := range conns {
			c.Close()
		}
		served.Wait()
	}()
	for range cfg.Conns {
		if cfg.Mode == "churn" || cfg.Mode == "flood" {
			break // its workers dial their own
		}
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return fmt.Errorf("connection %d of %d: %w", len(conns)+1, cfg.Conns, err)
		}
		conns = append(conns, c)
	}
	var res LoadResult
	res.Conns = len(conns)
	switch cfg.Mode {
	case "rr":
		res.RoundTrips, err = roundTrips(conns, cfg)
	case "churn":
		res.RoundTrips, err = churn(ln.Addr().String(), cfg)
		res.Conns = int(res.RoundTrips)
	case "flood":
		var n uint64
		n, err = flood(cfg)
		res.Conns = int(n)
	case "hold":
		buf := make([]byte, cfg.Size)
		for _, c := range conns {
			if err = roundTrip(c, buf); err != nil {
				break
			}
			res.RoundTrips++
		}
	case "pend":
		buf := make([]byte, cfg.Size)
		for _, c := range conns {
			if _, err = c.Write(buf); err != nil {
				break
			}
		}
	default:
		err = fmt.Errorf("mode %q: want rr, hold, pend, churn or flood", cfg.Mode)
	}
	if err != nil {
		res.Error = err.Error()
	}
	if err := json.NewEncoder(out).Encode(res); err != nil {
		return err
	}
	if (cfg.Mode == "hold" || cfg.Mode == "pend") && err == nil {
		_, _ = io.Copy(io.Discard, in)
	}
	return nil
}

// accept echoes every message back on every accepted connection, think
// after it arrived (or until stop).
func accept(ln net.Listener, size int, think time.Duration, stop <-chan struct{}, wg *sync.WaitGroup) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			buf := make([]byte, size)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if think > 0 {
					select {
					case <-time.After(think):
					case <-stop:
						return
					}
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

func roundTrip(c net.Conn, buf []byte) error {
	if _, err := c.Write(buf); err != nil {
		return err
	}
	_, err := io.ReadFull(c, buf)
	return err
}

// roundTrips runs every connection's loop until Duration has passed; a
// loop stops only between round trips, so each counted one is whole at
// both ends.
func roundTrips(conns []net.Conn, cfg LoadConfig) (uint64, error) {
	var total atomic.Uint64
	var wg sync.WaitGroup
	errs := make([]error, len(conns))
	end := time.Now().Add(cfg.Duration)
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(len(conns)) / cfg.Rate * float64(time.Second))
	}
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, cfg.Size)
			// Connections start spread over one interval, not together.
			next := time.Now().Add(interval * time.Duration(i) / time.Duration(len(conns)))
			for {
				now := time.Now()
				if now.After(end) {
					return
				}
				if interval > 0 {
					if d := next.Sub(now); d > 0 {
						time.Sleep(d)
					}
					next = next.Add(interval)
				}
				if err := roundTrip(c, buf); err != nil {
					errs[i] = err
					return
				}
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	return total.Load(), errors.Join(errs...)
}

// churn runs Conns workers, each connecting, making one round trip and
// closing, until Duration has passed; it returns how many connections
// made their round trip.
func churn(addr string, cfg LoadConfig) (uint64, error) {
	var total atomic.Uint64
	var wg sync.WaitGroup
	errs := make([]error, cfg.Conns)
	end := time.Now().Add(cfg.Duration)
	for i := range cfg.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, cfg.Size)
			for time.Now().Before(end) {
				c, err := net.Dial("tcp", addr)
				if err != nil {
					errs[i] = err
					return
				}
				err = roundTrip(c, buf)
				c.Close()
				if err != nil {
					errs[i] = err
					return
				}
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	return total.Load(), errors.Join(errs...)
}

// flood runs Conns threads, each connecting to a listener of its own and
// closing at once with a reset, until Duration has passed, paced to Rate
// connections/s in all when set; two threads accept and close. It goes
// through the system calls directly, on locked threads: the runtime's
// poller doubled the cost of each connection, which is the kernel's to
// measure. It returns how many connections were made.
func flood(cfg LoadConfig) (uint64, error) {
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return 0, err
	}
	if err := unix.Listen(ln, 4096); err != nil {
		return 0, err
	}
	sa, err := unix.Getsockname(ln)
	if err != nil {
		return 0, err
	}
	to := sa.(*unix.SockaddrInet4)
	var accepting sync.WaitGroup
	for range 2 {
		accepting.Add(1)
		go func() {
			defer accepting.Done()
			runtime.LockOSThread()
			for {
				fd, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
				if err != nil {
					return // the listener was shut down
				}
				unix.Close(fd)
			}
		}()
	}
	var total atomic.Uint64
	var wg sync.WaitGroup
	errs := make([]error, cfg.Conns)
	end := time.Now().Add(cfg.Duration)
	var interval time.Duration
	if cfg.Rate > 0 {
		interval = time.Duration(float64(cfg.Conns) / cfg.Rate * float64(time.Second))
	}
	// SO_LINGER 0: the close sends a reset, and neither end waits in
	// TIME_WAIT, so the ports last however many connections are made.
	linger := &unix.Linger{Onoff: 1, Linger: 0}
	for i := range cfg.Conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			next := time.Now()
			for time.Now().Before(end) {
				if interval > 0 {
					if w := time.Until(next); w > 0 {
						time.Sleep(w)
					}
					next = next.Add(interval)
				}
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					errs[i] = err
					return
				}
				err = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, linger)
				if err == nil {
					err = unix.Connect(fd, to)
				}
				unix.Close(fd)
				if err != nil {
					errs[i] = err
					return
				}
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	unix.Shutdown(ln, unix.SHUT_RDWR) // wakes the acceptors
	accepting.Wait()
	return total.Load(), errors.Join(errs...)
}

// Loadgen is a running child load generator.
type Loadgen struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	done  chan struct{}
	err   *lockedBuffer
}

// StartLoad starts `self loadgen <json>` in cgroupDir (if not ""): the
// benchmark binary itself, whose main hands that subcommand to RunLoad.
func StartLoad(self string, cfg LoadConfig, cgroupDir string) (*Loadgen, error) {
	job, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	argv := []string{self, "loadgen", string(job)}
	if cfg.CPU != nil {
		argv = append(pinned(*cfg.CPU), argv...)
	}
	l := &Loadgen{cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{}), err: &lockedBuffer{}}
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if cgroupDir != "" {
		f, err := os.Open(cgroupDir)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		l.cmd.SysProcAttr.UseCgroupFD = true
		l.cmd.SysProcAttr.CgroupFD = int(f.Fd())
	}
	if l.stdin, err = l.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := l.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	l.out = bufio.NewReader(stdout)
	l.cmd.Stderr = l.err
	if err := l.cmd.Start(); err != nil {
		return nil, err
	}
	return l, nil
}

// Result waits for the result line (in hold mode: until every connection
// is open, and the process goes on holding them).
func (l *Loadgen) Result(ctx context.Context) (LoadResult, error) {
	type line struct {
		s   string
		err error
	}
	ch := make(chan line, 1)
	go func() {
		s, err := l.out.ReadString('\n')
		ch <- line{s, err}
	}()
	var r LoadResult
	select {
	case ln := <-ch:
		if ln.err != nil {
			return r, fmt.Errorf("load generator: %v: %s", ln.err, strings.TrimSpace(l.err.String()))
		}
		if err := json.Unmarshal([]byte(ln.s), &r); err != nil {
			return r, fmt.Errorf("load generator said %q: %w", ln.s, err)
		}
		if r.Error != "" {
			return r, fmt.Errorf("load generator: %s", r.Error)
		}
		return r, nil
	case <-ctx.Done():
		return r, ctx.Err()
	}
}

// Close lets a holding generator close its connections, and waits for
// the process.
func (l *Loadgen) Close() error {
	l.stdin.Close()
	err := l.cmd.Wait()
	if err != nil {
		return fmt.Errorf("load generator: %v: %s", err, strings.TrimSpace(l.err.String()))
	}
	return nil
}
