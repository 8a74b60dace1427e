package tracer

import (
	"bytes"
	"net/netip"
	"unsafe"

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
	comm := unsafe.Slice((*byte)(unsafe.Pointer(&o.Comm[0])), len(o.Comm))
	if i := bytes.IndexByte(comm, 0); i >= 0 {
		comm = comm[:i]
	}
	return record.Owner{PID: o.Pid, TID: o.Tid, CgroupID: o.CgroupId, Comm: string(comm)}
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
