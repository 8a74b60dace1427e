package aggregate

import (
	"math"
	"time"

	"github.com/DataDog/sketches-go/ddsketch/mapping"

	"github.com/lattrace/lattrace/record"
)

// Sketch slots of a metrics: the duration, the components in the order of
// record.Components, and the path RTT.
const (
	skDuration = iota
	skNetwork
	skQueueing
	skSendWait
	skLossRecovery
	skHandshake
	skReceive
	skPeer
	skLocalRead
	skThink
	skPathRTT
	numSketches
)

// Sums of every field of record.Components, sub-splits included, so the
// means of the splits (propagation, send_wait by cause) are available
// without a sketch each.
const (
	csNetwork = iota
	csPropagation
	csQueueing
	csSendWait
	csSendWaitCwnd
	csSendWaitRwnd
	csSendWaitSndbuf
	csSendWaitPacing
	csSendWaitFlowControl
	csSendWaitOther
	csLossRecovery
	csHandshake
	csReceive
	csPeer
	csLocalRead
	csThink
	numComponentSums
)

// pendCap is how many exchanges a metrics holds before folding them into
// its sketches' stores. Each store is its own heap object; updating the
// two of a flow and the eleven of its peer pair on every exchange is a
// string of cache misses once there are more than a few hundred keys. An
// exchange updates the sketches' exact statistics at once and writes one
// row of bin indices here; folding 32 rows at a time walks each store
// while it is hot (docs/decisions.md has the measurement). Snapshots fold
// what is pending first, so they never lag.
const pendCap = 32

// metrics is what is accumulated per key, flows and peers alike. It is
// split so reset can clear the scalars in one assignment while keeping the
// sketches' memory.
type metrics struct {
	sk [numSketches]sketch
	// pend holds bin indices (int32: a row is 44 bytes) or noBin.
	pend  [pendCap][numSketches]int32
	npend int
	sc    scalars
	// cc is the congestion control seen at the last cwnd restart: apart
	// from scalars, which hold no pointer (pack.go stores them as bytes).
	cc string
}

type scalars struct {
	exchanges, requester, responder, partial, unanswered, multiplexed, pushes, unfinished, rejected uint64
	firstSeen, lastSeen                                                                             record.Mono
	// active is the sum of the durations of the complete exchanges in
	// ns, the denominator of goodput; activeBytes* the numerators.
	active                        float64
	activeBytesOut, activeBytesIn uint64
	compSum                       [numComponentSums]float64

	minRTT, srtt time.Duration

	retransmits, rtos                  uint64
	bytesOut, bytesIn, segsOut, segsIn uint64
	// Transfers (messages of TransferBytes or more) each way: bytes, the
	// time they took, and how many.
	xferOutBytes, xferInBytes uint64
	xferOutTime, xferInTime   time.Duration
	xfersOut, xfersIn         uint64

	turnsLast uint32
	turnsMax  uint32
	turnsSum  uint64

	// Completed bursts: runs of exchanges on one connection without an
	// idle gap (see burstGap).
	bursts, burstTurnsSum, burstExchangesSum uint64
	burstTurnsMax                            uint32

	cwndLast, cwndMin, cwndMax uint32
	cwndRestarts               uint64
	slowStartAfterIdle         bool
}

func (m *metrics) reset() {
	for i := range m.sk {
		m.sk[i].reset()
	}
	m.npend = 0
	m.sc = scalars{}
	m.cc = ""
}

// fold moves the pending bin indices into the sketches' stores, sketch by
// sketch.
func (m *metrics) fold(c *sketchCfg) {
	for k := range m.sk {
		if !c.binned[k] {
			continue
		}
		s := &m.sk[k]
		for i := range m.npend {
			if b := m.pend[i][k]; b != noBin {
				s.bin(c, b)
			}
		}
	}
	m.npend = 0
}

