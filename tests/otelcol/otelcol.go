// Package otelcol runs a real OpenTelemetry Collector for lattrace's tests.
//
// The collector is the minimal distribution in ./collector (its own Go module: OTLP receiver on
// gRPC and HTTP, debug exporter, contrib file exporter). build.sh builds it once into a cache keyed
// by the module's content; Start builds it (once per test process), starts one collector per call
// on free loopback ports and stops it when the test ends. Everything the collector received is
// written by the file exporter as OTLP JSON lines, which Spans and Metrics parse.
//
//	c := otelcol.Start(t)
//	exp, _ := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(c.GRPCEndpoint()), otlptracegrpc.WithInsecure())
//	...
//	span := c.WaitForSpan(t, "connect", 10*time.Second)
//
// Environment:
//
//	LATTRACE_OTELCOL_BIN=/path   use this collector binary instead of running build.sh
package otelcol

import (
	_ "embed"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/buildonce"
)

//go:embed config.yaml
var configYAML []byte

var binary = buildonce.New("otelcol", "build.sh", "LATTRACE_OTELCOL_BIN")

// Binary returns the path of the collector binary, building it with build.sh on first use
// (once per process). LATTRACE_OTELCOL_BIN overrides it.
func Binary() (string, error) { return binary.Path() }

// Collector is one running (or stopped) collector process.
type Collector struct {
	tb       testing.TB
	bin      string
	dir      string
	config   string
	logPath  string
	grpcPort int
	httpPort int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start builds (once per process) and starts a collector on free loopback ports, waits until both
// OTLP ports accept connections, and registers t.Cleanup to stop it.
func Start(tb testing.TB) *Collector {
	tb.Helper()
	c, err := prepare(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	c.tb = tb
	tb.Cleanup(func() {
		c.Stop()
		if tb.Failed() {
			tb.Logf("otelcol log (%s):\n%s", c.logPath, c.Log())
		}
	})
	if err := c.start(); err != nil {
		tb.Fatal(err)
	}
	return c
}

// StartIn is Start for programs that are not tests (make bench): the
// collector writes into dir, and the caller stops it. Restart needs Start.
func StartIn(dir string) (*Collector, error) {
	c, err := prepare(dir)
	if err != nil {
		return nil, err
	}
	if err := c.start(); err != nil {
		return nil, err
	}
	return c, nil
}

// prepare builds the collector (once per process) and writes its config
// into dir, with free loopback ports.
func prepare(dir string) (*Collector, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	c := &Collector{
		bin:     bin,
		dir:     dir,
		config:  filepath.Join(dir, "config.yaml"),
		logPath: filepath.Join(dir, "collector.log"),
	}
	if err := os.WriteFile(c.config, configYAML, 0o644); err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	c.grpcPort, c.httpPort = ports[0], ports[1]
	return c, nil
}

// GRPCEndpoint is the OTLP/gRPC receiver address, "127.0.0.1:port" (no scheme).
func (c *Collector) GRPCEndpoint() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.grpcPort))
}

// HTTPEndpoint is the OTLP/HTTP receiver address, "127.0.0.1:port" (no scheme); POST to
// http://<HTTPEndpoint>/v1/traces, /v1/metrics, /v1/logs.
func (c *Collector) HTTPEndpoint() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.httpPort))
}

// TracesFile, MetricsFile and LogsFile are the file exporter's OTLP JSON lines outputs.
func (c *Collector) TracesFile() string  { return filepath.Join(c.dir, "traces.jsonl") }
func (c *Collector) MetricsFile() string { return filepath.Join(c.dir, "metrics.jsonl") }
func (c *Collector) LogsFile() string    { return filepath.Join(c.dir, "logs.jsonl") }

// Log returns the collector's stdout+stderr so far (all runs, including restarts).
func (c *Collector) Log() string {
	b, _ := os.ReadFile(c.logPath)
	return string(b)
}

// Running reports whether the collector process is up.
func (c *Collector) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runningLocked()
}

func (c *Collector) runningLocked() bool {
	if c.cmd == nil {
		return false
	}
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

func (c *Collector) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runningLocked() {
		return nil
	}
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.bin, "--config", "file:"+c.config)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(),
		"OTELCOL_GRPC_PORT="+strconv.Itoa(c.grpcPort),
		"OTELCOL_HTTP_PORT="+strconv.Itoa(c.httpPort),
		"OTELCOL_TRACES_FILE="+c.TracesFile(),
		"OTELCOL_METRICS_FILE="+c.MetricsFile(),
		"OTELCOL_LOGS_FILE="+c.LogsFile(),
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that a test's Ctrl-C handling never reaches it first; Pdeathsig so
	// that it dies with the test binary even when Cleanup never runs (e.g. go test -timeout panic).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("otelcol: start %s: %w", c.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	c.cmd, c.done = cmd, done

	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range []string{c.GRPCEndpoint(), c.HTTPEndpoint()} {
		for {
			conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				conn.Close()
				break
			}
			select {
			case <-done:
				return fmt.Errorf("otelcol: collector exited before listening on %s (%v):\n%s", addr, cmd.ProcessState, c.Log())
			default:
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("otelcol: collector not listening on %s after 30s:\n%s", addr, c.Log())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// Stop shuts the collector down gracefully (SIGTERM: the file exporter flushes), killing it after
// 10 s. It is safe to call more than once and on a stopped collector.
func (c *Collector) Stop() { c.stop(syscall.SIGTERM) }

// Kill kills the collector with SIGKILL (a crash: whatever it has not flushed is lost).
func (c *Collector) Kill() { c.stop(syscall.SIGKILL) }

// Signal sends sig to the running collector: SIGSTOP makes a backend that
// accepts connections and never answers, SIGCONT ends that.
func (c *Collector) Signal(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.runningLocked() {
		return fmt.Errorf("otelcol: not running")
	}
	return c.cmd.Process.Signal(sig)
}

func (c *Collector) stop(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.runningLocked() {
		return
	}
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// Restart stops the collector (if running) and starts it again on the same ports and output files
// (the file exporter appends, so Spans/Metrics still return what was received before). Use it, or
// Stop followed later by Restart, to test an exporter's retry behaviour.
func (c *Collector) Restart() {
	c.tb.Helper()
	c.Stop()
	if err := c.start(); err != nil {
		c.tb.Fatal(err)
	}
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
