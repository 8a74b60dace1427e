package netlab

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// clockBase anchors the relay's clock. time.Since uses the runtime's vDSO
// CLOCK_MONOTONIC, which is cheaper than a clock_gettime syscall and immune
// to wall-clock steps.
var clockBase = time.Now()

func monoNow() int64 { return int64(time.Since(clockBase)) }

// The deliverer sleeps with clock_nanosleep, aiming early by the typical
// wake-up latency, then spins whatever time is left. Measured on
// this 2-vCPU VM: time.Sleep overshoots by 0.2-1 ms (the runtime's timers
// have millisecond granularity in epoll_pwait); clock_nanosleep with a 1 ns
// timer slack wakes 20-80 us late at the median/p90, up to ~0.7 ms at p99
// after an idle vCPU. A fixed 200 us spin per wake-up cost 45 % of a vCPU at
// 10 Mbit/s (the relay's floor there is ~15 %, mostly the receiving host's
// stack running inside the relay's send calls). Aiming early by the running
// median of the wake-up latency instead makes about half the wake-ups exact
// after a short spin, and the median delivery error about zero.
const (
	initialEarly = 50 * time.Microsecond
	maxEarly     = 300 * time.Microsecond
	earlyStep    = 2 * time.Microsecond // median tracker step per sample
)

// maxSleep bounds one sleep so the deliverer notices Close promptly.
const maxSleep = 20 * time.Millisecond

type direction struct {
	sh      *shaper
	in, out int // packet sockets: read from in, write to out

	frames, bytes, sendErrors, kernelDrops atomic.Uint64
}

// The relay runs in a process of its own, every thread of it at the
// real-time policy (rtPriority). A link's delay is the lab's truth, and a
// wire does not slow down when the hosts' CPUs are busy. Inside the process
// that builds the lab (a test, with its tracer, clients and servers) it
// would: at the default policy a CPU hog beside the lab (a busy neighbour on
// a shared machine) delays its wake-ups by whole time slices, and real-time
// threads there still wait for the Go runtime's processors, its garbage
// collector's pauses and its scheduler's hand-offs, all run by threads the
// hog preempts. In a process of its own, idle but for the frames, nothing
// of that stands between a due frame and its delivery. The hosts' kernel
// work for a frame runs inside the relay's send, so it goes first too,
// while the hosts' programs keep the default policy and wait for a CPU as
// they would on a busy machine.
const rtPriority = 10

// relayEnv, set in its environment, makes a program that links this
// package the relay of one lab: the process that builds the lab runs its
// own executable again, before its main.
const relayEnv = "NETLAB_RELAY_PROCESS"

func init() {
	if os.Getenv(relayEnv) != "" {
		os.Exit(serveRelay())
	}
}

// relay is the lab's handle on its relay process, which it talks to over a
// socket: the links at start and at SetLink, the counters at Stats. The
// process ends when the socket closes, with the lab or with the process
// that built it.
type relay struct {
	cmd  *exec.Cmd
	ctrl *os.File
	enc  *json.Encoder
	dec  *json.Decoder
	mu   sync.Mutex // one call at a time
	done chan struct{}
	err  error // why the process ended, once done is closed
}

// relayCall is a request to the relay process: at start, its seed and
// both links; then a new link for some directions, or the counters.
type relayCall struct {
	Seed  uint64      `json:",omitempty"`
	Set   []Direction `json:",omitempty"`
	Links [2]Link
	Stats bool `json:",omitempty"`
}

type relayReply struct {
	Err   string `json:",omitempty"`
	Stats [2]LinkStats
}

// openPacketSocket must run inside the middle namespace: both the interface
// lookup and the socket are resolved in the calling thread's namespace. The
// fd keeps that namespace afterwards, whatever thread uses it.
func openPacketSocket(ifname string) (int, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return -1, err
	}
	// Protocol 0 at creation so that nothing from other interfaces is queued
	// before bind narrows the socket to one interface.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("AF_PACKET socket: %w", err)
	}
	fail := func(what string, err error) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("%s on %s: %w", what, ifname, err)
	}
	// Without this the socket would also read back the frames the relay
	// itself writes to the interface, and forward them again.
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1); err != nil {
		return fail("PACKET_IGNORE_OUTGOING", err)
	}
	// Kernel receive timestamps let the relay compute due times from when
	// the frame really arrived, so the reader's own wake-up latency does not
	// add to the emulated delay.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
		return fail("SO_TIMESTAMPNS", err)
	}
	// Bursts at unlimited rate outrun one reader thread on a busy 2-vCPU box;
	// a deep buffer turns that into latency instead of silent drops.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	// Blocking reads with a timeout: close(2) does not wake a thread blocked
	// in recvmsg, so the reader polls the done channel this often.
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fail("SO_RCVTIMEO", err)
	}
	sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// startRelay opens the packet sockets on ma0 and mb0 in the middle
