package aggregate

import (
	"encoding/binary"
	"errors"
	"math"
	"math/bits"
	"net/netip"
	"reflect"
	"time"
	"unsafe"

	enc "github.com/DataDog/sketches-go/ddsketch/encoding"

	"github.com/lattrace/lattrace/record"
)

// A flow outside the Config.ActiveFlows most recently updated is packed:
// its state encoded into one byte slice of a few hundred bytes, where an
// unpacked entry with its sketches and pending rows takes kilobytes. A node
// holds tens of thousands of connections and most are idle at any moment
// (a pool's spare connections, keep-alives): every one stays listed, and
// its next record unpacks it exactly as it was. Packing is lossless, so a
// packed flow's snapshot is the one it would have had unpacked.

// packedFlow is a packed flow: what Expire and the writer need without
// decoding, the pointers it shares with other records, and the bytes.
type packedFlow struct {
	lastUpdate, closedAt record.Mono
	// close is the connection's ConnClose, nil while it is open: a closed
	// flow is retired after CloseGrace, so this memory is short-lived.
	close             *record.ConnClose
	ownerK8s, peerK8s *record.K8s
	// peer and peerGen are the flow's pair as livePeer checks it.
	peer    *peerEntry
	peerGen uint64
	// p50 and p99 are the duration's quantiles, which a list orders by
	// (FlowRow): computing them means decoding the sketches.
	p50, p99 time.Duration
	b        []byte
}

// pack encodes f, in scratch (returned for the next call); the caller
// removes f from the unpacked table. f's pending rows are folded first.
func (f *flowEntry) pack(c *sketchCfg, scratch []byte) (packedFlow, []byte) {
	f.m.fold(c)
	p := packedFlow{
		lastUpdate: f.lastUpdate, closedAt: f.closedAt,
		ownerK8s: f.owner.K8s, peerK8s: f.peerK8s,
		peer: f.peer, peerGen: f.peerGen,
	}
	p.p50, p.p99 = f.m.durationQuantiles(c)
	if f.closed {
		cl := f.close
		p.close = &cl
	}
	w := packer{b: scratch[:0]}
	w.key(f.key)
	w.uint(uint64(f.owner.PID))
	w.uint(uint64(f.owner.TID))
	w.uint(f.owner.CgroupID)
	w.str(f.owner.Comm)
	w.str(f.owner.ContainerID)
	w.str(string(f.connRole))
	w.str(string(f.roleSource))
	w.str(f.http2Framing)
	w.str(string(f.side))
	// The pair's key is the flow's and its owner's (attribute) unless the
	// flow is not attributed yet or its owner changed since: one byte says
	// which.
	if pk := &f.peerKey; *pk == record.PeerKeyOf(f.key.Flow, f.side, &f.owner) {
		w.uint(0)
	} else {
		w.uint(1)
		w.uint(uint64(pk.Netns))
		w.str(pk.Comm)
		w.uint(pk.CgroupID)
		w.str(string(pk.Side))
		w.uint(uint64(pk.LocalPort))
		w.addr(pk.Remote)
		w.uint(uint64(pk.RemotePort))
	}
	w.uint(uint64(f.opened))
	w.int(int64(f.connectLatency))
	w.int(int64(f.handshakeRTT))
	w.uint(uint64(f.burst.turns))
	w.uint(uint64(f.burst.exchanges))
	rw := &f.rate
	w.uint(rw.cur)
	w.uint(rw.prev)
	w.uint(uint64(rw.curAt))
	w.uint(uint64(rw.prevAt))
	hasPrev := uint64(0)
	if rw.hasPrev {
		hasPrev = 1
	}
	w.uint(hasPrev)
	w.str(f.m.cc)
	w.zeroRuns(wordsOf(&f.m.sc), scalarFloats)
	for i := range f.m.sk {
		w.exact(&f.m.sk[i].exactStats)
	}
	for i := range f.m.sk {
		st := f.m.sk[i].st
		if st == nil || st.IsEmpty() {
			w.uint(0)
			continue
		}
		// The length goes first: encode behind a two-byte hole, which
		// holds any store of a flow's few bins (up to 16 KiB).
		at := len(w.b)
		w.b = append(w.b, 0, 0)
		st.Encode(&w.b, enc.FlagTypePositiveStore)
		n := len(w.b) - at - 2
		if n >= 1<<14 {
			// Larger: move it behind a longer length.
			sb := append([]byte(nil), w.b[at+2:]...)
			w.b = w.b[:at]
			w.uint(uint64(n))
			w.b = append(w.b, sb...)
			continue
		}
		w.b[at], w.b[at+1] = byte(n)|0x80, byte(n>>7) // a two-byte uvarint
	}
	// The slice is kept for as long as the flow stays packed: no spare
	// capacity.
	p.b = append(make([]byte, 0, len(w.b)), w.b...)
	return p, w.b
}

