package tracer

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ring reads the BPF ring buffer and moves the consumer position only when
// told to (commit), after what was read is out for good. That is what lets a
// daemon killed mid-drain leave its unfinished records in the kernel for the
// next one: nothing is lost.
//
// cilium/ebpf v0.22's ringbuf.Reader advances the consumer position as it
// returns each record, so a record read and not yet written out dies with the
// process. Upstream has since merged ringbuf.RawReader with deferred commits
// (cilium/ebpf#2037), but no release carries it yet; replace this type with
// it when one does. The layout below is the kernel's ABI
// (kernel/bpf/ringbuf.c): one read-write consumer page, then a read-only
// producer page followed by the data pages. The kernel offers the data
// pages twice in a row, so that a record wrapping the end reads as one
// slice; we map them once (a second mapping of the same memory would add
// the whole ring to the daemon's RSS again) and copy the rare record that
// wraps.
type ring struct {
	cons, prod []byte // the two mappings
	consPos    *uint64
	prodPos    *uint64
	data       []byte
	mask       uint64
	epfd       int
	efd        int // an eventfd in the epoll set: interrupt wakes wait
	events     [2]unix.EpollEvent
	// wrapped holds the last record that wrapped the end of data; wraps
	// counts them (tests check the path is taken).
	wrapped []byte
	wraps   atomic.Uint64
	// read is the position after the last record handed out, ahead of
	// the committed consumer position until commit.
	read uint64
}

const (
	ringHdrSize    = 8
	ringBusyBit    = 1 << 31
	ringDiscardBit = 1 << 30
)

func newRing(m *ebpf.Map) (*ring, error) {
	size := int(m.MaxEntries())
	if m.Type() != ebpf.RingBuf || size == 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("map %s is not a ring buffer of a power-of-two size", m)
	}
	page := os.Getpagesize()
	cons, err := unix.Mmap(m.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping the ring buffer's consumer page: %w", err)
	}
	prod, err := unix.Mmap(m.FD(), int64(page), page+size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(cons)
		return nil, fmt.Errorf("mapping the ring buffer's data: %w", err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		unix.Munmap(cons)
		unix.Munmap(prod)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err == nil {
		// Edge-triggered: the ring is readable whenever it holds a record,
		// and level-triggered polling would wake us for every record the
		// kernel submits without a wakeup; we want its wakeups only.
		err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, m.FD(), &unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(m.FD())})
	}
	if err == nil {
		err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, efd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(efd)})
	}
	if err != nil {
		if efd > 0 {
			unix.Close(efd)
		}
		unix.Close(epfd)
		unix.Munmap(cons)
		unix.Munmap(prod)
		return nil, fmt.Errorf("epoll on the ring buffer: %w", err)
	}
	r := &ring{
		cons: cons, prod: prod,
		consPos: (*uint64)(unsafe.Pointer(&cons[0])),
		prodPos: (*uint64)(unsafe.Pointer(&prod[0])),
		data:    prod[page:],
		mask:    uint64(size - 1),
		epfd:    epfd,
		efd:     efd,
	}
	r.read = atomic.LoadUint64(r.consPos)
	return r, nil
}

// wait blocks until the kernel signals data past its wakeup threshold or
// the timeout passes; records below the threshold come without a signal,
// so callers read after either.
func (r *ring) wait(timeout time.Duration) error {
	n, err := unix.EpollWait(r.epfd, r.events[:], int(timeout.Milliseconds()))
	if err != nil && !errors.Is(err, unix.EINTR) {
		return fmt.Errorf("waiting on the ring buffer: %w", err)
	}
	for _, ev := range r.events[:max(n, 0)] {
		if int(ev.Fd) == r.efd {
			var b [8]byte
			unix.Read(r.efd, b[:])
		}
	}
	return nil
}

// interrupt ends a wait in progress (or the next one) at once.
func (r *ring) interrupt() {
	one := [8]byte{1}
	unix.Write(r.efd, one[:])
}

// next returns the next committed-by-the-kernel record after the last one
// handed out, as a view valid until the next call (into the ring, or a copy
// for a record that wraps its end), with the position just past it; ok is
// false when there is none (yet).
func (r *ring) next() (raw []byte, end uint64, ok bool) {
	prod := atomic.LoadUint64(r.prodPos)
	for r.read < prod {
		// The length word is written last by the kernel (with the busy bit
		// cleared): an atomic load orders the data read after it.
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[r.read&r.mask])))
		if hdr&ringBusyBit != 0 {
			return nil, r.read, false // reserved, not yet submitted
		}
		n := uint64(hdr &^ (ringBusyBit | ringDiscardBit))
		next := r.read + (ringHdrSize+n+7)&^7
		if next > prod {
			// Past what the kernel produced: no header it wrote says
			// that. Everything produced is given up, as one record
			// that does not decode (counted), rather than read from
			// past the ring's end or handed out twice.
			r.read = prod
			return nil, r.read, true
		}
		start := (r.read + ringHdrSize) & r.mask
		r.read = next
		if hdr&ringDiscardBit != 0 {
			continue
		}
		if start+n > uint64(len(r.data)) {
			// Headers are 8-byte aligned and the data is whole pages, so
			// only a record's body wraps.
			head := r.data[start:]
			r.wrapped = append(append(r.wrapped[:0], head...), r.data[:n-uint64(len(head))]...)
			r.wraps.Add(1)
			return r.wrapped, r.read, true
		}
		return r.data[start : start+n], r.read, true
	}
	return nil, r.read, false
}

// pending is the position the next commit would move the consumer to.
func (r *ring) pending() uint64 { return r.read }

// committed is the kernel's consumer position: everything before it is
// out for good.
func (r *ring) committed() uint64 { return atomic.LoadUint64(r.consPos) }

// commitTo releases everything before pos, a position handed out, to the
// kernel.
func (r *ring) commitTo(pos uint64) { atomic.StoreUint64(r.consPos, pos) }

// produced is the kernel's producer position: everything before it was
// reserved.
func (r *ring) produced() uint64 { return atomic.LoadUint64(r.prodPos) }

// backlog is how many bytes the kernel holds that were not handed out.
func (r *ring) backlog() uint64 { return atomic.LoadUint64(r.prodPos) - r.read }

func (r *ring) close() error {
	return errors.Join(unix.Close(r.efd), unix.Close(r.epfd), unix.Munmap(r.prod), unix.Munmap(r.cons))
}
