// Package diagnose turns a flow's or a peer pair's statistics into named
// findings a person can act on: what is slow, how much of the latency it
// explains, the numbers behind it and the fix. Each rule reads only the
// aggregate's metrics, so the daemon, the API, `top` and `explain` all say
// the same thing; docs/diagnoses.md lists the rules and the runs that
// prove them.
package diagnose

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/record"
)

// The diagnoses lattrace knows.
const (
	SlowStartAfterIdle record.DiagnosisName = "slow_start_after_idle"
	Bufferbloat        record.DiagnosisName = "bufferbloat"
	ConnPerRequest     record.DiagnosisName = "connection_per_request"
	CwndLimited        record.DiagnosisName = "cwnd_limited"
	RwndLimited        record.DiagnosisName = "rwnd_limited"
	SndbufLimited      record.DiagnosisName = "sndbuf_limited"
	SendStall          record.DiagnosisName = "send_stall"
	Loss               record.DiagnosisName = "loss"
	ManyTurns          record.DiagnosisName = "many_turns"
	PeerThink          record.DiagnosisName = "app_peer"
	LocalRead          record.DiagnosisName = "app_local_read"
	LocalThink         record.DiagnosisName = "app_think"
	Asymmetry          record.DiagnosisName = "direction_asymmetry"
	ReceiveLimited     record.DiagnosisName = "receive_limited"
	Paced              record.DiagnosisName = "paced"
)

// Thresholds: a part must explain at least this share of the mean latency
// to be named. Below them the part is noise on a healthy path (the
// false-positive check runs a clean 20 ms path with an immediate server).
const (
	minShare      = 0.20
	criticalShare = 0.50
	// manyExchangeTurns is the mean turns per exchange above which the
	// turns themselves are the finding: a request/response needs 2.
	manyExchangeTurns = 4
	// manyBurstTurns and manyBurstExchanges are the same for a burst of
	// back-to-back exchanges: three round trips where one could do (the
	// last exchange before a close has one turn, not two).
	manyBurstTurns     = 5
	manyBurstExchanges = 2.5
	// A pattern is bursts that repeat, of a bounded size: a client that
	// sends back to back without end (a load generator's loop) makes a
	// few huge bursts when it happens to pause, not a chatty protocol.
	minBursts         = 3
	maxBurstExchanges = 50
	// minLocalRead is the mean read delay from which a process reading late
	// is named.
	minLocalRead = 5 * time.Millisecond
	// minRestarted is the share of exchanges whose window restarted from
	// which the restarts, not the path, are the finding.
	minRestarted = 0.25
	// minPaid is the share of exchanges that opened their connection from
	// which the handshakes are a habit: at most four exchanges a
	// connection.
	minPaid = 0.25
	// asymmetric is the ratio of the two directions' transfer rates from
	// which the difference is a finding (docs/diagnoses.md has the paths
	// behind it).
	asymmetric = 3
	// minPart is the least time a part must take to be named at all: on a
	// loopback exchange of 100 us, 30 us of scheduling is a large share
	// and nothing anyone should act on.
	minPart = time.Millisecond
)

// Of returns the diagnoses of m, the largest share first. It needs at
// least one exchange with timing.
func Of(m *aggregate.Metrics) []record.Diagnosis {
	if m.Timed() == 0 || m.Duration.Mean <= 0 {
		return nil
	}
	f := newFacts(m)
	var out []record.Diagnosis
	for _, r := range rules {
		if d, ok := r(&f); ok {
			out = append(out, d)
		}
	}
	// Where the time goes first: the largest share leads, the more severe
	// of two equal shares first.
	slices.SortStableFunc(out, func(a, b record.Diagnosis) int {
		if c := cmp.Compare(b.Share, a.Share); c != 0 {
			return c
		}
		return cmp.Compare(b.Severity.Rank(), a.Severity.Rank())
	})
	return out
}

// A rule is one diagnosis: it reads the facts and names its finding, or
// reports false.
type rule func(f *facts) (record.Diagnosis, bool)

// rules run in this order, which is also the order of the diagnoses of
// equal share and severity in Of's result: its sort is stable.
var rules = []rule{
	slowStartAfterIdle, cwndLimited, rwndLimited, sndbufLimited, sendStall,
	paced, bufferbloat, loss, receiveLimited, connPerRequest, manyTurns,
	peerThink, localRead, localThink, asymmetry,
}

