// Package e2e runs the lattrace binary as a person would: built from this
// tree, started as a process, fed real traffic, stopped with a signal, and
// judged by its output, exit status and error lines.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/bench"
)

var lattrace string // path of the binary under test

func TestMain(m *testing.M) {
	// The overflow test's load generator is this binary, started again.
	bench.LoadgenMain()
	// So is what the access tests try as another user or from another
	// network namespace.
	if len(os.Args) >= 2 && os.Args[1] == "probe" {
		probe(os.Args[2:])
		return
	}
	bench.RunWithLattrace(m, "lattrace-e2e-", &lattrace)
}

// run starts lattrace with args and returns its exit status and output.
func run(t *testing.T, prefix []string, args ...string) (int, string, string) {
	t.Helper()
	return runEnv(t, nil, prefix, args...)
}

// runEnv is run with variables added to the environment.
func runEnv(t *testing.T, env []string, prefix []string, args ...string) (int, string, string) {
	t.Helper()
	argv := append(append([]string{}, prefix...), append([]string{lattrace}, args...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String()
}

// oneLine asserts that a failure was reported as exactly one line, starting
// with "lattrace: " and containing want, and never as a panic or usage dump.
func oneLine(t *testing.T, stderr, want string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "lattrace: ") || !strings.Contains(lines[0], want) {
		t.Errorf("want one line with %q, got:\n%s", want, stderr)
	}
}

func TestVersion(t *testing.T) {
	code, out, _ := run(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "lattrace ") {
		t.Errorf("version: exit %d, %q", code, out)
	}
}

func TestBadInputIsOneLine(t *testing.T) {
	for _, c := range []struct {
		name   string
		prefix []string
		args   []string
		code   int
		want   string
	}{
		{"unknown output", nil, []string{"daemon", "--output", "xml"}, 2, `unknown output "xml"`},
		{"unknown flag", nil, []string{"daemon", "--no-such-flag"}, 2, "unknown flag"},
		{"bad log level", nil, []string{"--log-level", "loud", "version"}, 2, "--log-level"},
		{"bad OTLP protocol", nil, []string{"daemon", "--otlp-endpoint", "127.0.0.1:1", "--otlp-protocol", "udp"}, 2, "--otlp-protocol"},
		{"no peer pairs", nil, []string{"daemon", "--metrics-max-peer-pairs", "0"}, 2, "--metrics-max-peer-pairs"},
		{"negative max procs", nil, []string{"daemon", "--max-procs", "-2"}, 2, "--max-procs -2"},
		{"unknown command", nil, []string{"bogus"}, 2, `unknown command "bogus"`},
		{"stray argument", nil, []string{"daemon", "extra"}, 2, "extra"},
		{"drain interval", nil, []string{"daemon", "--drain-interval", "1ns"}, 2, "outside 1ms..10s"},
		{"file without output", nil, []string{"daemon", "--output", "none", "--output-file", "/tmp/x"}, 2, "--output none"},
		{"no kernel BTF file", nil, []string{"daemon", "--kernel-btf", "/nonexistent/vmlinux"}, 1, "reading kernel BTF"},
		{"no cgroup", nil, []string{"daemon", "--cgroup", "/nonexistent"}, 2, "cgroup /nonexistent"},
		{"not a cgroup", nil, []string{"daemon", "--cgroup", "/tmp"}, 2, "not in a cgroup v2 hierarchy"},
		{"profile nowhere", nil, []string{"daemon", "--output", "none", "--cpu-profile", "/nonexistent/cpu.pprof"}, 1, "--cpu-profile: open /nonexistent/cpu.pprof"},
		// setpriv drops root: the daemon must say which capabilities it needs.
		{"unprivileged", asNobody, []string{"daemon"}, 1, "permission denied: lattrace needs root"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := run(t, c.prefix, c.args...)
			if code != c.code {
				t.Errorf("exit status %d, want %d", code, c.code)
			}
			oneLine(t, stderr, c.want)
		})
	}
}

