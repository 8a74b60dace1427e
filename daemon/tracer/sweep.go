package tracer

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
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

// sweepNow runs the sweep; with stopping, the last one.
func (t *Tracer) sweepNow(stopping bool) {
	t.lastSweep = time.Now()
	if t.sweep == nil {
		return
	}
	if stopping {
		if v := t.maps.Variables["sweep_stopping"]; v != nil {
			if err := v.Set(uint32(1)); err != nil {
				t.opts.Logger.Warn("exchanges in progress at the stop are not written", "err", err)
				return
			}
		}
	}
	var err error
	if t.sweepNetns == nil {
		err = readIter(t.sweep)
	} else {
		err = t.sweepNetns.each(func() error { return readIter(t.sweep) }, t.netnsUnswept)
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
	add := func(p string) {
		var st unix.Stat_t
		if unix.Stat(p, &st) == nil {
			if _, ok := paths[st.Ino]; !ok {
				paths[st.Ino] = p
			}
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

// each calls fn once in every namespace, on a thread of its own that
// enters them in turn. fail hears of a namespace that could not be
// entered (first: for the first time).
func (n *namespaces) each(fn func() error, fail func(ino uint64, first bool, err error)) error {
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
				errs = append(errs, fn())
				continue
			}
			if entered, err := enter(path, ino); err != nil {
				fail(ino, !n.told[ino], err)
				n.told[ino] = true
				continue
			} else if !entered {
				continue
			}
			errs = append(errs, fn())
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