// facts is what the rules read: the metrics and the values Of derives from
// them once.
type facts struct {
	m *aggregate.Metrics
	c *record.Components // m's component means
	// windowWait and otherWait are the send wait by cause. For a transfer
	// (a message of many segments) the kernel's own view of why data waits
	// flickers between the window and "other" from one hook to the next,
	// so both count as the window: a transfer that waits is limited by the
	// congestion window or the bottleneck behind it. For small messages
	// "other" is a stall of its own (Nagle, cork).
	windowWait, otherWait time.Duration
}

func newFacts(m *aggregate.Metrics) facts {
	f := facts{m: m, c: &m.ComponentMeans, windowWait: m.ComponentMeans.SendWaitCwnd, otherWait: m.ComponentMeans.SendWaitOther}
	if m.Exchanges > 0 && m.Out.Bytes/m.Exchanges >= aggregate.TransferBytes {
		f.windowWait, f.otherWait = f.windowWait+f.otherWait, 0
	}
	return f
}

// waitIsTypical reports whether the median exchange waited in the send
// queue at all (minPart): a window or a stall that limits a flow limits
// its typical exchange, while a new connection's slow start lengthens
// only its first few, which a mean over a short exchange's time (a
// responder's) can make look dominant.
func (f *facts) waitIsTypical() bool { return f.m.Components.SendWait.P50 >= minPart }

// share is the part of the mean latency d explains; zero below minPart.
func (f *facts) share(d time.Duration) float64 {
	if d < minPart {
		return 0
	}
	return float64(d) / float64(f.m.Duration.Mean)
}

// restarted is the share of exchanges whose congestion window restarted
// after idle; afterIdle reports whether the restarts, not the path,
// explain the window wait.
func (f *facts) restarted() (share float64, afterIdle bool) {
	share = float64(f.m.Cwnd.Restarts) / float64(f.m.Exchanges)
	return share, share >= minRestarted && f.m.SlowStartAfterIdle
}

// severity is a warning's or, from criticalShare, a critical one's.
func severity(share float64) record.Severity {
	if share >= criticalShare {
		return record.SeverityCritical
	}
	return record.SeverityWarning
}

// slowStartAfterIdle is the window wait of exchanges whose window was
// restarted by an idle gap.
func slowStartAfterIdle(f *facts) (record.Diagnosis, bool) {
	m, c := f.m, f.c
	s := f.share(f.windowWait)
	restarted, afterIdle := f.restarted()
	if s < minShare || !afterIdle {
		return record.Diagnosis{}, false
	}
	// Each round trip of waiting lets one more window out; the wait
	// belongs to the restarted exchanges.
	var rounds float64
	if c.Propagation > 0 {
		rounds = float64(f.windowWait) / float64(c.Propagation) / restarted
	}
	return record.Diagnosis{
		Name: SlowStartAfterIdle, Severity: severity(s), Share: s,
		Summary: fmt.Sprintf("%s of the latency is waiting for the congestion window, which %s restarted after idle on %s of exchanges (cwnd %d..%d segments, tcp_slow_start_after_idle=1): %.1f extra round trips each",
			pct(s), ccName(m.CongestionControl), pct(restarted), m.Cwnd.Min, m.Cwnd.Max, rounds),
		Evidence: []record.Evidence{
			msEv("send_wait_window_mean", f.windowWait), count("cwnd_restarts", m.Cwnd.Restarts),
			percent("exchanges_restarted", restarted), {Name: "extra_round_trips", Value: rounds},
			segs("cwnd_min", m.Cwnd.Min), segs("cwnd_max", m.Cwnd.Max),
			flag("tcp_slow_start_after_idle", m.SlowStartAfterIdle),
		},
		Fix: "set net.ipv4.tcp_slow_start_after_idle=0 (a per-namespace sysctl: the pod's securityContext.sysctls in Kubernetes), or use BBR, which keeps its window across idle",
	}, true
}

