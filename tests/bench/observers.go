package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Scope is where a workload's traffic flows, for the tools that must be
// pointed at it: tcpdump's interface and the namespace ss polls.
// lattrace and the BPF tools watch every namespace of the node.
type Scope struct {
	Netns string // named network namespace ("" = the host's)
	Iface string // the interface the traffic crosses ("lo" on loopback)
}

// Env is what the observers need from the benchmark.
type Env struct {
	Lattrace string // the lattrace binary
	Dir      string // scratch space, emptied between runs
	OTLP     string // a Collector's gRPC endpoint for lattrace's spans and metrics
}

// Observer is something watching the node's TCP while a workload runs:
// nothing, lattrace, or one of the tools a user would otherwise run.
type Observer struct {
	Name string
	// What says in a few words what it does, for the report.
	What string
	// Start starts it and returns once it observes; stop ends it and says
	// what it saw (a line of evidence that it did observe).
	Start func(ctx context.Context, env *Env, sc Scope) (stop func() (string, error), err error)
}

// Baseline is the observer that watches nothing: every cost is a ratio to
// its rate in the runs right beside the observer's (see Measure).
const Baseline = "untraced"

// Observers are the configurations every workload is measured under, the
// baseline first.
func Observers() []Observer {
	return []Observer{
		{Name: Baseline, What: "nothing watches", Start: startNothing},
		{Name: "lattrace", What: "lattrace daemon as the chart deploys it (API, /metrics, pinned maps) plus OTLP spans and metrics to a local Collector",
			Start: startLattrace(false)},
		{Name: "lattrace+jsonl", What: "the same, also writing every record as a JSON line to a file",
			Start: startLattrace(true)},
		{Name: "tcpdump -s 96", What: "tcpdump capturing 96 bytes of every packet to a file, as latency studies capture", Start: startTcpdump},
		{Name: "ss -ti 10 Hz", What: "ss -tin polled ten times a second, as latency studies poll socket statistics", Start: startSS},
		{Name: "bpftrace srtt", What: "bpftrace: a histogram of srtt from tracepoint:tcp:tcp_probe", Start: startBpftrace},
		{Name: "tcplife", What: "libbpf-tools tcplife (connection lifetimes)", Start: startTool("tcplife")},
		{Name: "tcpstates", What: "libbpf-tools tcpstates (state changes)", Start: startTool("tcpstates")},
	}
}

func startNothing(context.Context, *Env, Scope) (func() (string, error), error) {
	return func() (string, error) { return "", nil }, nil
}

// BenchPinPath is where the benchmark's daemons pin, apart from a node's
// own /sys/fs/bpf/lattrace.
const BenchPinPath = "/sys/fs/bpf/lattrace-bench"

// LattraceNoLinks is lattrace without the evidence of request trees
// (bpf/request_links.bpf.h, --request-links=false), measured in the hook
// phase only: beside lattrace's programs, what the evidence costs them.
var LattraceNoLinks = Observer{Name: "lattrace -request-links",
	What:  "lattrace as above without its request evidence (--request-links=false): beside it, what the evidence costs (hook phase only)",
	Start: startLattrace(false, "--request-links=false")}

func startLattrace(jsonl bool, args ...string) func(context.Context, *Env, Scope) (func() (string, error), error) {
	return func(ctx context.Context, env *Env, _ Scope) (func() (string, error), error) {
		d, err := StartDaemon(DaemonConfig{Bin: env.Lattrace, Dir: env.Dir, JSONL: jsonl, OTLP: env.OTLP, PinPath: BenchPinPath, Args: args})
		if err != nil {
			return nil, err
		}
		return func() (string, error) {
			m, err := d.Metrics()
			stopErr := d.Stop()
			if err != nil {
				return "", errors.Join(err, stopErr)
			}
			if lost := m["lattrace_ringbuf_full_total"]; lost > 0 {
				return "", fmt.Errorf("lattrace lost %.0f records to a full ring buffer", lost)
			}
			return fmt.Sprintf("%.0f records decoded, %.0f exchanges", m["lattrace_records_decoded_total"],
				m["lattrace_exchange_duration_seconds_count"]), stopErr
		}, nil
	}
}

// inNetns prefixes argv with ip netns exec when sc names a namespace.
func inNetns(sc Scope, argv ...string) []string {
	if sc.Netns == "" {
		return argv
	}
	return append([]string{"ip", "netns", "exec", sc.Netns}, argv...)
}

func startTcpdump(ctx context.Context, env *Env, sc Scope) (func() (string, error), error) {
	file := filepath.Join(env.Dir, "capture.pcap")
	// -Z root: stay root, so the file in a root-owned directory can be
	// written; -U off: buffered writes, as a user would capture.
	p, err := startWaiting(inNetns(sc, "tcpdump", "-i", sc.Iface, "-s", "96", "-Z", "root", "-w", file, "tcp"), "listening on")
	if err != nil {
		return nil, err
	}
	return func() (string, error) {
		out, err := p.stop(syscall.SIGINT)
		fi, statErr := os.Stat(file)
		os.Remove(file)
		if statErr != nil {
			return "", errors.Join(err, statErr)
		}
		return fmt.Sprintf("%d bytes captured; %s", fi.Size(), lastLine(out, "packets captured")), err
	}, nil
}

