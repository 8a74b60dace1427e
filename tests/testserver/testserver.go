// Package testserver runs a server program for a test: started in its own
// process group with its output in a file, ready when a probe says so,
// killed when the test ends, and killable and restartable in the middle
// (a gateway instance that dies mid-run). It reads the process's CPU time
// and peak memory from /proc, for the sizing a test measures.
package testserver

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Process is one server program, running or stopped.
type Process struct {
	name, bin string
	args, env []string
	logPath   string
	ready     func() error

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// cpu and peak keep what the runs before the current one used.
	cpu  time.Duration
	peak int64
}

// Start runs bin with args and env (added to this process's) in dir,
// waits until ready returns nil (30 s at most), and stops it when the test
// ends, logging its output if the test failed.
func Start(tb testing.TB, name, dir, bin string, args, env []string, ready func() error) *Process {
	tb.Helper()
	p := &Process{name: name, bin: bin, args: args, env: env, logPath: filepath.Join(dir, name+".log"), ready: ready}
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			tb.Logf("%s log (%s):\n%s", name, p.logPath, tail(p.Log(), 60))
		}
	})
	if err := p.start(); err != nil {
		tb.Fatal(err)
	}
	return p
}

func (p *Process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Dir = filepath.Dir(p.logPath)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so a test's Ctrl-C reaches it last; it dies
	// with the test binary even when no cleanup runs (a -timeout panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("%s: start %s: %w", p.name, p.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	var last error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case <-done:
			return fmt.Errorf("%s exited before it was ready:\n%s", p.name, tail(p.Log(), 30))
		default:
		}
		if last = p.ready(); last == nil {
			return nil
		}
	}
	return fmt.Errorf("%s not ready after 30 s (%v):\n%s", p.name, last, tail(p.Log(), 30))
}

// Kill ends the process at once (SIGKILL), as a crash or an OOM kill does,
// and waits for it.
func (p *Process) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
	default:
		p.account()
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Restart starts the process again after Kill.
func (p *Process) Restart(tb testing.TB) {
	tb.Helper()
	p.Kill()
	if err := p.start(); err != nil {
		tb.Fatal(err)
	}
}

// account adds the running process's CPU time and peak memory to what
// earlier runs used; with p.mu held, before it ends.
func (p *Process) account() {
	cpu, peak, err := usage(p.cmd.Process.Pid)
	if err == nil {
		p.cpu += cpu
		p.peak = max(p.peak, peak)
	}
}

// Usage is the CPU time the process has used so far (over its restarts)
// and its peak resident memory in bytes.
func (p *Process) Usage() (time.Duration, int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0, 0, errors.New(p.name + " never started")
	}
	select {
	case <-p.done:
		return p.cpu, p.peak, nil
	default:
	}
	cpu, peak, err := usage(p.cmd.Process.Pid)
	return p.cpu + cpu, max(p.peak, peak), err
}

// usage reads a process's user and system time (/proc/PID/stat, in clock
// ticks of 1/100 s on Linux) and its peak RSS (VmHWM).
func usage(pid int) (time.Duration, int64, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The fields after the command name, which may hold spaces.
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	var kb int64
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ = strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, kb << 10, nil
}

// Log returns the process's output so far, over its restarts.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// FreePorts returns n TCP ports free on the loopback address now.
func FreePorts(tb testing.TB, n int) []int {
	tb.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// probe bounds a readiness probe's request: a server that accepts and
// never answers is not ready.
var probe = &http.Client{Timeout: 2 * time.Second}

// HTTPReady is a readiness probe: url answers 200.
func HTTPReady(url string) func() error {
	return func() error {
		resp, err := probe.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	}
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
