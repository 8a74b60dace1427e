package capture

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Frame is one TCP frame of a capture with tshark's sequence analysis.
type Frame struct {
	Number   int       // frame number in the pcap, from 1
	Time     time.Time // capture time (ns precision with Start's captures)
	Stream   int       // tshark's tcp.stream index
	Src, Dst netip.AddrPort
	Flags    uint16 // TCP flags (0x02 SYN, 0x10 ACK, ...)
	Seq, Ack uint32 // relative to the stream's ISNs
	// Len is the TCP payload length. tshark derives it from the IP
	// header, so it is right although the capture truncates payloads.
	Len      int
	FrameLen int // original frame length on the wire (Ethernet included)
	// ACKRTT is tcp.analysis.ack_rtt: the time from the segment this frame
	// acknowledges (AcksFrame) to this frame, at the capture point. Zero
	// when the frame acknowledges no new data.
	ACKRTT    time.Duration
	AcksFrame int

	Retransmission         bool // tcp.analysis.retransmission (fast ones have it too)
	FastRetransmission     bool // tcp.analysis.fast_retransmission
	SpuriousRetransmission bool // tcp.analysis.spurious_retransmission
	OutOfOrder             bool // tcp.analysis.out_of_order
}

// Retransmitted reports whether the frame counts as a retransmission (see
// the package doc for why out-of-order frames do).
func (f Frame) Retransmitted() bool {
	return f.Retransmission || f.FastRetransmission || f.SpuriousRetransmission || f.OutOfOrder
}

// fields is the tshark column order parsed by parseFrame. Addresses come in
// IPv4 and IPv6 columns; one of each pair is empty.
var fields = []string{
	"frame.number", "frame.time_epoch", "frame.len", "tcp.stream",
	"ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst", "tcp.dstport",
	"tcp.flags", "tcp.seq", "tcp.ack", "tcp.len",
	"tcp.analysis.ack_rtt", "tcp.analysis.acks_frame",
	"tcp.analysis.retransmission", "tcp.analysis.fast_retransmission",
	"tcp.analysis.spurious_retransmission", "tcp.analysis.out_of_order",
}

// baseFilter keeps TCP headers quoted inside ICMP errors out: they would
// show up as frames of a stream they were never sent on.
const baseFilter = "tcp && !icmp && !icmpv6"

// Frames returns the TCP frames of pcap that match the tshark display filter
// ("" for all). The analysis always runs over the whole file, so flags and
// RTTs of the returned frames do not depend on the filter.
func Frames(pcap, filter string) ([]Frame, error) {
	out, err := tshark(pcap, andFilter(baseFilter, filter), fields)
	if err != nil {
		return nil, err
	}
	var frames []Frame
	for line := range strings.Lines(string(out)) {
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			continue
		}
		f, err := parseFrame(strings.Split(line, "\t"))
		if err != nil {
			return nil, fmt.Errorf("capture: tshark output %q: %w", line, err)
		}
		frames = append(frames, f)
	}
	return frames, nil
}

// HTTP2Frames counts the HTTP/2 frames of a whole-packet capture (StartWhole)
// of cleartext HTTP/2 on port, both ways, by type name (record's
// HTTP2FrameTypes; "other" for the rest), as tshark's dissector reads
// them from the reassembled streams.
func HTTP2Frames(pcap string, port uint16) (map[string]uint64, error) {
	out, err := runTshark(pcap, andFilter(baseFilter, "http2.type"), []string{"http2.type"},
		"-o", "tcp.desegment_tcp_streams:TRUE", "-d", fmt.Sprintf("tcp.port==%d,http2", port),
		"-E", "occurrence=a", "-E", "aggregator=,")
	if err != nil {
		return nil, err
	}
	frames := map[string]uint64{}
	for line := range strings.Lines(string(out)) {
		for _, v := range strings.Split(strings.TrimSpace(line), ",") {
			if v == "" {
				continue
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, fmt.Errorf("capture: tshark http2.type %q: %w", v, err)
			}
			name := "other"
			if n >= 0 && n < len(record.HTTP2FrameTypes) {
				name = record.HTTP2FrameTypes[n]
			}
			frames[name]++
		}
	}
	return frames, nil
}

