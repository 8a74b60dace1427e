package netlab

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
)

// Config describes a lab. The zero value is a valid lab: a perfect 1500-byte
// MTU wire with an auto-generated, reapable name.
type Config struct {
	// Prefix names the namespaces <Prefix>-a, <Prefix>-b and <Prefix>-m.
	// Empty (recommended) generates a unique prefix from the pid, the
	// process start time and a counter, which ReapStale can recognise after
	// the process dies. A chosen prefix must not already exist and is never
	// reaped automatically.
	Prefix string
	AtoB   Link // path from A to B
	BtoA   Link // path from B to A
	MTU    int  // of all four veth ends; 0 means 1500
	// Seed makes loss and jitter reproducible; 0 picks a random seed.
	Seed uint64
}

// Addresses of the hosts. Every lab lives in its own namespaces, so all labs
// can use the same ones. The MACs are locally administered.
var (
	AddrA4 = netip.MustParseAddr("10.99.0.1")
	AddrB4 = netip.MustParseAddr("10.99.0.2")
	AddrA6 = netip.MustParseAddr("fd6c:6174:7472::1")
	AddrB6 = netip.MustParseAddr("fd6c:6174:7472::2")
	macA   = net.HardwareAddr{0x02, 0x6c, 0x74, 0, 0, 0x0a}
	macB   = net.HardwareAddr{0x02, 0x6c, 0x74, 0, 0, 0x0b}
)

// Lab is a running emulated path between two hosts.
type Lab struct {
	A, B   *Host
	Middle string // namespace holding the relay's interfaces ma0 and mb0
	MTU    int

	seed   uint64
	linkMu sync.Mutex
	links  [2]Link // as last set, for Link
	relay  *relay
	names  []string // namespaces created, for Close

	closeOnce sync.Once
	closeErr  error
}

