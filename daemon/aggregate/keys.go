package aggregate

import (
	"cmp"
	"net/netip"

	"github.com/lattrace/lattrace/daemon/record"
)

// FlowKey names one connection: the cookie tells apart two connections
// that reused the same 4-tuple.
type FlowKey struct {
	Flow   record.Flow `json:"flow"`
	Cookie uint64      `json:"cookie"`
}

// PeerKey names "this local program talking to that service" (see the
// package comment for why each field is there and which port is dropped).
type PeerKey struct {
	Netns    uint32 `json:"netns"`
	Comm     string `json:"comm"`
	CgroupID uint64 `json:"cgroup_id"`
	// Side is RoleClient when the local end opened the connections and
	// RoleServer when it accepted them.
	Side record.Role `json:"side"`
	// LocalPort is the listening port, set on the server side only.
	LocalPort uint16 `json:"local_port,omitempty"`
	// Remote is the peer's address (IPv4-mapped addresses unmapped).
	Remote netip.Addr `json:"remote_addr"`
	// RemotePort is the service's port, set on the client side only.
	RemotePort uint16 `json:"remote_port,omitempty"`
}

// sideOf picks the side a flow is aggregated under. The connection's role
// is authoritative; without it the exchange role is the best guess (the
// end that opened a connection usually speaks first), and without either
// the lower port is taken as the listening one.
func sideOf(conn record.Role, ex record.ExchangeRole, f record.Flow) record.Role {
	switch conn {
	case record.RoleClient, record.RoleServer:
		return conn
	}
	switch ex {
	case record.Requester:
		return record.RoleClient
	case record.Responder:
		return record.RoleServer
	}
	if f.Local.Port() < f.Remote.Port() {
		return record.RoleServer
	}
	return record.RoleClient
}

// peerKeyOf builds the peer pair of a flow seen from side, owned by o.
func peerKeyOf(f record.Flow, side record.Role, o *record.Owner) PeerKey {
	k := PeerKey{
		Netns:    f.Netns,
		Comm:     o.Comm,
		CgroupID: o.CgroupID,
		Side:     side,
		Remote:   f.Remote.Addr().Unmap(),
	}
	if side == record.RoleServer {
		k.LocalPort = f.Local.Port()
	} else {
		k.RemotePort = f.Remote.Port()
	}
	return k
}

func compareFlowKeys(a, b FlowKey) int {
	if c := cmp.Compare(a.Flow.Netns, b.Flow.Netns); c != 0 {
		return c
	}
	if c := a.Flow.Local.Compare(b.Flow.Local); c != 0 {
		return c
	}
	if c := a.Flow.Remote.Compare(b.Flow.Remote); c != 0 {
		return c
	}
	return cmp.Compare(a.Cookie, b.Cookie)
}

func comparePeerKeys(a, b PeerKey) int {
	if c := cmp.Compare(a.Netns, b.Netns); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Comm, b.Comm); c != 0 {
		return c
	}
	if c := cmp.Compare(a.CgroupID, b.CgroupID); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Side, b.Side); c != 0 {
		return c
	}
	if c := cmp.Compare(a.LocalPort, b.LocalPort); c != 0 {
		return c
	}
	if c := a.Remote.Compare(b.Remote); c != 0 {
		return c
	}
	return cmp.Compare(a.RemotePort, b.RemotePort)
}
