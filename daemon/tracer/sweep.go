package tracer

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/record"
)

// The sweep: an exchange is held in its socket's storage until its next
// turn, which on an idle pooled connection may come hours later, or never
// before the daemon stops. Every IdleWrite the daemon runs an iterator
// whose program writes the exchanges that are complete and whose
// connection has been quiet since (handle_sweep in bpf/handlers.bpf.h);
// at its stop, with the hooks detached, it writes every exchange in
// progress, flagged unfinished when it is not complete.
//
// The iterator over the socket storage reaches every followed socket at
// once. Where the kernel refuses it, the TCP iterator stands in: it sees
// the sockets of the namespace it is opened in, so the daemon opens it in
// each network namespace in turn (namespaces).

// sweepAtStop writes every exchange in progress at the daemon's stop, its
// hooks detached, and drains them into sink. A pass writes what the ring
// has room for and leaves the rest, counted in sweep_deferred, for the
// next pass after a drain: more exchanges may be in progress than the
// ring holds (tens of thousands of idle pooled connections), and none may
// be lost for it. A pass that leaves as many as the one before has made
// no room; what it leaves is counted as lost (Counters.UnwrittenAtStop).
func (t *Tracer) sweepAtStop(sink record.Sink) {
	deferred := t.maps.Variables["sweep_deferred"]
	if t.sweep == nil || deferred == nil {
		t.drain(sink)
		return
	}
	if err := t.maps.Variables["sweep_stopping"].Set(uint32(1)); err != nil {
		t.opts.Logger.Warn("exchanges in progress at the stop are not written", "err", err)
		t.drain(sink)
		return
	}
	last := uint64(math.MaxUint64)
	for pass := 1; ; pass++ {
		if err := deferred.Set(uint64(0)); err != nil {
			t.opts.Logger.Warn("exchanges in progress at the stop are not written", "err", err)
			t.drain(sink)
			t.lostAtStop(last)
			return
		}
		t.sweepNow()
		t.drain(sink)
		var left uint64
		if err := deferred.Get(&left); err != nil {
			t.opts.Logger.Warn("exchanges in progress at the stop: reading what the sweep left", "err", err)
			t.lostAtStop(last)
			return
		}
		if left == 0 {
			if pass > 1 {
				t.opts.Logger.Info("exchanges in progress at the stop written in several passes, the ring drained between them", "passes", pass)
			}
			return
		}
		if left >= last {
			t.unwrittenAtStop.Add(left)
			t.opts.Logger.Warn("exchanges in progress at the stop not written: the ring stayed full", "exchanges", left, "passes", pass)
			return
		}
		last = left
	}
}

// lostAtStop counts as unwritten what the last pass of the sweep at the
// stop left, when no pass follows (last is MaxUint64 before the first).
func (t *Tracer) lostAtStop(last uint64) {
	if last != math.MaxUint64 {
		t.unwrittenAtStop.Add(last)
	}
}

// sweepNow runs the sweep once: over idle exchanges, or a pass of the
// sweep at the stop once sweepAtStop has set its variables.
func (t *Tracer) sweepNow() {
	t.lastSweep = time.Now()
	if t.sweep == nil {
		return
	}
	var err error
	if t.sweepNetns == nil {
		err = readIter(t.sweep)
	} else {
		err = t.sweepNetns.each(func(uint64) error { return readIter(t.sweep) }, t.netnsUnswept)
		// A namespace the scan could not read is passed over as surely
		// as one not entered, but has no inode to count it by.
		if n := t.sweepNetns; n.denied > 0 && !n.toldDenied {
			n.toldDenied = true
			t.opts.Logger.Warn("network namespaces of some processes not readable in /proc, so not swept unless bound in --netns-dir: reading another process's needs CAP_SYS_PTRACE (and the host's PID namespace in a pod)",
				"processes", n.denied)
		}
	}
	if err != nil {
		t.opts.Logger.Warn("sweep of idle exchanges failed", "err", err)
	}
}