// namespace and hands them to a relay process.
func startRelay(middleNetns string, links [2]Link, seed uint64) (*relay, error) {
	// The process gets its own copies: these close when it has started
	// (an os.File closes its descriptor once, by Close or by its finalizer).
	var sockets []*os.File
	defer func() {
		for _, f := range sockets {
			f.Close()
		}
	}()
	err := doInNetns(middleNetns, func() error {
		for _, ifname := range []string{"ma0", "mb0"} {
			fd, err := openPacketSocket(ifname)
			if err != nil {
				return err
			}
			sockets = append(sockets, os.NewFile(uintptr(fd), ifname))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("relay socket: %w", err)
	}
	ctrl, theirs := os.NewFile(uintptr(pair[0]), "relay"), os.NewFile(uintptr(pair[1]), "relay")
	sockets = append(sockets, theirs)
	exe, err := os.Executable()
	if err != nil {
		ctrl.Close()
		return nil, fmt.Errorf("relay process: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), relayEnv+"=1")
	// fds 3 (ma0), 4 (mb0) and 5 (this socket) of the relay process
	// (serveRelay).
	cmd.ExtraFiles = sockets
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		ctrl.Close()
		return nil, fmt.Errorf("relay process: %w", err)
	}
	r := &relay{cmd: cmd, ctrl: ctrl, enc: json.NewEncoder(ctrl), dec: json.NewDecoder(ctrl), done: make(chan struct{})}
	go func() {
		r.err = cmd.Wait()
		close(r.done)
	}()
	if _, err := r.call(relayCall{Seed: seed, Links: links}); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// call sends one request to the relay process and reads its reply.
func (r *relay) call(c relayCall) (relayReply, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rep relayReply
	if err := r.enc.Encode(c); err != nil {
		return rep, fmt.Errorf("relay process: %w", err)
	}
	if err := r.dec.Decode(&rep); err != nil {
		return rep, fmt.Errorf("relay process: %w", err)
	}
	if rep.Err != "" {
		return rep, errors.New(rep.Err)
	}
	return rep, nil
}

// set changes the link of some directions.
func (r *relay) set(dirs []Direction, l Link) error {
	_, err := r.call(relayCall{Set: dirs, Links: [2]Link{l, l}})
	return err
}

func (r *relay) stats() (atob, btoa LinkStats, err error) {
	rep, err := r.call(relayCall{Stats: true})
	return rep.Stats[AtoB], rep.Stats[BtoA], err
}

// stop closes the relay's socket, which ends the process, and waits for
// it: a relay that ended before, or not at once, is an error.
func (r *relay) stop() error {
	select {
	case <-r.done:
		r.ctrl.Close()
		return fmt.Errorf("netlab: the relay process ended before the lab: %v", r.err)
	default:
	}
	r.ctrl.Close()
	select {
	case <-r.done:
		return r.err
	case <-time.After(10 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
		return errors.New("netlab: the relay process did not end with its lab")
	}
}

// serveRelay is the relay process: it forwards frames between the packet
// sockets it was handed and answers its lab's requests until the lab
// closes the socket. It returns the exit status.
func serveRelay() int {
	ctrl := os.NewFile(5, "relay")
	enc, dec := json.NewEncoder(ctrl), json.NewDecoder(ctrl)
	var start relayCall
	if err := dec.Decode(&start); err != nil {
		fmt.Fprintf(os.Stderr, "netlab relay: %v\n", err)
		return 1
	}
	if err := realtime(); err != nil {
		enc.Encode(relayReply{Err: err.Error()})
		return 1
	}
	f := &forwarder{fdA: 3, fdB: 4, done: make(chan struct{})}
	f.dirs[AtoB] = &direction{sh: newShaper(start.Links[AtoB], start.Seed, uint64(AtoB)), in: f.fdA, out: f.fdB}
	f.dirs[BtoA] = &direction{sh: newShaper(start.Links[BtoA], start.Seed, uint64(BtoA)), in: f.fdB, out: f.fdA}
	for _, d := range f.dirs {
		f.wg.Add(2)
		go f.read(d)
		go f.deliver(d)
	}
	defer f.stop()
	rep := relayReply{}
	for enc.Encode(rep) == nil {
		var c relayCall
		if dec.Decode(&c) != nil {
			break // the lab is closed
		}
		rep = relayReply{}
		for _, d := range c.Set {
			f.dirs[d].sh.set(c.Links[d])
		}
		if c.Stats {
			rep.Stats[AtoB], rep.Stats[BtoA] = f.stats(monoNow())
		}
	}
	return 0
}

// realtime puts every thread of the process at rtPriority; threads the
// runtime starts later inherit it.
func realtime() error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	attr := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: rtPriority}
	for _, task := range tasks {
		tid, err := strconv.Atoi(filepath.Base(task.Name()))
		if err != nil {
			continue
		}
		if err := unix.SchedSetAttr(tid, &attr, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("netlab: the relay at SCHED_FIFO %d: %w", rtPriority, err)
		}
	}
	return nil
}

// forwarder moves the frames of both directions, in the relay process.
type forwarder struct {
	fdA, fdB int // packet sockets bound to ma0 and mb0 in the middle namespace
	dirs     [2]*direction
	done     chan struct{}
	wg       sync.WaitGroup
	statsMu  sync.Mutex // PACKET_STATISTICS reads reset the kernel counters
}

func (r *forwarder) stop() {
	close(r.done)
	r.wg.Wait()
}

func (r *forwarder) stopped() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *forwarder) read(d *direction) {
	defer r.wg.Done()
	buf := make([]byte, 1<<16+ethHeaderLen)
	oob := make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{}))))
	for !r.stopped() {
		n, oobn, _, _, err := unix.Recvmsg(d.in, buf, oob, 0)
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
				// ENETDOWN and friends while an interface is torn down: do
				// not spin on them.
				time.Sleep(10 * time.Millisecond)
			}
			continue
		}
		arrival := arrivalTime(oob[:oobn])
		d.sh.offer(append([]byte(nil), buf[:n]...), arrival)
	}
}

