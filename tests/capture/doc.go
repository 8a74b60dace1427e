// Package capture checks lattrace against an independent observer: it
// records the traffic of a test with tcpdump and analyses the capture with
// tshark, so a test can compare the tracer's RTTs and retransmission counts
// with Wireshark's TCP analysis of the very same packets.
//
// # Capturing
//
// Start runs tcpdump inside a netlab host's namespace (or the root
// namespace, for loopback) and returns once tcpdump reports "listening on",
// so no packet of the test's traffic is missed because tcpdump was still
// starting. The snap length is 128 bytes: enough for Ethernet + IPv6 + a
// TCP header with full options (14+40+60), and lattrace and its tests never
// keep payloads. tcpdump runs with --immediate-mode and -U, so each packet
// reaches the file as it is captured, and Stop ends it with SIGINT, which
// makes tcpdump flush the file and print its counters (see Stats).
//
// # Analysing
//
// Frames runs tshark once over a pcap and returns one record per TCP frame
// with the fields of Wireshark's sequence analysis; ACKRTTs, Retransmissions
// and Streams are views of it. tshark is run with explicit -o preferences
// (sequence analysis on, relative sequence numbers, no reassembly) and an
// empty configuration directory, so a user's Wireshark profile cannot change
// the result. Field names used (tshark 4.0): tcp.analysis.ack_rtt,
// tcp.analysis.acks_frame, tcp.analysis.retransmission,
// tcp.analysis.fast_retransmission, tcp.analysis.spurious_retransmission,
// tcp.analysis.out_of_order. The flag fields have no value; tshark -T fields
// prints "1" when they are present.
//
// # The capture point decides what ack_rtt means
//
// tshark's ack_rtt is the time between a data segment and the frame that
// acknowledges it, both as seen at the capture point, and it is attached to
// the acknowledging frame. In a capture on A's interface, A's segments are
// seen before the emulated path (netlab's relay sits behind the interface)
// and B's ACKs after it, so the samples on frames sent by B are the path RTT
// plus B's ACK delay: what A's kernel measures, minus A's own stack time
// (microseconds). The same traffic captured on B's interface yields ~0 for
// frames sent by B (B's local ACK turnaround) and path RTT + A's ACK delay for
// frames sent by A. So: capture at the endpoint whose view you want, and
// select the samples by the frames of its peer, ACKRTTs(pcap, SentBy(peer)).
// A capture in the relay's namespace would split the delay arbitrarily.
//
// The peer's ACK delay is part of every sample: a delayed ACK (up to 40 ms
// and more on Linux) shows up as a larger RTT, exactly as it does in the
// kernel's srtt. Tests that want the path RTT use a workload whose server
// answers at once, so the ACK rides on the response or is sent in quickack
// mode. Measured with netlab at 2 x 10 ms and such a server: median
// ack_rtt at A 20.25-20.33 ms; the excess over 20 ms is B's turnaround
// (kernel wake-up, read, write: 0.16-0.21 ms as seen on B's interface) plus
// the relay's forwarding time.
//
// # Counting retransmissions
//
// A retransmission here is a frame that tshark flags as retransmission, fast
// retransmission, spurious retransmission or out-of-order; each frame counts
// once. That matches the kernel's Tcp.RetransSegs of the sender when the
// capture is on the sender's interface:
//
//   - Fast retransmissions also carry the plain retransmission flag; the union
//     keeps them from being counted twice.
//   - Spurious ones (data the capture had already seen acknowledged, e.g. a
//     tail loss probe of a segment whose ACK was still in flight) count: the
//     kernel counted them too, it retransmitted the segment.
//   - tshark calls a segment below the highest sequence number "out-of-order"
//     rather than a retransmission when it comes less than one handshake RTT
//     after the highest segment and is not the segment the peer's last ACK
//     asks for. In a bulk transfer with SACK most retransmissions (every
//     hole after the first, RACK) look like that: measured here with 5 % loss
//     on a 3 MB upload, 12 frames were "retransmission" and 92 "out-of-order",
//     and 12+92 was exactly the sender's RetransSegs. A sender never emits
//     its own segments out of order, and netlab's path is FIFO, so on netlab
//     an out-of-order frame is a retransmission at either end. On a real,
//     reordering path a receiver-side capture would over-count; Counts keeps
//     the classes apart for such callers.
//
// What tshark cannot count: retransmissions tcpdump did not capture (Stop
// reports kernel drops as ErrIncomplete) and, with a capture on the
// receiver's side, retransmissions lost on the path again. Keep-alives and
// zero-window probes are flagged separately by tshark and not counted, as in
// the kernel.
//
// Tools: tcpdump and tshark (Debian: apt-get install -y tcpdump tshark), run
// as root. tshark prints a warning about running as root on stderr; it is
// harmless and ignored.
package capture
