package netlab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
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

type relay struct {
	fdA, fdB int // packet sockets bound to ma0 and mb0 in the middle namespace
	dirs     [2]*direction
	done     chan struct{}
	wg       sync.WaitGroup
	statsMu  sync.Mutex // PACKET_STATISTICS reads reset the kernel counters
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

func startRelay(middleNetns string, atob, btoa *shaper) (*relay, error) {
	r := &relay{fdA: -1, fdB: -1, done: make(chan struct{})}
	err := doInNetns(middleNetns, func() error {
		var err error
		if r.fdA, err = openPacketSocket("ma0"); err != nil {
			return err
		}
		r.fdB, err = openPacketSocket("mb0")
		return err
	})
	if err != nil {
		r.closeFDs()
		return nil, err
	}
	r.dirs[AtoB] = &direction{sh: atob, in: r.fdA, out: r.fdB}
	r.dirs[BtoA] = &direction{sh: btoa, in: r.fdB, out: r.fdA}
	for _, d := range r.dirs {
		r.wg.Add(2)
		go r.read(d)
		go r.deliver(d)
	}
	return r, nil
}

func (r *relay) closeFDs() {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	for _, fd := range []*int{&r.fdA, &r.fdB} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

func (r *relay) stop() {
	close(r.done)
	r.wg.Wait()
	r.closeFDs()
}

func (r *relay) stopped() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *relay) read(d *direction) {
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

func (r *relay) deliver(d *direction) {
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

func (r *relay) stats(now int64) (atob, btoa LinkStats) {
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
