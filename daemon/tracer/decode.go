package tracer

import (
	"bytes"
	"net/netip"
	"time"
	"unsafe"

	"github.com/lattrace/lattrace/daemon/latency"
	"github.com/lattrace/lattrace/daemon/record"
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

func connClose(c *lattraceLtConnClose) record.ConnClose {
	return record.ConnClose{
		Time:        record.Mono(c.Hdr.TsNs),
		Cookie:      c.Cookie,
		Flow:        flow(&c.Flow),
		Owner:       owner(&c.Owner),
		Role:        role(c.Role),
		Established: record.Mono(c.EstablishedNs),
		SendCalls:   c.SendmsgCalls,
		BytesSent:   c.BytesSent,
		SendSKBs:    c.SendSkbs,
	}
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

func owner(o *lattraceLtOwner) record.Owner {
	return record.Owner{PID: o.Pid, TID: o.Tid, CgroupID: o.CgroupId, Comm: cString(o.Comm[:])}
}

// cString reads a NUL-terminated C char array.
func cString(c []int8) string {
	b := unsafe.Slice((*byte)(unsafe.Pointer(&c[0])), len(c))
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
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

func usec(us uint32) time.Duration { return time.Duration(us) * time.Microsecond }

// exchange converts the kernel's record and computes its components.
func exchange(x *lattraceLtExchange) *record.Exchange {
	has := func(f lattraceLtExchangeFlag) bool { return x.Flags&uint32(f) != 0 }
	e := &record.Exchange{
		Time:     record.Mono(x.Hdr.TsNs),
		Cookie:   x.Cookie,
		Flow:     flow(&x.Flow),
		Owner:    owner(&x.Owner),
		ConnRole: role(x.ConnRole),
		Timeline: record.Timeline{
			Connect: record.Mono(x.ConnectNs), Established: record.Mono(x.EstablishedNs),
			W0: record.Mono(x.W0), W1: record.Mono(x.W1), X1: record.Mono(x.X1), A1: record.Mono(x.A1),
			R0: record.Mono(x.R0), R1: record.Mono(x.R1), D1: record.Mono(x.D1),
		},
		BytesOut:    x.BytesOut,
		BytesIn:     x.BytesIn,
		SegsOut:     x.SegsOut,
		SegsIn:      x.SegsIn,
		Retransmits: x.Retrans,
		RTOs:        x.Rtos,
		MinRTT:      usec(x.MinRttUs),
		SRTT:        usec(x.SrttUs),
		PathRTT:     usec(x.PathRttUs),
		PathMinRTT:  usec(x.PathMinRttUs),
		Raw: record.ExchangeRaw{
			LossOut: time.Duration(x.LossOutNs), LossIn: time.Duration(x.LossInNs),
			WaitCwnd: time.Duration(x.WaitCwndNs), WaitRwnd: time.Duration(x.WaitRwndNs),
			WaitSndbuf: time.Duration(x.WaitSndbufNs), WaitOther: time.Duration(x.WaitOtherNs),
		},
		CwndStart:          x.CwndStart,
		CwndEnd:            x.CwndEnd,
		RwndStart:          x.RwndStart,
		RwndEnd:            x.RwndEnd,
		ISNLocal:           x.IsnLocal,
		ISNRemote:          x.IsnRemote,
		OutSeq:             x.OutSeq,
		InSeq:              x.InSeq,
		Turns:              x.Turns,
		ExchangeTurns:      x.TurnsExchange,
		IdleGap:            time.Duration(x.IdleNs),
		CwndRestart:        has(lattraceLtExchangeFlagLT_EX_CWND_RESTART),
		SlowStartAfterIdle: has(lattraceLtExchangeFlagLT_EX_SSAI),
		TxTimestamps:       has(lattraceLtExchangeFlagLT_EX_TX_TSTAMP),
		Partial:            has(lattraceLtExchangeFlagLT_EX_PARTIAL),
		First:              has(lattraceLtExchangeFlagLT_EX_FIRST),
	}
	e.Role = exchangeRole(x.Role)
	e.CongestionControl = cString(x.Cong[:])
	if has(lattraceLtExchangeFlagLT_EX_ACK_PURE) {
		e.AckRTT = usec(x.AckRttUs)
	}
	latency.Attribute(e)
	return e
}