// cwndLimited is the window wait when no idle restart explains it.
func cwndLimited(f *facts) (record.Diagnosis, bool) {
	m := f.m
	s := f.share(f.windowWait)
	if _, afterIdle := f.restarted(); s < minShare || afterIdle || !f.waitIsTypical() {
		return record.Diagnosis{}, false
	}
	return record.Diagnosis{
		Name: CwndLimited, Severity: severity(s), Share: s,
		Summary: fmt.Sprintf("%s of the latency is data waiting for the congestion window or a thin bottleneck: the app got %s/s while it waited (cwnd %d..%d segments, %s retransmitted)",
			pct(s), rateText(m.Out.Goodput), m.Cwnd.Min, m.Cwnd.Max, countOf(m.Retransmits, "segment")),
		Evidence: []record.Evidence{
			msEv("send_wait_window_mean", f.windowWait), segs("cwnd_min", m.Cwnd.Min), segs("cwnd_max", m.Cwnd.Max),
			count("retransmits", m.Retransmits), rate("goodput_out", m.Out.Goodput),
		},
		Fix: "the transfer is limited by the congestion window or a thin bottleneck: check the path's capacity and loss; a larger initial window (ip route ... initcwnd) helps short transfers, BBR helps lossy long paths",
	}, true
}

// The send wait of a cause other than the congestion window: named from
// minShare, the wait its one piece of evidence.
var (
	rwndLimited = sendWaitRule(RwndLimited, "send_wait_rwnd_mean",
		func(f *facts) time.Duration { return f.c.SendWaitRwnd },
		"waiting for the peer's receive window: the peer reads slowly or its receive buffer is small",
		"on the peer: read faster, or raise its receive buffer (net.ipv4.tcp_rmem, or stop setting a small SO_RCVBUF)")
	sndbufLimited = sendWaitRule(SndbufLimited, "send_wait_sndbuf_mean",
		func(f *facts) time.Duration { return f.c.SendWaitSndbuf },
		"the application blocked on a full local send buffer",
		"raise the send buffer (net.ipv4.tcp_wmem, or stop setting a small SO_SNDBUF)")
	// sendStall is the wait of small messages with the windows open.
	sendStall = sendWaitRule(SendStall, "send_wait_other_mean",
		func(f *facts) time.Duration { return f.otherWait },
		"data held in the local kernel with the windows open: Nagle waiting for an ACK, cork, or the app writing in pieces",
		"if the app writes a message in pieces with Nagle on, set TCP_NODELAY or write it in one call")
)

// sendWaitRule is the rule for the send wait wait returns: what the wait
// is completes its summary, "N % of the latency is ...".
func sendWaitRule(name record.DiagnosisName, evidence string, wait func(*facts) time.Duration, what, fix string) rule {
	return func(f *facts) (record.Diagnosis, bool) {
		w := wait(f)
		s := f.share(w)
		if s < minShare || !f.waitIsTypical() {
			return record.Diagnosis{}, false
		}
		return record.Diagnosis{
			Name: name, Severity: severity(s), Share: s,
			Summary:  pct(s) + " of the latency is " + what,
			Evidence: []record.Evidence{msEv(evidence, w)},
			Fix:      fix,
		}, true
	}
}

// paced is the outgoing message held by TCP until its departure times:
// BBR spreads data at its estimate of the path's bandwidth, a rate cap
// (SO_MAX_PACING_RATE) at that rate. It is how the time is spent, not a
// fault: through a thin path the pace is the path's capacity, and on a
// fast one BBR's estimate grows as the connection carries more.
func paced(f *facts) (record.Diagnosis, bool) {
	m, c := f.m, f.c
	s := f.share(c.SendWaitPacing)
	if s < minShare || !f.waitIsTypical() {
		return record.Diagnosis{}, false
	}
	return record.Diagnosis{
		Name: Paced, Severity: record.SeverityInfo, Share: s,
		Summary: fmt.Sprintf("%s of the latency is the local kernel pacing the outgoing data (%s a message on average; the app got %s/s): BBR sends at its estimate of the path's bandwidth, a socket's rate cap at that rate",
			pct(s), dur(c.SendWaitPacing), rateText(m.Out.Goodput)),
		Evidence: []record.Evidence{msEv("send_wait_pacing_mean", c.SendWaitPacing), rate("goodput_out", m.Out.Goodput)},
		Fix:      "nothing to fix when the pace is the path's capacity; if it is far below, look for a rate cap on the sender (SO_MAX_PACING_RATE, the fq qdisc's maxrate)",
	}, true
}