// netnsUnswept says, once per namespace, that its idle exchanges wait for
// their next turn, and counts each time one was passed over.
func (t *Tracer) netnsUnswept(ino uint64, first bool, err error) {
	t.unswept.Add(1)
	if first {
		t.opts.Logger.Warn("network namespace not swept: its complete exchanges are written at their next turn, not when idle",
			"netns", ino, "err", err)
	}
}

// readIter runs an iterator's program over everything it walks; the
// sweep's program writes to the ring buffer, not to the iterator.
func readIter(it *link.Iter) error {
	r, err := it.Open()
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = io.Copy(io.Discard, r)
	return err
}

// namespaces finds the network namespaces the TCP iterator must be opened
// in: those of the processes the daemon sees in /proc and those bound in
// dirs (iproute2's /run/netns, where CNI plugins bind pods' too), each
// once, by inode.
type namespaces struct {
	dirs    []string
	paths   map[uint64]string
	scanned time.Time
	// stale: a record came from a namespace the last scan did not find.
	stale bool
	// told: namespaces whose failure was logged.
	told map[uint64]bool
	// denied: processes of the last scan whose namespace the daemon may
	// not read (another process's needs CAP_SYS_PTRACE when it has
	// capabilities the daemon lacks); toldDenied: that was said.
	denied     int
	toldDenied bool
}

// rescanEvery bounds how stale the list of namespaces gets; a namespace
// with traced sockets that the list lacks makes the next sweep rescan at
// once (saw).
const rescanEvery = 5 * time.Second

func newNamespaces(dirs []string) *namespaces {
	return &namespaces{dirs: dirs, told: map[uint64]bool{}}
}

// saw notes that a record came from namespace ino; n may be nil (the
// sweep reaches every namespace at once).
func (n *namespaces) saw(ino uint32) {
	if n != nil && !n.stale {
		if _, ok := n.paths[uint64(ino)]; !ok {
			n.stale = true
		}
	}
}

func (n *namespaces) scan() {
	paths := map[uint64]string{}
	n.denied = 0
	add := func(p string) {
		var st unix.Stat_t
		err := unix.Stat(p, &st)
		if err == nil {
			if _, ok := paths[st.Ino]; !ok {
				paths[st.Ino] = p
			}
		} else if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			n.denied++
		}
	}
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, e := range ents {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				add(filepath.Join("/proc", e.Name(), "ns", "net"))
			}
		}
	}
	for _, d := range n.dirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			add(filepath.Join(d, e.Name()))
		}
	}
	n.paths = paths
	n.scanned = time.Now()
	n.stale = false
}

// each calls fn once in every namespace (its inode), on a thread of its
// own that enters them in turn. fail hears of a namespace that could not be
// entered (first: for the first time).
func (n *namespaces) each(fn func(ino uint64) error, fail func(ino uint64, first bool, err error)) error {
	if n.stale || time.Since(n.scanned) >= rescanEvery {
		n.scan()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		var st unix.Stat_t
		if err := unix.Fstat(int(self.Fd()), &st); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		var errs []error
		for ino, path := range n.paths {
			if ino == st.Ino {
				errs = append(errs, fn(ino))
				continue
			}
			if entered, err := enter(path, ino); err != nil {
				fail(ino, !n.told[ino], err)
				n.told[ino] = true
				continue
			} else if !entered {
				continue
			}
			errs = append(errs, fn(ino))
			if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
				// Stay locked: the runtime ends this thread with the
				// goroutine, so no goroutine runs in the wrong namespace.
				errc <- errors.Join(append(errs, fmt.Errorf("returning from network namespace %d: %w", ino, err))...)
				return
			}
		}
		runtime.UnlockOSThread()
		errc <- errors.Join(errs...)
	}()
	return <-errc
}

// enter moves the calling thread into the namespace at path if it is
// still the one of inode ino; entered is false when it is not (its
// process exited since the scan: the next scan finds the namespace
// elsewhere if it lives on).
func enter(path string, ino uint64) (entered bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return false, nil
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Ino != ino {
		return false, nil
	}
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return false, fmt.Errorf("entering it: %w", err)
	}
	return true, nil
}
