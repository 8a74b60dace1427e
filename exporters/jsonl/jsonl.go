// Package jsonl writes lattrace records as JSON lines: one object per record,
// with a "type" field naming it. It is the output that needs nothing but a
// file, so it is what `lattrace daemon --output jsonl` and the tests read.
package jsonl

import (
	"bufio"
	"encoding/json"
	"io"
	"sync"

	"github.com/lattrace/lattrace/daemon/record"
)

// Writer encodes records to an io.Writer, buffered until Flush.
type Writer struct {
	mu      sync.Mutex
	buf     *bufio.Writer
	enc     *json.Encoder
	err     error
	dropped uint64
	// OnError, if set, is called once, with the first write error.
	OnError func(error)
}

// New returns a Writer on w.
func New(w io.Writer) *Writer {
	buf := bufio.NewWriterSize(w, 64*1024)
	return &Writer{buf: buf, enc: json.NewEncoder(buf)}
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
	if w.err == nil {
		w.fail(w.buf.Flush())
	}
}

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