// seen widens the [firstSeen, lastSeen] window.
func (m *metrics) seen(first, last record.Mono) {
	if first == 0 {
		first = last
	}
	if first != 0 && (m.sc.firstSeen == 0 || first < m.sc.firstSeen) {
		m.sc.firstSeen = first
	}
	if last > m.sc.lastSeen {
		m.sc.lastSeen = last
	}
}

// addBurst counts one completed burst of exchanges.
func (m *metrics) addBurst(b burst) {
	sc := &m.sc
	sc.bursts++
	sc.burstTurnsSum += uint64(b.turns)
	sc.burstExchangesSum += uint64(b.exchanges)
	sc.burstTurnsMax = max(sc.burstTurnsMax, b.turns)
}

// timing is an exchange's values for the sketches and the store bin of
// each, found once for its flow and its peer pair: both tables index with
// one mapping, and finding a bin is a large part of adding an exchange.
type timing struct {
	v   [numSketches]time.Duration
	bin [numSketches]int
}

func (t *timing) of(m mapping.IndexMapping, ex *record.Exchange) {
	cp := &ex.Components
	t.v = [numSketches]time.Duration{
		skDuration:     ex.Duration,
		skNetwork:      cp.Network,
		skQueueing:     cp.Queueing,
		skSendWait:     cp.SendWait,
		skLossRecovery: cp.LossRecovery,
		skHandshake:    cp.Handshake,
		skReceive:      cp.Receive,
		skPeer:         cp.Peer,
		skLocalRead:    cp.LocalRead,
		skThink:        cp.Think,
		skPathRTT:      ex.PathRTT,
	}
	for k, v := range t.v {
		t.bin[k] = noBin
		if v > 0 {
			t.bin[k] = m.Index(float64(v))
		}
	}
}

// add folds one exchange in; t is its timing (timing.of).
func (m *metrics) add(c *sketchCfg, t *timing, ex *record.Exchange) {
	turns := ex.ExchangeTurns
	sc := &m.sc
	sc.exchanges++
	switch ex.Role {
	case record.Requester:
		sc.requester++
	case record.Responder:
		sc.responder++
	}
	m.seen(ex.Start, ex.Time)
	if ex.Partial {
		// Its beginning predates lattrace, so its duration and components
		// are truncated: it would drag the distributions and the goodput
		// down. It still counts for traffic, RTT and window state below.
		sc.partial++
	} else if ex.Unanswered {
		// A message without its reply (closing message, unanswered
		// request, one-way stream) waited: its duration is no round
		// trip. A one-way stream's rate is still the path's.
		sc.unanswered++
		m.addTransfers(ex)
	} else if ex.Multiplexed {
		// A cut between overlapping messages is no request and its
		// answer: no latency sample either.
		sc.multiplexed++
	} else if ex.Push {
		sc.pushes++
	} else if ex.Unfinished {
		// Cut where it stood when the daemon stopped.
		sc.unfinished++
	} else if ex.Rejected != "" {
		// The model's guard refused it as a sample (record.Rejection).
		sc.rejected++
	} else {
		m.addTiming(c, t, ex)
		m.addTransfers(ex)
	}

	// Zero RTTs mean "not measured" (no sample yet), not "instant".
	if ex.MinRTT > 0 && (sc.minRTT == 0 || ex.MinRTT < sc.minRTT) {
		sc.minRTT = ex.MinRTT
	}
	if ex.SRTT > 0 {
		sc.srtt = ex.SRTT
	}

	sc.retransmits += uint64(ex.Retransmits)
	sc.rtos += uint64(ex.RTOs)
	sc.bytesOut += ex.BytesOut
	sc.bytesIn += ex.BytesIn
	sc.segsOut += uint64(ex.SegsOut)
	sc.segsIn += uint64(ex.SegsIn)

	sc.turnsLast = ex.Turns
	sc.turnsSum += uint64(turns)
	if turns > sc.turnsMax {
		sc.turnsMax = turns
	}

	// A zero cwnd is "not read", never a real window.
	for _, w := range [2]uint32{ex.CwndStart, ex.CwndEnd} {
		if w == 0 {
			continue
		}
		if sc.cwndMin == 0 || w < sc.cwndMin {
			sc.cwndMin = w
		}
		if w > sc.cwndMax {
			sc.cwndMax = w
		}
	}
	if ex.CwndEnd != 0 {
		sc.cwndLast = ex.CwndEnd
	} else if ex.CwndStart != 0 {
		sc.cwndLast = ex.CwndStart
	}
	if ex.CwndRestart {
		sc.cwndRestarts++
	}
	if ex.CongestionControl != "" {
		m.cc = ex.CongestionControl
	}
	sc.slowStartAfterIdle = ex.SlowStartAfterIdle
}

