package tracer

import (
	"os"
	"syscall"
	"time"

	"github.com/cilium/ebpf/link"
)

// Roles of connections open before lattrace started (bpf/listeners.bpf.h):
// an adopted end is the server when its network namespace has a listening
// socket on its local port, else the client. The state hook keeps the
// table of listeners from its attachment on; seedListeners fills in those
// that were listening already, in every network namespace, before the
// hooks that adopt sockets attach, and names each namespace it read
// whole. An adopted socket of a namespace not named has its role guessed
// from the ports, and its exchanges say so.

// seedListeners runs the listener iterator once in each network
// namespace. A namespace it cannot enter is counted (NetnsUnseeded) and
// said once; the iterator link itself is closed with the others.
func (t *Tracer) seedListeners(it *link.Iter) {
	seeded := t.maps.Maps["netns_seeded"]
	ns := newNamespaces(t.opts.NetnsDirs)
	read := 0
	err := ns.each(func(ino uint64) error {
		if err := readIter(it); err != nil {
			return err
		}
		read++
		return seeded.Put(uint32(ino), uint8(1))
	}, func(ino uint64, _ bool, err error) {
		t.unseeded.Add(1)
		t.opts.Logger.Warn("network namespace's listening sockets not read: roles of its connections open before lattrace are guessed from the ports",
			"netns", ino, "err", err)
	})
	if err != nil {
		t.unseeded.Add(1)
		t.opts.Logger.Warn("listening sockets not read everywhere: roles of some connections open before lattrace are guessed from the ports", "err", err)
	}
	if ns.denied > 0 {
		t.opts.Logger.Warn("network namespaces of some processes not readable in /proc, so their listening sockets are not read: roles of their connections open before lattrace are guessed from the ports (reading another process's needs CAP_SYS_PTRACE)",
			"processes", ns.denied)
	}
	t.opts.Logger.Debug("listening sockets read", "netns", read)
}

// pruneEvery is how often the tables of listeners and of namespaces read
// are pruned of namespaces that are gone.
const pruneEvery = time.Minute

// pruneListeners deletes, at most once every pruneEvery, the entries of
// network namespaces that are gone: listener counts fallen to zero (the
// programs never delete one, which could lose a listener opening on the
// same port at once) and the namespaces read. No socket opens in a
// namespace that is gone, so nothing races the deletes; a namespace the
// scan cannot see (its /proc entry not readable) keeps its entries only
// when they count listeners.
func (t *Tracer) pruneListeners() {
	listeners, seeded := t.maps.Maps["listeners"], t.maps.Maps["netns_seeded"]
	if listeners == nil || seeded == nil || time.Since(t.lastPrune) < pruneEvery {
		return
	}
	t.lastPrune = time.Now()
	ns := newNamespaces(t.opts.NetnsDirs)
	ns.scan()
	if self, err := os.Stat("/proc/thread-self/ns/net"); err == nil {
		if st, ok := self.Sys().(*syscall.Stat_t); ok {
			ns.paths[st.Ino] = "/proc/thread-self/ns/net"
		}
	}
	live := func(netns uint32) bool { _, ok := ns.paths[uint64(netns)]; return ok }
	var (
		key   listenerKey
		count uint32
		gone  []listenerKey
	)
	for it := listeners.Iterate(); it.Next(&key, &count); {
		if count == 0 && !live(key.Netns) {
			gone = append(gone, key)
		}
	}
	for _, k := range gone {
		_ = listeners.Delete(k)
	}
	var (
		netns uint32
		mark  uint8
		dead  []uint32
	)
	for it := seeded.Iterate(); it.Next(&netns, &mark); {
		if !live(netns) {
			dead = append(dead, netns)
		}
	}
	for _, n := range dead {
		_ = seeded.Delete(n)
	}
}

// listenerKey is struct listener_key (bpf/listeners.bpf.h), a key of a
// map only the daemon's pruning reads.
type listenerKey struct{ Netns, Port uint32 }
