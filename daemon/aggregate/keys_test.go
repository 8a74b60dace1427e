package aggregate

import (
	"net/netip"
	"testing"

	"github.com/lattrace/lattrace/record"
)

func TestClientSideDropsLocalEphemeralPort(t *testing.T) {
	a := New(Config{})
	// Three connections from one program to one service, from different
	// ephemeral ports and different pids (a restart in between).
	a.AddExchange(exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("curl", 7, 100), record.RoleClient, at(1), 10*ms))
	a.AddExchange(exch("10.0.0.1:40001", "10.0.0.2:443", 2, owner("curl", 7, 100), record.RoleClient, at(2), 10*ms))
	a.AddExchange(exch("10.0.0.1:40002", "10.0.0.2:443", 3, owner("curl", 7, 200), record.RoleClient, at(3), 10*ms))
	// Another port of the same host is another service.
	a.AddExchange(exch("10.0.0.1:40003", "10.0.0.2:80", 4, owner("curl", 7, 200), record.RoleClient, at(4), 10*ms))

	peers := a.Peers()
	if len(peers) != 2 {
		t.Fatalf("peers = %d, want 2: %+v", len(peers), peers)
	}
	want := record.PeerKey{Netns: 4026531840, Comm: "curl", CgroupID: 7, Side: record.RoleClient,
		Remote: netip.MustParseAddr("10.0.0.2"), RemotePort: 443}
	p, ok := a.Peer(want)
	if !ok {
		t.Fatalf("no peer %+v in %+v", want, peers)
	}
	if p.Connections != 3 || p.Exchanges != 3 {
		t.Errorf("connections %d exchanges %d, want 3 and 3", p.Connections, p.Exchanges)
	}
	if p.LocalPort != 0 {
		t.Errorf("client side kept local port %d", p.LocalPort)
	}
	// Sorted: port 80 before 443.
	if peers[0].RemotePort != 80 || peers[1].RemotePort != 443 {
		t.Errorf("order %d, %d", peers[0].RemotePort, peers[1].RemotePort)
	}
	if n := len(a.Flows()); n != 4 {
		t.Errorf("flows = %d, want 4", n)
	}
}

func TestServerSideDropsRemoteEphemeralPort(t *testing.T) {
	a := New(Config{})
	srv := owner("nginx", 9, 50)
	a.AddExchange(exch("10.0.0.2:8080", "10.0.0.9:51000", 1, srv, record.RoleServer, at(1), 5*ms))
	a.AddExchange(exch("10.0.0.2:8080", "10.0.0.9:51001", 2, srv, record.RoleServer, at(2), 5*ms))
	// Same client host on another listening port, and another client.
	a.AddExchange(exch("10.0.0.2:9090", "10.0.0.9:51002", 3, srv, record.RoleServer, at(3), 5*ms))
	a.AddExchange(exch("10.0.0.2:8080", "10.0.0.10:51000", 4, srv, record.RoleServer, at(4), 5*ms))

	peers := a.Peers()
	if len(peers) != 3 {
		t.Fatalf("peers = %d, want 3: %+v", len(peers), peers)
	}
	k := record.PeerKey{Netns: 4026531840, Comm: "nginx", CgroupID: 9, Side: record.RoleServer,
		LocalPort: 8080, Remote: netip.MustParseAddr("10.0.0.9")}
	p, ok := a.Peer(k)
	if !ok {
		t.Fatalf("no peer %+v in %+v", k, peers)
	}
	if p.Connections != 2 || p.Responder != 2 || p.Requester != 0 {
		t.Errorf("connections %d responder %d requester %d", p.Connections, p.Responder, p.Requester)
	}
	if p.RemotePort != 0 {
		t.Errorf("server side kept remote port %d", p.RemotePort)
	}
}

func TestPeerKeySeparatesProgramsAndNamespaces(t *testing.T) {
	a := New(Config{})
	base := exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("curl", 7, 1), record.RoleClient, at(1), ms)
	a.AddExchange(base)

	otherComm := exch("10.0.0.1:40001", "10.0.0.2:443", 2, owner("wget", 7, 1), record.RoleClient, at(2), ms)
	a.AddExchange(otherComm)
	otherCgroup := exch("10.0.0.1:40002", "10.0.0.2:443", 3, owner("curl", 8, 1), record.RoleClient, at(3), ms)
	a.AddExchange(otherCgroup)
	otherNetns := exch("10.0.0.1:40003", "10.0.0.2:443", 4, owner("curl", 7, 1), record.RoleClient, at(4), ms)
	otherNetns.Flow.Netns = 1
	a.AddExchange(otherNetns)

	if n := len(a.Peers()); n != 4 {
		t.Errorf("peers = %d, want 4", n)
	}
}

