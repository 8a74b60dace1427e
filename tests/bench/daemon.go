package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Daemon is a `lattrace daemon` process started by the benchmark.
type Daemon struct {
	cmd     *exec.Cmd
	metrics string // host:port of /metrics
	pinPath string
	bin     string
	log     *lockedBuffer
	done    chan struct{}
}

// DaemonConfig says how to start one.
type DaemonConfig struct {
	Bin string // the lattrace binary
	Dir string // for its socket and output file
	// JSONL writes every record to Dir/out.jsonl; else --output none (the
	// chart's default).
	JSONL bool
	// OTLP is a collector's gRPC endpoint ("" = no OTLP).
	OTLP string
	// PinPath pins maps and links there (the chart's default); "" = none.
	PinPath string
	// Cgroup traces only sockets of that cgroup v2 directory.
	Cgroup string
	// Drain is --drain-interval (0 = the default).
	Drain time.Duration
	// RingMiB is --ring-buffer-mib (0 = the default).
	RingMiB int
	// CPUProfile is --cpu-profile ("" = none).
	CPUProfile string
	// Args are more flags, after those above.
	Args []string
	// Procs, if set, is a cgroup.procs file (a memory cgroup's, v1 or v2)
	// the daemon is moved into before it runs, so that everything it
	// allocates, its BPF maps too, is charged there.
	Procs string
	// Env is added to the daemon's environment.
	Env []string
}

// StartDaemon starts the daemon and waits until /healthz answers.
func StartDaemon(c DaemonConfig) (*Daemon, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"daemon", "--metrics-addr", addr, "--api-socket", filepath.Join(c.Dir, "api.sock"), "--log-level", "warn"}
	if c.JSONL {
		args = append(args, "--output", "jsonl", "--output-file", filepath.Join(c.Dir, "out.jsonl"))
	} else {
		args = append(args, "--output", "none")
	}
	if c.OTLP != "" {
		args = append(args, "--otlp-endpoint", c.OTLP, "--otlp-insecure")
	}
	if c.PinPath != "" {
		args = append(args, "--pin-path", c.PinPath)
	}
	if c.Cgroup != "" {
		args = append(args, "--cgroup", c.Cgroup)
	}
	if c.Drain > 0 {
		args = append(args, "--drain-interval", c.Drain.String())
	}
	if c.RingMiB > 0 {
		args = append(args, "--ring-buffer-mib", strconv.Itoa(c.RingMiB))
	}
	if c.CPUProfile != "" {
		args = append(args, "--cpu-profile", c.CPUProfile)
	}
	args = append(args, c.Args...)
	d := &Daemon{metrics: addr, pinPath: c.PinPath, bin: c.Bin, log: &lockedBuffer{}, done: make(chan struct{})}
	if c.Procs != "" {
		// The shell moves itself, then becomes the daemon: nothing of the
		// daemon's runs outside the cgroup.
		args = append([]string{"-c", `echo $$ > "$0" && exec "$@"`, c.Procs, c.Bin}, args...)
		d.cmd = exec.Command("/bin/sh", args...)
	} else {
		d.cmd = exec.Command(c.Bin, args...)
	}
	d.cmd.Env = append(os.Environ(), c.Env...)
	d.cmd.Stdout, d.cmd.Stderr = io.Discard, d.log
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-d.done:
			return nil, fmt.Errorf("lattrace daemon exited before it was ready: %s", strings.TrimSpace(d.log.String()))
		default:
		}
		if r, err := http.Get("http://" + addr + "/healthz"); err == nil {
			r.Body.Close()
			if r.StatusCode == http.StatusOK {
				return d, nil
			}
		}
		if time.Now().After(deadline) {
			_ = d.Stop()
			return nil, fmt.Errorf("lattrace daemon not ready after 20 s: %s", d.log.String())
		}
	}
}

// Pid of the daemon process.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Log is what the daemon wrote on stderr.
func (d *Daemon) Log() string { return d.log.String() }

// Alive says whether the process still runs.
func (d *Daemon) Alive() bool {
	select {
	case <-d.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the daemon (SIGSTOP and SIGCONT starve it).
func (d *Daemon) Signal(sig syscall.Signal) error { return d.cmd.Process.Signal(sig) }

// Stop ends the daemon with SIGTERM (SIGKILL after 10 s) and removes its
// pins, so the next configuration starts from nothing.
func (d *Daemon) Stop() error {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
	if d.pinPath != "" {
		out, err := exec.Command(d.bin, "daemon", "--cleanup", "--pin-path", d.pinPath).CombinedOutput()
		if err != nil {
			return fmt.Errorf("lattrace daemon --cleanup: %v: %s", err, out)
		}
	}
	return nil
}

// Metrics scrapes the daemon's /metrics into name -> value, summing the
// series of each name (labels do not matter to the benchmark).
func (d *Daemon) Metrics() (map[string]float64, error) {
	r, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return nil, err
	}
	defer r.Body.Close()
	return parseMetrics(r.Body)
}

// parseMetrics reads the Prometheus text format, summing each name's
// series; a series with labels is also there on its own, as
// name{label="value",...} with the labels in the page's order.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var v float64
			key := name
			switch {
			case m.Counter != nil:
				v = m.Counter.GetValue()
			case m.Gauge != nil:
				v = m.Gauge.GetValue()
			case m.Untyped != nil:
				v = m.Untyped.GetValue()
			case m.Histogram != nil:
				key, v = name+"_count", float64(m.Histogram.GetSampleCount())
			default:
				continue
			}
			out[key] += v
			if lp := m.GetLabel(); len(lp) > 0 {
				var ls []string
				for _, l := range lp {
					ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				out[key+"{"+strings.Join(ls, ",")+"}"] += v
			}
		}
	}
	return out, nil
}

// ProcStat is a process's CPU time and memory, from /proc.
type ProcStat struct {
	CPU    time.Duration // user + system
	RSS    uint64        // bytes now
	RSSMax uint64        // bytes, the peak since start (VmHWM)
	// Anon is the resident memory that is the process's own (heap,
	// stacks): RSS less the pages of files it maps, its binary's code
	// and read-only data above all, which the page cache shares.
	Anon uint64
}

// ReadProc reads pid's /proc/<pid>/stat and status.
func ReadProc(pid int) (ProcStat, error) {
	var s ProcStat
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// The comm field may hold spaces: fields count from after its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return s, errors.New("bad /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return s, errors.New("short /proc stat")
	}
	utime, _ := strconv.ParseUint(f[11], 10, 64)
	stime, _ := strconv.ParseUint(f[12], 10, 64)
	// USER_HZ is 100 on every Linux ABI Go supports.
	s.CPU = time.Duration(utime+stime) * 10 * time.Millisecond
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, l := range strings.Split(string(st), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			s.RSS = kb << 10
		case "VmHWM":
			s.RSSMax = kb << 10
		case "RssAnon":
			s.Anon = kb << 10
		}
	}
	return s, nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// lockedBuffer collects a child's output from its copying goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// getBody returns the body of a GET (any status).
func getBody(url string) (string, error) {
	r, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	return string(b), err
}
