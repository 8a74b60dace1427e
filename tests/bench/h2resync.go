package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/daemon/api"
	"github.com/lattrace/lattrace/tests/workload"
)

// The adopted-HTTP/2 phase of MeasureHooks (issue 46): what lattrace's
// framing programs (lattrace_h2_egress, lattrace_h2_ingress on cgroup_skb)
// cost per write on a connection that is not HTTP/2 and was open before
// the daemon started. There they look for HTTP/2's framing from frame
// headers (bpf/h2_resync.bpf.h): each segment that starts one of its
// sender's writes has its first 9 bytes read and checked, until a
// direction's candidates failed H2_RESYNC_TRIES times and the connection
// is decided not HTTP/2; from then on they return after one socket-storage
// lookup, as on a connection seen from its start. Beside it, the same on
// connections opened after the daemon started: the baseline.

const (
	// h2ResyncConns is how many connections of each kind the phase
	// uses: the first writes of each are few, so many connections make
	// the first window thousands of writes.
	h2ResyncConns = 200
	// h2ResyncFirst is the round trips of each connection in the first
	// window (two writes each, one at each end): past the H2_RESYNC_TRIES
	// failed candidates (4) of each direction, and a write or two at each
	// end before its socket has state at all.
	h2ResyncFirst = 10
	// h2ResyncSize is the message each way, as the loop's.
	h2ResyncSize = 100
	// h2ResyncRounds is how many times the windows after the first
	// alternate between the two kinds of connection: a jump of the
	// machine's speed falls on both.
	h2ResyncRounds = 4
)

// h2ResyncPrograms are the programs measured, by the names they are
// pinned under (daemon/tracer/hooks.go).
var h2ResyncPrograms = []string{"lattrace_h2_egress", "lattrace_h2_ingress"}

// H2ResyncCost is the adopted-HTTP/2 phase: lattrace's HTTP/2 framing
// programs on loopback request/response connections that are not HTTP/2,
// Conns open before the daemon started (Adopted) and Conns opened after
// it (FromStart), each making round trips of 100 bytes each way, both
// ends on the loop's CPU. First is each connection's first FirstWrites
// writes after the daemon started, After the writes after those.
type H2ResyncCost struct {
	Conns       int       `json:"conns"`
	FirstWrites int       `json:"first_writes"`
	Adopted     H2Windows `json:"adopted"`
	FromStart   H2Windows `json:"from_start"`
	// AdoptedServer and AdoptedClient are the connection ends the daemon
	// counted adopted, by role, during the first window (at least Conns
	// of each: the phase checks it); AdoptedGuessed those whose role it
	// could not tell (the framing is not looked for on those).
	AdoptedServer  uint64 `json:"adopted_server"`
	AdoptedClient  uint64 `json:"adopted_client"`
	AdoptedGuessed uint64 `json:"adopted_guessed"`
	// IdleRunsPerSec is how often the two programs ran while the phase
	// sent nothing: the node's other traffic, which the windows count
	// too (a run of theirs is on a socket of no interest, one lookup).
	IdleRunsPerSec float64 `json:"idle_runs_per_sec"`
}

// H2Windows are one kind of connection's two windows.
type H2Windows struct {
	First H2Window `json:"first"`
	After H2Window `json:"after"`
}

// H2Window is the framing programs' cost over some writes: each program's
// runs and ns per run, its PerRoundTrip being runs per write, and the two
// programs' run time summed per write (a write's segments leave through
// lattrace_h2_egress at its sender and arrive through lattrace_h2_ingress
// at its receiver, both traced).
type H2Window struct {
	Writes     uint64     `json:"writes"`
	Programs   []ProgCost `json:"programs"`
	NsPerWrite float64    `json:"ns_per_write"`
}

// FirstExtra is what a write costs more in the first window on an
// adopted connection than on one seen from its start.
func (c *H2ResyncCost) FirstExtra() float64 {
	return c.Adopted.First.NsPerWrite - c.FromStart.First.NsPerWrite
}

