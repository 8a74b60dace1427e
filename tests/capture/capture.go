package capture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/netlab"
)

// SnapLen is the bytes kept per packet: all headers (Ethernet 14 + IPv6 40 +
// TCP with full options 60 = 114), no payload worth speaking of.
const SnapLen = 128

// ErrIncomplete is returned (wrapped) by Stop when tcpdump reports packets
// that the kernel dropped before tcpdump could read them: the pcap is usable
// but misses frames, so counts from it are lower bounds.
var ErrIncomplete = errors.New("capture incomplete")

// Timeouts are generous because tcpdump's start is dominated by `ip netns
// exec` and libpcap setup, which can take a while on two busy vCPUs.
const (
	startTimeout = 15 * time.Second
	stopTimeout  = 10 * time.Second
	// settle is waited before SIGINT. On SIGINT libpcap breaks its loop
	// after the packet at hand, and frames still in the ring are lost; with
	// --immediate-mode tcpdump reads a frame within microseconds, so a short
	// pause after the caller's traffic is enough to drain the ring.
	settle = 100 * time.Millisecond
)

// Stats are tcpdump's counters, printed when it exits.
type Stats struct {
	Captured int64 // written to the file
	// ReceivedByFilter is the kernel's count of packets that passed the
	// filter, drops included. On loopback every packet passes twice (out
	// and in) and libpcap discards the outgoing copy, so it is twice
	// Captured there.
	ReceivedByFilter int64
	DroppedByKernel  int64 // ring full: missing from the file
}

// Capture is a running tcpdump.
type Capture struct {
	path   string
	cmd    *exec.Cmd
	stderr *watchBuffer
	done   chan struct{} // closed when tcpdump has exited
	werr   error         // cmd.Wait's result, valid after done

	stopOnce sync.Once
	stats    Stats
	stopErr  error
}

// Start captures on iface in host's namespace (nil host: the current, root
// namespace, e.g. for loopback), with a tcpdump filter expression ("" for
// everything), into a new file in dir. It returns once tcpdump is capturing.
//
// ctx bounds the start; if it is cancelled later, tcpdump is stopped with
// SIGINT so that the file stays readable, and Stop returns the path with an
// error wrapping ctx.Err() (the capture ended early). Callers must call Stop.
func Start(ctx context.Context, host *netlab.Host, iface, filter, dir string) (*Capture, error) {
	return start(ctx, host, iface, filter, dir, SnapLen)
}

// StartWhole is Start keeping whole packets, payload included, for an
// analysis that reads it (tshark's HTTP/2 dissector).
func StartWhole(ctx context.Context, host *netlab.Host, iface, filter, dir string) (*Capture, error) {
	return start(ctx, host, iface, filter, dir, 0)
}

// start captures snap bytes of each packet (0: all).
func start(ctx context.Context, host *netlab.Host, iface, filter, dir string, snap int) (*Capture, error) {
	if _, err := exec.LookPath("tcpdump"); err != nil {
		return nil, fmt.Errorf("capture: tcpdump not found (apt-get install -y tcpdump): %w", err)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	f, err := os.CreateTemp(dir, "capture-"+sanitize(iface)+"-*.pcap")
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	path := f.Name()
	f.Close()

	// -Z root: Debian's tcpdump otherwise switches to user tcpdump before
	// opening the output file; with the file in a root-only test directory
	// that works only by grace of retained capabilities and leaves a file
	// the test cannot predict the owner of.
	// --time-stamp-precision=nano: the kernel stamps in ns; microseconds
	// would quantise every RTT sample.
	args := []string{"-i", iface, "-n", "-s", strconv.Itoa(snap), "-U", "--immediate-mode",
		"-Z", "root", "--time-stamp-precision=nano", "-w", path}
	if filter != "" {
		args = append(args, filter)
	}
	var cmd *exec.Cmd
	if host != nil {
		cmd = host.Command(ctx, "tcpdump", args...)
	} else {
		cmd = exec.CommandContext(ctx, "tcpdump", args...)
	}
	c := &Capture{path: path, cmd: cmd, stderr: newWatchBuffer("listening on"), done: make(chan struct{})}
	cmd.Stderr = c.stderr
	// `ip netns exec` execs tcpdump in place, so the signal reaches tcpdump.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = stopTimeout
	if err := cmd.Start(); err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("capture: starting tcpdump: %w", err)
	}
	go func() {
		c.werr = cmd.Wait()
		// tcpdump prints its counters last, on exit; parsing here makes
		// them visible to anyone who has seen done closed.
		c.stats = parseStats(c.stderr.String())
		close(c.done)
	}()

	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case <-c.stderr.found:
		return c, nil
	case <-c.done:
		os.Remove(path)
		return nil, fmt.Errorf("capture: tcpdump on %s exited before capturing (%v): %s", iface, c.werr, strings.TrimSpace(c.stderr.String()))
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = errors.New("timeout")
	}
	c.kill()
	os.Remove(path)
	return nil, fmt.Errorf("capture: waiting for tcpdump on %s to listen: %w: %s", iface, err, strings.TrimSpace(c.stderr.String()))
}

