// Package diagnose turns a flow's or a peer pair's statistics into named
// findings a person can act on: what is slow, how much of the latency it
// explains, the numbers behind it and the fix. The rules are the seed
// studies' findings (docs/latency-model.md, "Diagnoses it enables"); each
// reads only the aggregate's metrics, so the daemon, the API, `top` and
// `explain` all say the same thing.
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
)

// Thresholds: a part must explain at least this share of the mean latency
// to be named. Below them the part is noise on a healthy path (the
// false-positive check runs a clean 20 ms path with an immediate server).
const (
	minShare      = 0.20
	criticalShare = 0.50
	// manyTurns is the mean turns per exchange above which the turns
	// themselves are the finding: a request/response needs 2.
	manyTurns = 4
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
	// which the difference is a finding (seed 001 saw 71 vs 2.5 Mbit/s).
	asymmetric = 3
	// minPart is the least time a part must take to be named at all: on a
	// loopback exchange of 100 us, 30 us of scheduling is a large share
	// and nothing anyone should act on.
	minPart = time.Millisecond
)

// Of returns the diagnoses of m, the largest share first. It needs at
// least one exchange with timing.
func Of(m *aggregate.Metrics) []record.Diagnosis {
	n := m.Exchanges - m.Partial
	mean := m.Duration.Mean
	if n == 0 || mean <= 0 {
		return nil
	}
	c := m.ComponentMeans
	share := func(d time.Duration) float64 {
		if d < minPart {
			return 0
		}
		return float64(d) / float64(mean)
	}
	sev := func(s float64) record.Severity {
		if s >= criticalShare {
			return record.SeverityCritical
		}
		return record.SeverityWarning
	}
	var out []record.Diagnosis
	add := func(d record.Diagnosis) { out = append(out, d) }

	// Send wait, by cause. For a transfer (a message of many segments)
	// the kernel's own view of why data waits flickers between the window
	// and "other" from one hook to the next, so both count as the window:
	// a transfer that waits is limited by the congestion window or the
	// bottleneck behind it. For small messages "other" is a stall of its
	// own (Nagle, cork). Slow start after idle is the window wait of
	// exchanges whose window was restarted by an idle gap.
	transfer := m.Exchanges > 0 && m.Out.Bytes/m.Exchanges >= aggregate.TransferBytes
	windowWait, otherWait := c.SendWaitCwnd, c.SendWaitOther
	if transfer {
		windowWait, otherWait = windowWait+otherWait, 0
	}
	if s := share(windowWait); s >= minShare {
		restarted := float64(m.Cwnd.Restarts) / float64(m.Exchanges)
		if restarted >= minRestarted && m.SlowStartAfterIdle {
			// Each round trip of waiting lets one more window out; the
			// wait belongs to the restarted exchanges.
			var rounds float64
			if c.Propagation > 0 {
				rounds = float64(windowWait) / float64(c.Propagation) / restarted
			}
			add(record.Diagnosis{
				Name: SlowStartAfterIdle, Severity: sev(s), Share: s,
				Summary: fmt.Sprintf("%s of the latency is waiting for the congestion window, which %s restarted after idle on %s of exchanges (cwnd %d..%d segments, tcp_slow_start_after_idle=1): %.1f extra round trips each",
					pct(s), ccName(m.CongestionControl), pct(restarted), m.Cwnd.Min, m.Cwnd.Max, rounds),
				Evidence: []record.Evidence{
					msEv("send_wait_window_mean", windowWait), count("cwnd_restarts", m.Cwnd.Restarts),
					percent("exchanges_restarted", restarted), {Name: "extra_round_trips", Value: rounds},
					segs("cwnd_min", m.Cwnd.Min), segs("cwnd_max", m.Cwnd.Max),
					flag("tcp_slow_start_after_idle", m.SlowStartAfterIdle),
				},
				Fix: "set net.ipv4.tcp_slow_start_after_idle=0 (a per-namespace sysctl: the pod's securityContext.sysctls in Kubernetes), or use BBR, which keeps its window across idle",
			})
		} else {
			add(record.Diagnosis{
				Name: CwndLimited, Severity: sev(s), Share: s,
				Summary: fmt.Sprintf("%s of the latency is data waiting for the congestion window or a thin bottleneck: the app got %s/s while it waited (cwnd %d..%d segments, %s retransmitted)",
					pct(s), rateText(m.Out.Goodput), m.Cwnd.Min, m.Cwnd.Max, countOf(m.Retransmits, "segment")),
				Evidence: []record.Evidence{
					msEv("send_wait_window_mean", windowWait), segs("cwnd_min", m.Cwnd.Min), segs("cwnd_max", m.Cwnd.Max),
					count("retransmits", m.Retransmits), rate("goodput_out", m.Out.Goodput),
				},
				Fix: "the transfer is limited by the congestion window or a thin bottleneck: check the path's capacity and loss; a larger initial window (ip route ... initcwnd) helps short transfers, BBR helps lossy long paths",
			})
		}
	}
	if s := share(c.SendWaitRwnd); s >= minShare {
		add(record.Diagnosis{
			Name: RwndLimited, Severity: sev(s), Share: s,
			Summary:  fmt.Sprintf("%s of the latency is waiting for the peer's receive window: the peer reads slowly or its receive buffer is small", pct(s)),
			Evidence: []record.Evidence{msEv("send_wait_rwnd_mean", c.SendWaitRwnd)},
			Fix:      "on the peer: read faster, or raise its receive buffer (net.ipv4.tcp_rmem, or stop setting a small SO_RCVBUF)",
		})
	}
	if s := share(c.SendWaitSndbuf); s >= minShare {
		add(record.Diagnosis{
			Name: SndbufLimited, Severity: sev(s), Share: s,
			Summary:  fmt.Sprintf("%s of the latency is the application blocked on a full local send buffer", pct(s)),
			Evidence: []record.Evidence{msEv("send_wait_sndbuf_mean", c.SendWaitSndbuf)},
			Fix:      "raise the send buffer (net.ipv4.tcp_wmem, or stop setting a small SO_SNDBUF)",
		})
	}
	if s := share(otherWait); s >= minShare {
		add(record.Diagnosis{
			Name: SendStall, Severity: sev(s), Share: s,
			Summary:  fmt.Sprintf("%s of the latency is data held in the local kernel with the windows open: Nagle waiting for an ACK, cork, pacing, or the app writing in pieces", pct(s)),
			Evidence: []record.Evidence{msEv("send_wait_other_mean", otherWait)},
			Fix:      "if the app writes a message in pieces with Nagle on, set TCP_NODELAY or write it in one call; with BBR or the fq qdisc this is pacing, which spreads a burst over the round trip on purpose",
		})
	}
	// Queueing above the path's minimum: bufferbloat.
	if s := share(c.Queueing); s >= minShare && c.Queueing > c.Propagation/2 {
		add(record.Diagnosis{
			Name: Bufferbloat, Severity: sev(s), Share: s,
			Summary: fmt.Sprintf("%s of the latency is queueing on the path: the round trip is %s against a minimum of %s",
				pct(s), dur(c.Network), dur(c.Propagation)),
			Evidence: []record.Evidence{
				msEv("queueing_mean", c.Queueing), msEv("propagation", c.Propagation),
				msEv("path_rtt_p50", m.RTT.Path.P50), msEv("path_rtt_p99", m.RTT.Path.P99),
			},
			Fix: "a queue is filling at the bottleneck, usually behind bulk transfers: use fq_codel or cake there, BBR or pacing for the bulk senders, or shape them below the link rate",
		})
	}
	if s := share(c.LossRecovery); s >= minShare/2 || m.RTOs > 0 && s > 0 {
		add(record.Diagnosis{
			Name: Loss, Severity: sev(s), Share: s,
			Summary: fmt.Sprintf("%s of the latency is recovering lost segments: %s",
				pct(s), lossWords(m)),
			Evidence: []record.Evidence{
				msEv("loss_recovery_mean", c.LossRecovery), msEv("loss_recovery_max", m.Components.LossRecovery.Max),
				count("retransmits", m.Retransmits), count("rtos", m.RTOs),
			},
			Fix: "packets are lost on the path: look for drops on the interfaces and queues (ip -s link, tc -s qdisc); timeouts cost most on short flows",
		})
	}
	// The incoming message's own transfer: the peer sent it over several
	// round trips. Its reasons are on the peer's side.
	if s := share(c.Receive); s >= minShare {
		add(record.Diagnosis{
			Name: ReceiveLimited, Severity: record.SeverityInfo, Share: s,
			Summary: fmt.Sprintf("%s of the latency is the incoming message's own transfer (%s from its first byte to its last, %s/s): the peer sends it in several rounds",
				pct(s), dur(c.Receive), rateText(m.In.TransferRate)),
			Evidence: []record.Evidence{msEv("receive_mean", c.Receive), rate("transfer_rate_in", m.In.TransferRate), msEv("network_mean", c.Network)},
			Fix:      "the sender's window, its pacing or a thin path sets the pace: lattrace on the peer shows which; large responses gain from a larger initial window there, or from being smaller",
		})
	}
	// Connections that carry few exchanges each: a long connection whose
	// one handshake was slow (a lost SYN) is not a connection per request.
	if paid := float64(m.Components.Handshake.Nonzero) / float64(max(m.Components.Handshake.Count, 1)); share(c.Handshake) >= minShare && paid >= minPaid {
		s := share(c.Handshake)
		add(record.Diagnosis{
			Name: ConnPerRequest, Severity: sev(s), Share: s,
			Summary: fmt.Sprintf("%s of the latency is opening connections: %s of exchanges paid a handshake of %s on average",
				pct(s), pct(paid), dur(time.Duration(float64(m.Components.Handshake.Mean)/max(paid, 0.01)))),
			Evidence: []record.Evidence{msEv("handshake_mean", c.Handshake), percent("exchanges_with_handshake", paid)},
			Fix:      "reuse connections: HTTP keep-alive or a connection pool, so one handshake serves many requests",
		})
	}
	// Turns each wait for the path's round trip: the finding is their
	// number and what distance does to it. It explains the propagation
	// part (queueing is a finding of its own) of all round trips of a
	// burst but one, which batching would save.
	if s := share(c.Propagation); s >= minShare && (chatty(&m.Turns) || m.Turns.PerExchangeMean >= manyTurns) {
		t := m.Turns
		if chatty(&t) {
			s *= 1 - 1/t.ExchangesPerBurstMean
		}
		d := record.Diagnosis{Name: ManyTurns, Severity: sev(s), Share: s,
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
		if s >= minShare {
			add(d)
		}
	}
	// The app parts: not a fault of the network, said plainly.
	if s := share(c.Peer); s >= criticalShare {
		add(record.Diagnosis{
			Name: PeerThink, Severity: record.SeverityInfo, Share: s,
			Summary:  fmt.Sprintf("%s of the latency is the peer's own time to answer (%s per exchange); the network takes %s", pct(s), dur(c.Peer), dur(c.Network)),
			Evidence: []record.Evidence{msEv("peer_mean", c.Peer), msEv("peer_p99", m.Components.Peer.P99), msEv("network_mean", c.Network)},
			Fix:      "look at the peer application (its profile, its own dependencies); moving it closer would save only the network part",
		})
	}
	// A healthy process reads within microseconds; a millisecond is a busy
	// machine's scheduling, a finding only from several.
	if s := share(c.LocalRead); s >= minShare && c.LocalRead >= minLocalRead {
		add(record.Diagnosis{
			Name: LocalRead, Severity: sev(s), Share: s,
			Summary:  fmt.Sprintf("%s of the latency is data that had arrived waiting for this application to read it (%s per exchange)", pct(s), dur(c.LocalRead)),
			Evidence: []record.Evidence{msEv("local_read_mean", c.LocalRead), msEv("local_read_p99", m.Components.LocalRead.P99)},
			Fix:      "this process reads late: look at its event loop, thread pool or CPU limits",
		})
	}
	if s := share(c.Think); s >= criticalShare {
		add(record.Diagnosis{
			Name: LocalThink, Severity: record.SeverityInfo, Share: s,
			Summary:  fmt.Sprintf("%s of the latency is this service's own processing (%s per request); the network takes %s", pct(s), dur(c.Think), dur(c.Network)),
			Evidence: []record.Evidence{msEv("think_mean", c.Think), msEv("think_p99", m.Components.Think.P99)},
			Fix:      "profile this service: the time is spent between reading the request and writing the response",
		})
	}
	// The path carries much more one way than the other (a NAT, an
	// asymmetric link). It is about rate, not a share of latency.
	if up, down := m.Out.TransferRate, m.In.TransferRate; m.Out.Transfers > 0 && m.In.Transfers > 0 && up > 0 && down > 0 &&
		max(up, down) >= asymmetric*min(up, down) {
		slow := "outgoing"
		if down < up {
			slow = "incoming"
		}
		add(record.Diagnosis{
			Name: Asymmetry, Severity: record.SeverityWarning,
			Summary: fmt.Sprintf("transfers run %.1f times slower %s: %s/s out against %s/s in",
				max(up, down)/min(up, down), slow, rateText(up), rateText(down)),
			Evidence: []record.Evidence{
				rate("transfer_rate_out", up), rate("transfer_rate_in", down),
				count("transfers_out", m.Out.Transfers), count("transfers_in", m.In.Transfers),
			},
			Fix: "the path is asymmetric: look for a NAT, a shaper or an asymmetric link on the slow direction, or place the big transfers where the path is fast",
		})
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

// chatty reports whether the bursts are seed 000's pattern: repeated runs
// of a few back-to-back exchanges, each run many turns.
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
	perConn := float64(p.Exchanges) / float64(p.Connections)
	for i := range ds {
		if ds[i].Name != ConnPerRequest {
			continue
		}
		ds[i].Evidence = append(ds[i].Evidence, record.Evidence{Name: "exchanges_per_connection", Value: perConn})
		if perConn >= 1.5 {
			ds[i].Summary += fmt.Sprintf("; each connection carries %.1f exchanges, the first ones another handshake (TLS): a request waits for about %.0f round trips where a kept-alive connection needs one",
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
	if e.Partial || e.Duration < exchangeMinPart {
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
