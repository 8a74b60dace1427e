package requests

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/DataDog/sketches-go/ddsketch"

	"github.com/lattrace/lattrace/record"
)

// Config bounds a Tracker. Zero fields take the defaults.
type Config struct {
	// Settle is how long after a root ends its tree is made: its
	// exchanges are written at their connection's next turn or after
	// the tracer's idle write (half a second), and the hops under it
	// ended before it did. Default 2 s.
	Settle time.Duration
	// MaxWait is how long an exchange waits for the record of the
	// inbound request it served (a long request still being answered)
	// before it is counted orphaned. Default 60 s.
	MaxWait time.Duration
	// MaxPending bounds the exchanges held while their trees form; more
	// are dropped, oldest first, and counted. Default 100,000.
	MaxPending int
	// MaxHops bounds one request's tree (DefaultMaxHops).
	MaxHops int
	// Recent is how many finished requests are kept for the API, the
	// slowest of each endpoint among them. Default 256.
	Recent int
	// MaxEndpoints and MaxEdges bound the statistics; beyond them new
	// ones are counted apart (Stats.Unlisted). Default 1,024 each.
	MaxEndpoints, MaxEdges int
	// OnRequest, if set, is given each finished request (the OTLP
	// exporter's trace of it), outside the Tracker's lock.
	OnRequest func(*record.Request)
	// Self is a process whose exchanges make no trees: the daemon's own
	// (its exports during an API call or a /metrics scrape are no
	// request's calls). 0: none.
	Self uint32
}

func (c *Config) defaults() {
	if c.Settle <= 0 {
		c.Settle = 2 * time.Second
	}
	if c.MaxWait <= 0 {
		c.MaxWait = time.Minute
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 100_000
	}
	if c.MaxHops <= 0 {
		c.MaxHops = DefaultMaxHops
	}
	if c.Recent <= 0 {
		c.Recent = 256
	}
	if c.MaxEndpoints <= 0 {
		c.MaxEndpoints = 1024
	}
	if c.MaxEdges <= 0 {
		c.MaxEdges = 1024
	}
}

// passEvery spaces the passes that make trees: each reads every held
// exchange.
const passEvery = 500 * time.Millisecond

// Tracker makes request trees live: a record.Sink that holds exchanges
// until their trees are complete, then keeps per endpoint and per service
// edge what they showed, and the most recent requests. Safe for
// concurrent use.
//
// It makes the trees of requests that made calls: it holds the exchanges
// of the processes that call out while they serve (the middle tiers) and
// the calls that name a request, and keeps every other exchange (a
// client's request to a middle tier, a leaf server's answer to its call)
// apart in a ring of side exchanges, copied in place, from which the other
// end of a held exchange is taken when its hop is made. A node without a
// middle tier, whose requests are single exchanges, costs a map lookup
// per exchange.
type Tracker struct {
	mu       sync.Mutex
	cfg      Config
	pending  []*record.Exchange
	lastPass record.Mono
	// roles says when each process last answered, requested naming a
	// request it served (the kernel's evidence), and requested naming
	// none: a middle tier names requests, or answers and calls out where
	// nothing names what its calls served.
	roles map[uint32]*roles
	// tiers counts the processes of roles that are middle tiers now; none,
	// and nothing is kept apart.
	tiers int
	// The side ring: exchanges not held, copied in place, by key.
	side     []record.Exchange
	sideKey  []connKey
	sideAt   map[connKey]int32
	sideNext int
	// done holds the inbound requests already in trees, until MaxWait
	// after: evidence naming them is stale.
	done      map[reqKey]record.Mono
	doneOrder []doneAt // done's keys in the order they came, to expire them
	// recentHops counts the hops of the trees in recent.
	recentHops int
	recent     []*record.Request
	endpoints  map[string]*endpointStats
	edges      map[edgeKey]*edgeStats
	ambiguous  map[Process]uint64
	stats      Stats
}

