package otlp

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/lattrace/lattrace/daemon/record"
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

var bg = context.Background()

// Attribute values of the overflow peer pair.
const Other = "other"

// durationBuckets are the histograms' bounds in seconds: 50 µs to 30 s.
var durationBuckets = []float64{
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

// pairAttrs are the precomputed attribute options of one pair.
type pairAttrs struct {
	attrs      []attribute.KeyValue
	base       metric.MeasurementOption
	components [8]metric.MeasurementOption
	tx, rx     metric.MeasurementOption
	// diagnoses is filled as diagnoses occur, under metrics.mu.
	diagnoses map[record.DiagnosisName]metric.MeasurementOption
}

var componentNames = [8]string{
	StageNetwork, StageSendWait, StageLossRecovery, StageHandshake,
	StageReceive, StagePeer, StageLocalRead, StageThink,
}

type metrics struct {
	duration, component                                          metric.Float64Histogram
	exchanges, turns, retransmits, rtos, bytes, conns, diagnoses metric.Int64Counter

	mu       sync.Mutex
	maxPairs int
	pairs    map[pairKey]*pairAttrs
	other    map[record.ExchangeRole]*pairAttrs
	overflow uint64
	opened   map[record.Role]metric.MeasurementOption
	closed   map[record.Role]metric.MeasurementOption
}

func newMetrics(m metric.Meter, maxPairs int) (*metrics, error) {
	x := &metrics{
		maxPairs: maxPairs,
		pairs:    map[pairKey]*pairAttrs{},
		other:    map[record.ExchangeRole]*pairAttrs{},
		opened:   map[record.Role]metric.MeasurementOption{},
		closed:   map[record.Role]metric.MeasurementOption{},
	}
	var errs [9]error
	x.duration, errs[0] = m.Float64Histogram(MetricDuration, metric.WithUnit("s"),
		metric.WithDescription("Duration of a TCP request/response exchange, as one end saw it."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	x.component, errs[1] = m.Float64Histogram(MetricComponentDuration, metric.WithUnit("s"),
		metric.WithDescription("Time of an exchange spent in one component of the latency model (attribute lattrace.component)."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	x.exchanges, errs[2] = m.Int64Counter(MetricExchanges, metric.WithUnit("{exchange}"),
		metric.WithDescription("TCP request/response exchanges."))
	x.turns, errs[3] = m.Int64Counter(MetricTurns, metric.WithUnit("{turn}"),
		metric.WithDescription("Changes of direction on TCP connections."))
	x.retransmits, errs[4] = m.Int64Counter(MetricRetransmits, metric.WithUnit("{segment}"),
		metric.WithDescription("TCP segments retransmitted during exchanges."))
	x.rtos, errs[5] = m.Int64Counter(MetricRTOs, metric.WithUnit("{timeout}"),
		metric.WithDescription("TCP retransmission timeouts during exchanges."))
	x.bytes, errs[6] = m.Int64Counter(MetricBytes, metric.WithUnit("By"),
		metric.WithDescription("Payload bytes of exchanges, by network.io.direction."))
	x.conns, errs[7] = m.Int64Counter(MetricConnections, metric.WithUnit("{connection}"),
		metric.WithDescription("TCP connections opened and closed (attribute lattrace.event)."))
	x.diagnoses, errs[8] = m.Int64Counter(MetricDiagnoses, metric.WithUnit("{exchange}"),
		metric.WithDescription("Exchanges with a diagnosis (attribute lattrace.diagnosis: slow_start_after_idle, bufferbloat, ...)."))
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("otlp: metrics: %w", err)
		}
	}
	return x, nil
}

func newPairAttrs(comm, remote string, port int, role record.ExchangeRole) *pairAttrs {
	base := []attribute.KeyValue{
		attribute.String("process.executable.name", comm),
		attribute.String("network.peer.address", remote),
		attribute.Int("server.port", port),
		attribute.String("lattrace.role", string(role)),
	}
	with := func(kv ...attribute.KeyValue) metric.MeasurementOption {
		s := attribute.NewSet(append(append([]attribute.KeyValue(nil), base...), kv...)...)
		return metric.WithAttributeSet(s)
	}
	p := &pairAttrs{
		attrs:     base,
		diagnoses: map[record.DiagnosisName]metric.MeasurementOption{},
		base:      with(),
		tx:        with(attribute.String("network.io.direction", "transmit")),
		rx:        with(attribute.String("network.io.direction", "receive")),
	}
	for i, n := range componentNames {
		p.components[i] = with(attribute.String("lattrace.component", n))
	}
	return p
}

// attrs returns the pair's attributes, folding pairs beyond the cap into
// the "other" pair of the role.
func (m *metrics) attrs(e *record.Exchange) *pairAttrs {
	port := e.Flow.Remote.Port()
	if e.Role == record.Responder {
		port = e.Flow.Local.Port()
	}
	k := pairKey{comm: e.Owner.Comm, remote: e.Flow.Remote.Addr().Unmap(), port: port, role: e.Role}
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.pairs[k]; ok {
		return p
	}
	if len(m.pairs) < m.maxPairs {
		p := newPairAttrs(k.comm, k.remote.String(), int(k.port), k.role)
		m.pairs[k] = p
		return p
	}
	m.overflow++
	p, ok := m.other[e.Role]
	if !ok {
		p = newPairAttrs(Other, Other, 0, e.Role)
		m.other[e.Role] = p
	}
	return p
}

func (m *metrics) exchange(e *record.Exchange) {
	ctx := bg
	p := m.attrs(e)
	m.exchanges.Add(ctx, 1, p.base)
	m.duration.Record(ctx, e.Duration.Seconds(), p.base)
	c := e.Components
	for i, d := range [8]float64{
		c.Network.Seconds(), c.SendWait.Seconds(), c.LossRecovery.Seconds(), c.Handshake.Seconds(),
		c.Receive.Seconds(), c.Peer.Seconds(), c.LocalRead.Seconds(), c.Think.Seconds(),
	} {
		if d > 0 {
			m.component.Record(ctx, d, p.components[i])
		}
	}
	if e.ExchangeTurns > 0 {
		m.turns.Add(ctx, int64(e.ExchangeTurns), p.base)
	}
	if e.Retransmits > 0 {
		m.retransmits.Add(ctx, int64(e.Retransmits), p.base)
	}
	if e.RTOs > 0 {
		m.rtos.Add(ctx, int64(e.RTOs), p.base)
	}
	if e.BytesOut > 0 {
		m.bytes.Add(ctx, int64(e.BytesOut), p.tx)
	}
	if e.BytesIn > 0 {
		m.bytes.Add(ctx, int64(e.BytesIn), p.rx)
	}
	for _, d := range e.Diagnoses {
		m.diagnoses.Add(ctx, 1, m.diagnosisAttrs(p, d.Name))
	}
}

// diagnosisAttrs returns the pair's attributes with the diagnosis name.
func (m *metrics) diagnosisAttrs(p *pairAttrs, name record.DiagnosisName) metric.MeasurementOption {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := p.diagnoses[name]
	if !ok {
		kv := append(append([]attribute.KeyValue(nil), p.attrs...), attribute.String("lattrace.diagnosis", string(name)))
		o = metric.WithAttributeSet(attribute.NewSet(kv...))
		p.diagnoses[name] = o
	}
	return o
}

func (m *metrics) connAttrs(cache map[record.Role]metric.MeasurementOption, event string, role record.Role) metric.MeasurementOption {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := cache[role]
	if !ok {
		o = metric.WithAttributeSet(attribute.NewSet(
			attribute.String("lattrace.event", event),
			attribute.String("lattrace.conn_role", string(role))))
		cache[role] = o
	}
	return o
}

func (m *metrics) connOpen(c record.ConnOpen) {
	m.conns.Add(bg, 1, m.connAttrs(m.opened, "opened", c.Role))
}

func (m *metrics) connClose(c record.ConnClose) {
	m.conns.Add(bg, 1, m.connAttrs(m.closed, "closed", c.Role))
}

func (m *metrics) pairStats() (pairs, overflow uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return uint64(len(m.pairs)), m.overflow
}