func startSS(ctx context.Context, env *Env, sc Scope) (func() (string, error), error) {
	ctx, cancel := context.WithCancel(ctx)
	var polls, bytes int
	var pollErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			args := []string{"-tin"}
			if sc.Netns != "" {
				args = append(args, "-N", sc.Netns)
			}
			out, err := exec.Command("ss", args...).Output()
			if err != nil {
				pollErr = fmt.Errorf("ss: %w", err)
				return
			}
			polls++
			bytes += len(out)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() (string, error) {
		cancel()
		<-done
		return fmt.Sprintf("%d polls, %d bytes of socket statistics", polls, bytes), pollErr
	}, nil
}

// bpftraceScript histograms the smoothed RTT of every incoming segment:
// the usual one-liner for "what is the RTT", on the tracepoint this
// kernel allows (no kprobes).
const bpftraceScript = `tracepoint:tcp:tcp_probe { @srtt_us = hist(args->srtt >> 3); }`

func startBpftrace(ctx context.Context, env *Env, sc Scope) (func() (string, error), error) {
	p, err := startWaiting([]string{"bpftrace", "-e", bpftraceScript}, "Attaching")
	if err != nil {
		return nil, err
	}
	return func() (string, error) {
		out, err := p.stop(syscall.SIGINT)
		if !strings.Contains(out, "@srtt_us") {
			return "", errors.Join(err, fmt.Errorf("bpftrace printed no histogram: %s", out))
		}
		return fmt.Sprintf("histogram of %d lines", strings.Count(out, "\n")), err
	}, nil
}

// startTool runs one of libbpf-tools' programs, ready once it printed its
// header (after it attached).
func startTool(name string) func(context.Context, *Env, Scope) (func() (string, error), error) {
	return func(ctx context.Context, env *Env, sc Scope) (func() (string, error), error) {
		p, err := startWaiting([]string{name}, "PID")
		if err != nil {
			return nil, err
		}
		return func() (string, error) {
			out, err := p.stop(syscall.SIGINT)
			return fmt.Sprintf("%d lines", strings.Count(out, "\n")), err
		}, nil
	}
}

// proc is a tool started in the background with its output collected.
type proc struct {
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

// startWaiting starts argv and waits (at most 30 s) until its output
// holds ready.
// Its output is line-buffered (stdbuf): tools that print through stdio
// would otherwise hold their ready line in a pipe's buffer.
func startWaiting(argv []string, ready string) (*proc, error) {
	name := argv[0]
	if name == "ip" && len(argv) > 4 { // ip netns exec NS tool
		name = argv[4]
	}
	argv = append([]string{"stdbuf", "-oL", "-eL"}, argv...)
	p := &proc{cmd: exec.Command(argv[0], argv[1:]...), out: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	r, w := io.Pipe()
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	seen := make(chan struct{})
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.out.Write(append(sc.Bytes(), '\n'))
			if strings.Contains(sc.Text(), ready) {
				once.Do(func() { close(seen) })
			}
		}
		_, _ = io.Copy(io.Discard, r)
	}()
	go func() { _ = p.cmd.Wait(); w.Close(); close(p.done) }()
	select {
	case <-seen:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before it was ready: %s", name, strings.TrimSpace(p.out.String()))
	case <-time.After(30 * time.Second):
		_, _ = p.stop(syscall.SIGKILL)
		return nil, fmt.Errorf("%s not ready after 30 s: %s", name, p.out.String())
	}
}

// stop signals the process, waits (SIGKILL after 10 s) and returns its
// output. Ending on the signal sent is no error.
func (p *proc) stop(sig syscall.Signal) (string, error) {
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	// Let the output copier finish with what the process wrote last.
	time.Sleep(20 * time.Millisecond)
	if st := p.cmd.ProcessState; st != nil && !endedOn(st, sig) {
		return p.out.String(), fmt.Errorf("%s: %v: %s", p.cmd.Path, st, lastLine(p.out.String(), ""))
	}
	return p.out.String(), nil
}

// endedOn says whether a process ended well or on the signal it was sent.
func endedOn(st *os.ProcessState, sig syscall.Signal) bool {
	if st.Success() {
		return true
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && (ws.Signaled() && ws.Signal() == sig || ws.ExitStatus() == 128+int(sig))
}

// lastLine is the last line of out that contains sub.
func lastLine(out, sub string) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], sub) {
			return strings.TrimSpace(lines[i])
		}
	}
	return ""
}