// TransferBytes is the message size from which a message is a transfer:
// many segments, whose rate says what the path carries that way.
const TransferBytes = 64 << 10

// addTransfers counts the exchange's messages that are transfers, each
// timed the same way so the two directions compare: the outgoing one from
// its first write to its last byte first sent, the incoming one from its
// first byte to its last (neither holds a round trip or a delayed ACK).
// A transfer quicker than minTransferTime (one burst of segments) says
// nothing about the path's rate.
func (m *metrics) addTransfers(ex *record.Exchange) {
	sc, tl := &m.sc, &ex.Timeline
	if d := tl.X1.Sub(tl.W0); ex.BytesOut >= TransferBytes && tl.W0 != 0 && d >= minTransferTime {
		sc.xferOutBytes += ex.BytesOut
		sc.xferOutTime += d
		sc.xfersOut++
	}
	if d := tl.R1.Sub(tl.R0); ex.BytesIn >= TransferBytes && tl.R0 != 0 && d >= minTransferTime {
		sc.xferInBytes += ex.BytesIn
		sc.xferInTime += d
		sc.xfersIn++
	}
}

// minTransferTime: below it a transfer went out in one burst.
const minTransferTime = time.Millisecond

// addTiming records what an exchange says about time: its distributions,
// component sums and active time.
func (m *metrics) addTiming(c *sketchCfg, t *timing, ex *record.Exchange) {
	sc := &m.sc
	cp := &ex.Components
	row := &m.pend[m.npend]
	for k, v := range t.v {
		// A path RTT of zero is "no sample", not a zero RTT.
		if k == skPathRTT && v <= 0 {
			row[k] = noBin
			continue
		}
		s := &m.sk[k]
		if !s.count(v) || !c.binned[k] {
			row[k] = noBin
			continue
		}
		row[k] = s.pend(c, t.bin[k])
	}
	if m.npend++; m.npend == pendCap {
		m.fold(c)
	}

	s := &sc.compSum
	s[csNetwork] += float64(cp.Network)
	s[csPropagation] += float64(cp.Propagation)
	s[csQueueing] += float64(cp.Queueing)
	s[csSendWait] += float64(cp.SendWait)
	s[csSendWaitCwnd] += float64(cp.SendWaitCwnd)
	s[csSendWaitRwnd] += float64(cp.SendWaitRwnd)
	s[csSendWaitSndbuf] += float64(cp.SendWaitSndbuf)
	s[csSendWaitPacing] += float64(cp.SendWaitPacing)
	s[csSendWaitFlowControl] += float64(cp.SendWaitFlowControl)
	s[csSendWaitOther] += float64(cp.SendWaitOther)
	s[csLossRecovery] += float64(cp.LossRecovery)
	s[csHandshake] += float64(cp.Handshake)
	s[csReceive] += float64(cp.Receive)
	s[csPeer] += float64(cp.Peer)
	s[csLocalRead] += float64(cp.LocalRead)
	s[csThink] += float64(cp.Think)
	if ex.Duration > 0 {
		sc.active += float64(ex.Duration)
	}
	sc.activeBytesOut += ex.BytesOut
	sc.activeBytesIn += ex.BytesIn
}