// StartT is Start for tests: the file goes to t.TempDir(), a failure ends the
// test, and the capture is stopped at cleanup if the test did not.
func StartT(t testing.TB, host *netlab.Host, iface, filter string) *Capture {
	t.Helper()
	return startT(t, host, iface, filter, SnapLen)
}

// StartWholeT is StartT keeping whole packets (StartWhole).
func StartWholeT(t testing.TB, host *netlab.Host, iface, filter string) *Capture {
	t.Helper()
	return startT(t, host, iface, filter, 0)
}

func startT(t testing.TB, host *netlab.Host, iface, filter string, snap int) *Capture {
	t.Helper()
	c, err := start(context.Background(), host, iface, filter, t.TempDir(), snap)
	if err != nil {
		t.Fatal(err)
	}
	// Registered after TempDir's cleanup, so it runs before the directory
	// is removed (cleanups run last-in first-out).
	t.Cleanup(func() { c.Stop() })
	return c
}

// Path is the pcap file; complete only after Stop.
func (c *Capture) Path() string { return c.path }

// Stop ends tcpdump with SIGINT, so that it flushes the file, and returns the
// pcap's path. The error wraps ErrIncomplete if tcpdump reported kernel
// drops (the path is still returned). Stop may be called more than once.
func (c *Capture) Stop() (path string, err error) {
	c.stopOnce.Do(func() {
		select {
		case <-c.done:
			// Exited on its own or through ctx: report what happened.
		default:
			time.Sleep(settle)
			if err := c.cmd.Process.Signal(os.Interrupt); err != nil && !errors.Is(err, os.ErrProcessDone) {
				c.stopErr = fmt.Errorf("capture: signalling tcpdump: %w", err)
			}
			select {
			case <-c.done:
			case <-time.After(stopTimeout):
				c.kill()
				c.stopErr = errors.Join(c.stopErr, fmt.Errorf("capture: tcpdump did not stop on SIGINT within %v", stopTimeout))
			}
		}
		out := c.stderr.String()
		if c.werr != nil && c.stopErr == nil {
			c.stopErr = fmt.Errorf("capture: tcpdump: %w: %s", c.werr, strings.TrimSpace(out))
		}
		if c.stopErr == nil && c.stats.DroppedByKernel > 0 {
			c.stopErr = fmt.Errorf("%w: tcpdump: %d packets dropped by kernel, %d captured", ErrIncomplete, c.stats.DroppedByKernel, c.stats.Captured)
		}
	})
	return c.path, c.stopErr
}

// Stats returns tcpdump's counters; zero until tcpdump has exited (Stop).
func (c *Capture) Stats() Stats {
	select {
	case <-c.done:
		return c.stats
	default:
		return Stats{}
	}
}

func (c *Capture) kill() {
	c.cmd.Process.Kill()
	<-c.done
}

var statsRE = regexp.MustCompile(`(?m)^(\d+) packets? (captured|received by filter|dropped by kernel)`)

func parseStats(stderr string) Stats {
	var s Stats
	for _, m := range statsRE.FindAllStringSubmatch(stderr, -1) {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		switch m[2] {
		case "captured":
			s.Captured = n
		case "received by filter":
			s.ReceivedByFilter = n
		case "dropped by kernel":
			s.DroppedByKernel = n
		}
	}
	return s
}

// sanitize keeps an interface name usable in a file name pattern.
func sanitize(s string) string {
	s = filepath.Base(s)
	return strings.Map(func(r rune) rune {
		if r == '*' || r == '/' || r == filepath.Separator {
			return '_'
		}
		return r
	}, s)
}

// watchBuffer collects a process's stderr and closes found once the output
// contains a marker. exec copies stderr from a goroutine, in chunks that may
// split the marker, hence the search over everything so far.
type watchBuffer struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	marker string
	found  chan struct{}
	seen   bool
}

func newWatchBuffer(marker string) *watchBuffer {
	return &watchBuffer{marker: marker, found: make(chan struct{})}
}

func (w *watchBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.seen && bytes.Contains(w.buf.Bytes(), []byte(w.marker)) {
		w.seen = true
		close(w.found)
	}
	return len(p), nil
}

func (w *watchBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