// arrivalTime converts the kernel's CLOCK_REALTIME receive timestamp to the
// relay's monotonic clock by measuring the frame's age against the wall
// clock now. A missing or implausible stamp (clock step) falls back to now.
func arrivalTime(oob []byte) int64 {
	t := time.Now()
	mono := int64(t.Sub(clockBase))
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return mono
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= 16 {
			sec := int64(binary.NativeEndian.Uint64(m.Data[0:8]))
			nsec := int64(binary.NativeEndian.Uint64(m.Data[8:16]))
			age := t.UnixNano() - (sec*1e9 + nsec)
			if age >= 0 && age < int64(time.Second) {
				return mono - age
			}
		}
	}
	return mono
}

func (r *forwarder) deliver(d *direction) {
	defer r.wg.Done()
	// The thread is dedicated to precise sleeps; with the default 50 us timer
	// slack clock_nanosleep wakes 50-100 us late. Leaving the goroutine
	// locked at exit makes the runtime discard the modified thread.
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	var batch []frame
	var next int64
	var sl sleeper
	for {
		batch, next = d.sh.popDue(monoNow(), batch[:0])
		for i := range batch {
			f := &batch[i]
			if err := unix.Send(d.out, f.data, 0); err != nil {
				d.sendErrors.Add(1)
			} else {
				d.frames.Add(1)
				d.bytes.Add(uint64(len(f.data)))
			}
			f.data = nil
		}
		if next == 0 {
			select {
			case <-d.sh.wake:
				continue
			case <-r.done:
				return
			}
		}
		if r.stopped() {
			return
		}
		sl.until(next)
	}
}

// sleeper waits for due times. early tracks the median of clock_nanosleep's
// wake-up latency (a stochastic quantile estimate: it steps towards each
// sample), which ignores the rare long tails a mean would chase.
type sleeper struct{ early int64 }

// until returns at, or shortly after, monotonic time due, or after maxSleep,
// whichever is first.
func (s *sleeper) until(due int64) {
	if s.early == 0 {
		s.early = int64(initialEarly)
	}
	now := monoNow()
	target := due - s.early
	if wait := target - now; wait > 0 {
		capped := wait > int64(maxSleep)
		wait = min(wait, int64(maxSleep))
		ts := unix.NsecToTimespec(wait)
		_ = unix.Nanosleep(&ts, nil) // EINTR just ends the sleep early
		if capped {
			return
		}
		if monoNow()-target > s.early {
			s.early = min(s.early+int64(earlyStep), int64(maxEarly))
		} else {
			s.early = max(s.early-int64(earlyStep), int64(earlyStep))
		}
	}
	// A plain busy loop: sched_yield here handed the vCPU to any CPU hog
	// for a whole time slice (ms), which broke RTTs under load.
	for monoNow() < due {
	}
}

func (r *forwarder) stats(now int64) (atob, btoa LinkStats) {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	out := [2]LinkStats{}
	for i, d := range r.dirs {
		if d.in >= 0 && !r.stopped() {
			if ps, err := unix.GetsockoptTpacketStats(d.in, unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
				d.kernelDrops.Add(uint64(ps.Drops))
			}
		}
		st := &out[i]
		d.sh.stats(now, st)
		st.Frames = d.frames.Load()
		st.Bytes = d.bytes.Load()
		st.SendErrors = d.sendErrors.Load()
		st.KernelDrops = d.kernelDrops.Load()
	}
	return out[0], out[1]
}
