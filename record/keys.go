package record

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
)

// FlowKey names one connection: its 4-tuple and network namespace plus the
// kernel's socket cookie, because a 4-tuple is reused once the old
// connection is gone and the two must not be merged.
type FlowKey struct {
	Flow   Flow   `json:"flow"`
	Cookie uint64 `json:"cookie"`
}

// PeerKey names "this local program talking to that service", which must
// survive restarts and connection churn:
//
//   - the local program is comm + cgroup id, not pid: the pid changes at
//     every restart, the container (cgroup) and the command name do not;
//   - the network namespace, because the same addresses mean different
//     hosts in different namespaces;
//   - on the client side of a connection (the local end opened it): the
//     remote address and remote port; the local port is ephemeral and
//     dropped;
//   - on the server side (the local end accepted it): the local (listening)
//     port and the remote address; the remote port is the client's
//     ephemeral port and is dropped.
//
// IPv4-mapped IPv6 addresses are unmapped, so a v4 peer reached through a
// v6 socket is the same peer as over a v4 socket.
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
// authoritative: conn, the record's, else known, what the flow learned
// before (its open record). Without it the exchange role is the best guess
// (the end that opened a connection usually speaks first), and without
// either the lower port is taken as the listening one.
func SideOf(conn, known Role, ex ExchangeRole, f Flow) Role {
	for _, r := range []Role{conn, known} {
		if r == RoleClient || r == RoleServer {
			return r
		}
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