// tshark runs tshark over pcap and returns its -T fields output.
func tshark(pcap, filter string, fields []string) ([]byte, error) {
	// Reassembly is useless on truncated payloads and only costs time.
	return runTshark(pcap, filter, fields, "-o", "tcp.desegment_tcp_streams:FALSE", "-E", "occurrence=f")
}

// runTshark runs tshark over pcap with the options opts and returns its
// -T fields output.
func runTshark(pcap, filter string, fields []string, opts ...string) ([]byte, error) {
	if _, err := exec.LookPath("tshark"); err != nil {
		return nil, fmt.Errorf("capture: tshark not found (apt-get install -y tshark): %w", err)
	}
	// An empty configuration directory: a profile in root's home (disabled
	// protocols, "decode as", changed TCP preferences) would silently change
	// the analysis.
	cfg, err := os.MkdirTemp("", "capture-wireshark-*")
	if err != nil {
		return nil, fmt.Errorf("capture: %w", err)
	}
	defer os.RemoveAll(cfg)
	args := []string{"-r", pcap, "-n",
		"-o", "tcp.analyze_sequence_numbers:TRUE",
		"-o", "tcp.relative_sequence_numbers:TRUE",
		"-T", "fields", "-E", "separator=/t", "-E", "header=n"}
	args = append(args, opts...)
	if filter != "" {
		args = append(args, "-Y", filter)
	}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	cmd := exec.Command("tshark", args...)
	cmd.Env = append(os.Environ(), "WIRESHARK_CONFIG_DIR="+cfg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("capture: tshark -r %s -Y %q: %w: %s", pcap, filter, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func parseFrame(col []string) (Frame, error) {
	if len(col) != len(fields) {
		return Frame{}, fmt.Errorf("%d columns, want %d", len(col), len(fields))
	}
	var f Frame
	var err error
	num := func(s string) int {
		if s == "" || err != nil {
			return 0
		}
		var v uint64
		v, err = strconv.ParseUint(s, 0, 64) // base 0: tcp.flags is "0x0012"
		return int(v)
	}
	f.Number = num(col[0])
	ts, terr := parseNanos(col[1])
	f.Time = time.Unix(0, ts)
	f.FrameLen = num(col[2])
	f.Stream = num(col[3])
	src, serr := addrPort(col[4], col[5], col[6])
	dst, derr := addrPort(col[7], col[8], col[9])
	f.Src, f.Dst = src, dst
	f.Flags = uint16(num(col[10]))
	f.Seq = uint32(num(col[11]))
	f.Ack = uint32(num(col[12]))
	f.Len = num(col[13])
	var rerr error
	if col[14] != "" {
		var ns int64
		ns, rerr = parseNanos(col[14])
		f.ACKRTT = time.Duration(ns)
	}
	f.AcksFrame = num(col[15])
	// Flag fields have no value; tshark prints "1" when they are present.
	f.Retransmission = col[16] != ""
	f.FastRetransmission = col[17] != ""
	f.SpuriousRetransmission = col[18] != ""
	f.OutOfOrder = col[19] != ""
	return f, firstErr(err, terr, serr, derr, rerr)
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func addrPort(v4, v6, port string) (netip.AddrPort, error) {
	s := v4
	if s == "" {
		s = v6
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.AddrPort{}, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(a, uint16(p)), nil
}

// parseNanos turns tshark's decimal seconds ("1795426560.845612377",
// "0.020104312") into nanoseconds without a float: a float64 epoch keeps
// only ~0.2 µs, and the tests compare RTTs to well under a millisecond.
func parseNanos(s string) (int64, error) {
	whole, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("seconds %q: %w", s, err)
	}
	if len(frac) > 9 {
		frac = frac[:9]
	}
	frac += strings.Repeat("0", 9-len(frac))
	ns, err := strconv.ParseInt(frac, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("seconds %q: %w", s, err)
	}
	return sec*1e9 + ns, nil
}

func andFilter(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return "(" + a + ") && (" + b + ")"
}

// SentBy is a display filter for frames sent by addr. ACKRTTs(pcap,
// SentBy(peer)) gives the RTT samples of the data sent to peer, as the
// sender sees them when the capture is on the sender's interface.
func SentBy(addr netip.Addr) string {
	if addr.Is4() || addr.Is4In6() {
		return "ip.src==" + addr.Unmap().String()
	}
	return "ipv6.src==" + addr.String()
}

// SentFrom is SentBy narrowed to one port, for one side of one connection.
func SentFrom(ap netip.AddrPort) string {
	return SentBy(ap.Addr()) + " && tcp.srcport==" + strconv.Itoa(int(ap.Port()))
}

// Sample is one tcp.analysis.ack_rtt sample.
type Sample struct {
	Frame int       // the acknowledging frame, which carries the sample
	Time  time.Time // its capture time
	// Stream and the addresses identify the connection; Src sent the ACK,
	// Dst sent the acknowledged data.
	Stream    int
	Src, Dst  netip.AddrPort
	RTT       time.Duration
	AcksFrame int // the acknowledged data frame
}

// ACKRTTs returns the ack_rtt samples on frames matching filter, in capture
// order. Select the frames of the acknowledging side (SentBy(peer)); the
// package doc explains why the capture point decides what they measure.
func ACKRTTs(pcap, filter string) ([]Sample, error) {
	frames, err := Frames(pcap, andFilter("tcp.analysis.ack_rtt", filter))
	if err != nil {
		return nil, err
	}
	out := make([]Sample, 0, len(frames))
	for _, f := range frames {
		out = append(out, Sample{Frame: f.Number, Time: f.Time, Stream: f.Stream, Src: f.Src, Dst: f.Dst, RTT: f.ACKRTT, AcksFrame: f.AcksFrame})
	}
	return out, nil
}

// RTTs returns the RTTs of samples, for Median and friends.
func RTTs(samples []Sample) []time.Duration {
	out := make([]time.Duration, len(samples))
	for i, s := range samples {
		out[i] = s.RTT
	}
	return out
}

// Counts breaks retransmitted frames down by tshark's verdict. A frame
// flagged fast retransmission is also flagged retransmission, so the classes
// overlap; Total counts each frame once.
type Counts struct {
	Total          int // frames with any of the flags below: what Retransmissions returns
	Retransmission int
	Fast           int
	Spurious       int
	OutOfOrder     int
}

// retransFilter preselects in tshark, which is cheaper than printing every
// frame of a bulk transfer.
const retransFilter = "tcp.analysis.retransmission || tcp.analysis.fast_retransmission || tcp.analysis.spurious_retransmission || tcp.analysis.out_of_order"

// CountRetransmissions counts the retransmitted frames matching filter, by
// class.
func CountRetransmissions(pcap, filter string) (Counts, error) {
	frames, err := Frames(pcap, andFilter(retransFilter, filter))
	if err != nil {
		return Counts{}, err
	}
	return countFrames(frames), nil
}

func countFrames(frames []Frame) Counts {
	var c Counts
	for _, f := range frames {
		if !f.Retransmitted() {
			continue
		}
		c.Total++
		if f.Retransmission {
			c.Retransmission++
		}
		if f.FastRetransmission {
			c.Fast++
		}
		if f.SpuriousRetransmission {
			c.Spurious++
		}
		if f.OutOfOrder {
			c.OutOfOrder++
		}
	}
	return c
}

// Retransmissions returns the number of retransmitted frames matching filter
// (Counts.Total). With a capture on the sender's interface and filter
// SentBy(sender) it compares with the sender's Tcp.RetransSegs.
func Retransmissions(pcap, filter string) (int, error) {
	c, err := CountRetransmissions(pcap, filter)
	return c.Total, err
}

// Stream summarises one TCP connection (tshark's tcp.stream) of a capture.
type Stream struct {
	Index int
	// A sent the stream's first captured frame: the client when the SYN
	// is in the capture.
	A, B        netip.AddrPort
	AtoB, BtoA  Flow
	First, Last time.Time // first and last frame
}

// Flow is one direction of a Stream. Bytes include retransmitted ones.
type Flow struct {
	Packets         int
	PayloadBytes    int64 // TCP payload
	FrameBytes      int64 // original frame lengths, Ethernet header included
	Retransmissions int   // as Retransmissions counts them
}

// Streams summarises every TCP stream in pcap, ordered by index.
func Streams(pcap string) ([]Stream, error) {
	frames, err := Frames(pcap, "")
	if err != nil {
		return nil, err
	}
	byIdx := map[int]*Stream{}
	var order []int
	for _, f := range frames {
		s := byIdx[f.Stream]
		if s == nil {
			s = &Stream{Index: f.Stream, A: f.Src, B: f.Dst, First: f.Time}
			byIdx[f.Stream] = s
			order = append(order, f.Stream)
		}
		fl := &s.AtoB
		if f.Src != s.A {
			fl = &s.BtoA
		}
		fl.Packets++
		fl.PayloadBytes += int64(f.Len)
		fl.FrameBytes += int64(f.FrameLen)
		if f.Retransmitted() {
			fl.Retransmissions++
		}
		if f.Time.After(s.Last) {
			s.Last = f.Time
		}
	}
	slices.Sort(order)
	out := make([]Stream, 0, len(order))
	for _, i := range order {
		out = append(out, *byIdx[i])
	}
	return out, nil
}

// Median returns the median of v (the mean of the middle two for an even
// length), or zero for an empty v. v is not modified.
func Median[T ~int | ~int64 | ~float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return s[n/2-1] + (s[n/2]-s[n/2-1])/2
}

// Request names a request on the wire: its client's port and where it
// starts, relative to the client's initial sequence number (as tshark
// numbers it; a tracer's InSeq - ISNRemote on the server's end).
type Request struct {
	ClientPort uint16
	Seq        uint32
}

// Departures reads a capture of a server's side of the link (server port
// port): for each request, the time from its last data segment to the last
// data segment of the answer that followed, first transmissions only, so
// when the answer's last byte left. A request without an answer is left
// out. It suits lockstep protocols: an answer is what the server sent
// before the client's next data.
func Departures(pcap string, port uint16) (map[Request]time.Duration, error) {
	frames, err := Frames(pcap, "tcp.len > 0")
	if err != nil {
		return nil, err
	}
	type conn struct {
		reqStart      uint32
		reqLast, resp time.Time
		inResp, inReq bool
	}
	conns := map[uint16]*conn{}
	out := map[Request]time.Duration{}
	done := func(p uint16, c *conn) {
		if c.inResp {
			out[Request{p, c.reqStart}] = c.resp.Sub(c.reqLast)
		}
	}
	for _, f := range frames {
		if f.Retransmitted() {
			continue
		}
		fromClient := f.Dst.Port() == port
		p := f.Src.Port()
		if !fromClient {
			p = f.Dst.Port()
		}
		c := conns[p]
		if c == nil {
			c = &conn{}
			conns[p] = c
		}
		switch {
		case fromClient && !c.inReq:
			done(p, c)
			c.reqStart, c.reqLast, c.inReq, c.inResp = f.Seq, f.Time, true, false
		case fromClient:
			c.reqLast = f.Time
		case c.inReq || c.inResp:
			c.resp, c.inReq, c.inResp = f.Time, false, true
		}
	}
	for p, c := range conns {
		done(p, c)
	}
	return out, nil
}