// TestCPUProfile: --cpu-profile leaves a CPU profile of the daemon that
// go tool pprof reads, written as a SIGTERM stops it (make pgo builds the
// binary's profile-guided optimisation from one).
func TestCPUProfile(t *testing.T) {
	prof := filepath.Join(t.TempDir(), "cpu.pprof")
	cmd, log := startDaemon(t, "daemon", "--output", "none", "--metrics-addr", "", "--cpu-profile", prof)
	loopbackSends(t, 100)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemon: %v\n%s", err, log.String())
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", lattrace, prof).CombinedOutput()
	if err != nil || !regexp.MustCompile(`(?m)^Type: cpu$`).Match(out) || !regexp.MustCompile(`(?m)^Duration: `).Match(out) {
		t.Errorf("go tool pprof on the profile: %v\n%s", err, out)
	}
}

// A configuration file with a mistake is one line naming the file, the
// line and the key; a good one is taken, and a flag overrides it.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("output: none\ncolour: red\n"), 0o600)
	code, _, stderr := run(t, nil, "daemon", "--config", bad)
	if code != 2 {
		t.Errorf("exit %d", code)
	}
	oneLine(t, stderr, bad+`:2: unknown key "colour"`)
	rng := filepath.Join(dir, "range.yaml")
	os.WriteFile(rng, []byte("drain_interval: 1ns\n"), 0o600)
	code, _, stderr = run(t, nil, "daemon", "--config", rng)
	if code != 2 {
		t.Errorf("exit %d", code)
	}
	oneLine(t, stderr, "drain interval 1ns outside 1ms..10s")

	good := filepath.Join(dir, "good.yaml")
	out := filepath.Join(dir, "records.jsonl")
	os.WriteFile(good, []byte("output: none\nmetrics_addr: ''\nlog_level: warn\n"), 0o600)
	cmd, log := startDaemonQuiet(t, "daemon", "--config", good, "--output", "jsonl", "--output-file", out)
	loopbackSends(t, 3)
	cmd.Process.Signal(syscall.SIGINT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemon: %v\n%s", err, log.String())
	}
	if b, _ := os.ReadFile(out); !strings.Contains(string(b), `"type":"exchange"`) {
		t.Errorf("--output on the command line did not override the file's none: %q", b)
	}
	if strings.Contains(log.String(), "level=INFO") {
		t.Errorf("log_level: warn from the file was not applied:\n%s", log.String())
	}
}

// TestDaemonWritesJSONLines runs the daemon, makes a loopback connection with
// a known number of sends, stops the daemon right after the close and checks
// the record was written before it exited: nothing in flight is lost.
func TestDaemonWritesJSONLines(t *testing.T) {
	out := filepath.Join(t.TempDir(), "records.jsonl")
	cmd, log := startDaemon(t, "daemon", "--output", "jsonl", "--output-file", out, "--metrics-addr", "127.0.0.1:0")

	const sends = 25
	local := loopbackSends(t, sends)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("daemon exit: %v\n%s", err, log.String())
	}

	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	found, exchanges := false, 0
	for {
		var rec struct {
			Type string `json:"type"`
			Flow struct {
				Local string `json:"local"`
			} `json:"flow"`
			Role      string `json:"role"`
			SendCalls uint64 `json:"send_calls"`
			BytesSent uint64 `json:"bytes_sent"`
			Owner     struct {
				PID int `json:"pid"`
			} `json:"owner"`
			BytesOut   uint64 `json:"bytes_out"`
			DurationNs int64  `json:"duration_ns"`
		}
		if err := dec.Decode(&rec); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("output is not JSON lines: %v", err)
		}
		if rec.Flow.Local != local {
			continue
		}
		if rec.Type == "exchange" {
			// 25 writes and no reply: one exchange, a one-way message.
			exchanges++
			if rec.Role != "requester" || rec.BytesOut != sends*10 || rec.DurationNs <= 0 {
				t.Errorf("exchange record %+v, want one requester message of %d bytes", rec, sends*10)
			}
			continue
		}
		if rec.Type != "conn_close" {
			continue
		}
		found = true
		if rec.SendCalls != sends || rec.BytesSent != sends*10 || rec.Role != "client" || rec.Owner.PID != os.Getpid() {
			t.Errorf("record %+v, want %d sends of 10 bytes by pid %d as client", rec, sends, os.Getpid())
		}
	}
	if !found {
		t.Errorf("no conn_close record for %s in the output", local)
	}
	if exchanges != 1 {
		t.Errorf("%d exchange records for %s, want 1", exchanges, local)
	}
}