// Process names a process by its command and pid.
type Process struct {
	PID  uint32 `json:"pid"`
	Comm string `json:"comm"`
}

// Stats are the Tracker's counts.
type Stats struct {
	// Requests counts the trees made; Linked the hops linked under a
	// parent, by method.
	Requests uint64                       `json:"requests"`
	Linked   map[record.LinkMethod]uint64 `json:"linked"`
	// Ambiguous counts outbound exchanges more than one inbound exchange
	// could own (each roots a detached request); Orphaned the held
	// exchanges (either end) whose tree never formed within MaxWait (a
	// parent's record that never came); Dropped those let go for the
	// MaxPending bound; Shed those let go for the daemon's memory (Shed);
	// Truncated the hops beyond MaxHops.
	Ambiguous uint64 `json:"ambiguous"`
	Orphaned  uint64 `json:"orphaned"`
	Dropped   uint64 `json:"dropped"`
	Shed      uint64 `json:"shed"`
	Truncated uint64 `json:"truncated"`
	// Unlisted counts requests whose endpoint or edge, and ambiguous
	// exchanges whose process, found the statistics full.
	Unlisted uint64 `json:"unlisted"`
}

type endpointStats struct {
	requests, hops, critTurns uint64
	durations                 *ddsketch.DDSketch
	dominant                  map[string]uint64
}

type edgeKey struct{ endpoint, from, to string }

type doneAt struct {
	key reqKey
	at  record.Mono
}

// maxRecentHops bounds the hops of the recent requests kept together,
// beside their count (Config.Recent): a batch job's trees are large.
const maxRecentHops = 20_000

type edgeStats struct {
	exchanges, turns uint64
}

// roles are what a process did last (record.Mono of the exchanges' ends),
// and the ends it answered on last.
type roles struct {
	answered, named, blind, requested record.Mono
	// own are the last local ends it answered on, in any network
	// namespace (a test's server and client are often in two).
	own     [8]netip.AddrPort
	ownNext uint8
}

// tier reports whether a process with roles r is a middle tier at now:
// within window it named a request it served, or it answered and made a
// call that named none (a call written by a goroutine or thread other
// than the one that read the request, e.g. Go's HTTP client's writeLoop:
// linked by its window alone).
func (r *roles) tier(now record.Mono, window time.Duration) bool {
	since := before(now, window)
	in := func(m record.Mono) bool { return m != 0 && m >= since }
	return in(r.named) || (in(r.blind) && in(r.answered))
}

// note records what e says of its process.
func (r *roles) note(e *record.Exchange) {
	switch {
	case e.Role == record.Responder:
		r.answered = max(r.answered, e.End)
		if at := e.Flow.Local; !slices.Contains(r.own[:], at) {
			r.own[r.ownNext%uint8(len(r.own))] = at
			r.ownNext++
		}
		return
	case e.Served.Any():
		r.named = max(r.named, e.End)
	case r.answered != 0 && !slices.Contains(r.own[:], e.Flow.Remote):
		// A call to the process itself (a load generator serving its
		// own requests) makes no middle tier of it; nor does one before
		// its ends are known (a middle tier's first request's calls
		// are written before that request is).
		r.blind = max(r.blind, e.End)
	}
	r.requested = max(r.requested, e.End)
}

// sideSize is the side ring's length: at the rates where it turns over in
// well under a second, the two ends of an exchange are written within
// milliseconds of each other (each at its connection's next turn).
const sideSize = 8192

// New makes a Tracker.
func New(cfg Config) *Tracker {
	cfg.defaults()
	return &Tracker{cfg: cfg, done: map[reqKey]record.Mono{}, endpoints: map[string]*endpointStats{},
		edges: map[edgeKey]*edgeStats{}, ambiguous: map[Process]uint64{}, stats: Stats{Linked: map[record.LinkMethod]uint64{}},
		roles: map[uint32]*roles{}, sideAt: map[connKey]int32{}}
}

