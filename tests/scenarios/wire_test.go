package scenarios

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/lattrace/lattrace/tests/capture"
)

// wire captures the lab's traffic at both ends (A's and B's interfaces) so
// each exchange's truth can be read off the packets by an independent
// tool: the path's share is the round trip seen at A less the turnaround
// seen at B, and the peer's share is that turnaround.
type wire struct {
	t      *testing.T
	a, b   *capture.Capture
	pa, pb string
}

func (s *scenario) captureBoth() *wire {
	filter := fmt.Sprintf("tcp port %d", port)
	return &wire{t: s.t, a: capture.StartT(s.t, s.lab.A, s.lab.A.Ifname, filter), b: capture.StartT(s.t, s.lab.B, s.lab.B.Ifname, filter)}
}

func (w *wire) stop() {
	w.t.Helper()
	var err error
	if w.pa, err = w.a.Stop(); err != nil {
		w.t.Fatal(err)
	}
	if w.pb, err = w.b.Stop(); err != nil {
		w.t.Fatal(err)
	}
}

// wireExchange is one request and the first data of its response on one
// connection, as both captures saw them.
type wireExchange struct {
	reqA, respA, reqB, respB time.Time
}

func (x wireExchange) network() time.Duration { return x.respA.Sub(x.reqA) - x.peer() }
func (x wireExchange) peer() time.Duration    { return x.respB.Sub(x.reqB) }

// exchanges pairs, on the connection of client, each request's last data
// segment with the response's first one, in order. A segment that carries
// no byte not seen before at that capture is a retransmission of what the
// capture saw already: the times are the first passage of each byte there.
func (w *wire) exchanges(client netip.AddrPort) []wireExchange {
	w.t.Helper()
	side := func(pcap string) (reqs, resps []time.Time) {
		frames, err := capture.Frames(pcap, fmt.Sprintf("tcp.port == %d && tcp.len > 0", client.Port()))
		if err != nil {
			w.t.Fatal(err)
		}
		inResp := true
		seen := map[bool]uint32{} // by fromClient: the end of the bytes seen
		for _, f := range frames {
			fromClient := f.Src == client
			end := f.Seq + uint32(f.Len)
			if end <= seen[fromClient] {
				continue
			}
			seen[fromClient] = end
			switch {
			case fromClient && inResp:
				reqs = append(reqs, f.Time)
				inResp = false
			case fromClient:
				reqs[len(reqs)-1] = f.Time // a later segment of the same request
			case !inResp:
				resps = append(resps, f.Time)
				inResp = true
			}
		}
		return reqs, resps
	}
	reqA, respA := side(w.pa)
	reqB, respB := side(w.pb)
	n := min(len(reqA), len(respA), len(reqB), len(respB))
	out := make([]wireExchange, n)
	for i := range out {
		out[i] = wireExchange{reqA[i], respA[i], reqB[i], respB[i]}
	}
	return out
}

// handshakes are, by client port, the time from each connection's SYN to
// its client's first data segment on A's side of the wire.
func (w *wire) handshakes() map[uint16]time.Duration {
	w.t.Helper()
	frames, err := capture.Frames(w.pa, fmt.Sprintf("tcp.dstport == %d", port))
	if err != nil {
		w.t.Fatal(err)
	}
	syn := map[uint16]time.Time{}
	out := map[uint16]time.Duration{}
	for _, f := range frames {
		p := f.Src.Port()
		if _, done := out[p]; done {
			continue
		}
		switch {
		case f.Flags&0x12 == 0x02:
			syn[p] = f.Time
		case f.Len > 0 && !syn[p].IsZero():
			out[p] = f.Time.Sub(syn[p])
		}
	}
	return out
}

// synRTT is the round trip of client's handshake on A's side of the wire:
// from its SYN to the SYN-ACK.
func (w *wire) synRTT(client netip.AddrPort) time.Duration {
	w.t.Helper()
	frames, err := capture.Frames(w.pa, fmt.Sprintf("tcp.port == %d && tcp.flags.syn == 1", client.Port()))
	if err != nil {
		w.t.Fatal(err)
	}
	var syn time.Time
	for _, f := range frames {
		switch {
		case f.Src == client && syn.IsZero():
			syn = f.Time
		case f.Src != client && !syn.IsZero():
			return f.Time.Sub(syn)
		}
	}
	w.t.Fatalf("no handshake of %v on the wire", client)
	return 0
}