// FirstExtraPerConn is FirstExtra over the first window's writes: what
// looking for the framing costs an adopted connection in all.
func (c *H2ResyncCost) FirstExtraPerConn() float64 {
	return c.FirstExtra() * float64(c.FirstWrites)
}

// AfterExtra is the same after the first window: the cost of a
// connection decided not HTTP/2 (zero but for noise).
func (c *H2ResyncCost) AfterExtra() float64 {
	return c.Adopted.After.NsPerWrite - c.FromStart.After.NsPerWrite
}

// rrPair is a loopback TCP connection's two ends, blocking sockets that
// one thread drives in turn.
type rrPair struct{ client, server int }

// rrConns are connections to one listener of this process. The listener
// stays open while they are used: it is what tells lattrace that the
// adopted accepted ends are servers (bpf/listeners.bpf.h).
type rrConns struct {
	ln    int
	addr  *unix.SockaddrInet4
	pairs []rrPair
	buf   []byte
}

func newRRConns() (*rrConns, error) {
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	c := &rrConns{ln: ln, buf: make([]byte, h2ResyncSize)}
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		c.close()
		return nil, err
	}
	if err := unix.Listen(ln, 4096); err != nil {
		c.close()
		return nil, err
	}
	sa, err := unix.Getsockname(ln)
	if err != nil {
		c.close()
		return nil, err
	}
	c.addr = sa.(*unix.SockaddrInet4)
	return c, nil
}

// open makes n connections and returns them.
func (c *rrConns) open(n int) ([]rrPair, error) {
	var out []rrPair
	for range n {
		cl, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return out, err
		}
		if err := connectRetry(cl, c.addr); err != nil {
			unix.Close(cl)
			return out, err
		}
		var srv int
		for {
			srv, _, err = unix.Accept4(c.ln, unix.SOCK_CLOEXEC)
			if err != unix.EINTR {
				break
			}
		}
		if err != nil {
			unix.Close(cl)
			return out, err
		}
		for _, fd := range []int{cl, srv} {
			_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		}
		p := rrPair{client: cl, server: srv}
		c.pairs = append(c.pairs, p)
		out = append(out, p)
	}
	return out, nil
}

// connectRetry connects a blocking socket, through the runtime's signals.
func connectRetry(fd int, to unix.Sockaddr) error {
	err := unix.Connect(fd, to)
	for err == unix.EINTR || err == unix.EALREADY || err == unix.EINPROGRESS {
		// Interrupted, the handshake goes on: wait for it.
		time.Sleep(time.Millisecond)
		err = unix.Connect(fd, to)
	}
	if err == unix.EISCONN {
		return nil
	}
	return err
}

func (c *rrConns) close() {
	for _, p := range c.pairs {
		unix.Close(p.client)
		unix.Close(p.server)
	}
	c.pairs = nil
	unix.Close(c.ln)
}

// roundTrip: the client writes its message, the server reads it and
// writes it back, the client reads it. Two writes, one at each end.
func (c *rrConns) roundTrip(p rrPair) error {
	for _, step := range []struct {
		from, to int
	}{{p.client, p.server}, {p.server, p.client}} {
		if err := writeAll(step.from, c.buf); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		if err := readFull(step.to, c.buf); err != nil {
			return fmt.Errorf("read: %w", err)
		}
	}
	return nil
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func readFull(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("connection closed")
		}
		b = b[n:]
	}
	return nil
}