// Metrics is the part of a snapshot common to flows and peer pairs.
type Metrics struct {
	Exchanges uint64 `json:"exchanges"`
	// Requester and Responder count exchanges by the local end's role.
	Requester uint64 `json:"requester"`
	Responder uint64 `json:"responder"`
	// Partial counts exchanges whose beginning predates lattrace: they
	// count for traffic, RTT, turns and cwnd but not in the latency
	// distributions, component means, Active or Goodput, whose timing
	// they would truncate.
	Partial uint64 `json:"partial"`
	// Unanswered counts exchanges whose message got no reply before the
	// connection closed (record.Exchange.Unanswered): they count like
	// partial ones, outside the latency distributions and means.
	Unanswered uint64 `json:"unanswered"`
	// Multiplexed counts exchanges cut from overlapping messages
	// (record.Exchange.Multiplexed), also outside the latency
	// distributions and means.
	Multiplexed uint64 `json:"multiplexed"`
	// Pushes counts the server's unprompted messages
	// (record.Exchange.Push), outside them too.
	Pushes uint64 `json:"pushes"`
	// Unfinished counts exchanges still in progress when a daemon
	// stopped (record.Exchange.Unfinished), outside them too.
	Unfinished uint64 `json:"unfinished"`
	// Rejected counts exchanges the latency model's guard refused as
	// samples (record.Exchange.Rejected), outside them too.
	Rejected  uint64      `json:"rejected"`
	FirstSeen record.Mono `json:"first_seen_mono_ns"`
	LastSeen  record.Mono `json:"last_seen_mono_ns"`
	// Active is the summed duration of the (non-partial) exchanges: the
	// time the application was waiting on this key, idle gaps excluded.
	// For a peer pair, exchanges of concurrent connections each count.
	Active time.Duration `json:"active_ns"`

	Duration   Summary            `json:"duration"`
	Components ComponentSummaries `json:"components"`
	// ComponentMeans is the mean of every component per exchange,
	// including the splits that have no distribution of their own
	// (propagation, send_wait by cause). The top-level means add up to
	// Duration.Mean, as components add up to each exchange's duration.
	ComponentMeans record.Components `json:"component_means"`

	RTT         RTT    `json:"rtt"`
	Retransmits uint64 `json:"retransmits"`
	RTOs        uint64 `json:"rtos"`
	// Out is what the local end sent, In what it received.
	Out   Direction `json:"out"`
	In    Direction `json:"in"`
	Turns Turns     `json:"turns"`
	Cwnd  Cwnd      `json:"cwnd"`
	// SlowStartAfterIdle is the namespace's tcp_slow_start_after_idle as
	// of the last exchange.
	SlowStartAfterIdle bool `json:"slow_start_after_idle"`
	// CongestionControl is the algorithm seen at the last cwnd restart.
	CongestionControl string `json:"congestion_control,omitempty"`
}

// Timed is how many of the exchanges are latency samples (not partial,
// unanswered, multiplexed, pushed, unfinished or rejected): the
// distributions and means are theirs.
func (m *Metrics) Timed() uint64 {
	return m.Exchanges - m.Partial - m.Unanswered - m.Multiplexed - m.Pushes - m.Unfinished - m.Rejected
}

// ComponentSummaries has one summary per latency component of
// docs/latency-model.md: a distribution for a peer pair, and for a flow
// its send wait's (the others are exact statistics, Summary.NoDistribution).
type ComponentSummaries struct {
	Network      Summary `json:"network"`
	Queueing     Summary `json:"queueing"`
	SendWait     Summary `json:"send_wait"`
	LossRecovery Summary `json:"loss_recovery"`
	Handshake    Summary `json:"handshake"`
	Receive      Summary `json:"receive"`
	Peer         Summary `json:"peer"`
	LocalRead    Summary `json:"local_read"`
	Think        Summary `json:"think"`
}

