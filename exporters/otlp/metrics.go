package otlp

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/lattrace/lattrace/record"
)

// Metric names.
const (
	MetricDuration          = "lattrace.exchange.duration"           // histogram, s
	MetricComponentDuration = "lattrace.exchange.component.duration" // histogram, s, lattrace.component
	MetricExchanges         = "lattrace.exchanges"                   // counter
	MetricTurns             = "lattrace.tcp.turns"                   // counter
	MetricRetransmits       = "lattrace.tcp.retransmits"             // counter
	MetricRTOs              = "lattrace.tcp.rtos"                    // counter
	MetricBytes             = "lattrace.tcp.bytes"                   // counter, By, network.io.direction
	MetricConnections       = "lattrace.tcp.connections"             // counter, lattrace.event opened|closed
	MetricDiagnoses         = "lattrace.diagnoses"                   // counter, lattrace.diagnosis
)

// Attribute values of the overflow peer pair.
const Other = "other"

// durationBuckets are the histograms' bounds in seconds: 50 µs to 30 s.
var durationBuckets = [...]float64{
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
}

// pairKey is the peer pair the metrics are broken down by.
type pairKey struct {
	comm   string
	remote netip.Addr
	port   uint16 // server port
	role   record.ExchangeRole
}

// The latency metrics are counted here, per peer pair, and handed to the
// OpenTelemetry SDK's readers as a metric Producer at each collection (the
// OTLP push, a /metrics scrape): the SDK's own instruments normalise the
// attributes of every measurement, which costs more per exchange than the
// rest of the daemon's work. A pair's counts are a few array increments
// under one lock; the data model, temporality and export stay the SDK's.

var componentNames = [8]string{
	StageNetwork, StageSendWait, StageLossRecovery, StageHandshake,
	StageReceive, StagePeer, StageLocalRead, StageThink,
}

// histogram is a cumulative explicit-bucket histogram of seconds.
type histogram struct {
	counts   [len(durationBuckets) + 1]uint64
	n        uint64
	sum      float64
	min, max float64
}

func (h *histogram) add(v float64) {
	i := 0
	for i < len(durationBuckets) && v > durationBuckets[i] {
		i++
	}
	h.counts[i]++
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n++
	h.sum += v
}

func (h *histogram) point(attrs attribute.Set, start, now time.Time) metricdata.HistogramDataPoint[float64] {
	return metricdata.HistogramDataPoint[float64]{
		Attributes: attrs, StartTime: start, Time: now,
		Count: h.n, Sum: h.sum, Bounds: durationBuckets[:], BucketCounts: slices.Clone(h.counts[:]),
		Min: metricdata.NewExtrema(h.min), Max: metricdata.NewExtrema(h.max),
	}
}

// pair is one peer pair's counts and its attribute sets.
type pair struct {
	start time.Time
	attrs []attribute.KeyValue
	base  attribute.Set
	comp  [8]attribute.Set
	tx    attribute.Set
	rx    attribute.Set

	duration                            histogram
	components                          [8]histogram
	exchanges, turns, retransmits, rtos int64
	bytesTx, bytesRx                    int64
	diagnoses                           map[record.DiagnosisName]int64
}

func newPair(comm, remote string, port int, role record.ExchangeRole) *pair {
	base := []attribute.KeyValue{
		attribute.String("process.executable.name", comm),
		attribute.String("network.peer.address", remote),
		attribute.Int("server.port", port),
		attribute.String("lattrace.role", string(role)),
	}
	with := func(kv ...attribute.KeyValue) attribute.Set {
		return attribute.NewSet(append(slices.Clone(base), kv...)...)
	}
	p := &pair{
		start:     time.Now(),
		attrs:     base,
		base:      with(),
		tx:        with(attribute.String("network.io.direction", "transmit")),
		rx:        with(attribute.String("network.io.direction", "receive")),
		diagnoses: map[record.DiagnosisName]int64{},
	}
	for i, n := range componentNames {
		p.comp[i] = with(attribute.String("lattrace.component", n))
	}
	return p
}

// connKey is a connection counter's series.
type connKey struct {
	event string // opened or closed
	role  record.Role
}

type metrics struct {
	scope instrumentation.Scope

	mu       sync.Mutex
	maxPairs int
	pairs    map[pairKey]*pair
	other    map[record.ExchangeRole]*pair
	overflow uint64
	conns    map[connKey]int64
	start    time.Time
}

func newMetrics(scope instrumentation.Scope, maxPairs int) *metrics {
	return &metrics{
		scope:    scope,
		maxPairs: maxPairs,
		pairs:    map[pairKey]*pair{},
		other:    map[record.ExchangeRole]*pair{},
		conns:    map[connKey]int64{},
		start:    time.Now(),
	}
}

// pairOf returns e's pair, folding pairs beyond the cap into the "other"
// pair of the role. The caller holds mu.
func (m *metrics) pairOf(e *record.Exchange) *pair {
	// The server's port, whichever end spoke first: a server that greets
	// (MySQL, SMTP) must not make one pair per client port.
	port := e.Flow.Remote.Port()
	if record.SideOf(e.ConnRole, record.RoleUnknown, e.Role, e.Flow) == record.RoleServer {
		port = e.Flow.Local.Port()
	}
	k := pairKey{comm: e.Owner.Comm, remote: e.Flow.Remote.Addr().Unmap(), port: port, role: e.Role}
	if p, ok := m.pairs[k]; ok {
		return p
	}
	if len(m.pairs) < m.maxPairs {
		p := newPair(k.comm, k.remote.String(), int(k.port), k.role)
		m.pairs[k] = p
		return p
	}
	m.overflow++
	p, ok := m.other[e.Role]
	if !ok {
		p = newPair(Other, Other, 0, e.Role)
		m.other[e.Role] = p
	}
	return p
}

