package aggregate

import (
	"net/netip"
	"time"

	"github.com/lattrace/lattrace/record"
)

// ap parses "addr:port".
func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// owner is a process; pid is deliberately not part of the peer key.
func owner(comm string, cgroup uint64, pid uint32) record.Owner {
	return record.Owner{PID: pid, TID: pid, CgroupID: cgroup, Comm: comm}
}

// exch builds a requester exchange whose components sum to its duration:
// network + peer, the shape of a small request on a clean path.
func exch(local, remote string, cookie uint64, o record.Owner, connRole record.Role, t record.Mono, d time.Duration) *record.Exchange {
	network := d / 4
	ex := &record.Exchange{
		Time:     t,
		Cookie:   cookie,
		Flow:     record.Flow{Local: ap(local), Remote: ap(remote), Netns: 4026531840},
		Owner:    o,
		Role:     record.Requester,
		ConnRole: connRole,
		Start:    t - record.Mono(d),
		End:      t,
		Duration: d,
		Components: record.Components{
			Network:     network,
			Propagation: network,
			Peer:        d - network,
		},
		BytesOut: 100,
		BytesIn:  1000,
		SegsOut:  1,
		SegsIn:   1,
		MinRTT:   network,
		SRTT:     network,
		PathRTT:  network,
	}
	if connRole == record.RoleServer {
		ex.Role = record.Responder
		ex.Components = record.Components{Network: network, Propagation: network, Think: d - network}
	}
	return ex
}

func flowKey(ex *record.Exchange) record.FlowKey {
	return record.FlowKey{Flow: ex.Flow, Cookie: ex.Cookie}
}

const ms = time.Millisecond

// at turns seconds into a Mono far from zero, so "zero means unset"
// never collides with a real timestamp.
func at(sec float64) record.Mono { return record.Mono(1e12 + sec*1e9) }