// bufferbloat is queueing above the path's minimum round trip; below half
// that minimum it is the path's own jitter.
func bufferbloat(f *facts) (record.Diagnosis, bool) {
	m, c := f.m, f.c
	s := f.share(c.Queueing)
	if s < minShare || c.Queueing <= c.Propagation/2 {
		return record.Diagnosis{}, false
	}
	mid, tail := pathEv(m.RTT.Path)
	return record.Diagnosis{
		Name: Bufferbloat, Severity: severity(s), Share: s,
		Summary: fmt.Sprintf("%s of the latency is queueing on the path: the round trip is %s against a minimum of %s",
			pct(s), dur(c.Network), dur(c.Propagation)),
		Evidence: []record.Evidence{
			msEv("queueing_mean", c.Queueing), msEv("propagation", c.Propagation),
			mid, tail,
		},
		Fix: "a queue is filling at the bottleneck, usually behind bulk transfers: use fq_codel or cake there, BBR or pacing for the bulk senders, or shape them below the link rate",
	}, true
}

// loss is named from half the usual share, and from any share at all once
// a retransmission timed out: a timeout is costly even when rare.
func loss(f *facts) (record.Diagnosis, bool) {
	m, c := f.m, f.c
	s := f.share(c.LossRecovery)
	if !(s >= minShare/2 || m.RTOs > 0 && s > 0) {
		return record.Diagnosis{}, false
	}
	return record.Diagnosis{
		Name: Loss, Severity: severity(s), Share: s,
		Summary: fmt.Sprintf("%s of the latency is recovering lost segments: %s",
			pct(s), lossWords(m)),
		Evidence: []record.Evidence{
			msEv("loss_recovery_mean", c.LossRecovery), msEv("loss_recovery_max", m.Components.LossRecovery.Max),
			count("retransmits", m.Retransmits), count("rtos", m.RTOs),
		},
		Fix: "packets are lost on the path: look for drops on the interfaces and queues (ip -s link, tc -s qdisc); timeouts cost most on short flows",
	}, true
}

// receiveLimited is the incoming message's own transfer: the peer sent it
// over several round trips. Its reasons are on the peer's side.
func receiveLimited(f *facts) (record.Diagnosis, bool) {
	m, c := f.m, f.c
	s := f.share(c.Receive)
	if s < minShare {
		return record.Diagnosis{}, false
	}
	return record.Diagnosis{
		Name: ReceiveLimited, Severity: record.SeverityInfo, Share: s,
		Summary: fmt.Sprintf("%s of the latency is the incoming message's own transfer (%s from its first byte to its last, %s/s): the peer sends it in several rounds",
			pct(s), dur(c.Receive), rateText(m.In.TransferRate)),
		Evidence: []record.Evidence{msEv("receive_mean", c.Receive), rate("transfer_rate_in", m.In.TransferRate), msEv("network_mean", c.Network)},
		Fix:      "the sender's window, its pacing or a thin path sets the pace: lattrace on the peer shows which; large responses gain from a larger initial window there, or from being smaller",
	}, true
}

// connPerRequest is the handshakes of connections that carry few
// exchanges each: a long connection whose one handshake was slow (a lost
// SYN) is not a connection per request.
func connPerRequest(f *facts) (record.Diagnosis, bool) {
	m, c := f.m, f.c
	// Cuts between overlapping messages have no timing, but they are
	// exchanges the connection carried after its handshake.
	paid := float64(m.Components.Handshake.Nonzero) / float64(max(m.Components.Handshake.Count+m.Multiplexed, 1))
	s := f.share(c.Handshake)
	if s < minShare || paid < minPaid {
		return record.Diagnosis{}, false
	}
	return record.Diagnosis{
		Name: ConnPerRequest, Severity: severity(s), Share: s,
		Summary: fmt.Sprintf("%s of the latency is opening connections: %s of exchanges paid a handshake of %s on average",
			pct(s), pct(paid), dur(time.Duration(float64(m.Components.Handshake.Mean)/max(paid, 0.01)))),
		Evidence: []record.Evidence{msEv("handshake_mean", c.Handshake), percent("exchanges_with_handshake", paid)},
		Fix:      "reuse connections: HTTP keep-alive or a connection pool, so one handshake serves many requests",
	}, true
}