// Exchange holds a copy of e (the tracer reuses e) until its tree forms,
// when its process is a middle tier or it names the request it served;
// else it keeps it apart, when there is a middle tier on the node.
func (t *Tracker) Exchange(e *record.Exchange) {
	if !linkable(e) || (t.cfg.Self != 0 && e.Owner.PID == t.cfg.Self) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.roles[e.Owner.PID]
	if r == nil {
		r = &roles{}
		t.roles[e.Owner.PID] = r
	}
	was := r.tier(e.End, t.cfg.MaxWait)
	r.note(e)
	is := r.tier(e.End, t.cfg.MaxWait)
	if is && !was {
		t.tiers++
	}
	if is || e.Served.Any() {
		t.hold(e)
		return
	}
	if t.tiers > 0 {
		t.aside(e)
	}
}

// hold keeps a copy of e until its tree forms.
func (t *Tracker) hold(e *record.Exchange) {
	x := *e
	x.Diagnoses = nil
	if len(t.pending) >= t.cfg.MaxPending {
		n := len(t.pending) / 10
		t.stats.Dropped += uint64(n)
		t.pending = slices.Delete(t.pending, 0, n)
	}
	t.pending = append(t.pending, &x)
}

// aside copies e into the side ring, in place of the oldest.
func (t *Tracker) aside(e *record.Exchange) {
	k := requesterKey(e)
	if e.Role == record.Responder {
		k = responderKey(e)
	}
	if !pairable(k) {
		return
	}
	if t.side == nil {
		t.side, t.sideKey = make([]record.Exchange, sideSize), make([]connKey, sideSize)
	}
	i := t.sideNext
	t.sideNext = (i + 1) % sideSize
	if old := t.sideKey[i]; pairable(old) && t.sideAt[old] == int32(i) {
		delete(t.sideAt, old)
	}
	t.side[i] = *e
	t.side[i].Diagnoses = nil
	t.sideKey[i] = k
	t.sideAt[k] = int32(i)
}

// partner is the side exchange of key k, copied out: the ring's slot is
// overwritten in time.
func (t *Tracker) partner(k connKey) *record.Exchange {
	i, ok := t.sideAt[k]
	if !ok {
		return nil
	}
	x := t.side[i]
	return &x
}

// Shed lets go of every exchange held for a tree and of the side ring,
// for the daemon's memory guard (daemon/memguard), and returns how many
// held exchanges went: their trees are not made, and they count as shed.
// The statistics and the recent requests stay; trees form again from the
// next exchanges.
func (t *Tracker) Shed() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(t.pending)
	t.stats.Shed += uint64(n)
	t.pending = nil
	t.side, t.sideKey, t.sideNext = nil, nil, 0
	clear(t.sideAt)
	return n
}

func (t *Tracker) ConnOpen(record.ConnOpen)   {}
func (t *Tracker) ConnClose(record.ConnClose) {}

// Flush makes the trees whose roots have settled, at most every passEvery.
func (t *Tracker) Flush() { t.Pass(record.Now(), false) }

// Pass makes the trees of the exchanges held: those whose roots ended
// Settle before now, or all of them when all is set (at the end of a
// recording, or a test's run).
func (t *Tracker) Pass(now record.Mono, all bool) {
	for _, r := range t.pass(now, all) {
		t.cfg.OnRequest(r)
	}
}

