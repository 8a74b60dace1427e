package record

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
)

// FlowKey names one connection: the cookie tells apart two connections
// that reused the same 4-tuple.
type FlowKey struct {
	Flow   Flow   `json:"flow"`
	Cookie uint64 `json:"cookie"`
}

// PeerKey names "this local program talking to that service": the program
// by command and cgroup (a pid changes at every restart, they do not), the
// network namespace, the peer's address, and the service's port: the
// remote port on the client side, the listening port on the server side.
// The other port is ephemeral and left out.
type PeerKey struct {
	Netns    uint32 `json:"netns"`
	Comm     string `json:"comm"`
	CgroupID uint64 `json:"cgroup_id"`
	// Side is RoleClient when the local end opened the connections and
	// RoleServer when it accepted them.
	Side Role `json:"side"`
	// LocalPort is the listening port, set on the server side only.
	LocalPort uint16 `json:"local_port,omitempty"`
	// Remote is the peer's address (IPv4-mapped addresses unmapped).
	Remote netip.Addr `json:"remote_addr"`
	// RemotePort is the service's port, set on the client side only.
	RemotePort uint16 `json:"remote_port,omitempty"`
}

// SideOf picks the side a flow is counted under. The connection's role is
// authoritative; without it the exchange role is the best guess (the end
// that opened a connection usually speaks first), and without either the
// lower port is taken as the listening one.
func SideOf(conn Role, ex ExchangeRole, f Flow) Role {
	switch conn {
	case RoleClient, RoleServer:
		return conn
	}
	switch ex {
	case Requester:
		return RoleClient
	case Responder:
		return RoleServer
	}
	if f.Local.Port() < f.Remote.Port() {
		return RoleServer
	}
	return RoleClient
}

// PeerKeyOf is the peer pair of flow f seen from side, owned by o.
func PeerKeyOf(f Flow, side Role, o *Owner) PeerKey {
	k := PeerKey{
		Netns:    f.Netns,
		Comm:     o.Comm,
		CgroupID: o.CgroupID,
		Side:     side,
		Remote:   f.Remote.Addr().Unmap(),
	}
	if side == RoleServer {
		k.LocalPort = f.Local.Port()
	} else {
		k.RemotePort = f.Remote.Port()
	}
	return k
}

// ID names the pair in the API, the CLI and reports: 12 hex digits of a
// hash of its key, stable across daemons and runs, prefixed with "p" so it
// can never be mistaken for a flow's (decimal) id.
func (k PeerKey) ID() string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d|%s|%d|%s|%d|%s|%d", k.Netns, k.Comm, k.CgroupID, k.Side, k.LocalPort, k.Remote, k.RemotePort)
	return fmt.Sprintf("p%012x", h.Sum64()&(1<<48-1))
}

// Compare orders flow keys by namespace, local and remote end, then cookie.
func (k FlowKey) Compare(o FlowKey) int {
	if c := cmp.Compare(k.Flow.Netns, o.Flow.Netns); c != 0 {
		return c
	}
	if c := k.Flow.Local.Compare(o.Flow.Local); c != 0 {
		return c
	}
	if c := k.Flow.Remote.Compare(o.Flow.Remote); c != 0 {
		return c
	}
	return cmp.Compare(k.Cookie, o.Cookie)
}

// Compare orders peer keys field by field, in the order they are declared.
func (k PeerKey) Compare(o PeerKey) int {
	if c := cmp.Compare(k.Netns, o.Netns); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Comm, o.Comm); c != 0 {
		return c
	}
	if c := cmp.Compare(k.CgroupID, o.CgroupID); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Side, o.Side); c != 0 {
		return c
	}
	if c := cmp.Compare(k.LocalPort, o.LocalPort); c != 0 {
		return c
	}
	if c := k.Remote.Compare(o.Remote); c != 0 {
		return c
	}
	return cmp.Compare(k.RemotePort, o.RemotePort)
}