// RTT is the round-trip view of the path.
type RTT struct {
	// Min is the smallest windowed minimum RTT the kernel reported: the
	// best estimate of propagation delay.
	Min time.Duration `json:"min_ns"`
	// SRTTLast is the kernel's smoothed RTT at the last exchange.
	SRTTLast time.Duration `json:"srtt_last_ns"`
	// Path summarizes the clean path RTT per exchange: its distribution
	// for a peer pair, exact statistics for a flow.
	Path Summary `json:"path"`
}

// Direction is the traffic one way.
type Direction struct {
	Bytes    uint64 `json:"bytes"`
	Segments uint64 `json:"segments"`
	// Goodput is the bytes of the non-partial exchanges over Active, in
	// bytes per second: the rate the application got while it was
	// waiting on an exchange. Idle time between exchanges is excluded so
	// that a keep-alive connection that sits idle is not reported slow;
	// peer and local think time are included because the application
	// waited through them for those bytes. It is the rate experienced,
	// not the capacity of the path.
	Goodput float64 `json:"goodput_bytes_per_s"`
	// Transfers counts the messages of TransferBytes or more this way;
	// TransferRate is their bytes over the time they took: what the path
	// carried this way when asked to carry much.
	Transfers    uint64  `json:"transfers"`
	TransferRate float64 `json:"transfer_bytes_per_s"`
}

// Turns is how many changes of direction an exchange took. The tracer
// reports the connection's running count; per exchange it is the
// difference from the connection's previous exchange.
type Turns struct {
	// Last is the connection's running count at its last exchange (flows
	// only).
	Last            uint32  `json:"last,omitempty"`
	PerExchangeMean float64 `json:"per_exchange_mean"`
	PerExchangeMax  uint32  `json:"per_exchange_max"`
	// A burst is a run of exchanges on one connection with no idle gap
	// between them (the next request left as soon as the last response
	// came): what an application does for one of its own requests, such
	// as several database queries in a row. Its turns are what distance
	// multiplies. Counted once the burst is over.
	Bursts                uint64  `json:"bursts"`
	PerBurstMean          float64 `json:"per_burst_mean"`
	PerBurstMax           uint32  `json:"per_burst_max"`
	ExchangesPerBurstMean float64 `json:"exchanges_per_burst_mean"`
}

// Cwnd is the congestion window, in segments.
type Cwnd struct {
	Last uint32 `json:"last"`
	Min  uint32 `json:"min"`
	Max  uint32 `json:"max"`
	// Restarts counts exchanges whose window was cut by slow start after
	// idle before they sent.
	Restarts uint64 `json:"restarts"`
}

func meanDur(sum float64, n uint64) time.Duration {
	if n == 0 {
		return 0
	}
	return time.Duration(math.Round(sum / float64(n)))
}

func goodput(bytes uint64, active float64) float64 {
	if active <= 0 {
		return 0
	}
	return float64(bytes) / (active / float64(time.Second))
}

// summary is sketch k's Summary, which says when the table keeps no
// distribution of it.
func (m *metrics) summary(c *sketchCfg, k int) Summary {
	s := m.sk[k].summary(c)
	s.NoDistribution = !c.binned[k]
	return s
}

// durationQuantiles are the duration's p50 and p99, as snapshot gives
// them; m must be folded.
func (m *metrics) durationQuantiles(c *sketchCfg) (p50, p99 time.Duration) {
	return m.sk[skDuration].quantile(c, 0.50), m.sk[skDuration].quantile(c, 0.99)
}