// manyTurns: turns each wait for the path's round trip, so the finding is
// their number and what distance does to it. It explains the propagation
// part (queueing is a finding of its own) of all round trips of a burst
// but one, which batching would save.
func manyTurns(f *facts) (record.Diagnosis, bool) {
	c, t := f.c, f.m.Turns
	s := f.share(c.Propagation)
	if s < minShare || !(chatty(&t) || t.PerExchangeMean >= manyExchangeTurns) {
		return record.Diagnosis{}, false
	}
	if chatty(&t) {
		s *= 1 - 1/t.ExchangesPerBurstMean
	}
	if s < minShare {
		return record.Diagnosis{}, false
	}
	d := record.Diagnosis{Name: ManyTurns, Severity: severity(s), Share: s,
		Fix: "batch the requests (one query for many rows, a bulk API) or pipeline them, so fewer turns wait on the round trip; or keep the two ends close"}
	if chatty(&t) {
		d.Summary = fmt.Sprintf("requests come as bursts of %.1f exchanges back to back, %.1f turns each (up to %d): every millisecond more between the ends costs %.1f ms per burst",
			t.ExchangesPerBurstMean, t.PerBurstMean, t.PerBurstMax, t.PerBurstMean/2)
	} else {
		d.Summary = fmt.Sprintf("each exchange takes %.1f turns on average (up to %d): every millisecond more between the ends costs %.1f ms per exchange",
			t.PerExchangeMean, t.PerExchangeMax, t.PerExchangeMean/2)
	}
	d.Evidence = []record.Evidence{
		{Name: "turns_per_burst", Value: t.PerBurstMean}, {Name: "exchanges_per_burst", Value: t.ExchangesPerBurstMean},
		count("turns_per_burst_max", uint64(t.PerBurstMax)), count("bursts", t.Bursts),
		{Name: "turns_per_exchange", Value: t.PerExchangeMean}, msEv("network_mean", c.Network),
	}
	return d, true
}

// peerThink is the peer's own time to answer: not a fault of the network,
// said plainly, and only when it is most of the latency.
func peerThink(f *facts) (record.Diagnosis, bool) {
	m, c := f.m, f.c
	s := f.share(c.Peer)
	if s < criticalShare {
		return record.Diagnosis{}, false
	}
	return record.Diagnosis{
		Name: PeerThink, Severity: record.SeverityInfo, Share: s,
		Summary:  fmt.Sprintf("%s of the latency is the peer's own time to answer (%s per exchange); the network takes %s", pct(s), dur(c.Peer), dur(c.Network)),
		Evidence: []record.Evidence{msEv("peer_mean", c.Peer), tailEv("peer", m.Components.Peer), msEv("network_mean", c.Network)},
		Fix:      "look at the peer application (its profile, its own dependencies); moving it closer would save only the network part",
	}, true
}

// localRead is data that arrived waiting for this process to read it. A
// healthy process reads within microseconds; a millisecond is a busy
// machine's scheduling, a finding only from several.
func localRead(f *facts) (record.Diagnosis, bool) {
	m, c := f.m, f.c
	s := f.share(c.LocalRead)
	if s < minShare || c.LocalRead < minLocalRead {
		return record.Diagnosis{}, false
	}
	return record.Diagnosis{
		Name: LocalRead, Severity: severity(s), Share: s,
		Summary:  fmt.Sprintf("%s of the latency is data that had arrived waiting for this application to read it (%s per exchange)", pct(s), dur(c.LocalRead)),
		Evidence: []record.Evidence{msEv("local_read_mean", c.LocalRead), tailEv("local_read", m.Components.LocalRead)},
		Fix:      "this process reads late: look at its event loop, thread pool or CPU limits",
	}, true
}

// localThink is this service's own processing, like peerThink on the
// other side.
func localThink(f *facts) (record.Diagnosis, bool) {
	m, c := f.m, f.c
	s := f.share(c.Think)
	if s < criticalShare {
		return record.Diagnosis{}, false
	}
	return record.Diagnosis{
		Name: LocalThink, Severity: record.SeverityInfo, Share: s,
		Summary:  fmt.Sprintf("%s of the latency is this service's own processing (%s per request); the network takes %s", pct(s), dur(c.Think), dur(c.Network)),
		Evidence: []record.Evidence{msEv("think_mean", c.Think), tailEv("think", m.Components.Think)},
		Fix:      "profile this service: the time is spent between reading the request and writing the response",
	}, true
}

