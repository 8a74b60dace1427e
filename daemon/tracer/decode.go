package tracer

import (
	"bytes"
	"net/netip"
	"time"
	"unsafe"

	"github.com/lattrace/lattrace/daemon/streams"
	"github.com/lattrace/lattrace/record"
)

const (
	afInet  = 2
	afInet6 = 10
)

// view reads a record in place as the bpf2go-generated type T: the layout is
// the C header's, so there is nothing to parse, only a length to check.
func view[T any](raw []byte) (*T, bool) {
	var zero T
	if len(raw) < int(unsafe.Sizeof(zero)) {
		return nil, false
	}
	return (*T)(unsafe.Pointer(&raw[0])), true
}

func connClose(c *lattraceLtConnClose, n *names) record.ConnClose {
	return record.ConnClose{
		Time:        record.Mono(c.Hdr.TsNs),
		Cookie:      c.Cookie,
		Flow:        flow(&c.Flow),
		Owner:       owner(&c.Owner, n),
		Role:        role(c.Role),
		Established: record.Mono(c.EstablishedNs),
		SendCalls:   c.SendmsgCalls,
		BytesSent:   c.BytesSent,
		SendSKBs:    c.SendSkbs,
		HTTP2:       http2Frames(c),
	}
}

// http2Frames converts the close record's HTTP/2 frame counts, when the
// connection was HTTP/2.
func http2Frames(c *lattraceLtConnClose) *record.HTTP2Frames {
	if c.H2Flags&uint32(lattraceLtH2FlagLT_H2SEEN) == 0 {
		return nil
	}
	h := &record.HTTP2Frames{Frames: map[string]uint64{}, Unsynced: c.H2Flags&uint32(lattraceLtH2FlagLT_H2UNSYNCED) != 0,
		Resynced: c.H2Flags&uint32(lattraceLtH2FlagLT_H2RESYNCED) != 0}
	for i, n := range c.H2Frames {
		if n == 0 {
			continue
		}
		name := "other"
		if i < int(lattraceLtH2FrameLT_H2OTHER) {
			name = record.HTTP2FrameTypes[i]
		}
		h.Frames[name] += uint64(n)
	}
	return h
}

func flow(f *lattraceLtFlow) record.Flow {
	return record.Flow{
		Local:  netip.AddrPortFrom(addr(f.Family, f.Saddr), f.Sport),
		Remote: netip.AddrPortFrom(addr(f.Family, f.Daddr), f.Dport),
		Netns:  f.Netns,
	}
}

// addr unmaps IPv4-mapped IPv6 addresses: a dual-stack socket talking to an
// IPv4 peer is an IPv4 connection on the wire.
func addr(family uint16, b [16]uint8) netip.Addr {
	if family == afInet {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b).Unmap()
}

// owner converts the record's owner; n, when not nil, interns its command.
func owner(o *lattraceLtOwner, n *names) record.Owner {
	return record.Owner{PID: o.Pid, TID: o.Tid, CgroupID: o.CgroupId, Comm: n.get(o.Comm[:])}
}

// cBytes is a NUL-terminated C char array's bytes, in place.
func cBytes(c []int8) []byte {
	b := unsafe.Slice((*byte)(unsafe.Pointer(&c[0])), len(c))
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return b
}

// names interns the short strings records repeat (command names, congestion
// control algorithms): a host has a few hundred of them at most, and a new
// string per record was half of the daemon's allocations. Not safe for
// concurrent use: the draining goroutine owns one.
type names struct {
	m map[string]string
	// last is the string get returned last: records come in runs from
	// the same process, and comparing is cheaper than hashing.
	last string
}

// maxNames bounds the table; a host cycling through more distinct command
// names than this only costs the allocations the table saves elsewhere.
const maxNames = 4096

