package recording

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/fuzz"
)

// readBound is what reading a recording may allocate: its two 1 MiB
// buffers, the decompressor and the batches in flight (the fixed part),
// and per byte of JSON lines the line's copy and what the line decodes
// into. The largest value per byte of text is an element of a list: a
// diagnosis (120 bytes) from the 3 bytes of "{},", twice over as its slice
// grows by doubling, 80 bytes per byte.
var readBound = fuzz.Bound{PerByte: 128, Fixed: 8 * fuzz.MiB}

// FuzzRead reads the JSON lines of a recording, compressed as the writer
// compresses them, so that the fuzzer works on the lines rather than on
// gzip's checksums. What it accepts, the writer writes back to the same
// records.
func FuzzRead(f *testing.F) {
	seeds := map[string][]any{}
	for name, file := range seedRecordings(f) {
		seeds[name] = []any{gunzip(f, file)}
	}
	fuzz.Seeds(f, seeds)
	f.Fuzz(func(t *testing.T, lines []byte) {
		file := gzipped(lines)
		var got contents
		var hdr Header
		var end End
		var err error
		fuzz.Alloc(t, len(lines), readBound, func() { hdr, end, err = Read(bytes.NewReader(file), got.handler()) })
		fuzz.OneLine(t, err)
		if err != nil {
			return
		}
		again := rewrite(t, hdr, end, &got)
		var back contents
		hdr2, end2, err := Read(bytes.NewReader(again), back.handler())
		if err != nil {
			t.Fatalf("the writer's copy of an accepted recording does not read back: %v", err)
		}
		// The writer fills in the sampling a header leaves out.
		hdr.Sampling = hdr.Sampling.withDefaults()
		sameJSON(t, "header", hdr, hdr2)
		sameJSON(t, "end line's time and losses", End{Ended: end.Ended, EndedWall: end.EndedWall, Lost: end.Lost},
			End{Ended: end2.Ended, EndedWall: end2.EndedWall, Lost: end2.Lost})
		sameJSON(t, "records", got.records, back.records)
	})
}

// FuzzReadGzip reads a recording's file as it is: gzip's header, blocks,
// checksums and trailer as well as the lines.
func FuzzReadGzip(f *testing.F) {
	seeds := map[string][]any{}
	for name, file := range seedRecordings(f) {
		seeds[name] = []any{file}
	}
	// A line of 8 MiB in 8 kB: refused at 1 MiB (TestLongLine).
	seeds["long-line"] = []any{gzipped([]byte(`{"format":"lattrace-recording","version":1}` + "\n" + `{"type":"exchange","x":"` + strings.Repeat("a", 8<<20)))}
	fuzz.Seeds(f, seeds)
	f.Fuzz(func(t *testing.T, file []byte) {
		// The lines the file holds bound what reading it may take; a few
		// kilobytes of gzip may hold megabytes of them.
		n := len(file) + decompressedLen(file)
		var err error
		var got contents
		fuzz.Alloc(t, n, readBound, func() { _, _, err = Read(bytes.NewReader(file), got.handler()) })
		fuzz.OneLine(t, err)
	})
}

