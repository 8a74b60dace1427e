package recording

import (
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/lattrace/lattrace/exporters/jsonl"
	"github.com/lattrace/lattrace/record"
)

// Writer writes a recording. Its record methods make it a tracer sink; it
// may be called from several goroutines. After a write error it drops
// what it is given (Err says why); Close reports the error.
type Writer struct {
	mu  sync.Mutex
	gz  *gzip.Writer
	j   *jsonl.Writer // the records' own JSON lines, into gz
	enc *json.Encoder // the lines of this package, into gz
	err error

	sampling Sampling
	flows    map[uint64]*flowSampling
	end      End
	// synced is when the compressed stream was last flushed to the file.
	synced record.Mono
}

type flowSampling struct {
	last record.Mono
	n    int
}

// maxSampledFlows bounds the per-flow sampling state: a flow whose close
// was lost must not pin memory for ever.
const maxSampledFlows = 1 << 16

// syncEvery is how often the compressed stream is flushed through to the
// file, so that a recorder killed mid-way leaves a file whose first part
// reads back.
const syncEvery = time.Second

// NewWriter writes h (format and version filled in) to out and returns a
// Writer for the rest. Zero sampling fields take DefaultSampling's.
func NewWriter(out io.Writer, h Header) (*Writer, error) {
	h.Sampling = h.Sampling.withDefaults()
	h.Format, h.Version = Format, Version
	// The fastest level: the recorder runs on the node it measures, and
	// repetitive JSON compresses well even so (about 10:1).
	gz, err := gzip.NewWriterLevel(out, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	w := &Writer{gz: gz, enc: json.NewEncoder(gz), sampling: h.Sampling, flows: map[uint64]*flowSampling{}}
	w.j = jsonl.New(gz)
	w.j.OnError = func(err error) { w.fail(err) }
	w.line(h)
	if err := w.syncLocked(); err != nil {
		return nil, err
	}
	return w, nil
}

// Exchange writes an exchange and samples its flow's RTT and window.
func (w *Writer) Exchange(e *record.Exchange) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	w.j.Exchange(e)
	w.end.Exchanges++
	w.sample(Sample{
		Time: e.End, Cookie: e.Cookie, Flow: e.Flow,
		SRTT: e.SRTT, MinRTT: e.MinRTT, PathRTT: e.PathRTT,
		Cwnd: e.CwndEnd, Rwnd: e.RwndEnd,
		Retransmits: e.Retransmits, RTOs: e.RTOs, CwndRestart: e.CwndRestart,
		Source: SourceExchange,
	})
}

// ConnOpen writes a connection's open.
func (w *Writer) ConnOpen(o record.ConnOpen) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.j.ConnOpen(o)
		w.end.ConnOpens++
	}
}

// ConnClose writes a connection's close and forgets its sampling state.
func (w *Writer) ConnClose(c record.ConnClose) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.j.ConnClose(c)
		w.end.ConnCloses++
	}
	delete(w.flows, c.Cookie)
}

// InFlight samples the exchanges in progress, as read from the kernel at
// now.
func (w *Writer) InFlight(ins []record.InFlight, now record.Mono) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range ins {
		in := &ins[i]
		if in.Start == 0 {
			continue // nothing exchanged yet: no window worth drawing
		}
		w.sample(Sample{Time: now, Cookie: in.Cookie, Flow: in.Flow, SRTT: in.SRTT, Cwnd: in.Cwnd, Source: SourceInFlight})
	}
}

// sample writes s if the bounds allow it. Caller holds mu.
func (w *Writer) sample(s Sample) {
	if w.err != nil {
		return
	}
	f := w.flows[s.Cookie]
	if f == nil {
		if len(w.flows) >= maxSampledFlows {
			w.end.SamplesDropped++
			return
		}
		f = &flowSampling{}
		w.flows[s.Cookie] = f
	}
	if f.n > 0 && !s.event() && s.Time < f.last+record.Mono(w.sampling.Interval) {
		w.end.SamplesThinned++
		return
	}
	if f.n >= w.sampling.MaxPerFlow || w.end.Samples >= uint64(w.sampling.Max) {
		w.end.SamplesDropped++
		return
	}
	f.n++
	if !s.event() || f.n == 1 {
		// An event sample does not move the regular ones.
		f.last = s.Time
	}
	w.end.Samples++
	w.line(struct {
		Type string `json:"type"`
		Sample
	}{TypeSample, s})
}

// Diagnoses writes the findings about one flow or peer pair.
func (w *Writer) Diagnoses(d Diagnoses) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	w.end.Diagnoses++
	w.line(struct {
		Type string `json:"type"`
		Diagnoses
	}{TypeDiagnoses, d})
}

// Flush passes what the records buffered on to the compressor and, once a
// second, through to the file: called after each drain of the tracer.
func (w *Writer) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.j.Flush()
	if now := record.Now(); w.err == nil && now >= w.synced+record.Mono(syncEvery) {
		w.synced = now
		w.fail(w.gz.Flush())
	}
}

// Err is the first write error.
func (w *Writer) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Counts returns the end line as it stands: what was written so far.
func (w *Writer) Counts() End {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.end
}

// Close writes the end line (its counts are the Writer's own; the caller
// gives the times and what was lost) and ends the compressed stream. It
// does not close the file underneath.
func (w *Writer) Close(end End) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	counts := w.end
	end.Exchanges, end.ConnOpens, end.ConnCloses = counts.Exchanges, counts.ConnOpens, counts.ConnCloses
	end.Samples, end.Diagnoses = counts.Samples, counts.Diagnoses
	end.SamplesThinned, end.SamplesDropped = counts.SamplesThinned, counts.SamplesDropped
	w.line(struct {
		Type string `json:"type"`
		End
	}{TypeEnd, end})
	if w.err == nil {
		w.fail(w.gz.Close())
	}
	if w.err != nil {
		return fmt.Errorf("writing the recording: %w", w.err)
	}
	return nil
}

// line writes one line of this package after the records buffered before
// it, so the file keeps the order of the calls. Caller holds mu.
func (w *Writer) line(v any) {
	w.j.Flush()
	if w.err == nil {
		w.fail(w.enc.Encode(v))
	}
}

func (w *Writer) syncLocked() error {
	if w.err == nil {
		w.fail(w.gz.Flush())
	}
	return w.err
}

func (w *Writer) fail(err error) {
	if err != nil && w.err == nil {
		w.err = err
	}
}
