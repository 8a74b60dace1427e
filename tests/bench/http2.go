package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// http2Server is nghttpd serving a 100-byte file in clear (h2c) on
// loopback, for the HTTP/2 phase of MeasureHooks.
type http2Server struct {
	cmd  *exec.Cmd
	addr string
	dir  string
}

// startHTTP2 starts nghttpd on the loop's CPU.
func startHTTP2(ctx context.Context) (*http2Server, error) {
	dir, err := os.MkdirTemp("", "lattrace-bench-h2")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "100.bin"), []byte(strings.Repeat("x", 100)), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	argv := append(pinned(1), "nghttpd", "--no-tls", "-d", dir, "-a", "127.0.0.1", strconv.Itoa(port))
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("nghttpd: %w", err)
	}
	s := &http2Server{cmd: cmd, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := net.Dial("tcp", s.addr)
		if err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.close()
			return nil, fmt.Errorf("nghttpd does not accept on %s: %w", s.addr, err)
		}
	}
}

func (s *http2Server) close() {
	syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
	s.cmd.Wait()
	os.RemoveAll(s.dir)
}

// h2loadRequests is the count of h2load's completed requests.
var h2loadRequests = regexp.MustCompile(`requests: \d+ total, \d+ started, (\d+) done`)

// calls runs h2load for d on one connection, one stream at a time, on the
// loop's CPU, and returns the calls it completed: each is one exchange at
// each end.
func (s *http2Server) calls(ctx context.Context, d time.Duration) (uint64, error) {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	argv := append(pinned(1), "h2load", "-c", "1", "-m", "1", "-D", strconv.Itoa(secs), "http://"+s.addr+"/100.bin")
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("h2load: %w: %s", err, out)
	}
	m := h2loadRequests.FindSubmatch(out)
	if m == nil {
		return 0, errors.New("h2load: no request count in its output")
	}
	n, _ := strconv.ParseUint(string(m[1]), 10, 64)
	if n == 0 {
		return 0, errors.New("h2load: no request completed")
	}
	return n, nil
}
