package report

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/lattrace/lattrace/exporters/recording"
	"github.com/lattrace/lattrace/record"
)

// Options shape a report. Zero fields take the defaults.
type Options struct {
	// MaxPairs is how many peer pairs get their charts (the busiest by
	// total latency); the summary table lists every pair.
	MaxPairs int
	// Points bounds each time series' points, CDFPoints each CDF's.
	Points    int
	CDFPoints int
	// FlowsPerPair is how many of a pair's connections get their cwnd and
	// srtt drawn (the most sampled).
	FlowsPerPair int
	// MaxMarkers bounds the retransmission markers of one chart.
	MaxMarkers int
}

// Defaults.
const (
	DefaultMaxPairs     = 8
	DefaultPoints       = 2000
	DefaultCDFPoints    = 400
	DefaultFlowsPerPair = 4
	DefaultMaxMarkers   = 500
	maxRows             = 500
	maxTurnsBin         = 20
)

func (o *Options) defaults() {
	o.MaxPairs = cmp.Or(o.MaxPairs, DefaultMaxPairs)
	o.Points = cmp.Or(o.Points, DefaultPoints)
	o.CDFPoints = cmp.Or(o.CDFPoints, DefaultCDFPoints)
	o.FlowsPerPair = cmp.Or(o.FlowsPerPair, DefaultFlowsPerPair)
	o.MaxMarkers = cmp.Or(o.MaxMarkers, DefaultMaxMarkers)
}

// Components are the top-level parts of an exchange's latency, in the
// order they are stacked, with the part of the model each belongs to.
var Components = []struct{ Name, Part string }{
	{"network", "network"},
	{"send_wait", "transport"}, {"loss_recovery", "transport"}, {"handshake", "transport"}, {"receive", "transport"},
	{"peer", "app"}, {"local_read", "app"}, {"think", "app"},
}

func componentValues(c *record.Components) [8]float32 {
	return [8]float32{ms32(c.Network), ms32(c.SendWait), ms32(c.LossRecovery), ms32(c.Handshake), ms32(c.Receive), ms32(c.Peer), ms32(c.LocalRead), ms32(c.Think)}
}

func ms32(d time.Duration) float32 { return float32(float64(d) / 1e6) }
func ms(d time.Duration) float64   { return float64(d) / 1e6 }

// point is what the report keeps of one exchange: enough for every chart,
// small enough for millions.
type point struct {
	t     float64 // seconds since the recording started
	dur   float32 // ms, and the components in ms
	comp  [8]float32
	srtt  float32 // ms: the transport's RTT
	net   float32 // ms: the path's RTT (the network's), 0 when unknown
	turns uint16
	retr  uint16
	flow  int32 // index in the pair's flows
}

type sample struct {
	t    float64
	cwnd float32
	srtt float32
	retr uint16
}

type flowAcc struct {
	key     record.FlowKey
	pair    int // -1 until its first exchange names it
	samples []sample
	// early are samples that came before the flow's first exchange.
	exchanges int
}

type pairAcc struct {
	key       record.PeerKey
	points    []point
	flows     []int // indexes into builder.flows
	exDiag    map[record.DiagnosisName]*ExchangeDiagnosis
	diagnoses []record.Diagnosis
	retr      uint64
}

type builder struct {
	o   Options
	hdr recording.Header
	// roles are the roles of the open connections not yet named by an
	// exchange: the side a flow is counted under comes from its opening.
	// A connection's close drops its entry, so connections that never
	// exchange (health checks) do not pile up.
	roles  map[record.FlowKey]record.Role
	flows  []*flowAcc
	cookie map[record.FlowKey]int
	pairs  []*pairAcc
	byKey  map[record.PeerKey]int
	flowDx map[record.FlowKey][]record.Diagnosis
	opens  int
}