func TestFlowKeyUsesCookie(t *testing.T) {
	a := New(Config{})
	// The same 4-tuple reused by a second connection.
	e1 := exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("curl", 7, 1), record.RoleClient, at(1), ms)
	e2 := exch("10.0.0.1:40000", "10.0.0.2:443", 2, owner("curl", 7, 1), record.RoleClient, at(2), ms)
	a.AddExchange(e1)
	a.AddExchange(e2)
	a.AddExchange(e2)
	flows := a.Flows()
	if len(flows) != 2 {
		t.Fatalf("flows = %d, want 2", len(flows))
	}
	if flows[0].Cookie != 1 || flows[0].Exchanges != 1 || flows[1].Cookie != 2 || flows[1].Exchanges != 2 {
		t.Errorf("flows %+v", flows)
	}
	f, ok := a.Flow(flowKey(e2))
	if !ok || f.Exchanges != 2 {
		t.Errorf("Flow(e2) = %v, %d", ok, f.Exchanges)
	}
	if _, ok := a.Flow(record.FlowKey{Flow: e1.Flow, Cookie: 99}); ok {
		t.Error("found a flow that never existed")
	}
	p := a.Peers()
	if len(p) != 1 || p[0].Connections != 2 {
		t.Errorf("peer %+v", p)
	}
}

func TestUnknownConnRoleFallsBackAndSticks(t *testing.T) {
	a := New(Config{})
	// A connection open before lattrace started: no ConnRole. The local
	// end answered first, so it is taken as the server.
	ex := exch("10.0.0.2:5432", "10.0.0.9:60000", 1, owner("postgres", 3, 1), record.RoleServer, at(1), ms)
	ex.ConnRole = record.RoleUnknown
	a.AddExchange(ex)
	// Later the same connection has the local end speaking first; it must
	// stay under the same pair.
	ex2 := *ex
	ex2.Time = at(2)
	ex2.Role = record.Requester
	a.AddExchange(&ex2)

	peers := a.Peers()
	if len(peers) != 1 {
		t.Fatalf("peers %+v", peers)
	}
	p := peers[0]
	if p.Side != record.RoleServer || p.LocalPort != 5432 || p.RemotePort != 0 {
		t.Errorf("key %+v", p.PeerKey)
	}
	if p.Requester != 1 || p.Responder != 1 {
		t.Errorf("roles %d/%d", p.Requester, p.Responder)
	}

	// Without ConnRole nor exchange role, the lower port is the listener.
	if s := record.SideOf(record.RoleUnknown, "", "", record.Flow{Local: ap("1.1.1.1:443"), Remote: ap("2.2.2.2:50000")}); s != record.RoleServer {
		t.Errorf("side %s", s)
	}
	if s := record.SideOf(record.RoleUnknown, "", "", record.Flow{Local: ap("1.1.1.1:50000"), Remote: ap("2.2.2.2:443")}); s != record.RoleClient {
		t.Errorf("side %s", s)
	}
}

func TestMappedAddressesAreUnmapped(t *testing.T) {
	a := New(Config{})
	a.AddExchange(exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("curl", 7, 1), record.RoleClient, at(1), ms))
	a.AddExchange(exch("[::ffff:10.0.0.1]:40001", "[::ffff:10.0.0.2]:443", 2, owner("curl", 7, 1), record.RoleClient, at(2), ms))
	peers := a.Peers()
	if len(peers) != 1 || peers[0].Connections != 2 || !peers[0].Remote.Is4() {
		t.Errorf("peers %+v", peers)
	}
}

func TestOwnerChangeMovesFlowToNewPair(t *testing.T) {
	a := New(Config{})
	ex := exch("10.0.0.1:40000", "10.0.0.2:443", 1, owner("sh", 7, 1), record.RoleClient, at(1), ms)
	a.AddExchange(ex)
	ex2 := *ex
	ex2.Time = at(2)
	ex2.Owner = owner("curl", 7, 1) // exec'd
	a.AddExchange(&ex2)
	peers := a.Peers()
	if len(peers) != 2 || peers[0].Comm != "curl" || peers[0].Exchanges != 1 || peers[1].Exchanges != 1 {
		t.Errorf("peers %+v", peers)
	}
	f, _ := a.Flow(flowKey(ex))
	if f.Peer.Comm != "curl" || f.Owner.Comm != "curl" || f.Exchanges != 2 {
		t.Errorf("flow peer %+v owner %+v", f.Peer, f.Owner)
	}
}