func (m *metrics) exchange(e *record.Exchange) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pairOf(e)
	p.exchanges++
	// A message without a reply waited, a cut between overlapping
	// messages is no request and its answer, a push has no request: none
	// is a latency.
	if e.Timed() {
		p.duration.add(e.Duration.Seconds())
		c := e.Components
		for i, d := range [8]time.Duration{
			c.Network, c.SendWait, c.LossRecovery, c.Handshake,
			c.Receive, c.Peer, c.LocalRead, c.Think,
		} {
			if d > 0 {
				p.components[i].add(d.Seconds())
			}
		}
	}
	p.turns += int64(e.ExchangeTurns)
	p.retransmits += int64(e.Retransmits)
	p.rtos += int64(e.RTOs)
	p.bytesTx += int64(e.BytesOut)
	p.bytesRx += int64(e.BytesIn)
	for _, d := range e.Diagnoses {
		p.diagnoses[d.Name]++
	}
}

func (m *metrics) connOpen(c record.ConnOpen) {
	m.mu.Lock()
	m.conns[connKey{"opened", c.Role}]++
	m.mu.Unlock()
}

func (m *metrics) connClose(c record.ConnClose) {
	m.mu.Lock()
	m.conns[connKey{"closed", c.Role}]++
	m.mu.Unlock()
}

func (m *metrics) pairStats() (pairs, overflow uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return uint64(len(m.pairs)), m.overflow
}

// Produce is the sdkmetric.Producer: every pair's counts as cumulative
// series. A counter that never moved for a pair has no series, as with
// the SDK's instruments.
func (m *metrics) Produce(context.Context) ([]metricdata.ScopeMetrics, error) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	var (
		dur, comp                           []metricdata.HistogramDataPoint[float64]
		exch, turns, retr, rtos, bytes, dgn []metricdata.DataPoint[int64]
	)
	sum := func(pts *[]metricdata.DataPoint[int64], attrs attribute.Set, start time.Time, v int64) {
		if v > 0 {
			*pts = append(*pts, metricdata.DataPoint[int64]{Attributes: attrs, StartTime: start, Time: now, Value: v})
		}
	}
	each := func(p *pair) {
		if p.exchanges > 0 {
			dur = append(dur, p.duration.point(p.base, p.start, now))
		}
		for i := range p.components {
			if p.components[i].n > 0 {
				comp = append(comp, p.components[i].point(p.comp[i], p.start, now))
			}
		}
		sum(&exch, p.base, p.start, p.exchanges)
		sum(&turns, p.base, p.start, p.turns)
		sum(&retr, p.base, p.start, p.retransmits)
		sum(&rtos, p.base, p.start, p.rtos)
		sum(&bytes, p.tx, p.start, p.bytesTx)
		sum(&bytes, p.rx, p.start, p.bytesRx)
		for name, n := range p.diagnoses {
			attrs := attribute.NewSet(append(slices.Clone(p.attrs), attribute.String("lattrace.diagnosis", string(name)))...)
			sum(&dgn, attrs, p.start, n)
		}
	}
	for _, p := range m.pairs {
		each(p)
	}
	for _, p := range m.other {
		each(p)
	}
	var conns []metricdata.DataPoint[int64]
	for k, n := range m.conns {
		sum(&conns, attribute.NewSet(attribute.String("lattrace.event", k.event), attribute.String("lattrace.conn_role", string(k.role))), m.start, n)
	}
	hist := func(name, unit, desc string, pts []metricdata.HistogramDataPoint[float64]) metricdata.Metrics {
		return metricdata.Metrics{Name: name, Unit: unit, Description: desc,
			Data: metricdata.Histogram[float64]{Temporality: metricdata.CumulativeTemporality, DataPoints: pts}}
	}
	counter := func(name, unit, desc string, pts []metricdata.DataPoint[int64]) metricdata.Metrics {
		return metricdata.Metrics{Name: name, Unit: unit, Description: desc,
			Data: metricdata.Sum[int64]{Temporality: metricdata.CumulativeTemporality, IsMonotonic: true, DataPoints: pts}}
	}
	var out []metricdata.Metrics
	for _, mt := range []metricdata.Metrics{
		hist(MetricDuration, "s", "Duration of a TCP request/response exchange, as one end saw it.", dur),
		hist(MetricComponentDuration, "s", "Time of an exchange spent in one component of the latency model (attribute lattrace.component).", comp),
		counter(MetricExchanges, "{exchange}", "TCP request/response exchanges.", exch),
		counter(MetricTurns, "{turn}", "Changes of direction on TCP connections.", turns),
		counter(MetricRetransmits, "{segment}", "TCP segments retransmitted during exchanges.", retr),
		counter(MetricRTOs, "{timeout}", "TCP retransmission timeouts during exchanges.", rtos),
		counter(MetricBytes, "By", "Payload bytes of exchanges, by network.io.direction.", bytes),
		counter(MetricConnections, "{connection}", "TCP connections opened and closed (attribute lattrace.event).", conns),
		counter(MetricDiagnoses, "{exchange}", "Exchanges with a diagnosis (attribute lattrace.diagnosis: slow_start_after_idle, bufferbloat, ...).", dgn),
	} {
		if points(mt) > 0 {
			out = append(out, mt)
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return []metricdata.ScopeMetrics{{Scope: m.scope, Metrics: out}}, nil
}

func points(m metricdata.Metrics) int {
	switch d := m.Data.(type) {
	case metricdata.Histogram[float64]:
		return len(d.DataPoints)
	case metricdata.Sum[int64]:
		return len(d.DataPoints)
	}
	return 0
}
