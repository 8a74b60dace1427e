package recording

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"

	"github.com/lattrace/lattrace/exporters/jsonl"
	"github.com/lattrace/lattrace/record"
)

// Handler receives a recording's lines in file order; nil fields skip
// their lines (which are then not even decoded).
type Handler struct {
	// Header is called first, once the header is read and accepted.
	Header    func(*Header)
	Exchange  func(*record.Exchange)
	ConnOpen  func(*record.ConnOpen)
	ConnClose func(*record.ConnClose)
	Sample    func(*Sample)
	Diagnoses func(*Diagnoses)
}

// ReadFile reads the recording at path; see Read.
func ReadFile(path string, h Handler) (Header, End, error) {
	f, err := os.Open(path)
	if err != nil {
		return Header{}, End{}, err
	}
	defer f.Close()
	hdr, end, err := Read(f, h)
	if err != nil {
		return hdr, end, fmt.Errorf("%s: %w", path, err)
	}
	return hdr, end, nil
}

// ErrTruncated: the file ends before its end line.
var ErrTruncated = errors.New("the recording is cut short (no end line: the recorder was killed or its disk filled)")

// Read decodes a recording from r, handing each line to h, and returns its
// header and end line. It fails on anything but a whole recording of a
// version it knows: not gzip, no header, a newer version, a line that is
// not JSON, or a missing end line (ErrTruncated). Lines are decoded on
// every CPU and delivered in order.
func Read(r io.Reader, h Handler) (Header, End, error) {
	var hdr Header
	var end End
	gz, err := gzip.NewReader(bufio.NewReaderSize(r, 1<<20))
	if err != nil {
		if errors.Is(err, gzip.ErrHeader) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return hdr, end, errors.New("not a lattrace recording (not gzip-compressed; write one with lattrace record)")
		}
		return hdr, end, err
	}
	// One stream: a concatenated second one would not be ours.
	gz.Multistream(false)
	// A line is read whole into this buffer: one that does not fit is
	// refused, so a few kilobytes of gzip that inflate to a line of
	// gigabytes cost no more than the buffer.
	br := bufio.NewReaderSize(gz, maxLine)
	first, err := br.ReadSlice('\n')
	if err != nil && len(first) == 0 {
		return hdr, end, readErr(err, 0)
	}
	if err := json.Unmarshal(first, &hdr); err != nil || hdr.Format != Format {
		return hdr, end, errors.New("not a lattrace recording (its first line is not a lattrace-recording header)")
	}
	if hdr.Version < 1 || hdr.Version > Version {
		return hdr, end, fmt.Errorf("a version %d recording; this lattrace reads version %d (use the lattrace that wrote it, or a newer one)", hdr.Version, Version)
	}

	if h.Header != nil {
		h.Header(&hdr)
	}
	d := &decoder{h: h, quit: make(chan struct{})}
	// Nothing of the reading outlives Read, even when it gives up early:
	// the caller may close the file.
	defer d.wg.Wait()
	defer close(d.quit)
	batches := make(chan *batch, 2*runtime.GOMAXPROCS(0))
	readErrc := make(chan error, 1)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		readErrc <- d.split(br, batches)
	}()
	sawEnd := false
	for b := range batches {
		<-b.done
		for i := range b.items {
			it := &b.items[i]
			if it.err != nil {
				return hdr, end, fmt.Errorf("line %d: %w", b.firstLine+i, it.err)
			}
			if sawEnd {
				return hdr, end, fmt.Errorf("line %d: a line after the end line", b.firstLine+i)
			}
			if it.end != nil {
				end, sawEnd = *it.end, true
				continue
			}
			d.deliver(it)
		}
	}
	if err := <-readErrc; err != nil {
		return hdr, end, err
	}
	if !sawEnd {
		return hdr, end, ErrTruncated
	}
	return hdr, end, nil
}

func readErr(err error, line int) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return ErrTruncated
	}
	return fmt.Errorf("after line %d: the recording is corrupt: %w", line, err)
}

type decoder struct {
	h Handler
	// quit stops the splitter when the reader gives up early; wg counts
	// the splitter and the batches it is decoding.
	quit chan struct{}
	wg   sync.WaitGroup
}

// batch is a run of lines decoded together; done closes when items are
// ready.
type batch struct {
	firstLine int
	lines     [][]byte
	items     []item
	done      chan struct{}
}

type item struct {
	exchange  *record.Exchange
	connOpen  *record.ConnOpen
	connClose *record.ConnClose
	sample    *Sample
	diagnoses *Diagnoses
	end       *End
	err       error
}

// A batch is sent to be decoded once it holds batchLines lines or
// batchBytes bytes: the batches in flight, a few per CPU, hold a bounded
// part of the file whatever its lines' lengths.
const (
	batchLines = 512
	batchBytes = 1 << 20
)