// pass is Pass under the lock; it returns the requests finished, for
// OnRequest.
func (t *Tracker) pass(now record.Mono, all bool) (finished []*record.Request) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !all && now.Sub(t.lastPass) < passEvery {
		return nil
	}
	t.lastPass = now
	cutoff, stale := before(now, t.cfg.Settle), before(now, t.cfg.MaxWait)
	if all {
		cutoff, stale = ^record.Mono(0), ^record.Mono(0)
	}
	t.expireDone(now)
	t.pruneRoles(now)
	ripe, later := t.ripe(cutoff)
	res := assemble(ripe, t.cfg.MaxHops, func(k reqKey) bool { _, ok := t.done[k]; return ok }, t.partner, later)
	ready := make([]bool, len(res.Requests))
	for i, r := range res.Requests {
		if latest(r.Root) >= cutoff {
			continue
		}
		ready[i] = true
		t.finished(r, now)
		if t.cfg.OnRequest != nil {
			finished = append(finished, r)
		}
	}
	gone := map[*record.Exchange]bool{}
	for e, idx := range res.Members {
		if idx >= 0 && ready[idx] {
			gone[e] = true
		}
	}
	kept := t.pending[:0]
	for _, e := range t.pending {
		switch {
		case gone[e]:
		case e.End < stale:
			t.stats.Orphaned++
		default:
			kept = append(kept, e)
		}
	}
	clear(t.pending[len(kept):])
	t.pending = kept
	return finished
}

// ripe splits the held exchanges for a pass: those that can be in a tree
// finished at cutoff (ended before it, and the later calls naming one of
// their requests: a call outliving its request holds its tree back), and
// the later inbound exchanges, a call's parent that holds its tree back.
// The rest wait for a later pass: each exchange is linked about once
// after its Settle, not at every pass while it settles.
func (t *Tracker) ripe(cutoff record.Mono) (ripe, later []*record.Exchange) {
	ended := map[reqKey]bool{}
	for _, e := range t.pending {
		if e.End < cutoff {
			ripe = append(ripe, e)
			if e.Role == record.Responder {
				ended[reqKey{e.Cookie, e.InSeq}] = true
			}
		}
	}
	names := func(s record.ServedRequest) bool { return s.Cookie != 0 && ended[reqKey{s.Cookie, s.InSeq}] }
	for _, e := range t.pending {
		switch {
		case e.End < cutoff:
		case e.Role == record.Responder:
			later = append(later, e)
		case names(e.Served.Parent) || names(e.Served.Prev) || names(e.Served.Handoff):
			ripe = append(ripe, e)
		}
	}
	return ripe, later
}

// pruneRoles forgets the processes idle for MaxWait, and recounts the
// middle tiers.
func (t *Tracker) pruneRoles(now record.Mono) {
	since := before(now, t.cfg.MaxWait)
	t.tiers = 0
	for pid, r := range t.roles {
		switch {
		case max(r.requested, r.answered) < since:
			delete(t.roles, pid)
		case r.tier(now, t.cfg.MaxWait):
			t.tiers++
		}
	}
}

func (t *Tracker) isTier(pid uint32, now record.Mono) bool {
	r := t.roles[pid]
	return r != nil && r.tier(now, t.cfg.MaxWait)
}

// before is d before now, or 0 (the clock's start).
func before(now record.Mono, d time.Duration) record.Mono {
	if now < record.Mono(d) {
		return 0
	}
	return now - record.Mono(d)
}

// latest is the last end among a tree's exchanges.
func latest(h *record.Hop) record.Mono {
	m := h.End
	for _, e := range []*record.Exchange{h.Client, h.Server} {
		if e != nil {
			m = max(m, e.End, e.Time)
		}
	}
	for _, c := range h.Children {
		m = max(m, latest(c))
	}
	return m
}