// loopbackSends connects to a local server, makes n writes of 10 bytes,
// closes, and returns the client's local address.
func loopbackSends(t *testing.T, n int) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		b, _ := io.ReadAll(c)
		c.Close()
		got <- len(b)
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := c.Write([]byte("0123456789")); err != nil {
			t.Fatal(err)
		}
	}
	local := c.LocalAddr().String()
	c.Close()
	if b := <-got; b != n*10 {
		t.Fatalf("server read %d bytes", b)
	}
	return local
}

// startDaemon runs lattrace with args and waits until it traces, with every
// hook attached; the returned buffer collects its log.
func startDaemon(t *testing.T, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	return startNode(t, "node-e2e", args...)
}

// startNode is startDaemon as the daemon of node (its NODE_NAME).
func startNode(t *testing.T, node string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	if !slices.Contains(args, "--api-socket") {
		// Not the node's default socket: a daemon running on this machine
		// must not make the test fail, nor the test disturb it.
		args = append(args, "--api-socket", filepath.Join(t.TempDir(), "api.sock"))
	}
	cmd := exec.Command(lattrace, args...)
	cmd.Env = append(os.Environ(), "NODE_NAME="+node)
	return startTracing(t, cmd, cmd.Start)
}

// startTracing starts cmd, a daemon, through start (which may start it
// elsewhere, e.g. in a network namespace) and waits until it traces, with
// every hook attached; the returned buffer collects its log.
func startTracing(t *testing.T, cmd *exec.Cmd, start func() error) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	args := cmd.Args[1:]
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	ready := make(chan string, 1)
	log := &syncBuffer{}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "msg=tracing") {
				ready <- sc.Text()
			}
		}
		close(ready)
	}()
	select {
	case line, ok := <-ready:
		if !ok {
			t.Fatalf("daemon exited before tracing:\n%s", log.String())
		}
		checkAttached(t, log.String())
		// The runtime's own count: one CPU unless the test asked for more.
		if !slices.Contains(args, "--max-procs") && !strings.Contains(line, " max_procs=1") {
			t.Errorf("the daemon runs its Go code on more than one CPU by default: %s", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not start tracing within 10s")
	}
	return cmd, log
}

// syncBuffer is a bytes.Buffer safe for the log reader and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) WriteString(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.WriteString(v)
}

// Write makes it an io.Writer, for a process's stderr.
func (s *syncBuffer) Write(p []byte) (int, error) {
	s.WriteString(string(p))
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startDaemonQuiet runs a daemon whose log may say nothing at start (a
// higher log level) and waits until its API socket answers.
func startDaemonQuiet(t *testing.T, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	cmd := exec.Command(lattrace, append(args, "--api-socket", sock)...)
	log := &syncBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return cmd, log
		}
	}
	t.Fatalf("daemon's API did not answer within 10s:\n%s", log.String())
	return nil, nil
}

// checkAttached wants every hook attached, as the daemon's log says, each
// through its first alternative or one standing in for it. Where the
// kernel refuses the iterators over socket storage, the TCP iterator
// stands in, and the log must say so and what it sees less.
func checkAttached(t *testing.T, log string) {
	t.Helper()
	m := regexp.MustCompile(`hooks_attached=(\d+) hooks_total=(\d+)`).FindStringSubmatch(log)
	if m == nil {
		t.Errorf("the daemon did not say how many hooks it attached:\n%s", log)
		return
	}
	attached, _ := strconv.Atoi(m[1])
	total, _ := strconv.Atoi(m[2])
	if strings.Contains(log, "(lattrace_inflight_tcp)") {
		t.Logf("this kernel refuses iterators over socket storage: the TCP iterator stands in")
		if !strings.Contains(log, "sees less") {
			t.Errorf("the TCP iterator stands in for the one over socket storage, and the log does not say what it sees less:\n%s", log)
		}
	}
	if total == 0 || attached != total {
		t.Errorf("%d of %d hooks attached, want all on this kernel:\n%s", attached, total, log)
	}
}