// maxLine is the longest line read: hundreds of times the longest line
// lattrace writes (an exchange or a list of diagnoses, a few kilobytes).
const maxLine = 1 << 20

// split reads lines into batches, starts each one's decoding and queues it
// in file order.
func (d *decoder) split(br *bufio.Reader, out chan<- *batch) error {
	defer close(out)
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	line := 2 // the header was line 1
	b := &batch{firstLine: line, done: make(chan struct{})}
	size := 0
	send := func() bool {
		select {
		case sem <- struct{}{}:
		case <-d.quit:
			return false
		}
		d.wg.Add(1)
		go func(b *batch) {
			defer d.wg.Done()
			d.decode(b)
			close(b.done)
			<-sem
		}(b)
		select {
		case out <- b:
			return true
		case <-d.quit:
			return false
		}
	}
	for {
		select {
		case <-d.quit:
			return nil
		default:
		}
		l, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if len(b.lines) > 0 {
				send()
			}
			return fmt.Errorf("line %d: the recording is corrupt: longer than %d MiB, which no line lattrace writes is", line, maxLine>>20)
		}
		if len(l) > 0 {
			if l[len(l)-1] != '\n' {
				// A last line without its newline: cut off mid-write.
				if len(b.lines) > 0 {
					send()
				}
				return ErrTruncated
			}
			// The reader's buffer is reused: the batch keeps a copy.
			b.lines = append(b.lines, bytes.Clone(l))
			size += len(l)
			line++
			if len(b.lines) == batchLines || size >= batchBytes {
				if !send() {
					return nil
				}
				b = &batch{firstLine: line, done: make(chan struct{})}
				size = 0
			}
		}
		if err != nil {
			if len(b.lines) > 0 {
				send()
			}
			if err == io.EOF {
				return nil
			}
			return readErr(err, line-1)
		}
	}
}

var (
	prefixExchange  = []byte(`{"type":"` + jsonl.TypeExchange + `"`)
	prefixConnOpen  = []byte(`{"type":"` + jsonl.TypeConnOpen + `"`)
	prefixConnClose = []byte(`{"type":"` + jsonl.TypeConnClose + `"`)
	prefixSample    = []byte(`{"type":"` + TypeSample + `"`)
	prefixDiagnoses = []byte(`{"type":"` + TypeDiagnoses + `"`)
	prefixEnd       = []byte(`{"type":"` + TypeEnd + `"`)
)

// decode decodes the lines the handler wants. Every line writer of this
// format puts "type" first, so the prefix tells the type without a second
// decoding.
func (d *decoder) decode(b *batch) {
	b.items = make([]item, len(b.lines))
	for i, l := range b.lines {
		it := &b.items[i]
		switch {
		case bytes.HasPrefix(l, prefixExchange):
			it.exchange, it.err = decodeIf[record.Exchange](l, d.h.Exchange != nil)
		case bytes.HasPrefix(l, prefixSample):
			it.sample, it.err = decodeIf[Sample](l, d.h.Sample != nil)
		case bytes.HasPrefix(l, prefixConnOpen):
			it.connOpen, it.err = decodeIf[record.ConnOpen](l, d.h.ConnOpen != nil)
		case bytes.HasPrefix(l, prefixConnClose):
			it.connClose, it.err = decodeIf[record.ConnClose](l, d.h.ConnClose != nil)
		case bytes.HasPrefix(l, prefixDiagnoses):
			it.diagnoses, it.err = decodeIf[Diagnoses](l, d.h.Diagnoses != nil)
		case bytes.HasPrefix(l, prefixEnd):
			it.end, it.err = decodeIf[End](l, true)
		default:
			// A type this version does not know is skipped, as long as
			// the line is JSON at all.
			if !json.Valid(l) {
				it.err = errors.New("the recording is corrupt: not a JSON line")
			}
		}
		if it.err != nil && !errors.Is(it.err, ErrTruncated) {
			var se *json.SyntaxError
			if errors.As(it.err, &se) {
				it.err = fmt.Errorf("the recording is corrupt: %w", it.err)
			}
		}
	}
	b.lines = nil
}

// decodeIf decodes line l into a new T when want, and is nil otherwise: a
// line no handler takes costs no decoding.
func decodeIf[T any](l []byte, want bool) (*T, error) {
	if !want {
		return nil, nil
	}
	v := new(T)
	return v, json.Unmarshal(l, v)
}

func (d *decoder) deliver(it *item) {
	switch {
	case it.exchange != nil:
		d.h.Exchange(it.exchange)
	case it.sample != nil:
		d.h.Sample(it.sample)
	case it.connOpen != nil:
		d.h.ConnOpen(it.connOpen)
	case it.connClose != nil:
		d.h.ConnClose(it.connClose)
	case it.diagnoses != nil:
		d.h.Diagnoses(it.diagnoses)
	}
}