func (t *Tracker) finished(r *record.Request, now record.Mono) {
	if r.Detached {
		x := r.Root.Client
		t.stats.Ambiguous++
		p := Process{PID: x.Owner.PID, Comm: x.Owner.Comm}
		if _, ok := t.ambiguous[p]; ok || len(t.ambiguous) < t.cfg.MaxEndpoints {
			t.ambiguous[p]++
		} else {
			t.stats.Unlisted++
		}
	}
	t.stats.Requests++
	t.stats.Truncated += uint64(r.Truncated)
	var walk func(h *record.Hop)
	walk = func(h *record.Hop) {
		if h.Link != "" {
			t.stats.Linked[h.Link]++
		}
		// Only a process that calls out can name a request later: a
		// leaf server's are not kept.
		if s := h.Server; s != nil && (len(h.Children) > 0 || t.isTier(s.Owner.PID, now)) {
			k := reqKey{s.Cookie, s.InSeq}
			t.done[k] = now
			t.doneOrder = append(t.doneOrder, doneAt{k, now})
		}
		for _, c := range h.Children {
			walk(c)
		}
	}
	walk(r.Root)
	ep := t.endpoints[r.Endpoint]
	if ep == nil {
		if len(t.endpoints) >= t.cfg.MaxEndpoints {
			t.stats.Unlisted++
			return
		}
		sk, _ := ddsketch.NewDefaultDDSketch(0.01)
		ep = &endpointStats{durations: sk, dominant: map[string]uint64{}}
		t.endpoints[r.Endpoint] = ep
	}
	ep.requests++
	ep.hops += uint64(r.Hops)
	ep.critTurns += uint64(r.CriticalTurns)
	if r.Duration > 0 {
		ep.durations.Add(float64(r.Duration))
	}
	if len(ep.dominant) < 64 {
		ep.dominant[r.Dominant]++
	}
	for _, e := range r.Edges {
		k := edgeKey{r.Endpoint, e.From, e.To}
		s := t.edges[k]
		if s == nil {
			if len(t.edges) >= t.cfg.MaxEdges {
				t.stats.Unlisted++
				continue
			}
			s = &edgeStats{}
			t.edges[k] = s
		}
		s.exchanges += uint64(e.Exchanges)
		s.turns += uint64(e.Turns)
	}
	t.recent = append(t.recent, r)
	t.recentHops += r.Hops
	n := 0
	for len(t.recent)-n > t.cfg.Recent || (t.recentHops > maxRecentHops && len(t.recent)-n > 1) {
		t.recentHops -= t.recent[n].Hops
		n++
	}
	t.recent = slices.Delete(t.recent, 0, n)
}

// expireDone forgets the requests in trees for MaxWait.
func (t *Tracker) expireDone(now record.Mono) {
	stale, n := before(now, t.cfg.MaxWait), 0
	for ; n < len(t.doneOrder) && t.doneOrder[n].at < stale; n++ {
		if d := t.doneOrder[n]; t.done[d.key] == d.at {
			delete(t.done, d.key)
		}
	}
	t.doneOrder = slices.Delete(t.doneOrder, 0, n)
}

// EndpointRow is what the requests to one root endpoint showed.
type EndpointRow struct {
	Endpoint string `json:"endpoint"`
	Requests uint64 `json:"requests"`
	// ChildrenPerRequest and CriticalTurns are means per request.
	ChildrenPerRequest float64       `json:"children_per_request"`
	CriticalTurns      float64       `json:"critical_turns_per_request"`
	P50                time.Duration `json:"p50_ns"`
	P99                time.Duration `json:"p99_ns"`
	// Dominant is the hop most often dominant on the critical path.
	Dominant string `json:"dominant_hop"`
}

// EdgeRow is one service edge under one root endpoint: its exchanges and
// turns per request to that endpoint.
type EdgeRow struct {
	Endpoint            string  `json:"endpoint"`
	From                string  `json:"from"`
	To                  string  `json:"to"`
	ExchangesPerRequest float64 `json:"exchanges_per_request"`
	TurnsPerRequest     float64 `json:"turns_per_request"`
	Exchanges, Turns    uint64  `json:"-"`
	RequestsOfEndpoint  uint64  `json:"requests"`
}

// AmbiguousRow counts one process's outbound exchanges left unlinked.
type AmbiguousRow struct {
	Process
	Exchanges uint64 `json:"exchanges"`
}