// snapshot summarizes m; it folds pending values, so it needs the same
// lock as add.
func (m *metrics) snapshot(c *sketchCfg) Metrics {
	m.fold(c)
	sc := &m.sc
	n := sc.exchanges - sc.partial - sc.unanswered - sc.multiplexed - sc.pushes - sc.unfinished - sc.rejected // the exchanges with timing
	cs := &sc.compSum
	out := Metrics{
		Exchanges:   sc.exchanges,
		Requester:   sc.requester,
		Responder:   sc.responder,
		Partial:     sc.partial,
		Unanswered:  sc.unanswered,
		Multiplexed: sc.multiplexed,
		Pushes:      sc.pushes,
		Unfinished:  sc.unfinished,
		Rejected:    sc.rejected,
		FirstSeen:   sc.firstSeen,
		LastSeen:    sc.lastSeen,
		Active:      time.Duration(math.Round(sc.active)),
		Duration:    m.summary(c, skDuration),
		Components: ComponentSummaries{
			Network:      m.summary(c, skNetwork),
			Queueing:     m.summary(c, skQueueing),
			SendWait:     m.summary(c, skSendWait),
			LossRecovery: m.summary(c, skLossRecovery),
			Handshake:    m.summary(c, skHandshake),
			Receive:      m.summary(c, skReceive),
			Peer:         m.summary(c, skPeer),
			LocalRead:    m.summary(c, skLocalRead),
			Think:        m.summary(c, skThink),
		},
		ComponentMeans: record.Components{
			Network:             meanDur(cs[csNetwork], n),
			Propagation:         meanDur(cs[csPropagation], n),
			Queueing:            meanDur(cs[csQueueing], n),
			SendWait:            meanDur(cs[csSendWait], n),
			SendWaitCwnd:        meanDur(cs[csSendWaitCwnd], n),
			SendWaitRwnd:        meanDur(cs[csSendWaitRwnd], n),
			SendWaitSndbuf:      meanDur(cs[csSendWaitSndbuf], n),
			SendWaitPacing:      meanDur(cs[csSendWaitPacing], n),
			SendWaitFlowControl: meanDur(cs[csSendWaitFlowControl], n),
			SendWaitOther:       meanDur(cs[csSendWaitOther], n),
			LossRecovery:        meanDur(cs[csLossRecovery], n),
			Handshake:           meanDur(cs[csHandshake], n),
			Receive:             meanDur(cs[csReceive], n),
			Peer:                meanDur(cs[csPeer], n),
			LocalRead:           meanDur(cs[csLocalRead], n),
			Think:               meanDur(cs[csThink], n),
		},
		RTT: RTT{
			Min:      sc.minRTT,
			SRTTLast: sc.srtt,
			Path:     m.summary(c, skPathRTT),
		},
		Retransmits: sc.retransmits,
		RTOs:        sc.rtos,
		Out: Direction{Bytes: sc.bytesOut, Segments: sc.segsOut, Goodput: goodput(sc.activeBytesOut, sc.active),
			Transfers: sc.xfersOut, TransferRate: goodput(sc.xferOutBytes, float64(sc.xferOutTime))},
		In: Direction{Bytes: sc.bytesIn, Segments: sc.segsIn, Goodput: goodput(sc.activeBytesIn, sc.active),
			Transfers: sc.xfersIn, TransferRate: goodput(sc.xferInBytes, float64(sc.xferInTime))},
		Turns: Turns{Last: sc.turnsLast, PerExchangeMax: sc.turnsMax},
		Cwnd: Cwnd{
			Last:     sc.cwndLast,
			Min:      sc.cwndMin,
			Max:      sc.cwndMax,
			Restarts: sc.cwndRestarts,
		},
		SlowStartAfterIdle: sc.slowStartAfterIdle,
		CongestionControl:  m.cc,
	}
	if sc.exchanges > 0 {
		out.Turns.PerExchangeMean = float64(sc.turnsSum) / float64(sc.exchanges)
	}
	if sc.bursts > 0 {
		out.Turns.Bursts = sc.bursts
		out.Turns.PerBurstMean = float64(sc.burstTurnsSum) / float64(sc.bursts)
		out.Turns.PerBurstMax = sc.burstTurnsMax
		out.Turns.ExchangesPerBurstMean = float64(sc.burstExchangesSum) / float64(sc.bursts)
	}
	return out
}