// get returns c as a string; on a nil table, a fresh copy.
func (n *names) get(c []int8) string {
	b := cBytes(c)
	if n == nil {
		return string(b)
	}
	if string(b) == n.last { // neither conversion allocates
		return n.last
	}
	if s, ok := n.m[string(b)]; ok {
		n.last = s
		return s
	}
	if len(n.m) >= maxNames || n.m == nil {
		n.m = make(map[string]string, 64)
	}
	s := string(b)
	n.m[s] = s
	n.last = s
	return s
}

func exchangeRole(r uint32) record.ExchangeRole {
	if lattraceLtExchangeRole(r) == lattraceLtExchangeRoleLT_RESPONDER {
		return record.Responder
	}
	return record.Requester
}

func role(r uint32) record.Role {
	switch lattraceLtRole(r) {
	case lattraceLtRoleLT_ROLE_CLIENT:
		return record.RoleClient
	case lattraceLtRoleLT_ROLE_SERVER:
		return record.RoleServer
	}
	return record.RoleUnknown
}

func connOpen(c *lattraceLtConnOpen) record.ConnOpen {
	o := record.ConnOpen{
		Time:         record.Mono(c.Hdr.TsNs),
		Cookie:       c.Cookie,
		Flow:         flow(&c.Flow),
		Role:         role(c.Role),
		HandshakeRTT: usec(c.HandshakeRttUs),
	}
	if c.SynNs != 0 && c.SynNs <= c.Hdr.TsNs {
		o.ConnectLatency = time.Duration(c.Hdr.TsNs - c.SynNs)
	}
	return o
}

// h2Event converts an HTTP/2 event into ev, overwriting all of it.
func h2Event(x *lattraceLtH2Event, ev *streams.Event, comms *names) {
	*ev = streams.Event{
		Kind:       streams.Kind(x.Kind),
		Cookie:     x.Cookie,
		Flow:       flow(&x.Flow),
		Owner:      owner(&x.Owner, comms),
		ConnRole:   role(x.ConnRole),
		Seq:        x.Seq,
		End:        x.EndSeq,
		T0:         record.Mono(x.T0),
		T1:         record.Mono(x.T1),
		Stream:     x.Stream,
		Type:       x.Type,
		Flags:      x.Flags,
		Held:       streams.Cause(x.WaitCause),
		SRTT:       usec(x.SrttUs),
		MinRTT:     usec(x.MinRttUs),
		PathRTT:    usec(x.PathRttUs),
		PathMinRTT: usec(x.PathMinRttUs),
		ISNLocal:   x.IsnLocal,
		ISNRemote:  x.IsnRemote,
		Connect:    record.Mono(x.SynNs),
		Adopted:    x.Adopted != 0,
	}
}

// served converts one request of an exchange's link; zero when the
// writer served none.
func served(s *lattraceLtServed) record.ServedRequest {
	if s.Cookie == 0 {
		return record.ServedRequest{}
	}
	return record.ServedRequest{Cookie: s.Cookie, InSeq: s.InSeq, Method: linkMethods[lattraceLtLinkMethod(s.Method)]}
}

var linkMethods = map[lattraceLtLinkMethod]record.LinkMethod{
	lattraceLtLinkMethodLT_LINK_THREAD:    record.LinkThread,
	lattraceLtLinkMethodLT_LINK_HANDOFF:   record.LinkHandoff,
	lattraceLtLinkMethodLT_LINK_GOROUTINE: record.LinkGoroutine,
	lattraceLtLinkMethodLT_LINK_GO_PARENT: record.LinkGoParent,
}

func usec(us uint32) time.Duration { return time.Duration(us) * time.Microsecond }