// Snapshot is what a Tracker holds, for the API.
type Snapshot struct {
	Endpoints []EndpointRow  `json:"endpoints"`
	Edges     []EdgeRow      `json:"edges"`
	Ambiguous []AmbiguousRow `json:"ambiguous"`
	Stats     Stats          `json:"stats"`
	// Recent holds the most recent requests, oldest first.
	Recent  []*record.Request `json:"recent,omitempty"`
	Pending int               `json:"pending"`
}

// Held is the number of exchanges held until their trees form.
func (t *Tracker) Held() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pending)
}

// Stats returns the counts alone, cheaper than Snapshot (a /metrics
// scrape).
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stats
	s.Linked = maps.Clone(t.stats.Linked)
	return s
}

// Snapshot returns the statistics, and the recent requests when trees is
// set.
func (t *Tracker) Snapshot(trees bool) Snapshot {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := Snapshot{Stats: t.stats, Pending: len(t.pending), Endpoints: t.endpointRows(), Edges: t.edgeRows(), Ambiguous: t.ambiguousRows()}
	s.Stats.Linked = maps.Clone(t.stats.Linked)
	if trees {
		s.Recent = slices.Clone(t.recent)
	}
	return s
}

// Edges returns the service edges' rows alone (a /metrics scrape).
func (t *Tracker) Edges() []EdgeRow {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.edgeRows()
}

// Ambiguous returns the processes' ambiguous exchanges alone.
func (t *Tracker) Ambiguous() []AmbiguousRow {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ambiguousRows()
}

func (t *Tracker) endpointRows() []EndpointRow {
	var rows []EndpointRow
	for name, ep := range t.endpoints {
		row := EndpointRow{Endpoint: name, Requests: ep.requests}
		if ep.requests > 0 {
			row.ChildrenPerRequest = float64(ep.hops-ep.requests) / float64(ep.requests)
			row.CriticalTurns = float64(ep.critTurns) / float64(ep.requests)
		}
		if q, err := ep.durations.GetValuesAtQuantiles([]float64{0.5, 0.99}); err == nil {
			row.P50, row.P99 = time.Duration(q[0]), time.Duration(q[1])
		}
		var most uint64
		for d, n := range ep.dominant {
			if n > most || (n == most && d < row.Dominant) {
				most, row.Dominant = n, d
			}
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b EndpointRow) int { return cmp.Compare(b.Requests, a.Requests) })
	return rows
}

func (t *Tracker) edgeRows() []EdgeRow {
	var rows []EdgeRow
	for k, e := range t.edges {
		n := t.endpoints[k.endpoint].requests
		row := EdgeRow{Endpoint: k.endpoint, From: k.from, To: k.to, Exchanges: e.exchanges, Turns: e.turns, RequestsOfEndpoint: n}
		if n > 0 {
			row.ExchangesPerRequest = float64(e.exchanges) / float64(n)
			row.TurnsPerRequest = float64(e.turns) / float64(n)
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(a, b EdgeRow) int {
		return cmp.Or(cmp.Compare(a.Endpoint, b.Endpoint), cmp.Compare(b.Turns, a.Turns), cmp.Compare(a.From+a.To, b.From+b.To))
	})
	return rows
}

func (t *Tracker) ambiguousRows() []AmbiguousRow {
	var rows []AmbiguousRow
	for p, n := range t.ambiguous {
		rows = append(rows, AmbiguousRow{Process: p, Exchanges: n})
	}
	slices.SortFunc(rows, func(a, b AmbiguousRow) int { return cmp.Compare(b.Exchanges, a.Exchanges) })
	return rows
}

// Request returns a recent request by its ID.
func (t *Tracker) Request(id string) (*record.Request, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := len(t.recent) - 1; i >= 0; i-- {
		if t.recent[i].ID == id {
			return t.recent[i], nil
		}
	}
	return nil, fmt.Errorf("no recent request %q (the daemon keeps the last %d)", id, t.cfg.Recent)
}
