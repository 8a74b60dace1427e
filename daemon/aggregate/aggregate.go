package aggregate

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Defaults for the zero Config fields.
const (
	DefaultMaxFlows         = 1 << 18
	DefaultActiveFlows      = 2048
	DefaultMaxPeers         = 1024
	DefaultCloseGrace       = 30 * time.Second
	DefaultFlowIdle         = 10 * time.Minute
	DefaultPeerIdle         = time.Hour
	DefaultRelativeAccuracy = 0.01
	DefaultSketchBins       = 1024
)

// Config bounds an Aggregator. Zero fields take the defaults above.
type Config struct {
	// MaxFlows and MaxPeers cap the tables; inserting into a full table
	// evicts (see the package comment). What an entry costs, and so what
	// the defaults hold, is in docs/decisions.md. MaxFlows counts packed
	// flows too: it is a bound against a runaway, not the working size.
	MaxFlows int
	MaxPeers int
	// ActiveFlows is how many of the most recently updated flows are kept
	// unpacked, ready for their next exchange; the others are packed
	// (pack.go) until their next record.
	ActiveFlows int
	// CloseGrace is how long a closed flow stays visible after its
	// ConnClose.
	CloseGrace time.Duration
	// FlowIdle and PeerIdle drop entries that received nothing for that
	// long; negative disables it (the table bound still holds).
	FlowIdle time.Duration
	PeerIdle time.Duration
	// RelativeAccuracy of the quantiles, in (0, 1).
	RelativeAccuracy float64
	// SketchBins caps the bins of one peer-pair sketch (8 bytes each).
	// At 1 % accuracy, 1024 bins span about eight decades before the
	// lowest ones are merged. Flow sketches are paged instead (see
	// flowSketches).
	SketchBins int
}