// New builds the namespaces, veths and addresses and starts the relay. On
// error, everything it created is removed again.
func New(cfg Config) (*Lab, error) {
	if err := cfg.AtoB.Validate(); err != nil {
		return nil, fmt.Errorf("netlab: A->B link: %w", err)
	}
	if err := cfg.BtoA.Validate(); err != nil {
		return nil, fmt.Errorf("netlab: B->A link: %w", err)
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if cfg.MTU < 1280 || cfg.MTU > 65535 {
		// Below 1280 IPv6 is disabled on the interface.
		return nil, fmt.Errorf("netlab: MTU %d outside 1280..65535", cfg.MTU)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("netlab: needs root (network namespaces, veths, AF_PACKET)")
	}
	// A lab's own failure must not be blamed on garbage from a previous
	// run; reaping errors are not fatal for the same reason.
	_, _ = ReapStale()

	prefix := cfg.Prefix
	if prefix == "" {
		prefix = autoPrefix()
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	l := &Lab{
		A:      &Host{Name: "A", Netns: prefix + "-a", Ifname: "a0", MAC: macA, IPv4: AddrA4, IPv6: AddrA6},
		B:      &Host{Name: "B", Netns: prefix + "-b", Ifname: "b0", MAC: macB, IPv4: AddrB4, IPv6: AddrB6},
		Middle: prefix + "-m",
		MTU:    cfg.MTU,
		seed:   seed,
		links:  [2]Link{AtoB: cfg.AtoB, BtoA: cfg.BtoA},
	}
	if err := l.setup(); err != nil {
		return nil, errors.Join(fmt.Errorf("netlab: %w", err), l.Close())
	}
	return l, nil
}

func (l *Lab) setup() error {
	for _, ns := range []string{l.A.Netns, l.B.Netns, l.Middle} {
		if err := run("ip", "netns", "add", ns); err != nil {
			return err
		}
		l.names = append(l.names, ns)
	}
	// The middle must stay silent: with IPv6 on, its ma0/mb0 would send
	// router solicitations and MLD reports into the emulated path.
	if err := doInNetns(l.Middle, func() error {
		return writeProcSys(map[string]string{
			"net/ipv6/conf/all/disable_ipv6":     "1",
			"net/ipv6/conf/default/disable_ipv6": "1",
		})
	}); err != nil {
		return err
	}
	for _, h := range []*Host{l.A, l.B} {
		// DAD would hold the addresses tentative for a second; the
		// solicitations are only noise in the loss and rate counters.
		if err := h.Do(func() error {
			return writeProcSys(map[string]string{
				"net/ipv6/conf/all/accept_dad":               "0",
				"net/ipv6/conf/default/accept_dad":           "0",
				"net/ipv6/conf/default/router_solicitations": "0",
			})
		}); err != nil {
			return err
		}
	}
	mtu := fmt.Sprint(l.MTU)
	for _, p := range []struct {
		mid string
		h   *Host
	}{{"ma0", l.A}, {"mb0", l.B}} {
		if err := run("ip", "-n", l.Middle, "link", "add", "name", p.mid, "mtu", mtu, "type", "veth",
			"peer", "name", p.h.Ifname, "netns", p.h.Netns, "mtu", mtu, "address", p.h.MAC.String()); err != nil {
			return err
		}
		if err := p.h.Do(func() error { return disableOffloads(p.h.Ifname) }); err != nil {
			return err
		}
	}
	if err := doInNetns(l.Middle, func() error {
		return errors.Join(disableOffloads("ma0"), disableOffloads("mb0"))
	}); err != nil {
		return err
	}
	if err := runInput([]byte("link set dev ma0 up\nlink set dev mb0 up\n"), "ip", "-n", l.Middle, "-batch", "-"); err != nil {
		return err
	}
	// The relay is listening before the hosts' interfaces come up, so their
	// first frames are not lost.
	r, err := startRelay(l.Middle, l.links, l.seed)
	if err != nil {
		return err
	}
	l.relay = r
	for _, p := range [][2]*Host{{l.A, l.B}, {l.B, l.A}} {
		h, peer := p[0], p[1]
		// Permanent neighbour entries: loss and delay then apply to IP
		// traffic only, as on a routed WAN path where ARP/ND is local to
		// each hop, and a lossy or 100 %-loss link never turns into
		// "no route to host" from failed neighbour resolution.
		batch := fmt.Sprintf(`link set dev lo up
addr add %[1]s/24 dev %[3]s
addr add %[2]s/64 dev %[3]s nodad
neigh replace %[4]s lladdr %[6]s dev %[3]s nud permanent
neigh replace %[5]s lladdr %[6]s dev %[3]s nud permanent
link set dev %[3]s up
`, h.IPv4, h.IPv6, h.Ifname, peer.IPv4, peer.IPv6, peer.MAC)
		if err := runInput([]byte(batch), "ip", "-n", h.Netns, "-batch", "-"); err != nil {
			return err
		}
	}
	return nil
}

func writeProcSys(kv map[string]string) error {
	for k, v := range kv {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// Close stops the relay and deletes the namespaces (which destroys the
// veths). It is idempotent and safe to call on a half-built lab.
func (l *Lab) Close() error {
	if l == nil {
		return nil
	}
	l.closeOnce.Do(func() {
		// Sockets hold their namespace: close them before deleting it.
		var errs []error
		if l.relay != nil {
			if err := l.relay.stop(); err != nil {
				errs = append(errs, err)
			}
		}
		for _, ns := range l.names {
			if err := deleteNetns(ns); err != nil {
				errs = append(errs, err)
			}
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// SetLink changes a direction's parameters at run time (Both changes both).
// Frames already accepted keep their due time; the change applies to frames
// arriving afterwards, and the queue backlog carries over.
func (l *Lab) SetLink(dir Direction, link Link) error {
	if err := link.Validate(); err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	dirs := []Direction{dir}
	switch dir {
	case AtoB, BtoA:
	case Both:
		dirs = []Direction{AtoB, BtoA}
	default:
		return fmt.Errorf("netlab: bad direction %v", dir)
	}
	l.linkMu.Lock()
	defer l.linkMu.Unlock()
	if err := l.relay.set(dirs, link); err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	for _, d := range dirs {
		l.links[d] = link
	}
	return nil
}

// Link returns a direction's current parameters.
func (l *Lab) Link(dir Direction) Link {
	l.linkMu.Lock()
	defer l.linkMu.Unlock()
	return l.links[dir]
}

// Stats returns the counters of both directions. A relay that cannot
// answer returns none; the lab's Close then says why.
func (l *Lab) Stats() (atob, btoa LinkStats) {
	atob, btoa, _ = l.relay.stats()
	return atob, btoa
}

// NewT builds a lab for a test and removes it when the test ends. cfg.Prefix
// is ignored: tests always get a unique, reapable name. Not being root is a
// test failure, not a skip, so a mis-configured CI cannot pass silently.
func NewT(t testing.TB, cfg Config) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("netlab: these tests need root (network namespaces, veths, AF_PACKET); run them as root, e.g. sudo go test ./tests/netlab/...")
	}
	cfg.Prefix = ""
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Frames the relay dropped outside its link model break the
		// lab's truth: whatever the test saw of them is no finding.
		atob, btoa := l.Stats()
		for _, st := range []struct {
			dir Direction
			LinkStats
		}{{AtoB, atob}, {BtoA, btoa}} {
			if st.KernelDrops != 0 || st.SendErrors != 0 {
				t.Errorf("netlab: the relay lost frames %v outside the link's model: %+v", st.dir, st.LinkStats)
			}
		}
		if err := l.Close(); err != nil {
			t.Errorf("netlab: close: %v", err)
		}
	})
	return l
}