// key decodes only the flow's key.
func (p *packedFlow) key() (record.FlowKey, error) {
	r := unpacker{b: p.b}
	k := r.key()
	return k, r.err
}

// row decodes what a list filters and orders p by (FlowRow): its bytes up
// to its scalars, not its sketches.
func (p *packedFlow) row(out *FlowRow) error {
	r := unpacker{b: p.b}
	out.FlowKey = r.key()
	out.Owner = record.Owner{
		PID: uint32(r.uint()), TID: uint32(r.uint()), CgroupID: r.uint(),
		Comm: r.str(), ContainerID: r.str(), K8s: p.ownerK8s,
	}
	r.str() // the connection's role
	r.str() // and how it was told
	r.str() // HTTP/2's framing
	side := record.Role(r.str())
	switch r.uint() {
	case 0:
		out.Peer = record.PeerKeyOf(out.Flow, side, &out.Owner)
	case 1:
		out.Peer = record.PeerKey{
			Netns: uint32(r.uint()), Comm: r.str(), CgroupID: r.uint(), Side: record.Role(r.str()),
			LocalPort: uint16(r.uint()), Remote: r.addr(), RemotePort: uint16(r.uint()),
		}
	default:
		r.fail()
	}
	r.uint() // opened
	r.int()  // connect latency
	r.int()  // handshake RTT
	r.uint() // the burst's turns
	r.uint() // and exchanges
	out.rate = rateWindow{cur: r.uint(), prev: r.uint(), curAt: record.Mono(r.uint()), prevAt: record.Mono(r.uint()), hasPrev: r.uint() == 1}
	r.str() // congestion control
	var sc scalars
	r.zeroRuns(wordsOf(&sc), scalarFloats)
	out.setScalars(&sc)
	out.P50, out.P99 = p.p50, p.p99
	return r.err
}

