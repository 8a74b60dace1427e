// Package netlab emulates a network path with known delay, jitter, loss,
// rate and queue limit between two network namespaces, for tests of the
// tracer that need real TCP connections over a non-trivial path.
//
// # Why a userspace relay
//
// The test kernel has no netem (nor sch_fq, nor modules), so delay cannot come
// from a qdisc. A Go relay forwards whole Ethernet frames instead, and owns
// every timing decision, which also makes the model identical on any kernel.
//
// # Topology
//
//	ns <p>-a            ns <p>-m (relay)            ns <p>-b
//	a0 10.99.0.1  <-veth->  ma0  ==Go==  mb0  <-veth->  b0 10.99.0.2
//	fd6c:6174:7472::1                                 fd6c:6174:7472::2
//
// A and B share one L2 subnet (/24 and a ULA /64). The relay holds AF_PACKET
// raw sockets on ma0 and mb0 in the middle namespace (opened on a thread that
// joined it; fds keep their namespace whichever thread uses them later). It
// sets PACKET_IGNORE_OUTGOING so that it never reads back its own writes.
// The middle namespace has no addresses and IPv6 disabled, so it adds no
// traffic of its own. Neighbour entries in A and B are permanent: loss and
// delay hit IP packets only, like on a routed WAN path, and a 100 %-loss link
// looks like a black hole rather than "no route to host".
//
// Segmentation and checksum offloads (TSO, GSO, GRO, tx checksum) are off on
// all four veth ends. Otherwise the relay would read 64 KB super-packets with
// unfilled (CHECKSUM_PARTIAL) checksums; re-injected they are dropped by the
// receiver, and the rate model would see one frame where the wire has 45.
//
// # Link model (per direction)
//
// Every decision is taken when a frame arrives, from the kernel's receive
// timestamp (SO_TIMESTAMPNS), so the relay's own scheduling latency does not
// shift the emulated timing:
//
//  1. Loss: the frame is dropped with probability Loss, before queueing.
//  2. Queue: with a rate set, the bytes still waiting for serialization are
//     (lastDeparture - arrival) * rate. If they are non-zero and adding the
//     frame would exceed QueueLimitBytes, the frame is tail-dropped.
//  3. Serialization: departure = max(arrival, lastDeparture) + size*8/rate,
//     where size counts IP bytes (frame minus the 14-byte Ethernet header),
//     like tbf on an IP link. A "10 Mbit/s" link thus carries 10 Mbit/s of
//     IP packets, and bulk TCP goodput is about rate*MSS/MTU.
//  4. Delivery: due = departure + Delay + uniform(-Jitter, +Jitter), then
//     raised to the previous frame's due time. Delivery is FIFO: jitter never
//     reorders frames (a real single path rarely does, and reordering would
//     confound loss-detection tests); it therefore adds a small positive
//     bias to the mean delay when Jitter exceeds the inter-frame gap.
//
// The relay is a process of its own: the program that builds the lab runs
// its own executable again (this package's init takes over when
// NETLAB_RELAY_PROCESS is set), hands it the packet sockets and talks to it
// over a socket (the links, SetLink, Stats); it ends with the lab or with
// its builder. Every thread of it runs at SCHED_FIFO, so a CPU hog beside
// the lab does not delay a frame: inside a busy test process, or at the
// default policy, the hog's time slices and the Go runtime's pauses and
// hand-offs showed in the emulated delay. One goroutine per direction
// reads frames; another, locked to its OS thread with a 1 ns timer slack,
// sleeps with clock_nanosleep until shortly before the head frame is due
// (by the running median of its own wake-up latency) and busy-waits the
// rest. Go's time.Sleep overshoots by up to a millisecond here, which would
// show in every RTT; sched_yield in the busy-wait would hand the vCPU to
// any CPU hog for a whole slice.
//
// Costs and limits: every frame crosses userspace (tens of microseconds of
// base latency when Delay is 0; over 1 Gbit/s of bulk TCP here). The relay's
// send runs the receiving host's stack, so its CPU time includes that: ~11 %
// of one vCPU for a saturated 10 Mbit/s flow, about nothing when idle (the
// readers poll for Close every 100 ms).
//
// # Naming and cleanup
//
// Automatic prefixes are lt<pid>-<process start time>-<n>. New first reaps
// labs whose process is gone (killed, crashed, timed out), so kill -9 leaves
// garbage only until the next lab is built anywhere on the machine. The start
// time guards against a recycled pid keeping a dead lab alive. Interface
// names are fixed (a0, b0, ma0, mb0): each lives in its own namespace, so labs
// never collide, and names never approach the 15-character limit.
package netlab