// Validate checks the tables' bounds as a user gives them (the daemon's
// flags); zero takes the default.
func (c Config) Validate() error {
	for _, b := range []struct {
		flag string
		v    int
	}{{"--max-flows", c.MaxFlows}, {"--active-flows", c.ActiveFlows}, {"--max-peers", c.MaxPeers}} {
		if b.v < 0 {
			return fmt.Errorf("%s %d: want a positive number", b.flag, b.v)
		}
	}
	if d := c.withDefaults(); c.ActiveFlows > d.MaxFlows {
		return fmt.Errorf("--active-flows %d is above --max-flows %d", c.ActiveFlows, d.MaxFlows)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.MaxFlows <= 0 {
		c.MaxFlows = DefaultMaxFlows
	}
	if c.MaxPeers <= 0 {
		c.MaxPeers = DefaultMaxPeers
	}
	if c.ActiveFlows <= 0 {
		c.ActiveFlows = DefaultActiveFlows
	}
	c.ActiveFlows = min(c.ActiveFlows, c.MaxFlows)
	if c.CloseGrace <= 0 {
		c.CloseGrace = DefaultCloseGrace
	}
	if c.FlowIdle == 0 {
		c.FlowIdle = DefaultFlowIdle
	}
	if c.PeerIdle == 0 {
		c.PeerIdle = DefaultPeerIdle
	}
	if !(c.RelativeAccuracy > 0 && c.RelativeAccuracy < 1) {
		c.RelativeAccuracy = DefaultRelativeAccuracy
	}
	if c.SketchBins <= 0 {
		c.SketchBins = DefaultSketchBins
	}
	return c
}

// Counters are the Aggregator's own health: how full it is and what it had
// to drop. A rising FlowsEvicted means MaxFlows is too small for the host.
type Counters struct {
	Flows int `json:"flows"`
	// PackedFlows are the flows among Flows that are packed: not updated
	// since ActiveFlows others were.
	PackedFlows int    `json:"packed_flows"`
	Peers       int    `json:"peers"`
	MaxFlows    int    `json:"max_flows"`
	MaxPeers    int    `json:"max_peers"`
	Exchanges   uint64 `json:"exchanges"`
	ConnOpens   uint64 `json:"conn_opens"`
	ConnCloses  uint64 `json:"conn_closes"`

	FlowsCreated uint64 `json:"flows_created"`
	PeersCreated uint64 `json:"peers_created"`
	// Evicted: dropped early because the table was full.
	FlowsEvicted uint64 `json:"flows_evicted"`
	PeersEvicted uint64 `json:"peers_evicted"`
	// FlowsRetired: closed flows dropped after CloseGrace.
	FlowsRetired uint64 `json:"flows_retired"`
	// Expired: dropped after FlowIdle / PeerIdle without records.
	FlowsExpired uint64 `json:"flows_expired"`
	PeersExpired uint64 `json:"peers_expired"`
	// FlowsShed: dropped to give memory back, the daemon near its memory
	// limit (Shed).
	FlowsShed uint64 `json:"flows_shed"`
	// PackErrors counts packed flows that did not decode and were
	// dropped: a bug if ever above zero.
	PackErrors uint64 `json:"pack_errors"`
}

// The values of FlowStats.HTTP2Framing.
const (
	HTTP2FromPreface = "preface"
	HTTP2FoundMidway = "found_midway"
	HTTP2Searching   = "searching"
	HTTP2NotFound    = "not_found"
)

// http2Framing is what a flow's framing is after ex, from what it was.
func http2Framing(was string, ex *record.Exchange) string {
	switch {
	case ex.Stream != nil && ex.RoleSource != "":
		return HTTP2FoundMidway
	case ex.Stream != nil:
		return HTTP2FromPreface
	case ex.HTTP2Searching:
		return HTTP2Searching
	case was == HTTP2Searching:
		return HTTP2NotFound
	}
	return was
}

// FlowStats is a snapshot of one connection.
type FlowStats struct {
	record.FlowKey
	Owner record.Owner `json:"owner"`
	// ConnRole is who opened the connection, when known.
	ConnRole record.Role `json:"conn_role"`
	// RoleSource says how ConnRole was told on a connection open before
	// lattrace started: from the listening sockets, or guessed (empty:
	// its handshake was seen).
	RoleSource record.RoleSource `json:"role_source,omitempty"`
	// HTTP2Framing says how the framing of a cleartext HTTP/2 connection
	// was found: HTTP2FromPreface, HTTP2FoundMidway (open before
	// lattrace), HTTP2Searching or HTTP2NotFound (it looked like HTTP/2;
	// its exchanges are the connection's own). Empty: not HTTP/2, or not
	// known to be.
	HTTP2Framing string `json:"http2_framing,omitempty"`
	// Peer is the peer pair the flow is counted under (zero until the
	// flow has an owner, i.e. before its first exchange or close).
	Peer record.PeerKey `json:"peer"`
	// Opened, ConnectLatency and HandshakeRTT come from the ConnOpen.
	Opened         record.Mono   `json:"opened_mono_ns,omitempty"`
	ConnectLatency time.Duration `json:"connect_latency_ns,omitempty"`
	HandshakeRTT   time.Duration `json:"handshake_rtt_ns,omitempty"`
	// Close is the ConnClose, once the connection ended; the flow stays
	// until CloseGrace after it.
	Close *record.ConnClose `json:"close,omitempty"`
	// PeerK8s names the remote end in a cluster, as of the last exchange.
	PeerK8s *record.K8s `json:"peer_k8s,omitempty"`
	Metrics
	rate rateWindow // RateAt
}

// PeerStats is a snapshot of one peer pair.
type PeerStats struct {
	record.PeerKey
	// Connections is how many flows were counted under this pair.
	Connections uint64 `json:"connections"`
	// ConnectLatency is the distribution of the connections' SYN to
	// ESTABLISHED time, for those whose open lattrace saw.
	ConnectLatency Summary `json:"connect_latency"`
	Metrics
}

// guard is what a snapshot needs of an entry of either table.
type guard struct {
	// mu guards the fields snapshots read; the writer holds it only while
	// changing them.
	mu sync.Mutex
	// gen changes whenever the entry leaves its table, so a snapshot that
	// picked the pointer before can tell it now holds something else.
	gen uint64
}

func (g *guard) guarded() *guard { return g }

type flowEntry struct {
	guard
	key            record.FlowKey
	owner          record.Owner
	connRole       record.Role
	roleSource     record.RoleSource
	http2Framing   string
	peerKey        record.PeerKey
	opened         record.Mono
	connectLatency time.Duration
	handshakeRTT   time.Duration
	closed         bool
	close          record.ConnClose
	peerK8s        *record.K8s
	m              metrics
	// burst is the connection's run of exchanges in progress.
	burst burst
	rate  rateWindow

	// Below: writer only.
	ln         [2]links[flowEntry] // lruList, closedList
	lastUpdate record.Mono
	closedAt   record.Mono
	side       record.Role // fixed at the first attribution
	peer       *peerEntry
	peerGen    uint64
}

func (e *flowEntry) link(i int) *links[flowEntry] { return &e.ln[i] }

// burst is a run of exchanges without an idle gap between them.
type burst struct {
	turns, exchanges uint32
}

// burstGap is the silence that ends a burst. Back to back, the next
// request follows the response within microseconds (the app reacts to
// it); a client on a timer waits a good part of a round trip or more.
func burstGap(ex *record.Exchange) time.Duration {
	return max(2*time.Millisecond, ex.SRTT/4)
}

type peerEntry struct {
	guard
	key         record.PeerKey
	connections uint64
	connect     sketch
	m           metrics

	ln         [1]links[peerEntry]
	lastUpdate record.Mono
}

func (e *peerEntry) link(i int) *links[peerEntry] { return &e.ln[i] }

const (
	lruList    = 0
	closedList = 1
)

// Aggregator holds the live tables. See the package comment for the
// concurrency contract.
type Aggregator struct {
	cfg Config
	// Both tables index with one mapping (New), so AddExchange finds an
	// exchange's bins once for its flow and its pair.
	flowSC sketchCfg
	peerSC sketchCfg

	// wmu serializes writers, so they may read the maps without mu.
	wmu sync.Mutex
	// mu guards the maps' structure against snapshots.
	mu sync.RWMutex
	// flows is keyed by socket cookie: a cookie names one socket for the
	// kernel's lifetime, and hashing it costs a fraction of hashing the
	// whole FlowKey on every exchange. A socket that connects again (after
	// a failed connect) is a new flow: its old entry is retired.
	flows map[uint64]*flowEntry
	// packed holds the flows outside the ActiveFlows most recently
	// updated, by cookie too; a flow is in one map or the other.
	packed map[uint64]packedFlow
	peers  map[record.PeerKey]*peerEntry
	// packOrder is the packed flows' cookies in the order they were
	// packed, which is the order of their last update: the oldest is
	// evicted first. Entries of flows unpacked since are skipped.
	packOrder []packRef
	// packedScan is when Expire last walked packed.
	packedScan record.Mono
	// packBuf is pack's scratch (writer only).
	packBuf []byte
	// packErrs counts packed flows that failed to decode (a bug): they
	// are dropped, and Counters says how many.
	packErrs atomic.Uint64

	// Under wmu.
	flowLRU    list[flowEntry, *flowEntry]
	flowClosed list[flowEntry, *flowEntry]
	peerLRU    list[peerEntry, *peerEntry]
	// Removed entries, kept with their sketch memory for the next insert.
	freeFlows free[flowEntry]
	freePeers free[peerEntry]

	exchanges, connOpens, connCloses atomic.Uint64
	flowsCreated, peersCreated       atomic.Uint64
	flowsEvicted, peersEvicted       atomic.Uint64
	flowsRetired                     atomic.Uint64
	flowsExpired, peersExpired       atomic.Uint64
	flowsShed                        atomic.Uint64
}

// New returns an empty Aggregator bounded by cfg.
func New(cfg Config) *Aggregator {
	cfg = cfg.withDefaults()
	m := newMapping(cfg.RelativeAccuracy)
	return &Aggregator{
		cfg:        cfg,
		flowSC:     flowSketches(m),
		peerSC:     peerSketches(m, cfg.SketchBins),
		flows:      make(map[uint64]*flowEntry),
		packed:     make(map[uint64]packedFlow),
		peers:      make(map[record.PeerKey]*peerEntry),
		flowLRU:    list[flowEntry, *flowEntry]{i: lruList},
		flowClosed: list[flowEntry, *flowEntry]{i: closedList},
		peerLRU:    list[peerEntry, *peerEntry]{i: 0},
	}
}

// Config returns the configuration in force, defaults filled in.
func (a *Aggregator) Config() Config { return a.cfg }

// AddExchange folds one exchange into its flow and its peer pair.
func (a *Aggregator) AddExchange(ex *record.Exchange) {
	if ex == nil {
		return
	}
	t := ex.Time
	// Partial, unanswered and multiplexed exchanges skip the sketches.
	var tm timing
	if !ex.Partial && ex.Timed() {
		tm.of(a.flowSC.m, ex)
	}
	a.wmu.Lock()
	f := a.flowFor(record.FlowKey{Flow: ex.Flow, Cookie: ex.Cookie}, t)
	// A socket adopted from softirq has no owner until its process next
	// touches it: its first exchange counts for the flow, and for the pair
	// only once the pair is known, rather than under a nameless pair.
	hasOwner := ex.Owner.Known()
	var p *peerEntry
	if hasOwner {
		p = a.attribute(f, &ex.Owner, ex.ConnRole, ex.Role, t)
	} else {
		p = a.livePeer(f)
	}

	f.mu.Lock()
	if f.connRole == "" || f.connRole == record.RoleUnknown {
		f.connRole = ex.ConnRole
	}
	if ex.RoleSource != "" {
		f.roleSource = ex.RoleSource
	}
	f.http2Framing = http2Framing(f.http2Framing, ex)
	if hasOwner {
		f.owner = ex.Owner
	}
	if ex.Peer != nil {
		f.peerK8s = ex.Peer
	}
	// An idle gap ends the connection's burst: count it where it belongs.
	// Bursts are the requester's: a responder's idle gap runs from its
	// own last write and holds a round trip.
	var done burst
	if ex.Role == record.Requester {
		if f.burst.exchanges > 0 && ex.IdleGap >= burstGap(ex) {
			done, f.burst = f.burst, burst{}
			f.m.addBurst(done)
		}
		f.burst.turns += ex.ExchangeTurns
		f.burst.exchanges++
	}
	f.rate.add(t)
	f.m.add(&a.flowSC, &tm, ex)
	f.mu.Unlock()

	if p != nil {
		p.mu.Lock()
		if done.exchanges > 0 {
			p.m.addBurst(done)
		}
		p.m.add(&a.peerSC, &tm, ex)
		p.mu.Unlock()
	}
	a.wmu.Unlock()
	a.exchanges.Add(1)
}

// AddConnOpen records a connection's establishment: its role and connect
// latency, which the peer pair gets once the flow has an owner.
func (a *Aggregator) AddConnOpen(o record.ConnOpen) {
	a.wmu.Lock()
	f := a.flowFor(record.FlowKey{Flow: o.Flow, Cookie: o.Cookie}, o.Time)
	f.mu.Lock()
	if o.Role == record.RoleClient || o.Role == record.RoleServer {
		f.connRole = o.Role
	}
	f.opened = o.Time
	f.connectLatency = o.ConnectLatency
	f.handshakeRTT = o.HandshakeRTT
	f.m.seen(o.Time, o.Time)
	f.mu.Unlock()
	// Records from different CPUs can arrive out of order: if the flow was
	// already counted under a peer pair, give it the latency now.
	if p := a.livePeer(f); p != nil && o.ConnectLatency > 0 {
		p.mu.Lock()
		p.connect.add(&a.peerSC, o.ConnectLatency)
		p.mu.Unlock()
	}
	a.wmu.Unlock()
	a.connOpens.Add(1)
}

// AddConnClose marks a flow closed; Expire retires it after CloseGrace. A
// close of a flow never seen creates it, so short connections that ended
// without a complete exchange are still counted under their peer pair.
func (a *Aggregator) AddConnClose(c record.ConnClose) {
	a.wmu.Lock()
	f := a.flowFor(record.FlowKey{Flow: c.Flow, Cookie: c.Cookie}, c.Time)
	hasOwner := c.Owner.Known()
	var p *peerEntry
	if hasOwner {
		p = a.attribute(f, &c.Owner, c.Role, "", c.Time)
	}
	f.mu.Lock()
	if f.connRole == "" || f.connRole == record.RoleUnknown {
		f.connRole = c.Role
	}
	if hasOwner {
		f.owner = c.Owner
	}
	f.closed = true
	f.close = c
	f.m.seen(0, c.Time)
	// The connection's last burst ends with it.
	done := f.burst
	f.burst = burst{}
	if done.exchanges > 0 {
		f.m.addBurst(done)
	}
	f.mu.Unlock()
	if p == nil {
		p = a.livePeer(f)
	}
	if p != nil {
		p.mu.Lock()
		if done.exchanges > 0 {
			p.m.addBurst(done)
		}
		p.m.seen(0, c.Time)
		p.mu.Unlock()
	}
	if !a.flowClosed.contains(f) {
		f.closedAt = c.Time
		a.flowClosed.pushFront(f)
	}
	a.wmu.Unlock()
	a.connCloses.Add(1)
}

// Expire retires closed flows past CloseGrace and drops entries idle past
// FlowIdle / PeerIdle, as of now (CLOCK_MONOTONIC, the records' clock).
// Call it periodically, e.g. every second. It returns how many entries it
// removed.
//
// The lists are ordered by arrival, and records are nearly but not exactly
// time-ordered across CPUs; Expire stops at the first entry that is not
// due, so an entry can outlive its deadline by the skew, never die early.
func (a *Aggregator) Expire(now record.Mono) int {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	n := 0
	for f := a.flowClosed.tail; f != nil && due(f.closedAt, now, a.cfg.CloseGrace); f = a.flowClosed.tail {
		a.removeFlow(f)
		a.flowsRetired.Add(1)
		n++
	}
	if a.cfg.FlowIdle > 0 {
		for f := a.flowLRU.tail; f != nil && due(f.lastUpdate, now, a.cfg.FlowIdle); f = a.flowLRU.tail {
			a.removeFlow(f)
			a.flowsExpired.Add(1)
			n++
		}
	}
	if now >= a.packedScan && now.Sub(a.packedScan) >= packedScanEvery {
		a.packedScan = now
		n += a.expirePacked(now)
	}
	if a.cfg.PeerIdle > 0 {
		for p := a.peerLRU.tail; p != nil && due(p.lastUpdate, now, a.cfg.PeerIdle); p = a.peerLRU.tail {
			a.removePeer(p)
			a.peersExpired.Add(1)
			n++
		}
	}
	return n
}

// packedScanEvery is how often Expire walks the packed flows, which are in
// no list: a walk of 100,000 takes about a millisecond, and a packed flow
// outlives its deadline by at most this much.
const packedScanEvery = 5 * time.Second

func (a *Aggregator) expirePacked(now record.Mono) int {
	n := 0
	for c, p := range a.packed {
		var count *atomic.Uint64
		switch {
		case p.close != nil && due(p.closedAt, now, a.cfg.CloseGrace):
			count = &a.flowsRetired
		case a.cfg.FlowIdle > 0 && due(p.lastUpdate, now, a.cfg.FlowIdle):
			count = &a.flowsExpired
		default:
			continue
		}
		a.mu.Lock()
		delete(a.packed, c)
		a.mu.Unlock()
		count.Add(1)
		n++
	}
	return n
}

func due(t, now record.Mono, after time.Duration) bool {
	return now >= t && now.Sub(t) >= after
}

// flowFor returns the flow for k, creating it, and marks it updated at t.
// Caller holds wmu.
func (a *Aggregator) flowFor(k record.FlowKey, t record.Mono) *flowEntry {
	f := a.flows[k.Cookie]
	if f != nil && f.key != k {
		a.removeFlow(f)
		a.flowsRetired.Add(1)
		f = nil
	}
	switch {
	case f != nil:
		a.flowLRU.moveToFront(f)
	case a.isPacked(k.Cookie):
		f = a.unpackFlow(k)
	}
	if f == nil {
		if len(a.flows)+len(a.packed) >= a.cfg.MaxFlows {
			a.evictFlow()
		}
		f = a.spareFlow()
		// A snapshot that listed this entry in its previous life may
		// still lock it to compare gen, so its fields change under mu.
		f.mu.Lock()
		f.key = k
		f.mu.Unlock()
		f.peer, f.peerGen, f.side = nil, 0, ""
		a.mu.Lock()
		a.flows[k.Cookie] = f
		a.mu.Unlock()
		a.flowLRU.pushFront(f)
		a.flowsCreated.Add(1)
	}
	f.lastUpdate = max(f.lastUpdate, t)
	return f
}

func (a *Aggregator) isPacked(cookie uint64) bool {
	_, ok := a.packed[cookie]
	return ok
}

// evictFlow makes room in a table of MaxFlows flows (dropOldest).
func (a *Aggregator) evictFlow() {
	a.flowsEvicted.Add(1)
	a.dropOldest()
}

// Shed drops the given share of the flows, the least recently updated
// (dropOldest), with their statistics, to give memory back when the
// daemon nears its memory limit (daemon/memguard); their peer pairs keep
// what they counted, and a flow dropped starts anew at its next record.
// The spare entries kept for reuse go too. It returns how many flows
// went, also counted in Counters.FlowsShed.
func (a *Aggregator) Shed(share float64) int {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	share = min(max(share, 0), 1)
	n := min(int(math.Ceil(share*float64(len(a.flows)+len(a.packed)))), len(a.flows)+len(a.packed))
	for range n {
		a.dropOldest()
	}
	a.freeFlows = nil
	// Dropping from the front keeps the array: copy what is left.
	a.packOrder = slices.Clone(a.packOrder)
	a.flowsShed.Add(uint64(n))
	return n
}

// dropOldest drops the least recently updated flow, unless a closed flow
// is only waiting out its grace period, the cheapest loss. Packed flows
// are older than every unpacked one.
func (a *Aggregator) dropOldest() {
	if v := a.flowClosed.tail; v != nil {
		a.removeFlow(v)
		return
	}
	for len(a.packOrder) > 0 {
		r := a.packOrder[0]
		a.packOrder = a.packOrder[1:]
		if p, ok := a.packed[r.cookie]; ok && p.lastUpdate == r.lastUpdate {
			a.mu.Lock()
			delete(a.packed, r.cookie)
			a.mu.Unlock()
			return
		}
	}
	if v := a.flowLRU.tail; v != nil {
		a.removeFlow(v)
	}
}

// packRef is an entry of packOrder.
type packRef struct {
	cookie     uint64
	lastUpdate record.Mono
}

// queuePacked appends a packed flow to packOrder, dropping the entries of
// flows unpacked or removed since once they outnumber the packed flows.
func (a *Aggregator) queuePacked(cookie uint64, lastUpdate record.Mono) {
	if len(a.packOrder) >= 2*len(a.packed)+1024 {
		live := a.packOrder[:0:0]
		for _, r := range a.packOrder {
			if p, ok := a.packed[r.cookie]; ok && p.lastUpdate == r.lastUpdate {
				live = append(live, r)
			}
		}
		a.packOrder = live
	}
	a.packOrder = append(a.packOrder, packRef{cookie, lastUpdate})
}

// spareFlow returns a reset entry for a flow about to be made or unpacked,
// packing the least recently updated one when ActiveFlows are unpacked.
func (a *Aggregator) spareFlow() *flowEntry {
	if len(a.flows) >= a.cfg.ActiveFlows {
		if v := a.flowLRU.tail; v != nil {
			v.mu.Lock()
			var p packedFlow
			p, a.packBuf = v.pack(&a.flowSC, a.packBuf)
			v.mu.Unlock()
			a.mu.Lock()
			delete(a.flows, v.key.Cookie)
			a.packed[v.key.Cookie] = p
			a.mu.Unlock()
			a.queuePacked(v.key.Cookie, p.lastUpdate)
			a.recycleFlow(v)
		}
	}
	return a.freeFlows.get()
}

// unpackFlow moves k's packed flow back to the unpacked table. A packed
// flow of the cookie under another key is retired (see flowFor), one that
// does not decode dropped and counted: either way it returns nil.
func (a *Aggregator) unpackFlow(k record.FlowKey) *flowEntry {
	p := a.packed[k.Cookie]
	drop := func(count *atomic.Uint64) {
		count.Add(1)
		a.mu.Lock()
		delete(a.packed, k.Cookie)
		a.mu.Unlock()
	}
	if pk, err := p.key(); err != nil || pk != k {
		if err != nil {
			drop(&a.packErrs)
		} else {
			drop(&a.flowsRetired)
		}
		return nil
	}
	f := a.spareFlow()
	f.mu.Lock()
	err := p.unpack(f, &a.flowSC)
	f.mu.Unlock()
	if err != nil {
		drop(&a.packErrs)
		a.recycleFlow(f)
		return nil
	}
	// In one step, so that a snapshot finds the flow in one map or the
	// other.
	a.mu.Lock()
	delete(a.packed, k.Cookie)
	a.flows[k.Cookie] = f
	a.mu.Unlock()
	a.flowLRU.pushFront(f)
	if f.closed {
		// Out of order on the closed list, it is retired late, never
		// early (Expire).
		a.flowClosed.pushFront(f)
	}
	return f
}

func (a *Aggregator) removeFlow(f *flowEntry) {
	a.mu.Lock()
	delete(a.flows, f.key.Cookie)
	a.mu.Unlock()
	a.recycleFlow(f)
}

// recycleFlow resets f, which no table holds any longer, for reuse.
func (a *Aggregator) recycleFlow(f *flowEntry) {
	a.flowLRU.remove(f)
	a.flowClosed.remove(f)
	f.mu.Lock()
	f.gen++
	f.owner, f.connRole, f.roleSource, f.http2Framing, f.peerKey = record.Owner{}, "", "", "", record.PeerKey{}
	f.opened, f.connectLatency, f.handshakeRTT = 0, 0, 0
	f.closed, f.close, f.burst, f.peerK8s, f.rate = false, record.ConnClose{}, burst{}, nil, rateWindow{}
	f.m.reset()
	f.mu.Unlock()
	f.peer, f.peerGen, f.side, f.lastUpdate, f.closedAt = nil, 0, "", 0, 0
	a.freeFlows.put(f, a.cfg.ActiveFlows)
}

// free holds removed entries for reuse.
type free[E any] []*E

// get is a removed entry, or a new one when none is kept.
func (l *free[E]) get() *E {
	n := len(*l)
	if n == 0 {
		return new(E)
	}
	e := (*l)[n-1]
	(*l)[n-1] = nil
	*l = (*l)[:n-1]
	return e
}

// put keeps e unless the entries kept for a table of limit entries are
// enough already.
func (l *free[E]) put(e *E, limit int) {
	if len(*l) < freeCap(limit) {
		*l = append(*l, e)
	}
}

// freeCap bounds the recycled entries: enough to absorb connection churn
// without allocating, not so many that a table that shrank keeps all its
// memory.
func freeCap(limit int) int { return limit/4 + 16 }

// livePeer is the flow's peer entry if it still holds the same pair.
func (a *Aggregator) livePeer(f *flowEntry) *peerEntry {
	if p := f.peer; p != nil && p.gen == f.peerGen {
		return p
	}
	return nil
}

// attribute returns the peer entry flow f counts under for owner o,
// creating it, and marks it updated at t. Caller holds wmu.
func (a *Aggregator) attribute(f *flowEntry, o *record.Owner, conn record.Role, ex record.ExchangeRole, t record.Mono) *peerEntry {
	if f.side == "" {
		f.side = record.SideOf(conn, f.connRole, ex, f.key.Flow)
	}
	p := a.livePeer(f)
	// The pair is the flow's (fixed) and its owner's: while the owner is
	// the same, so is the pair, and its key need not be built again.
	if p == nil || p.key.Comm != o.Comm || p.key.CgroupID != o.CgroupID {
		k := record.PeerKeyOf(f.key.Flow, f.side, o)
		// First attribution, the owner changed (exec, fd passing), or
		// the pair was evicted meanwhile: a new connection of this pair.
		p = a.peerFor(k, t)
		f.peer, f.peerGen = p, p.gen
		f.mu.Lock()
		f.peerKey = k
		lat := f.connectLatency
		f.mu.Unlock()
		p.mu.Lock()
		p.connections++
		if lat > 0 {
			p.connect.add(&a.peerSC, lat)
		}
		p.mu.Unlock()
		return p
	}
	a.peerLRU.moveToFront(p)
	p.lastUpdate = max(p.lastUpdate, t)
	return p
}

func (a *Aggregator) peerFor(k record.PeerKey, t record.Mono) *peerEntry {
	p := a.peers[k]
	if p == nil {
		if len(a.peers) >= a.cfg.MaxPeers {
			a.removePeer(a.peerLRU.tail)
			a.peersEvicted.Add(1)
		}
		p = a.freePeers.get()
		p.mu.Lock()
		p.key = k
		p.mu.Unlock()
		a.mu.Lock()
		a.peers[k] = p
		a.mu.Unlock()
		a.peerLRU.pushFront(p)
		a.peersCreated.Add(1)
	} else {
		a.peerLRU.moveToFront(p)
	}
	p.lastUpdate = max(p.lastUpdate, t)
	return p
}

func (a *Aggregator) removePeer(p *peerEntry) {
	a.mu.Lock()
	delete(a.peers, p.key)
	a.mu.Unlock()
	a.peerLRU.remove(p)
	p.mu.Lock()
	p.gen++
	p.key = record.PeerKey{}
	p.connections = 0
	p.connect.reset()
	p.m.reset()
	p.mu.Unlock()
	p.lastUpdate = 0
	a.freePeers.put(p, a.cfg.MaxPeers)
}

func (f *flowEntry) snapshotLocked(c *sketchCfg) FlowStats {
	s := FlowStats{
		FlowKey:        f.key,
		Owner:          f.owner,
		ConnRole:       f.connRole,
		RoleSource:     f.roleSource,
		HTTP2Framing:   f.http2Framing,
		Peer:           f.peerKey,
		Opened:         f.opened,
		ConnectLatency: f.connectLatency,
		HandshakeRTT:   f.handshakeRTT,
		PeerK8s:        f.peerK8s,
		Metrics:        f.m.snapshot(c),
		rate:           f.rate,
	}
	if s.ConnRole == "" {
		s.ConnRole = record.RoleUnknown
	}
	if f.closed {
		cl := f.close
		s.Close = &cl
	}
	return s
}

func (p *peerEntry) snapshotLocked(c *sketchCfg) PeerStats {
	s := PeerStats{
		PeerKey:        p.key,
		Connections:    p.connections,
		ConnectLatency: p.connect.summary(c),
		Metrics:        p.m.snapshot(c),
	}
	// The running turn count belongs to one connection, not to a pair.
	s.Turns.Last = 0
	return s
}

// Flows returns a snapshot of every flow, packed ones included, sorted by
// namespace, local address, remote address and cookie.
func (a *Aggregator) Flows() []FlowStats {
	// Sorted by key before the snapshots are taken: a snapshot is over a
	// kilobyte, and moving them in a sort took as long as making them.
	type flowRef struct {
		key record.FlowKey
		ref[flowEntry]
		packed *packedFlow
	}
	a.mu.RLock()
	refs := make([]flowRef, 0, len(a.flows)+len(a.packed))
	for _, e := range a.flows {
		refs = append(refs, flowRef{key: e.key, ref: ref[flowEntry]{e, e.gen}})
	}
	// One copy of the packed entries, which refs point into: not one
	// allocation each.
	packed := make([]packedFlow, 0, len(a.packed))
	for _, p := range a.packed {
		packed = append(packed, p)
	}
	a.mu.RUnlock()
	for i := range packed {
		refs = append(refs, flowRef{packed: &packed[i]})
	}
	for i := range refs {
		if p := refs[i].packed; p != nil {
			// A key that does not decode sorts first; its flow is left
			// out below.
			refs[i].key, _ = p.key()
		}
	}
	slices.SortFunc(refs, func(x, y flowRef) int { return x.key.Compare(y.key) })
	out := make([]FlowStats, 0, len(refs))
	var scratch flowEntry
	for _, r := range refs {
		var s FlowStats
		ok := false
		switch {
		case r.packed != nil:
			s, ok = a.unpacked(r.packed, &scratch)
		default:
			if s, ok = snapshotOf[FlowStats](r.ref, &a.flowSC); !ok {
				// Packed or unpacked again since the map was read:
				// where is it now?
				s, ok = a.flowByCookie(r.key.Cookie)
			}
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

// unpacked is the snapshot of a packed flow, decoded into scratch.
func (a *Aggregator) unpacked(p *packedFlow, scratch *flowEntry) (FlowStats, bool) {
	scratch.m.reset()
	if err := p.unpack(scratch, &a.flowSC); err != nil {
		// Counted when the writer meets it (unpackFlow).
		return FlowStats{}, false
	}
	return scratch.snapshotLocked(&a.flowSC), true
}

// flowByCookie is the snapshot of the flow of a cookie, packed or not.
func (a *Aggregator) flowByCookie(cookie uint64) (FlowStats, bool) {
	var s FlowStats
	var scratch flowEntry
	ok := a.flowInto(cookie, &scratch, &s)
	return s, ok
}

// FlowByCookie is the snapshot of the flow whose socket has that cookie
// (the API's flow id).
func (a *Aggregator) FlowByCookie(cookie uint64) (FlowStats, bool) { return a.flowByCookie(cookie) }

// flowInto takes the snapshot of the flow of a cookie into s, a packed one
// decoded through scratch. The two maps are read at once: a flow is always
// in one of them.
func (a *Aggregator) flowInto(cookie uint64, scratch *flowEntry, s *FlowStats) bool {
	for {
		a.mu.RLock()
		e := a.flows[cookie]
		var r ref[flowEntry]
		if e != nil {
			r = ref[flowEntry]{e, e.gen}
		}
		p, packed := a.packed[cookie]
		a.mu.RUnlock()
		switch {
		case e != nil:
			var ok bool
			if *s, ok = snapshotOf[FlowStats](r, &a.flowSC); ok {
				return true
			}
			// Packed or removed since: look again.
		case packed:
			var ok bool
			*s, ok = a.unpacked(&p, scratch)
			return ok
		default:
			return false
		}
	}
}

// EachFlow calls fn with the snapshot of every flow, packed ones included,
// in no particular order, until fn returns false. The snapshot is reused:
// what fn keeps of it, it copies. So the memory of a pass is that of one
// flow, whatever their number: the API answers a node of a hundred
// thousand connections from a daemon under a memory limit (Flows makes
// every snapshot at once, a kilobyte and more each).
func (a *Aggregator) EachFlow(fn func(*FlowStats) bool) {
	var scratch flowEntry
	var s FlowStats
	for _, c := range a.cookies() {
		if a.flowInto(c, &scratch, &s) && !fn(&s) {
			return
		}
	}
}

// Peers returns a snapshot of every peer pair, sorted by namespace, comm,
// cgroup, side, local port, remote address and remote port.
func (a *Aggregator) Peers() []PeerStats {
	return snapshots(a, a.peers, &a.peerSC, func(x, y PeerStats) int { return x.PeerKey.Compare(y.PeerKey) })
}

// Flow returns the snapshot of one flow.
func (a *Aggregator) Flow(k record.FlowKey) (FlowStats, bool) {
	// The table is keyed by cookie: the rest of the key must match too.
	s, ok := a.flowByCookie(k.Cookie)
	if !ok || s.FlowKey != k {
		return FlowStats{}, false
	}
	return s, true
}

// Peer returns the snapshot of one peer pair.
func (a *Aggregator) Peer(k record.PeerKey) (PeerStats, bool) {
	return lookup[PeerStats](a, a.peers, k, &a.peerSC)
}

// entry is an entry E of either table, whose snapshot is an S.
type entry[E, S any] interface {
	*E
	guarded() *guard
	snapshotLocked(c *sketchCfg) S
}

// ref is an entry as a snapshot found it in its table.
type ref[E any] struct {
	e   *E
	gen uint64
}

// snapshots returns a snapshot of every entry of table m, sorted by order.
// The map is read under a.mu, each entry then under its own lock.
func snapshots[S any, K comparable, E any, P entry[E, S]](a *Aggregator, m map[K]*E, c *sketchCfg, order func(x, y S) int) []S {
	a.mu.RLock()
	refs := make([]ref[E], 0, len(m))
	for _, e := range m {
		refs = append(refs, ref[E]{e, P(e).guarded().gen})
	}
	a.mu.RUnlock()
	out := make([]S, 0, len(refs))
	for _, r := range refs {
		if s, ok := snapshotOf[S, E, P](r, c); ok {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, order)
	return out
}

// lookup returns the snapshot of the entry of table m under k.
func lookup[S any, K comparable, E any, P entry[E, S]](a *Aggregator, m map[K]*E, k K, c *sketchCfg) (S, bool) {
	a.mu.RLock()
	e := m[k]
	var r ref[E]
	if e != nil {
		r = ref[E]{e, P(e).guarded().gen}
	}
	a.mu.RUnlock()
	if e == nil {
		var none S
		return none, false
	}
	return snapshotOf[S, E, P](r, c)
}

// snapshotOf returns the snapshot of r's entry unless its gen changed:
// removed (and perhaps reused) since the map was read, it no longer holds
// what was listed.
func snapshotOf[S, E any, P entry[E, S]](r ref[E], c *sketchCfg) (S, bool) {
	g := P(r.e).guarded()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gen != r.gen {
		var none S
		return none, false
	}
	return P(r.e).snapshotLocked(c), true
}

// Stats returns the Aggregator's counters.
func (a *Aggregator) Stats() Counters {
	a.mu.RLock()
	nf, npk, np := len(a.flows), len(a.packed), len(a.peers)
	a.mu.RUnlock()
	return Counters{
		Flows:        nf + npk,
		PackedFlows:  npk,
		PackErrors:   a.packErrs.Load(),
		Peers:        np,
		MaxFlows:     a.cfg.MaxFlows,
		MaxPeers:     a.cfg.MaxPeers,
		Exchanges:    a.exchanges.Load(),
		ConnOpens:    a.connOpens.Load(),
		ConnCloses:   a.connCloses.Load(),
		FlowsCreated: a.flowsCreated.Load(),
		PeersCreated: a.peersCreated.Load(),
		FlowsEvicted: a.flowsEvicted.Load(),
		PeersEvicted: a.peersEvicted.Load(),
		FlowsRetired: a.flowsRetired.Load(),
		FlowsExpired: a.flowsExpired.Load(),
		PeersExpired: a.peersExpired.Load(),
		FlowsShed:    a.flowsShed.Load(),
	}
}