// unpack restores p into f, a reset entry (removeFlow's or a new one).
func (p *packedFlow) unpack(f *flowEntry, c *sketchCfg) (err error) {
	// sketches-go's decoding trusts its input and can panic on bytes
	// that are not a store's: a corrupt flow is an error, never a crash.
	defer func() {
		if recover() != nil {
			err = errPacked
		}
	}()
	r := unpacker{b: p.b}
	f.key = r.key()
	f.owner = record.Owner{
		PID: uint32(r.uint()), TID: uint32(r.uint()), CgroupID: r.uint(),
		Comm: r.str(), ContainerID: r.str(), K8s: p.ownerK8s,
	}
	f.connRole = record.Role(r.str())
	f.roleSource = record.RoleSource(r.str())
	f.http2Framing = r.str()
	f.side = record.Role(r.str())
	switch r.uint() {
	case 0:
		f.peerKey = record.PeerKeyOf(f.key.Flow, f.side, &f.owner)
	case 1:
		f.peerKey = record.PeerKey{
			Netns: uint32(r.uint()), Comm: r.str(), CgroupID: r.uint(), Side: record.Role(r.str()),
			LocalPort: uint16(r.uint()), Remote: r.addr(), RemotePort: uint16(r.uint()),
		}
	default:
		r.fail()
	}
	f.opened = record.Mono(r.uint())
	f.connectLatency = time.Duration(r.int())
	f.handshakeRTT = time.Duration(r.int())
	f.burst = burst{turns: uint32(r.uint()), exchanges: uint32(r.uint())}
	f.rate = rateWindow{cur: r.uint(), prev: r.uint(), curAt: record.Mono(r.uint()), prevAt: record.Mono(r.uint()), hasPrev: r.uint() == 1}
	f.m.cc = r.str()
	r.zeroRuns(wordsOf(&f.m.sc), scalarFloats)
	for i := range f.m.sk {
		f.m.sk[i].exactStats = r.exact()
	}
	for i := range f.m.sk {
		s := &f.m.sk[i]
		n := r.uint()
		if n == 0 || r.err != nil {
			continue
		}
		if n > uint64(len(r.b)) {
			r.fail()
			break
		}
		sb := r.b[:n]
		r.b = r.b[n:]
		st := s.store(c)
		for len(sb) > 0 && r.err == nil {
			fl, err := enc.DecodeFlag(&sb)
			if err == nil {
				err = st.DecodeAndMergeWith(&sb, fl.SubFlag())
			}
			if err != nil {
				r.err = err
			}
		}
	}
	if r.err == nil && len(r.b) != 0 {
		r.fail()
	}
	f.closed = p.close != nil
	if f.closed {
		f.close = *p.close
	}
	f.peerK8s = p.peerK8s
	f.peer, f.peerGen = p.peer, p.peerGen
	f.lastUpdate, f.closedAt = p.lastUpdate, p.closedAt
	return r.err
}

// wordsOf is v's memory as 64-bit words. Only for the type packing
// stores as memory (scalars), which holds no pointer and is whole words
// long (TestPackedTypesHoldNoPointer).
func wordsOf(v *scalars) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(v)), unsafe.Sizeof(*v)/8)
}

// scalarFloats marks the words of scalars that hold a float64, which
// packing stores as floats (packer.float).
var scalarFloats = floatWords(reflect.TypeFor[scalars]())

// float appends a float64 by its bits. The sums lattrace keeps are whole
// nanoseconds: such a value is stored as its integer (doubled, so the
// first uvarint is even), any other as 1 and its bits byte-reversed, a
// short uvarint too when the low mantissa bytes are zero.
func (w *packer) float(b uint64) {
	if f := math.Float64frombits(b); b>>63 == 0 && f < 1<<53 && f == math.Trunc(f) {
		w.uint(uint64(f) << 1)
		return
	}
	w.uint(1)
	w.uint(bits.ReverseBytes64(b))
}

func (r *unpacker) float() uint64 {
	switch v := r.uint(); {
	case v&1 == 0:
		return math.Float64bits(float64(v >> 1))
	case v == 1:
		return bits.ReverseBytes64(r.uint())
	}
	r.fail()
	return 0
}

func floatWords(t reflect.Type) []bool {
	out := make([]bool, t.Size()/8)
	var walk func(t reflect.Type, off uintptr)
	walk = func(t reflect.Type, off uintptr) {
		switch t.Kind() {
		case reflect.Float64:
			out[off/8] = true
		case reflect.Struct:
			for i := range t.NumField() {
				walk(t.Field(i).Type, off+t.Field(i).Offset)
			}
		case reflect.Array:
			for i := range t.Len() {
				walk(t.Elem(), off+uintptr(i)*t.Elem().Size())
			}
		}
	}
	walk(t, 0)
	return out
}

// packer appends varints, strings and zero-run-encoded memory.
type packer struct{ b []byte }

func (w *packer) uint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *packer) int(v int64)   { w.b = binary.AppendVarint(w.b, v) }

func (w *packer) str(s string) {
	w.uint(uint64(len(s)))
	w.b = append(w.b, s...)
}

func (w *packer) addr(a netip.Addr) {
	w.uint(uint64(a.BitLen()/8 + len(a.Zone())))
	w.b, _ = a.AppendBinary(w.b) // cannot fail
}

