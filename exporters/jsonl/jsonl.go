// Package jsonl writes lattrace records as JSON lines: one object per record,
// with a "type" field naming it. It is the output that needs nothing but a
// file, so it is what `lattrace daemon --output jsonl` and the tests read.
package jsonl

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"

	"github.com/lattrace/lattrace/record"
)

// Writer encodes records to an io.Writer, buffered until Flush, which
// writes the whole batch with one call: a daemon killed between two drains
// has written whole drains, which is what lets the next one resume exactly
// where it stopped (tracer.Resume).
type Writer struct {
	mu      sync.Mutex
	out     io.Writer
	buf     bytes.Buffer
	enc     *json.Encoder
	err     error
	dropped uint64
	lines   uint64 // in buf
	// OnError, if set, is called once, with the first write error.
	OnError func(error)
}

// New returns a Writer on w.
func New(w io.Writer) *Writer {
	x := &Writer{out: w}
	x.enc = json.NewEncoder(&x.buf)
	return x
}

// Line types, the "type" field of each JSON object.
const (
	TypeExchange  = "exchange"
	TypeConnOpen  = "conn_open"
	TypeConnClose = "conn_close"
)

type exchangeLine struct {
	Type string `json:"type"`
	*record.Exchange
}

type connOpenLine struct {
	Type string `json:"type"`
	record.ConnOpen
}

// Exchange writes one exchange line.
func (w *Writer) Exchange(e *record.Exchange) { w.write(exchangeLine{TypeExchange, e}) }

// ConnOpen writes one conn_open line.
func (w *Writer) ConnOpen(c record.ConnOpen) { w.write(connOpenLine{TypeConnOpen, c}) }

type connCloseLine struct {
	Type string `json:"type"`
	record.ConnClose
	LifetimeNs int64 `json:"lifetime_ns,omitempty"`
}

// ConnClose writes one conn_close line.
func (w *Writer) ConnClose(c record.ConnClose) {
	w.write(connCloseLine{Type: TypeConnClose, ConnClose: c, LifetimeNs: int64(c.Lifetime())})
}

func (w *Writer) write(v any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		w.dropped++
		return
	}
	w.lines++
	w.fail(w.enc.Encode(v))
}

func (w *Writer) fail(err error) {
	if err == nil {
		return
	}
	w.err = err
	w.dropped++
	if w.OnError != nil {
		w.OnError(err)
	}
}

// Flush writes out what is buffered.
func (w *Writer) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && w.buf.Len() > 0 {
		if _, err := w.out.Write(w.buf.Bytes()); err != nil {
			w.fail(err)
			w.dropped += w.lines - 1 // the batch's lines, fail counted one
		}
	}
	w.buf.Reset()
	w.lines = 0
	// A burst's buffer is not kept for the quiet that follows.
	if w.buf.Cap() > maxKeptBuffer {
		w.buf = bytes.Buffer{}
	}
}

const maxKeptBuffer = 4 << 20

// Sync reports whether everything taken so far was written (the first
// write error, if any): lines are written at Flush, so it answers at once.
func (w *Writer) Sync(done func(error)) { done(w.Err()) }

// Dropped counts the records not written because of an error.
func (w *Writer) Dropped() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dropped
}

// Err reports the first write error; after one, the Writer drops records
// and counts them (Dropped) rather than blocking the tracer.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}