// exchange converts the kernel's record into e, overwriting all of it; the
// pipeline computes its components. Filling one reused record instead of a
// new one per exchange spares the garbage collector a record per exchange.
func exchange(x *lattraceLtExchange, e *record.Exchange, comms, congs *names) {
	p := &x.Progress
	has := func(f lattraceLtExchangeFlag) bool { return p.Flags&uint32(f) != 0 }
	*e = record.Exchange{
		Time:     record.Mono(x.Hdr.TsNs),
		Cookie:   x.Cookie,
		Flow:     flow(&x.Flow),
		Owner:    owner(&x.Owner, comms),
		ConnRole: role(x.ConnRole),
		Timeline: record.Timeline{
			Connect: record.Mono(p.ConnectNs), Established: record.Mono(p.EstablishedNs),
			W0: record.Mono(p.W0), W1: record.Mono(p.W1), X1: record.Mono(p.X1), A1: record.Mono(p.A1),
			R0: record.Mono(p.R0), R1: record.Mono(p.R1), D1: record.Mono(p.D1),
		},
		BytesOut:    x.BytesOut,
		BytesIn:     x.BytesIn,
		SegsOut:     x.SegsOut,
		SegsIn:      p.SegsIn,
		Retransmits: x.Retrans,
		RTOs:        p.Rtos,
		MinRTT:      usec(x.MinRttUs),
		SRTT:        usec(x.SrttUs),
		PathRTT:     usec(x.PathRttUs),
		PathMinRTT:  usec(x.PathMinRttUs),
		Raw: record.ExchangeRaw{
			LossOut: time.Duration(p.LossOutNs), LossIn: time.Duration(p.LossInNs),
			WaitCwnd: time.Duration(p.WaitCwndNs), WaitRwnd: time.Duration(p.WaitRwndNs),
			WaitSndbuf: time.Duration(p.WaitSndbufNs), WaitPacing: time.Duration(p.WaitPacingNs),
			WaitOther: time.Duration(p.WaitOtherNs), WriteGaps: time.Duration(p.WriteGapsNs),
		},
		CwndStart:          p.CwndStart,
		CwndEnd:            p.CwndEnd,
		RwndStart:          p.RwndStart,
		RwndEnd:            x.RwndEnd,
		ISNLocal:           x.IsnLocal,
		ISNRemote:          x.IsnRemote,
		OutSeq:             x.OutSeq,
		InSeq:              x.InSeq,
		Turns:              x.Turns,
		ExchangeTurns:      x.TurnsExchange,
		IdleGap:            time.Duration(p.IdleNs),
		CwndRestart:        has(lattraceLtExchangeFlagLT_EX_CWND_RESTART),
		SlowStartAfterIdle: has(lattraceLtExchangeFlagLT_EX_SSAI),
		TxTimestamps:       has(lattraceLtExchangeFlagLT_EX_TX_TSTAMP),
		X1Transmit:         has(lattraceLtExchangeFlagLT_EX_X1XMIT),
		Partial:            has(lattraceLtExchangeFlagLT_EX_PARTIAL),
		First:              has(lattraceLtExchangeFlagLT_EX_FIRST),
		Greeting:           has(lattraceLtExchangeFlagLT_EX_GREETING),
		Unanswered:         has(lattraceLtExchangeFlagLT_EX_UNANSWERED),
		Push:               has(lattraceLtExchangeFlagLT_EX_PUSH),
		Unfinished:         has(lattraceLtExchangeFlagLT_EX_UNFINISHED),
		// HTTP/2 on a connection open before lattrace, its framing still
		// being confirmed: a cut at a change of direction may split
		// overlapping streams.
		Multiplexed:    has(lattraceLtExchangeFlagLT_EX_H2RESYNCING),
		HTTP2Searching: has(lattraceLtExchangeFlagLT_EX_H2RESYNCING),
	}
	e.Role = exchangeRole(p.Role)
	switch {
	case has(lattraceLtExchangeFlagLT_EX_ROLE_LISTENER):
		e.RoleSource = record.RoleFromListener
	case has(lattraceLtExchangeFlagLT_EX_ROLE_GUESSED):
		e.RoleSource = record.RoleGuessed
	}
	e.Ctx = p.Ctx
	e.Served = record.Served{Parent: served(&x.Link.Parent), Prev: served(&x.Link.Prev), Handoff: served(&x.Link.Handoff)}
	e.CongestionControl = congs.get(p.Cong[:])
	if has(lattraceLtExchangeFlagLT_EX_ACK_PURE) {
		e.AckRTT = usec(p.AckRttUs)
	}
}