// Build reads the recording at path into a report's model.
func Build(path string, o Options) (*Model, error) {
	o.defaults()
	b := &builder{
		o:      o,
		roles:  map[record.FlowKey]record.Role{},
		cookie: map[record.FlowKey]int{},
		byKey:  map[record.PeerKey]int{},
		flowDx: map[record.FlowKey][]record.Diagnosis{},
	}
	var peerDx []*recording.Diagnoses
	_, end, err := recording.ReadFile(path, recording.Handler{
		Header:    func(h *recording.Header) { b.hdr = *h },
		Exchange:  b.exchange,
		ConnOpen:  b.connOpen,
		ConnClose: func(c *record.ConnClose) { delete(b.roles, record.FlowKey{Flow: c.Flow, Cookie: c.Cookie}) },
		Sample:    b.sample,
		Diagnoses: func(d *recording.Diagnoses) {
			switch {
			case d.Scope == recording.ScopeFlow && d.Flow != nil:
				b.flowDx[*d.Flow] = d.Diagnoses
			case d.Scope == recording.ScopePeer && d.Peer != nil:
				peerDx = append(peerDx, d)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	for _, d := range peerDx {
		if i, ok := b.byKey[*d.Peer]; ok {
			b.pairs[i].diagnoses = d.Diagnoses
		}
	}
	return b.model(path, end), nil
}

func (b *builder) since(m record.Mono) float64 {
	return float64(int64(m)-int64(b.hdr.StartedMono)) / 1e9
}

func (b *builder) flowOf(k record.FlowKey) *flowAcc {
	i, ok := b.cookie[k]
	if !ok {
		i = len(b.flows)
		b.flows = append(b.flows, &flowAcc{key: k, pair: -1})
		b.cookie[k] = i
	}
	return b.flows[i]
}

func (b *builder) connOpen(o *record.ConnOpen) {
	if o.Role == record.RoleClient || o.Role == record.RoleServer {
		b.roles[record.FlowKey{Flow: o.Flow, Cookie: o.Cookie}] = o.Role
	}
	b.opens++
}

// peerOf is the peer pair a flow's first exchange names, as the daemon's
// aggregator names it; an exchange without an owner names none.
func (b *builder) peerOf(fk record.FlowKey, e *record.Exchange) record.PeerKey {
	opened := b.roles[fk]
	delete(b.roles, fk)
	if !e.Owner.Known() {
		return record.PeerKey{}
	}
	return record.PeerKeyOf(e.Flow, record.SideOf(e.ConnRole, opened, e.Role, e.Flow), &e.Owner)
}

func (b *builder) exchange(e *record.Exchange) {
	fk := record.FlowKey{Flow: e.Flow, Cookie: e.Cookie}
	f := b.flowOf(fk)
	if f.pair < 0 {
		pk := b.peerOf(fk, e)
		pi, ok := b.byKey[pk]
		if !ok {
			pi = len(b.pairs)
			b.pairs = append(b.pairs, &pairAcc{key: pk, exDiag: map[record.DiagnosisName]*ExchangeDiagnosis{}})
			b.byKey[pk] = pi
		}
		f.pair = pi
		b.pairs[pi].flows = append(b.pairs[pi].flows, b.cookie[fk])
	}
	f.exchanges++
	p := b.pairs[f.pair]
	start := e.Start
	if start == 0 {
		start = e.End
	}
	net := e.PathRTT
	if net == 0 {
		net = e.MinRTT
	}
	p.points = append(p.points, point{
		t: b.since(start), dur: ms32(e.Duration), comp: componentValues(&e.Components),
		srtt: ms32(e.SRTT), net: ms32(net),
		turns: uint16(min(e.ExchangeTurns, 1<<16-1)), retr: uint16(min(e.Retransmits, 1<<16-1)),
		flow: int32(slices.Index(p.flows, b.cookie[fk])),
	})
	p.retr += uint64(e.Retransmits)
	for _, d := range e.Diagnoses {
		x := p.exDiag[d.Name]
		if x == nil {
			x = &ExchangeDiagnosis{Name: string(d.Name), Severity: string(d.Severity), Example: d.Summary, Fix: d.Fix}
			p.exDiag[d.Name] = x
		}
		x.Count++
	}
}

func (b *builder) sample(s *recording.Sample) {
	f := b.flowOf(record.FlowKey{Flow: s.Flow, Cookie: s.Cookie})
	f.samples = append(f.samples, sample{t: b.since(s.Time), cwnd: float32(s.Cwnd), srtt: ms32(s.SRTT), retr: uint16(min(s.Retransmits+s.RTOs, 1<<16-1))})
}

// PairName says who talks to whom, the way a person names it.
func PairName(k record.PeerKey) string {
	comm := k.Comm
	if comm == "" {
		comm = "(unknown process)"
	}
	if k.Side == record.RoleServer {
		return fmt.Sprintf("%s :%d ← %s (netns %d)", comm, k.LocalPort, k.Remote, k.Netns)
	}
	return fmt.Sprintf("%s → %s (netns %d)", comm, fmtAddrPort(k), k.Netns)
}

func fmtAddrPort(k record.PeerKey) string {
	if k.Remote.Is6() {
		return fmt.Sprintf("[%s]:%d", k.Remote, k.RemotePort)
	}
	return fmt.Sprintf("%s:%d", k.Remote, k.RemotePort)
}

// split is the mean latency by part, grouped as the live views group it.
func split(means [8]float64) record.Split {
	d := func(v float64) time.Duration { return time.Duration(v * 1e6) }
	c := record.Components{
		Network: d(means[0]), SendWait: d(means[1]), LossRecovery: d(means[2]), Handshake: d(means[3]),
		Receive: d(means[4]), Peer: d(means[5]), LocalRead: d(means[6]), Think: d(means[7]),
	}
	return c.Split()
}

func pairID(k record.PeerKey) string { return k.ID() }
