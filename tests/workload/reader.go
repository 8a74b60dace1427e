package workload

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// timedReader reads messages from a connection and remembers when each byte
// left the socket: it only calls Read when its buffer is empty, so every
// buffered byte came from the same Read call, whose return time is fillNs.
// That makes "first byte read" and "last byte read" exact at the application
// level even when several pipelined messages arrive in one read.
type timedReader struct {
	r      io.Reader
	buf    []byte
	s, e   int
	fillNs int64 // MonoNow right after the Read that filled buf
	// callNs is MonoNow right before that Read, or before its system call
	// when r is a syscallReader: the kernel read the bytes between the two.
	callNs int64
	err    error // sticky error returned by Read along with data

	maxRead int             // cap on one Read (slow reader); 0: len(buf)
	gap     time.Duration   // sleep before each Read that continues a message
	done    <-chan struct{} // interrupts gap sleeps
	inMsg   bool            // a message is partly consumed

	consumed int64 // bytes handed out so far
}

const readBufSize = 64 << 10

func newTimedReader(r io.Reader, maxRead int, gap time.Duration, done <-chan struct{}) *timedReader {
	return &timedReader{r: r, buf: make([]byte, readBufSize), maxRead: maxRead, gap: gap, done: done}
}

// fill reads once into the empty buffer.
func (t *timedReader) fill() error {
	if t.err != nil {
		return t.err
	}
	if t.inMsg && t.gap > 0 {
		if !sleepChan(t.done, t.gap) {
			return errClosing
		}
	}
	n := len(t.buf)
	if t.maxRead > 0 && t.maxRead < n {
		n = t.maxRead
	}
	for {
		call := MonoNow()
		m, err := t.r.Read(t.buf[:n])
		if m > 0 {
			t.fillNs = MonoNow()
			t.callNs = call
			if sr, ok := t.r.(*syscallReader); ok {
				t.callNs = sr.callNs
			}
			t.s, t.e = 0, m
			t.err = err
			return nil
		}
		if err != nil {
			t.err = err
			return err
		}
	}
}

var errClosing = errors.New("workload: connection closing")

// syscallReader reads a TCP connection with read(2) itself, to know when
// the call that returned data started: the runtime's poller waits for data
// between calls, so a Read's start is long before the bytes were taken
// when they had not arrived yet.
type syscallReader struct {
	rc     syscall.RawConn
	callNs int64 // MonoNow before the last read(2)
}

// newSyscallReader reads conn through a syscallReader when it is a plain
// TCP connection, and as it is otherwise (TLS).
func newSyscallReader(conn net.Conn) io.Reader {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return conn
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return conn
	}
	return &syscallReader{rc: rc}
}

func (r *syscallReader) Read(p []byte) (int, error) {
	var n int
	var err error
	if rerr := r.rc.Read(func(fd uintptr) bool {
		r.callNs = MonoNow()
		n, err = unix.Read(int(fd), p)
		return err != unix.EAGAIN && err != unix.EINTR
	}); rerr != nil {
		return 0, rerr
	}
	switch {
	case err != nil:
		return 0, err
	case n == 0 && len(p) > 0:
		return 0, io.EOF
	}
	return n, nil
}

// readHeader reads one header. firstNs is the time of the Read that returned
// its first byte. It returns io.EOF when the stream ended cleanly before the
// header, io.ErrUnexpectedEOF when it ended inside it.
func (t *timedReader) readHeader() (h Header, firstNs int64, err error) {
	var hb [HeaderSize]byte
	t.inMsg = false
	got := 0
	for got < HeaderSize {
		if t.s == t.e {
			if err := t.fill(); err != nil {
				if err == io.EOF && got > 0 {
					err = io.ErrUnexpectedEOF
				}
				return Header{}, firstNs, err
			}
		}
		if got == 0 {
			firstNs = t.fillNs
			t.inMsg = true
		}
		c := copy(hb[got:], t.buf[t.s:t.e])
		t.s += c
		got += c
		t.consumed += int64(c)
	}
	h, err = ParseHeader(hb[:])
	return h, firstNs, err
}

// discard consumes n more bytes of the current message and returns the time
// of the Read that returned the last of them (or of the header's last byte
// when n is 0).
func (t *timedReader) discard(n int64) (lastNs int64, err error) {
	t.inMsg = true
	for n > 0 {
		if t.s == t.e {
			if err := t.fill(); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return 0, err
			}
		}
		c := int64(t.e - t.s)
		if c > n {
			c = n
		}
		t.s += int(c)
		n -= c
		t.consumed += c
	}
	t.inMsg = false
	return t.fillNs, nil
}

// drain consumes everything until the stream ends; it returns the bytes
// consumed, the time of the last Read that returned data (0 if none), and
// the error that ended the stream (io.EOF for a clean end).
func (t *timedReader) drain() (n int64, lastNs int64, err error) {
	t.inMsg = true
	if t.s < t.e {
		n = int64(t.e - t.s)
		t.consumed += n
		lastNs = t.fillNs
		t.s = t.e
	}
	for {
		if err := t.fill(); err != nil {
			return n, lastNs, err
		}
		m := int64(t.e - t.s)
		n += m
		t.consumed += m
		lastNs = t.fillNs
		t.s = t.e
	}
}
