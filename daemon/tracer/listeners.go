package tracer

import (
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