// asymmetry is a path that carries much more one way than the other (a
// NAT, an asymmetric link). It is about rate, not a share of latency.
func asymmetry(f *facts) (record.Diagnosis, bool) {
	m := f.m
	up, down := m.Out.TransferRate, m.In.TransferRate
	if !(m.Out.Transfers > 0 && m.In.Transfers > 0 && up > 0 && down > 0 && max(up, down) >= asymmetric*min(up, down)) {
		return record.Diagnosis{}, false
	}
	slow := "outgoing"
	if down < up {
		slow = "incoming"
	}
	return record.Diagnosis{
		Name: Asymmetry, Severity: record.SeverityWarning,
		Summary: fmt.Sprintf("transfers run %.1f times slower %s: %s/s out against %s/s in",
			max(up, down)/min(up, down), slow, rateText(up), rateText(down)),
		Evidence: []record.Evidence{
			rate("transfer_rate_out", up), rate("transfer_rate_in", down),
			count("transfers_out", m.Out.Transfers), count("transfers_in", m.In.Transfers),
		},
		Fix: "the path is asymmetric: look for a NAT, a shaper or an asymmetric link on the slow direction, or place the big transfers where the path is fast",
	}, true
}

// chatty reports whether the bursts are a chatty protocol's: repeated runs
// of a few back-to-back exchanges (several queries for one request), each
// run many turns.
func chatty(t *aggregate.Turns) bool {
	return t.Bursts >= minBursts && t.PerBurstMean >= manyBurstTurns &&
		t.ExchangesPerBurstMean >= manyBurstExchanges && t.ExchangesPerBurstMean <= maxBurstExchanges
}

// OfPair is Of for a peer pair, which also knows its connections: a
// connection per request that carries more than one exchange spends the
// first ones on more handshakes (TLS's), each a round trip.
func OfPair(p *aggregate.PeerStats) []record.Diagnosis {
	ds := Of(&p.Metrics)
	if p.Connections == 0 {
		return ds
	}
	// Messages without a reply (a closing goodbye) and pushes are no
	// round trip of the connection's.
	perConn := float64(p.Exchanges-p.Unanswered-p.Pushes) / float64(p.Connections)
	for i := range ds {
		if ds[i].Name != ConnPerRequest {
			continue
		}
		ds[i].Evidence = append(ds[i].Evidence, record.Evidence{Name: "exchanges_per_connection", Value: perConn})
		if perConn >= 1.5 {
			ds[i].Summary += fmt.Sprintf("; each connection carries %.1f exchanges, the first ones more set-up (a TLS handshake, a login): a request waits for about %.0f round trips where a kept-alive connection needs one",
				perConn, perConn+1)
		}
	}
	return ds
}

// WhatIf estimates how much longer each exchange would take if the peer
// were extra farther away (extra round-trip time). Every round trip waits
// once more: one per two turns (there and back), at least one per
// exchange, and one more for each handshake. Only the requester waits for
// round trips: a responder's exchange (request read to response sent)
// holds none, so a pair that only answers gets zero.
func WhatIf(m *aggregate.Metrics, extra time.Duration) (perExchange time.Duration, roundTrips float64) {
	if m.Exchanges == 0 || m.Requester == 0 {
		return 0, 0
	}
	roundTrips = max(m.Turns.PerExchangeMean/2, 1)
	if n := m.Components.Handshake.Count; n > 0 {
		roundTrips += float64(m.Components.Handshake.Nonzero) / float64(n)
	}
	roundTrips *= float64(m.Requester) / float64(m.Exchanges)
	return time.Duration(roundTrips * float64(extra)), roundTrips
}

// WhatIfBurst is WhatIf for a burst of back-to-back exchanges, what an
// application waits for as one of its own requests; zero without bursts.
func WhatIfBurst(m *aggregate.Metrics, extra time.Duration) (perBurst time.Duration, roundTrips float64) {
	if m.Requester == 0 {
		return 0, 0
	}
	roundTrips = m.Turns.PerBurstMean / 2
	if n := m.Components.Handshake.Count; n > 0 && m.Turns.Bursts > 0 {
		// A connection's handshake is one more round trip of its first burst.
		roundTrips += float64(m.Components.Handshake.Nonzero) / float64(m.Turns.Bursts)
	}
	return time.Duration(roundTrips * float64(extra)), roundTrips
}

