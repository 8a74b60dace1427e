package tracer

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/lattrace/lattrace/daemon/streams"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/fuzz"
)

// drainBound is what draining one ring's worth of records may allocate:
// per byte, a record's share of what decoding it makes (an exchange handed
// on, a connection the HTTP/2 assembler starts: a few hundred bytes for a
// record of at least 64), and a fixed part for the tracer's tables and a
// record that wraps the ring's end.
var drainBound = fuzz.Bound{PerByte: 64, Fixed: fuzz.MiB}

// FuzzRing drains a ring buffer holding the given bytes as produced by the
// kernel: records framed by its 8-byte headers, each decoded into what it
// claims to be and the HTTP/2 events handed to the stream assembler, as
// Run drains a ring pinned by another version or written by programs gone
// wrong. The drain reads up to what was produced and stops there (or at a
// record still being written); whatever it hands on was decoded.
func FuzzRing(f *testing.F) {
	if fuzz.Writing() {
		fuzz.Seeds(f, ringSeeds(f))
	}
	f.Fuzz(func(t *testing.T, produced []byte) {
		tr := &Tracer{streams: streams.New(), ring: memRing(produced)}
		var sink counting
		fuzz.Alloc(t, len(produced), drainBound, func() {
			tr.drain(&sink)
			tr.streams.Stop(sink.Exchange)
		})
		if read, prod := tr.ring.pending(), *tr.ring.prodPos; read != prod && !busyAt(tr.ring, read) {
			t.Fatalf("the drain stopped %d bytes short of what was produced, at no record in progress", prod-read)
		}
		// Each record decoded is an exchange, an open, a close, an
		// HTTP/2 event or an exchange its streams replace; the
		// assembler's exchanges are its own.
		handed := uint64(sink.exchanges+sink.opens+sink.closes) - tr.streams.Stats.Streams.Load()
		if handed > tr.decoded.Load() {
			t.Fatalf("%d records handed on, %d decoded", handed, tr.decoded.Load())
		}
	})
}

// memStart is where memRing's records begin: a few records before the
// end of the ring, so that a longer input wraps it.
const memStart = 4096 - 512

// memRing is a ring buffer of a power of two bytes, a page at least, in
// memory, holding produced from memStart on as the kernel lays records
// out: its positions count bytes from the ring's creation, and the data
// wraps its end.
func memRing(produced []byte) *ring {
	size := uint64(4096)
	for size < uint64(len(produced)) {
		size *= 2
	}
	// The kernel's pages are page-aligned: 8 bytes are what a record's
	// header needs.
	words := make([]uint64, size/8)
	data := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size)
	for i, b := range produced {
		data[(memStart+uint64(i))&(size-1)] = b
	}
	cons, prod := uint64(memStart), uint64(memStart+len(produced))
	return &ring{consPos: &cons, prodPos: &prod, data: data, mask: size - 1, read: memStart}
}

// busyAt reports whether the record at pos is one the kernel is still
// writing, where a drain stops.
func busyAt(r *ring, pos uint64) bool {
	return binary.LittleEndian.Uint32(r.data[pos&r.mask:])&ringBusyBit != 0
}

// counting counts what a drain hands on.
type counting struct {
	exchanges, opens, closes int
}

func (c *counting) Exchange(*record.Exchange)  { c.exchanges++ }
func (c *counting) ConnOpen(record.ConnOpen)   { c.opens++ }
func (c *counting) ConnClose(record.ConnClose) { c.closes++ }
func (c *counting) Flush()                     {}

// ringSeeds are records the programs wrote, framed as the ring held them:
// a tracer follows a plain TCP conversation and an HTTP/2 one over
// loopback, and the records of each make a seed.
func ringSeeds(f *testing.F) map[string][]any {
	tr, err := Open(Options{})
	if err != nil {
		f.Fatalf("Open: %v (the seeds are a tracer's records: run as root)", err)
	}
	defer tr.Close()
	cases := map[string]h2Case{}
	for _, c := range h2Cases() {
		switch c.name {
		case "headers cut at every offset":
			cases["http2"] = c
		case "preface cut in two": // not HTTP/2: a plain conversation
			cases["plain-tcp"] = c
		}
	}
	ports := map[string][]uint16{}
	for name, c := range cases {
		client, server := runH2(f, c)
		ports[name] = []uint16{client.Port(), server.Port()}
	}
	// The last records, the closes', are made as the sockets close.
	time.Sleep(200 * time.Millisecond)
	produced := map[string][]byte{}
	for {
		raw, _, ok := tr.ring.next()
		if !ok {
			break
		}
		for name, ps := range ports {
			// Every record has the flow where an open has it.
			if x, ok := view[lattraceLtConnOpen](raw); ok && (slices.Contains(ps, x.Flow.Sport) || slices.Contains(ps, x.Flow.Dport)) {
				produced[name] = binary.LittleEndian.AppendUint32(produced[name], uint32(len(raw)))
				produced[name] = append(produced[name], 0, 0, 0, 0)
				produced[name] = append(produced[name], raw...)
				produced[name] = append(produced[name], make([]byte, -len(raw)&7)...)
			}
		}
	}
	seeds := map[string][]any{}
	for name, p := range produced {
		seeds[name] = []any{p}
	}
	if len(seeds) != len(cases) {
		f.Fatalf("records of %d conversations read, want %d", len(seeds), len(cases))
	}
	return seeds
}