// seedRecordings are recordings as the writer writes them: a whole one with
// a record of every type, one without its end line, and an empty one.
func seedRecordings(f *testing.F) map[string][]byte {
	flow := record.Flow{Local: netip.MustParseAddrPort("10.0.0.1:40000"), Remote: netip.MustParseAddrPort("[fd00::2]:443"), Netns: 4026531840}
	hdr := Header{LattraceVersion: "v0.3", Host: "node-1", Kernel: "6.18.0", Started: time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC),
		StartedMono: 336171877029, Duration: time.Minute, Notes: []string{"tx timestamps: off"}}
	whole := func(w *Writer) {
		w.ConnOpen(record.ConnOpen{Time: 336171877030, Cookie: 7, Flow: flow, Role: record.RoleClient, ConnectLatency: time.Millisecond})
		for i := range 3 {
			e := exchange(7, record.Mono(336171877029+int64(i+1)*int64(time.Second)), uint32(i%2))
			e.Flow = flow
			e.Stream = &record.HTTP2Stream{ID: uint32(2*i + 1), DataOut: 1, DataIn: 2}
			w.Exchange(e)
		}
		w.InFlight([]record.InFlight{{Cookie: 7, Flow: flow, Start: 336171877029 + 5e9, SRTT: time.Millisecond, Cwnd: 10}}, 336171877029+6e9)
		w.ConnClose(record.ConnClose{Time: 336171877029 + 7e9, Cookie: 7, Flow: flow, Role: record.RoleClient, SendCalls: 3,
			HTTP2: &record.HTTP2Frames{Frames: map[string]uint64{"HEADERS": 6, "DATA": 9, "other": 1}}})
		fk := record.FlowKey{Flow: flow, Cookie: 7}
		w.Diagnoses(Diagnoses{Scope: ScopeFlow, Flow: &fk, Exchanges: 3, Diagnoses: exchange(7, 1, 0).Diagnoses})
	}
	out := map[string][]byte{}
	for name, c := range map[string]struct {
		body func(*Writer)
		end  bool
	}{"whole": {whole, true}, "cut-short": {whole, false}, "empty": {func(*Writer) {}, true}} {
		var buf bytes.Buffer
		w, err := NewWriter(&buf, hdr)
		if err != nil {
			f.Fatal(err)
		}
		c.body(w)
		if !c.end {
			w.Flush()
			w.gz.Flush()
			out[name] = bytes.Clone(buf.Bytes())
			continue
		}
		if err := w.Close(End{Ended: 336171877029 + 8e9, EndedWall: hdr.Started.Add(8 * time.Second), Lost: map[string]uint64{"ringbuf_full": 2}}); err != nil {
			f.Fatal(err)
		}
		out[name] = buf.Bytes()
	}
	return out
}

// contents collects the records a recording holds, in file order, each
// with the type of its line. Samples are left out: the writer makes its own
// from the exchanges, and has no method to write one as it is.
type contents struct {
	records []any
}

type typed struct {
	Type string `json:"type"`
	V    any    `json:"v"`
}

func (l *contents) handler() Handler {
	add := func(typ string, v any) { l.records = append(l.records, typed{typ, v}) }
	return Handler{
		Exchange:  func(e *record.Exchange) { add("exchange", e) },
		ConnOpen:  func(o *record.ConnOpen) { add("conn_open", o) },
		ConnClose: func(c *record.ConnClose) { add("conn_close", c) },
		Diagnoses: func(d *Diagnoses) { add("diagnoses", d) },
	}
}

// rewrite writes what a recording held with the writer.
func rewrite(t *testing.T, hdr Header, end End, got *contents) []byte {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, hdr)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range got.records {
		switch v := r.(typed).V.(type) {
		case *record.Exchange:
			w.Exchange(v)
		case *record.ConnOpen:
			w.ConnOpen(*v)
		case *record.ConnClose:
			w.ConnClose(*v)
		case *Diagnoses:
			w.Diagnoses(*v)
		}
	}
	if err := w.Close(end); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sameJSON fails t when a and b encode differently: the records' JSON is
// the format, so two values that encode alike are the same record.
func sameJSON(t *testing.T, what string, a, b any) {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if !bytes.Equal(ja, jb) {
		t.Fatalf("%s changed through the writer:\n read %s\nagain %s", what, ja, jb)
	}
}

// gzipper is gzipped's compressor, made once: a new one costs more than
// reading most inputs.
var gzipper = gzip.NewWriter(nil)

func gzipped(b []byte) []byte {
	var buf bytes.Buffer
	gzipper.Reset(&buf)
	gzipper.Write(b)
	gzipper.Close()
	return buf.Bytes()
}

func gunzip(tb testing.TB, b []byte) []byte {
	r, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		tb.Fatal(err)
	}
	out, err := io.ReadAll(r)
	if err != nil && err != io.ErrUnexpectedEOF {
		tb.Fatal(err)
	}
	return out
}

// decompressedLen is how many bytes the file's one gzip stream holds, as
// far as it reads.
func decompressedLen(file []byte) int {
	r, err := gzip.NewReader(bytes.NewReader(file))
	if err != nil {
		return 0
	}
	r.Multistream(false)
	n, _ := io.Copy(io.Discard, r)
	return int(n)
}