// Exchange diagnoses one exchange with the same rules as a flow: what made
// this exchange slow. Its first exchange of a socket adopted mid-way
// (partial) has no reliable timing and gets none.
func Exchange(e *record.Exchange) []record.Diagnosis {
	// Every finding on one exchange must cost it exchangeMinPart: a
	// shorter exchange (most of them, on a LAN) has none, and this runs
	// for every exchange.
	if e.Partial || !e.Timed() || e.Duration < exchangeMinPart {
		return nil
	}
	c := &e.Components
	m := aggregate.Metrics{
		Exchanges:      1,
		ComponentMeans: *c,
		Retransmits:    uint64(e.Retransmits),
		RTOs:           uint64(e.RTOs),
		Turns:          aggregate.Turns{PerExchangeMean: float64(e.ExchangeTurns), PerExchangeMax: e.ExchangeTurns},
		Cwnd:           aggregate.Cwnd{Last: e.CwndEnd, Min: min(e.CwndStart, e.CwndEnd), Max: max(e.CwndStart, e.CwndEnd)},

		SlowStartAfterIdle: e.SlowStartAfterIdle,
		CongestionControl:  e.CongestionControl,
	}
	m.Duration = one(e.Duration)
	m.Components = aggregate.ComponentSummaries{
		Network: one(c.Network), Queueing: one(c.Queueing), SendWait: one(c.SendWait),
		LossRecovery: one(c.LossRecovery), Handshake: one(c.Handshake), Receive: one(c.Receive),
		Peer: one(c.Peer), LocalRead: one(c.LocalRead), Think: one(c.Think),
	}
	m.RTT.Path = one(e.PathRTT)
	if e.CwndRestart {
		m.Cwnd.Restarts = 1
	}
	m.Out.Bytes, m.In.Bytes = e.BytesOut, e.BytesIn
	if e.Duration > 0 {
		m.Out.Goodput = float64(e.BytesOut) / e.Duration.Seconds()
	}
	if tl := &e.Timeline; tl.R1 > tl.R0 && tl.R0 != 0 {
		m.In.TransferRate = float64(e.BytesIn) / tl.R1.Sub(tl.R0).Seconds()
	}
	var out []record.Diagnosis
	for _, d := range Of(&m) {
		switch {
		case d.Share < exchangeMinShare && d.Name != ConnPerRequest, d.Name == ConnPerRequest && d.Share < 0.3:
			continue
		case time.Duration(d.Share*float64(e.Duration)) < exchangeMinPart:
			continue
		case d.Name == LocalRead || d.Name == LocalThink:
			// One late read is the local scheduler's noise; a process that
			// reads late shows on its flow and pair, where it is a finding.
			continue
		case opening(e, d.Name):
			// A window still opening (slow start, the peer's receive
			// buffer growing) is TCP starting up: a new connection's
			// first large messages wait for it by design. A flow of such
			// exchanges (a connection per request) is named on its flow
			// and pair, whose means it dominates.
			continue
		case d.Name == ConnPerRequest && !(e.First && e.ExchangeTurns <= 1):
			// Every connection's first exchange has a handshake; it is a
			// connection per request when the connection closed after it.
			continue
		case d.Name == SlowStartAfterIdle:
			d.Evidence = append(d.Evidence, msEv("idle_gap", e.IdleGap))
		}
		out = append(out, d)
	}
	return out
}

// opening reports whether the window behind diagnosis n grew by half or
// more during e, rather than holding the data back at its size: the
// congestion window in slow start (a send buffer fills behind it), the
// peer's receive window while its buffer autotunes.
func opening(e *record.Exchange, n record.DiagnosisName) bool {
	grew := func(from, to uint32) bool { return from > 0 && uint64(to)*2 >= uint64(from)*3 }
	switch n {
	case CwndLimited, SndbufLimited:
		return grew(e.CwndStart, e.CwndEnd)
	case RwndLimited:
		return grew(e.RwndStart, e.RwndEnd)
	}
	return false
}

// exchangeMinShare is the share a cause must have of one exchange to be
// named on it: one exchange is noisier than a flow's mean (a server's
// 6 ms hiccup is a third of a 20 ms exchange), so only what dominated it
// is named. A handshake is the exception: on a one-exchange connection it
// is a round trip of two, half by construction.
const exchangeMinShare = 0.5

// exchangeMinPart is the least time a cause must cost one exchange to be
// named on it: a responder's exchange lasts a fraction of a millisecond,
// and a 1 ms hiccup of its machine would dominate it.
const exchangeMinPart = 5 * time.Millisecond

