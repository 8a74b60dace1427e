package scenarios

import (
	"testing"
	"time"

	"github.com/lattrace/lattrace/daemon/diagnose"
	"github.com/lattrace/lattrace/daemon/tracer"
	"github.com/lattrace/lattrace/record"
	"github.com/lattrace/lattrace/tests/capture"
	"github.com/lattrace/lattrace/tests/netlab"
	"github.com/lattrace/lattrace/tests/workload"
)

// Paced senders: TCP holds each skb of a paced socket until its departure
// time, so a response can leave well after its write returned. The
// responder's x1 is when its last byte left, as a capture on the server's
// interface shows, whether BBR asks for pacing or a rate cap
// (SO_MAX_PACING_RATE) under cubic does; the time held is the pacing
// cause of the send wait, and no window or stall diagnosis fires for a
// sender whose window did not fill.
func TestPacedSender(t *testing.T) {
	for _, c := range []struct {
		name  string
		cc    string
		rate  int64 // SO_MAX_PACING_RATE, bytes/s
		resp  int
		split bool
		paced bool // the response takes long enough at the pacing rate to show
	}{
		{name: "bbr 1 KB in two writes", cc: "bbr", resp: 1024, split: true},
		{name: "bbr 100 KB", cc: "bbr", resp: 100 << 10},
		{name: "cubic 100 KB at 2 MB/s", cc: "cubic", rate: 2 << 20, resp: 100 << 10, paced: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newLab(t, symmetric(10*time.Millisecond))
			for _, h := range []*netlab.Host{s.lab.A, s.lab.B} {
				if err := h.Sysctl("net.ipv4.tcp_congestion_control", c.cc); err != nil {
					t.Fatal(err)
				}
			}
			s.startTracer(tracer.Options{})
			s.server(workload.ServerConfig{PacingRate: c.rate, SplitResponse: c.split})
			w := s.captureBoth()
			recs := s.client(workload.ClientConfig{ReqSize: 200, RespSize: c.resp, Count: 20, Interval: 150 * time.Millisecond})
			s.settle(recs)
			w.stop()

			truth, err := capture.Departures(w.pb, port)
			if err != nil {
				t.Fatal(err)
			}
			resp := s.responders()
			if len(resp) != len(recs) || len(truth) != len(recs) {
				t.Fatalf("%d responder exchanges and %d on the wire for %d requests", len(resp), len(truth), len(recs))
			}
			var errs, held, pacing []time.Duration
			for i, e := range resp {
				wire, ok := truth[capture.Request{ClientPort: e.Flow.Remote.Port(), Seq: e.InSeq - e.ISNRemote}]
				if !ok {
					t.Errorf("exchange %d: its request is not on the wire", i)
					continue
				}
				got := time.Duration(e.Timeline.X1 - e.Timeline.R1)
				errs = append(errs, got-wire)
				held = append(held, wire)
				pacing = append(pacing, e.Components.SendWaitPacing)
				if d := (got - wire).Abs(); d > time.Millisecond {
					t.Errorf("exchange %d: x1 is %v after the request's last byte, the capture says %v (tx timestamps %v)",
						i, got, wire, e.TxTimestamps)
				}
				if e.Components.Sum() != e.Duration {
					t.Errorf("exchange %d: sum %v duration %v", i, e.Components.Sum(), e.Duration)
				}
			}
			t.Logf("last response byte left %v after the request's (capture, median); lattrace off by %v (median); pacing wait %v (median)",
				median(held), median(errs), median(pacing))
			accuracy(t, "responder x1 - r1 (median)", "ms", msf(median(held)), "capture on the server's interface", msf(median(held)+median(errs)))
			if c.paced && median(pacing) < median(held)/2 {
				t.Errorf("pacing wait %v (median) for responses that left %v after their request", median(pacing), median(held))
			}
			v := s.verdict(s.netnsB, record.Responder)
			for _, n := range []record.DiagnosisName{diagnose.CwndLimited, diagnose.SendStall, diagnose.SlowStartAfterIdle, diagnose.SndbufLimited} {
				v.quiet(t, n)
			}
		})
	}
}
