package labtrace

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/cgroup"
	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/netlab"
)

// Busy is what the machine did to a lab's run beside the test, from the
// kernel's own accounts, which lattrace does not read: how long some task
// waited for a CPU (pressure stall information) and how many segments the
// lab's hosts sent again (their SNMP counters). On a busy machine (a CPU
// hog beside the suite) applications really are slow to read, think and
// answer, and a peer's ACK held back by a late timer really makes the
// sender retransmit: a finding of either on an unimpaired path is what
// happened, when the machine's accounts cover it, and a false finding
// when they do not.
type Busy struct {
	t       testing.TB
	hosts   []*netlab.Host
	stall   time.Duration // at the start
	retrans int64         // at the start, all hosts
	warned  bool          // that the kernel keeps no CPU pressure account
}

// WatchBusy starts the accounts of a run on the lab's hosts.
func WatchBusy(t testing.TB, hosts ...*netlab.Host) *Busy {
	t.Helper()
	b := &Busy{t: t, hosts: hosts}
	b.stall, b.retrans = b.now()
	return b
}

func (b *Busy) now() (stall time.Duration, retrans int64) {
	b.t.Helper()
	stall, err := cpuStall()
	if err != nil && !b.warned {
		// Debian's kernels count pressure only when booted with psi=1.
		b.t.Logf("no CPU pressure account (%v): findings of slow applications are held as on an idle machine", err)
		b.warned = true
	}
	for _, h := range b.hosts {
		st, err := h.NetStats()
		if err != nil {
			b.t.Fatal(err)
		}
		retrans += st["Tcp.RetransSegs"]
	}
	return stall, retrans
}

// cpuStall is the kernel's total time some task was waiting for a CPU.
func cpuStall() (time.Duration, error) { return someTotal("/proc/pressure/cpu") }

// someTotal reads the total of "some" from a pressure file.
func someTotal(path string) (time.Duration, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "some" {
			continue
		}
		for _, kv := range fields[1:] {
			if v, ok := strings.CutPrefix(kv, "total="); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				return time.Duration(us) * time.Microsecond, err
			}
		}
	}
	return 0, fmt.Errorf("%s: no total of \"some\"", path)
}

// Excuses decides the findings of one unimpaired run against the
// machine's accounts of it. Each finding it grants uses up what the
// accounts cover: the time applications are found slow (beyond what the
// test made them take) is no more than the time the CPU was contended,
// and the exchanges found to lose segments are no more than the segments
// the hosts sent again.
type Excuses struct {
	stall, appTime time.Duration
	retrans        int64
	lossy          int
	// requester is how long the requesting application waited for a
	// CPU, where the test knows it (Waited); else the machine's stall.
	requester time.Duration
}

// Excuses takes the accounts so far.
func (b *Busy) Excuses() *Excuses {
	b.t.Helper()
	stall, retrans := b.now()
	return &Excuses{stall: stall - b.stall, retrans: retrans - b.retrans, requester: stall - b.stall}
}

// Requester sets how long the requesting application waited for a CPU.
func (x *Excuses) Requester(waited time.Duration) { x.requester = waited }

// String says what the accounts hold and what was granted of them.
func (x *Excuses) String() string {
	return fmt.Sprintf("the CPU was contended %v and the hosts sent %d segments again; findings used %v of applications' time and %d lossy exchanges",
		x.stall.Round(time.Millisecond), x.retrans, x.appTime.Round(time.Millisecond), x.lossy)
}

// Exchange reports whether diagnosis n on e is what the machine did: a
// slow application whose blamed time (less own, what the test made it
// take) the CPU's contention covers, or loss the hosts' retransmissions
// cover.
func (x *Excuses) Exchange(e *record.Exchange, n record.DiagnosisName, own time.Duration) bool {
	if n == diagnose.Loss {
		if int64(x.lossy) >= x.retrans {
			return false
		}
		x.lossy++
		return true
	}
	blamed, ok := appTime(e.Components, n)
	if !ok {
		return false
	}
	blamed = max(blamed-own, 0)
	if x.appTime+blamed > x.stall {
		return false
	}
	x.appTime += blamed
	return true
}

// Pair reports whether diagnosis n on the pair p, of these exchanges, is
// what the machine did, as Exchange does for all of them together
// (nothing is used up: the pair's finding sums its exchanges'). A
// requester that loops without a pause makes one long run of exchanges,
// which is no chatty protocol; descheduled, its pauses cut the run into
// bursts: many_turns is what the machine did when the requester waited
// for a CPU at least the least silence that ends a burst, once per burst.
func (x *Excuses) Pair(p *aggregate.PeerStats, exchanges []*record.Exchange, n record.DiagnosisName, own time.Duration) bool {
	switch n {
	case diagnose.Loss:
		return x.retrans > 0
	case diagnose.ManyTurns:
		return p.Turns.Bursts > 1 && x.requester >= time.Duration(p.Turns.Bursts-1)*minBurstGap
	}
	var blamed time.Duration
	for _, e := range exchanges {
		d, ok := appTime(e.Components, n)
		if !ok {
			return false
		}
		blamed += max(d-own, 0)
	}
	return blamed <= x.stall
}

// minBurstGap is the least silence that ends a burst (aggregate's
// burstGap).
const minBurstGap = 2 * time.Millisecond

// appTime is the time an application finding blames, and whether n is
// one.
func appTime(c record.Components, n record.DiagnosisName) (time.Duration, bool) {
	switch n {
	case diagnose.PeerThink:
		return c.Peer, true
	case diagnose.LocalRead:
		return c.LocalRead, true
	case diagnose.LocalThink:
		return c.Think, true
	}
	return 0, false
}

// Waited is a cgroup v2 of a program's own, whose pressure stall
// information is how long the program waited for a CPU: on a busy machine
// a client's own latency report includes that wait, outside the system
// calls lattrace times.
type Waited struct {
	dir string
	fd  *os.File
}

var waitedSeq atomic.Int64

// NewWaited makes the cgroup, removed when the test ends.
func NewWaited(t testing.TB, name string) *Waited {
	t.Helper()
	root, err := cgroup.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, fmt.Sprintf("lattrace-test-%d-%d-%s", os.Getpid(), waitedSeq.Add(1), name))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := os.Open(dir)
	if err != nil {
		os.Remove(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		fd.Close()
		os.Remove(dir)
	})
	return &Waited{dir: dir, fd: fd}
}

// Start starts cmd in the cgroup (from its first instruction: clone3's
// CLONE_INTO_CGROUP).
func (w *Waited) Start(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(w.fd.Fd())
	return cmd.Start()
}

// Total is how long some task of the cgroup was waiting for a CPU; 0
// where the kernel keeps no pressure account (Busy).
func (w *Waited) Total() time.Duration {
	d, err := someTotal(filepath.Join(w.dir, "cpu.pressure"))
	if err != nil {
		return 0
	}
	return d
}