// one is the summary of a single value.
func one(d time.Duration) aggregate.Summary {
	s := aggregate.Summary{Count: 1, Min: d, P50: d, P90: d, P99: d, Max: d, Mean: d}
	if d > 0 {
		s.Nonzero = 1
	}
	return s
}

func ccName(cc string) string {
	if cc == "" {
		return "the kernel"
	}
	return cc
}

func pct(f float64) string { return fmt.Sprintf("%.0f %%", 100*f) }

func rateText(bytesPerSec float64) string {
	switch {
	case bytesPerSec >= 1e6:
		return fmt.Sprintf("%.1f MB", bytesPerSec/1e6)
	case bytesPerSec >= 1e3:
		return fmt.Sprintf("%.0f kB", bytesPerSec/1e3)
	}
	return fmt.Sprintf("%.0f B", bytesPerSec)
}

// dur prints a duration at the precision a person reads: 0.35 ms, 20.1 ms, 1.2 s.
func dur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.0f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2f ms", float64(d)/1e6)
}

// Dur is the duration format of the diagnoses, for the CLI's own text.
func Dur(d time.Duration) string { return dur(d) }

// lossWords says who retransmitted: this end's retransmissions are
// counted; the peer's show as holes in what arrived.
func lossWords(m *aggregate.Metrics) string {
	if m.Retransmits == 0 {
		return "the peer retransmitted (holes in what arrived); this end sent nothing again"
	}
	return countOf(m.Retransmits, "retransmission") + " and " + countOf(m.RTOs, "timeout") + " on this end"
}

func countOf(n uint64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// tailEv is the tail of a distribution as evidence: its p99 where one is
// kept (a peer pair), else its exact max (a flow's component: the
// distribution is the pair's).
func tailEv(name string, s aggregate.Summary) record.Evidence {
	if s.NoDistribution {
		return msEv(name+"_max", s.Max)
	}
	return msEv(name+"_p99", s.P99)
}

// pathEv is the path RTT's middle and tail as evidence: its p50 and p99
// where the distribution is kept, else its exact mean and max.
func pathEv(s aggregate.Summary) (mid, tail record.Evidence) {
	if s.NoDistribution {
		return msEv("path_rtt_mean", s.Mean), tailEv("path_rtt", s)
	}
	return msEv("path_rtt_p50", s.P50), tailEv("path_rtt", s)
}

func msEv(name string, d time.Duration) record.Evidence {
	return record.Evidence{Name: name, Value: float64(d) / 1e6, Unit: "ms"}
}
func count(name string, n uint64) record.Evidence {
	return record.Evidence{Name: name, Value: float64(n), Unit: "count"}
}
func segs(name string, n uint32) record.Evidence {
	return record.Evidence{Name: name, Value: float64(n), Unit: "segments"}
}
func percent(name string, f float64) record.Evidence {
	return record.Evidence{Name: name, Value: 100 * f, Unit: "%"}
}
func rate(name string, bps float64) record.Evidence {
	return record.Evidence{Name: name, Value: bps, Unit: "bytes/s"}
}
func flag(name string, b bool) record.Evidence {
	v := 0.0
	if b {
		v = 1
	}
	return record.Evidence{Name: name, Value: v}
}

// bulkBytes is how much a flow must have moved to count as a bulk sender.
const bulkBytes = 1 << 20

// MayBeBulk tells whether a flow that moved that many bytes may be named
// among BulkSenders: what a caller keeps of a node's flows for them.
func MayBeBulk(moved uint64) bool { return moved >= bulkBytes }

// BulkSenders returns the flows that moved data in bulk while the victim's
// exchanges ran (their active time overlaps the victim's), the largest
// first: the likely fillers of a queue the victim waits in. flows should
// hold the transfers still running too, with their bytes so far (the API
// adds them from the kernel). A flow counts by the bytes of its life, so
// an old keep-alive connection that moved much long ago can be named.
func BulkSenders(victim *aggregate.Metrics, flows []aggregate.FlowStats) []aggregate.FlowStats {
	var out []aggregate.FlowStats
	for _, f := range flows {
		moved := f.Out.Bytes + f.In.Bytes
		if moved < bulkBytes || f.LastSeen < victim.FirstSeen || f.FirstSeen > victim.LastSeen {
			continue
		}
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b aggregate.FlowStats) int {
		return cmp.Compare(b.Out.Bytes+b.In.Bytes, a.Out.Bytes+a.In.Bytes)
	})
	return out
}