func (w *packer) key(k record.FlowKey) {
	w.uint(k.Cookie)
	w.uint(uint64(k.Flow.Netns))
	for _, ap := range [2]netip.AddrPort{k.Flow.Local, k.Flow.Remote} {
		w.addr(ap.Addr())
		w.uint(uint64(ap.Port()))
	}
}

// zeroRuns appends words as runs: how many zero words, how many nonzero
// ones, and those as uvarints, or floats where floats says so.
// A flow's statistics are mostly zero and their counts and durations small
// numbers.
func (w *packer) zeroRuns(words []uint64, floats []bool) {
	for i := 0; i < len(words); {
		z := 0
		for i+z < len(words) && words[i+z] == 0 {
			z++
		}
		i += z
		l := 0
		for i+l < len(words) && words[i+l] != 0 {
			l++
		}
		w.uint(uint64(z))
		w.uint(uint64(l))
		for end := i + l; i < end; i++ {
			if floats[i] {
				w.float(words[i])
			} else {
				w.uint(words[i])
			}
		}
	}
}

// exact appends a sketch's exact statistics. Its zeros move none of the
// others (sketch.count), and one positive value is its own sum, min and
// max: most packed flows' sketches hold one value or none (a connection
// per request).
func (w *packer) exact(e *exactStats) {
	w.uint(e.n)
	w.uint(e.zeros)
	if e.n == e.zeros {
		return
	}
	w.uint(uint64(e.max))
	w.uint(uint64(e.max - e.minPos))
	if e.n-e.zeros > 1 {
		w.float(math.Float64bits(e.sum))
	}
}

// unpacker reads what packer wrote; the first error sticks.
type unpacker struct {
	b   []byte
	err error
}

var errPacked = errors.New("aggregate: corrupt packed flow")

func (r *unpacker) fail() {
	if r.err == nil {
		r.err = errPacked
	}
	r.b = nil
}

func (r *unpacker) uint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *unpacker) int() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *unpacker) bytes() []byte {
	n := r.uint()
	if n > uint64(len(r.b)) {
		r.fail()
		return nil
	}
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}

func (r *unpacker) str() string { return string(r.bytes()) }

func (r *unpacker) addr() netip.Addr {
	var a netip.Addr
	if err := a.UnmarshalBinary(r.bytes()); err != nil {
		r.fail()
	}
	return a
}

func (r *unpacker) key() record.FlowKey {
	var k record.FlowKey
	k.Cookie = r.uint()
	k.Flow.Netns = uint32(r.uint())
	for _, ap := range [2]*netip.AddrPort{&k.Flow.Local, &k.Flow.Remote} {
		a := r.addr()
		*ap = netip.AddrPortFrom(a, uint16(r.uint()))
	}
	return k
}

func (r *unpacker) exact() exactStats {
	e := exactStats{n: r.uint(), zeros: r.uint()}
	switch {
	case e.zeros > e.n:
		r.fail()
	case e.n > e.zeros:
		e.max = time.Duration(r.uint())
		delta := time.Duration(r.uint())
		if e.max <= 0 || delta < 0 || delta >= e.max {
			r.fail() // the smallest positive value is at least 1
			return exactStats{}
		}
		e.minPos = e.max - delta
		e.sum = float64(e.max)
		if e.n-e.zeros > 1 {
			e.sum = math.Float64frombits(r.float())
		}
	}
	return e
}

// zeroRuns fills dst, which must come out exactly full.
func (r *unpacker) zeroRuns(dst []uint64, floats []bool) {
	clear(dst)
	for i := 0; i < len(dst) && r.err == nil; {
		z, l := r.uint(), r.uint()
		if z > uint64(len(dst)-i) || l > uint64(len(dst)-i)-z {
			r.fail()
			return
		}
		i += int(z)
		for end := i + int(l); i < end; i++ {
			if floats[i] {
				dst[i] = r.float()
			} else {
				dst[i] = r.uint()
			}
		}
	}
}