// sweeps makes one round trip on each connection in turn, rounds times,
// or, with rounds 0, until d has passed (whole sweeps); it returns the
// round trips made.
func (c *rrConns) sweeps(pairs []rrPair, rounds int, d time.Duration) (uint64, error) {
	var n uint64
	end := time.Now().Add(d)
	for r := 0; rounds == 0 || r < rounds; r++ {
		if rounds == 0 && r > 0 && time.Now().After(end) {
			break
		}
		for _, p := range pairs {
			if err := c.roundTrip(p); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// onLoopCPU runs f on a thread of its own pinned to the loop's CPU (1, as
// sockperfOn in MeasureHooks): both ends of every connection on one CPU,
// as in the loop. The thread ends with f (never unlocked).
func onLoopCPU(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if runtime.NumCPU() >= 2 {
			var set unix.CPUSet
			set.Set(1)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				done <- fmt.Errorf("pinning to CPU 1: %w", err)
				return
			}
		}
		done <- f()
	}()
	return <-done
}

// h2Progs are the daemon's two framing programs, found through the links
// it pinned under BenchPinPath: another lattrace loaded on the node (a
// test's) has programs of the same names, which these are not.
type h2Progs struct {
	names []string
	progs []*ebpf.Program
}

func openH2Progs(pinPath string) (*h2Progs, error) {
	h := &h2Progs{}
	for _, name := range h2ResyncPrograms {
		l, err := link.LoadPinnedLink(filepath.Join(pinPath, "links", name), nil)
		if err != nil {
			h.close()
			return nil, fmt.Errorf("the daemon's %s: %w (not attached, or not pinned)", name, err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			h.close()
			return nil, fmt.Errorf("the daemon's %s: %w", name, err)
		}
		p, err := ebpf.NewProgramFromID(info.Program)
		if err != nil {
			h.close()
			return nil, fmt.Errorf("the daemon's %s: %w", name, err)
		}
		h.names, h.progs = append(h.names, name), append(h.progs, p)
	}
	return h, nil
}

func (h *h2Progs) close() {
	for _, p := range h.progs {
		p.Close()
	}
}

// h2Stat is a program's run count and run time at one moment.
type h2Stat struct {
	runs uint64
	rt   time.Duration
}

func (h *h2Progs) stats() ([]h2Stat, error) {
	out := make([]h2Stat, len(h.progs))
	for i, p := range h.progs {
		st, err := p.Stats()
		if err != nil {
			return nil, fmt.Errorf("%s's statistics: %w", h.names[i], err)
		}
		out[i] = h2Stat{st.RunCount, st.Runtime}
	}
	return out, nil
}

// h2Acc sums the programs' runs and run time over windows of writes.
type h2Acc struct {
	writes uint64
	runs   []uint64
	rt     []time.Duration
}

// measure runs f (which returns round trips) between two readings of the
// programs' statistics and adds the difference.
func (a *h2Acc) measure(h *h2Progs, f func() (uint64, error)) error {
	from, err := h.stats()
	if err != nil {
		return err
	}
	n, err := f()
	if err != nil {
		return err
	}
	to, err := h.stats()
	if err != nil {
		return err
	}
	if a.runs == nil {
		a.runs, a.rt = make([]uint64, len(to)), make([]time.Duration, len(to))
	}
	a.writes += 2 * n
	for i := range to {
		a.runs[i] += to[i].runs - from[i].runs
		a.rt[i] += to[i].rt - from[i].rt
	}
	return nil
}

func (a *h2Acc) window(h *h2Progs) H2Window {
	w := H2Window{Writes: a.writes}
	if a.writes == 0 {
		return w
	}
	for i, name := range h.names {
		if i >= len(a.runs) {
			break
		}
		p := ProgCost{Name: name, Type: ebpf.CGroupSKB.String(), Runs: a.runs[i], PerRoundTrip: float64(a.runs[i]) / float64(a.writes)}
		if a.runs[i] > 0 {
			p.Ns = float64(a.rt[i]) / float64(a.runs[i])
		}
		w.Programs = append(w.Programs, p)
		w.NsPerWrite += float64(a.rt[i]) / float64(a.writes)
	}
	return w
}

// adoptedConns opens the phase's connections that predate the daemon,
// with a few round trips on each (connections in use, not fresh ones).
// Called before the daemon starts; the caller closes them.
func adoptedConns() (*rrConns, error) {
	c, err := newRRConns()
	if err != nil {
		return nil, fmt.Errorf("a listener: %w", err)
	}
	err = onLoopCPU(func() error {
		pairs, err := c.open(h2ResyncConns)
		if err != nil {
			return fmt.Errorf("opening connections: %w", err)
		}
		_, err = c.sweeps(pairs, 2, 0)
		return err
	})
	if err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// measureH2Resync is the phase, under a running daemon that pinned under
// pinPath and serves its API in dir: c's connections were open before it
// started, as many are opened now beside them; d is the windows' time
// after the first ones.
func measureH2Resync(ctx context.Context, c *rrConns, dir, pinPath string, d time.Duration) (*H2ResyncCost, error) {
	cl, err := api.NewClient(filepath.Join(dir, "api.sock"))
	if err != nil {
		return nil, err
	}
	health, err := cl.Health(ctx)
	if err != nil {
		return nil, fmt.Errorf("the daemon's health: %w", err)
	}
	for _, h := range health.Hooks {
		for _, name := range h2ResyncPrograms {
			if h.Program == name && !h.Attached {
				return nil, fmt.Errorf("%s not attached: %s", name, h.Error)
			}
		}
	}
	progs, err := openH2Progs(pinPath)
	if err != nil {
		return nil, err
	}
	defer progs.close()
	adopted := c.pairs
	res := &H2ResyncCost{Conns: len(adopted), FirstWrites: 2 * h2ResyncFirst}

	// The programs' runs with nothing sent: the node's other traffic.
	var idle h2Acc
	const idleFor = 200 * time.Millisecond
	if err := idle.measure(progs, func() (uint64, error) { return 0, workload.SleepCtx(ctx, idleFor) }); err != nil {
		return nil, err
	}
	for _, r := range idle.runs {
		res.IdleRunsPerSec += float64(r) / idleFor.Seconds()
	}

	var adFirst, adAfter, fsFirst, fsAfter h2Acc
	err = onLoopCPU(func() error {
		fresh, err := c.open(h2ResyncConns)
		if err != nil {
			return fmt.Errorf("opening connections after the daemon started: %w", err)
		}
		// The first windows: adopted first, its first writes are
		// the ones the daemon adopts the sockets on.
		if err := adFirst.measure(progs, func() (uint64, error) { return c.sweeps(adopted, h2ResyncFirst, 0) }); err != nil {
			return fmt.Errorf("open before the daemon, first writes: %w", err)
		}
		if err := fsFirst.measure(progs, func() (uint64, error) { return c.sweeps(fresh, h2ResyncFirst, 0) }); err != nil {
			return fmt.Errorf("opened after the daemon, first writes: %w", err)
		}
		each := d / (2 * h2ResyncRounds)
		for range h2ResyncRounds {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := adAfter.measure(progs, func() (uint64, error) { return c.sweeps(adopted, 0, each) }); err != nil {
				return fmt.Errorf("open before the daemon: %w", err)
			}
			if err := fsAfter.measure(progs, func() (uint64, error) { return c.sweeps(fresh, 0, each) }); err != nil {
				return fmt.Errorf("opened after the daemon: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	after, err := cl.Health(ctx)
	if err != nil {
		return nil, fmt.Errorf("the daemon's health: %w", err)
	}
	k0, k1 := health.Kernel, after.Kernel
	res.AdoptedServer, res.AdoptedClient, res.AdoptedGuessed = k1.AdoptedServer-k0.AdoptedServer, k1.AdoptedClient-k0.AdoptedClient, k1.AdoptedGuessed-k0.AdoptedGuessed
	res.Adopted = H2Windows{First: adFirst.window(progs), After: adAfter.window(progs)}
	res.FromStart = H2Windows{First: fsFirst.window(progs), After: fsAfter.window(progs)}
	// Without both ends of every connection adopted, their roles known,
	// the figures are not those of the framing looked for.
	if n := uint64(res.Conns); res.AdoptedServer < n || res.AdoptedClient < n {
		return res, fmt.Errorf("the daemon adopted %d server and %d client ends (%d guessed) of the %d connections open before it: the framing was not looked for on all of them",
			res.AdoptedServer, res.AdoptedClient, res.AdoptedGuessed, res.Conns)
	}
	return res, nil
}
