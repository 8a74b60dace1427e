package aggregate

import (
	"encoding/binary"
	"errors"
	"net/netip"
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
	b       []byte
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
	w.str(string(f.side))
	pk := &f.peerKey
	w.uint(uint64(pk.Netns))
	w.str(pk.Comm)
	w.uint(pk.CgroupID)
	w.str(string(pk.Side))
	w.uint(uint64(pk.LocalPort))
	w.addr(pk.Remote)
	w.uint(uint64(pk.RemotePort))
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
	w.zeroRuns(wordsOf(&f.m.sc))
	var ex [numSketches]exactStats
	for i := range f.m.sk {
		ex[i] = f.m.sk[i].exactStats
	}
	w.zeroRuns(wordsOf(&ex))
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
	f.side = record.Role(r.str())
	f.peerKey = record.PeerKey{
		Netns: uint32(r.uint()), Comm: r.str(), CgroupID: r.uint(), Side: record.Role(r.str()),
		LocalPort: uint16(r.uint()), Remote: r.addr(), RemotePort: uint16(r.uint()),
	}
	f.opened = record.Mono(r.uint())
	f.connectLatency = time.Duration(r.int())
	f.handshakeRTT = time.Duration(r.int())
	f.burst = burst{turns: uint32(r.uint()), exchanges: uint32(r.uint())}
	f.rate = rateWindow{cur: r.uint(), prev: r.uint(), curAt: record.Mono(r.uint()), prevAt: record.Mono(r.uint()), hasPrev: r.uint() == 1}
	f.m.cc = r.str()
	r.zeroRuns(wordsOf(&f.m.sc))
	var ex [numSketches]exactStats
	r.zeroRuns(wordsOf(&ex))
	for i := range f.m.sk {
		s := &f.m.sk[i]
		s.exactStats = ex[i]
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

// wordsOf is v's memory as 64-bit words. Only for the types packing
// stores as memory (scalars, exactStats), which hold no pointer and are
// whole words long (TestPackedTypesHoldNoPointer).
func wordsOf[T scalars | [numSketches]exactStats](v *T) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(v)), unsafe.Sizeof(*v)/8)
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
// ones, and those as uvarints. A flow's statistics are mostly zero and
// their counts and durations small numbers.
func (w *packer) zeroRuns(words []uint64) {
	for len(words) > 0 {
		z := 0
		for z < len(words) && words[z] == 0 {
			z++
		}
		words = words[z:]
		l := 0
		for l < len(words) && words[l] != 0 {
			l++
		}
		w.uint(uint64(z))
		w.uint(uint64(l))
		for _, v := range words[:l] {
			w.uint(v)
		}
		words = words[l:]
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

// zeroRuns fills dst, which must come out exactly full.
func (r *unpacker) zeroRuns(dst []uint64) {
	clear(dst)
	for len(dst) > 0 && r.err == nil {
		z, l := r.uint(), r.uint()
		if z > uint64(len(dst)) || l > uint64(len(dst))-z {
			r.fail()
			return
		}
		dst = dst[z:]
		for i := range l {
			dst[i] = r.uint()
		}
		dst = dst[l:]
	}
}
