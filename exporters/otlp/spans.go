package otlp

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/unix"

	"github.com/lattrace/lattrace/record"
)

// SpanName is the name of an exchange's span.
const SpanName = "tcp exchange"

// Stage span names, the children of an exchange span.
const (
	StageHandshake    = "handshake"
	StageSendWait     = "send_wait"
	StageLossRecovery = "loss_recovery"
	StageNetwork      = "network"
	StagePeer         = "peer"
	StageReceive      = "receive"
	StageLocalRead    = "local_read"
	StageThink        = "think"
)

type stage struct {
	name string
	d    time.Duration
}

// stages lays the top-level components out on the exchange's timeline as
// consecutive intervals from Start, in the order they happen. The model
// computes them as differences of consecutive points, so the layout is the
// real one except for loss recovery, which is one total of both
// directions: it is placed where its outgoing part is (after send_wait on
// the requester, before receive on the responder). Network comes before
// peer in the x1..r0 gap (the request's trip precedes the peer's think
// time; the response's trip after it is not separable). Zero-length stages
// are omitted.
func stages(e *record.Exchange) []stage {
	c := e.Components
	var all []stage
	if e.Role == record.Responder {
		all = []stage{
			{StageLossRecovery, c.LossRecovery}, {StageReceive, c.Receive}, {StageLocalRead, c.LocalRead},
			{StageThink, c.Think}, {StageSendWait, c.SendWait},
			// Not produced for responders by the model; kept so the
			// children always cover Duration.
			{StageHandshake, c.Handshake}, {StageNetwork, c.Network}, {StagePeer, c.Peer},
		}
	} else {
		all = []stage{
			{StageHandshake, c.Handshake}, {StageSendWait, c.SendWait}, {StageLossRecovery, c.LossRecovery},
			{StageNetwork, c.Network}, {StagePeer, c.Peer}, {StageReceive, c.Receive},
			{StageLocalRead, c.LocalRead}, {StageThink, c.Think},
		}
	}
	out := all[:0]
	for _, s := range all {
		if s.d > 0 {
			out = append(out, s)
		}
	}
	return out
}

// spans exports e as an exchange span and its stage children, queued with
// priority p.
func (x *Exporter) spans(e *record.Exchange, p priority) {
	if e.Start == 0 || e.End < e.Start {
		// Nothing to place on a timeline (the metrics still have it).
		x.unexported[dropNoTimeline].Add(1)
		return
	}
	st := stages(e)
	n := 1 + len(st)
	x.spanMu.Lock()
	defer x.spanMu.Unlock()
	x.spansQueued.Add(uint64(n))
	if !x.queue.begin(n, p) {
		x.unexported[dropQueueFull].Add(1)
		x.spansDropped[dropQueueFull].Add(uint64(n))
		return
	}

	off := x.clock.offset(e.Time)
	wall := func(m record.Mono) time.Time { return time.Unix(0, int64(m)+off) }

	ctx := context.Background()
	if key, ok := exchangeKey(e); ok {
		x.sampled.add(key)
		tid, sid := key.ids()
		if e.Role == record.Responder {
			ctx = trace.ContextWithRemoteSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true,
			}))
		} else {
			ctx = context.WithValue(ctx, idKey{}, forcedIDs{tid, sid})
		}
	}
	span := x.exchangeSpan(ctx, SpanName, e, st, wall, exchangeAttrs(e))
	span.End(trace.WithTimestamp(wall(e.End)))
}

// exchangeSpan starts e's span under ctx, of the kind its role makes it,
// and its stage children st (stages(e)); the caller ends it, after nesting
// what else belongs under it.
func (x *Exporter) exchangeSpan(ctx context.Context, name string, e *record.Exchange, st []stage, wall func(record.Mono) time.Time,
	attrs []attribute.KeyValue, opts ...trace.SpanStartOption) trace.Span {
	kind := trace.SpanKindClient
	if e.Role == record.Responder {
		kind = trace.SpanKindServer
	}
	_, span := x.tracer.Start(ctx, name, append(opts,
		trace.WithSpanKind(kind),
		trace.WithTimestamp(wall(e.Start)),
		trace.WithAttributes(attrs...),
	)...)
	// Children start from a fresh context holding only the parent span, so
	// IDs forced for the parent apply to it alone.
	cctx := trace.ContextWithSpan(context.Background(), span)
	at := e.Start
	for _, s := range st {
		end := at + record.Mono(s.d)
		_, c := x.tracer.Start(cctx, s.name,
			trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithTimestamp(wall(at)),
			trace.WithAttributes(stageAttrs(e, s.name)...),
		)
		c.End(trace.WithTimestamp(wall(end)))
		at = end
	}
	diagnosisEvents(span, e, wall(e.End))
	return span
}

func stageAttrs(e *record.Exchange, name string) []attribute.KeyValue {
	c := e.Components
	kv := []attribute.KeyValue{attribute.String("lattrace.component", name)}
	switch name {
	case StageNetwork:
		kv = append(kv,
			attribute.Int64("lattrace.component.propagation_ns", int64(c.Propagation)),
			attribute.Int64("lattrace.component.queueing_ns", int64(c.Queueing)))
	case StageSendWait:
		kv = append(kv,
			attribute.Int64("lattrace.component.send_wait_cwnd_ns", int64(c.SendWaitCwnd)),
			attribute.Int64("lattrace.component.send_wait_rwnd_ns", int64(c.SendWaitRwnd)),
			attribute.Int64("lattrace.component.send_wait_sndbuf_ns", int64(c.SendWaitSndbuf)),
			attribute.Int64("lattrace.component.send_wait_pacing_ns", int64(c.SendWaitPacing)),
			attribute.Int64("lattrace.component.send_wait_flow_control_ns", int64(c.SendWaitFlowControl)),
			attribute.Int64("lattrace.component.send_wait_other_ns", int64(c.SendWaitOther)))
	}
	return kv
}

func exchangeAttrs(e *record.Exchange) []attribute.KeyValue {
	c := e.Components
	netType := "ipv4"
	if e.Flow.IPv6() {
		netType = "ipv6"
	}
	local, remote := e.Flow.Local, e.Flow.Remote
	server, client := remote, local
	if record.SideOf(e.ConnRole, record.RoleUnknown, e.Role, e.Flow) == record.RoleServer {
		server, client = local, remote
	}
	kv := []attribute.KeyValue{
		attribute.String("network.transport", "tcp"),
		attribute.String("network.type", netType),
		attribute.String("network.peer.address", remote.Addr().Unmap().String()),
		attribute.Int("network.peer.port", int(remote.Port())),
		attribute.String("network.local.address", local.Addr().Unmap().String()),
		attribute.Int("network.local.port", int(local.Port())),
		attribute.String("server.address", server.Addr().Unmap().String()),
		attribute.Int("server.port", int(server.Port())),
		attribute.String("client.address", client.Addr().Unmap().String()),
		attribute.Int("client.port", int(client.Port())),
		attribute.Int64("process.pid", int64(e.Owner.PID)),
		attribute.String("process.executable.name", e.Owner.Comm),

		attribute.String("lattrace.role", string(e.Role)),
		attribute.String("lattrace.conn_role", string(e.ConnRole)),
		attribute.Int64("lattrace.component.network_ns", int64(c.Network)),
		attribute.Int64("lattrace.component.propagation_ns", int64(c.Propagation)),
		attribute.Int64("lattrace.component.queueing_ns", int64(c.Queueing)),
		attribute.Int64("lattrace.component.send_wait_ns", int64(c.SendWait)),
		attribute.Int64("lattrace.component.send_wait_cwnd_ns", int64(c.SendWaitCwnd)),
		attribute.Int64("lattrace.component.send_wait_rwnd_ns", int64(c.SendWaitRwnd)),
		attribute.Int64("lattrace.component.send_wait_sndbuf_ns", int64(c.SendWaitSndbuf)),
		attribute.Int64("lattrace.component.send_wait_pacing_ns", int64(c.SendWaitPacing)),
		attribute.Int64("lattrace.component.send_wait_flow_control_ns", int64(c.SendWaitFlowControl)),
		attribute.Int64("lattrace.component.send_wait_other_ns", int64(c.SendWaitOther)),
		attribute.Int64("lattrace.component.loss_recovery_ns", int64(c.LossRecovery)),
		attribute.Int64("lattrace.component.handshake_ns", int64(c.Handshake)),
		attribute.Int64("lattrace.component.receive_ns", int64(c.Receive)),
		attribute.Int64("lattrace.component.peer_ns", int64(c.Peer)),
		attribute.Int64("lattrace.component.local_read_ns", int64(c.LocalRead)),
		attribute.Int64("lattrace.component.think_ns", int64(c.Think)),
		attribute.Int64("lattrace.turns", int64(e.Turns)),
		attribute.Int64("lattrace.retransmits", int64(e.Retransmits)),
		attribute.Int64("lattrace.rtos", int64(e.RTOs)),
		attribute.Int64("lattrace.min_rtt_ns", int64(e.MinRTT)),
		attribute.Int64("lattrace.srtt_ns", int64(e.SRTT)),
		attribute.Int64("lattrace.path_rtt_ns", int64(e.PathRTT)),
		attribute.Int64("lattrace.path_min_rtt_ns", int64(e.PathMinRTT)),
		attribute.Int64("lattrace.cwnd_start", int64(e.CwndStart)),
		attribute.Int64("lattrace.cwnd_end", int64(e.CwndEnd)),
		attribute.Int64("lattrace.bytes_out", int64(e.BytesOut)),
		attribute.Int64("lattrace.bytes_in", int64(e.BytesIn)),
		attribute.Int64("lattrace.idle_gap_ns", int64(e.IdleGap)),
		attribute.Bool("lattrace.cwnd_restart", e.CwndRestart),
		attribute.Bool("lattrace.first", e.First),
		attribute.Bool("lattrace.partial", e.Partial),
		attribute.Bool("lattrace.unanswered", e.Unanswered),
		attribute.Bool("lattrace.multiplexed", e.Multiplexed),
		attribute.Bool("lattrace.push", e.Push),
		attribute.Bool("lattrace.unfinished", e.Unfinished),
		attribute.Bool("lattrace.greeting", e.Greeting),
	}
	if st := e.Stream; st != nil {
		kv = append(kv, attribute.Int64("lattrace.http2.stream_id", int64(st.ID)),
			attribute.Int64("lattrace.http2.data_frames_out", int64(st.DataOut)),
			attribute.Int64("lattrace.http2.data_frames_in", int64(st.DataIn)),
			attribute.Bool("lattrace.http2.reset", st.Reset))
	}
	if e.Owner.ContainerID != "" {
		kv = append(kv, attribute.String("container.id", e.Owner.ContainerID))
	}
	kv = k8sAttrs(kv, "", e.Owner.K8s)
	kv = k8sAttrs(kv, "lattrace.peer.", e.Peer)
	if p := e.Peer; p != nil && p.Service != "" {
		kv = append(kv, attribute.String("peer.service", p.Service))
	}
	if len(e.Diagnoses) > 0 {
		names := make([]string, len(e.Diagnoses))
		worst := record.SeverityInfo
		for i, d := range e.Diagnoses {
			names[i] = string(d.Name)
			if d.Severity.Rank() > worst.Rank() {
				worst = d.Severity
			}
		}
		// The worst severity as one string, which a gateway's tail
		// sampling matches (string_attribute reads span attributes, not
		// events).
		kv = append(kv, attribute.StringSlice("lattrace.diagnoses", names),
			attribute.String("lattrace.diagnosis.severity", string(worst)))
	}
	return kv
}

// k8sAttrs adds the semantic-convention names of a pod (k8s.pod.name,
// k8s.deployment.name, ...), under prefix for the peer's.
func k8sAttrs(kv []attribute.KeyValue, prefix string, n *record.K8s) []attribute.KeyValue {
	if n == nil {
		return kv
	}
	add := func(k, v string) {
		if v != "" {
			kv = append(kv, attribute.String(prefix+k, v))
		}
	}
	add("k8s.namespace.name", n.Namespace)
	add("k8s.pod.name", n.Pod)
	add("k8s.container.name", n.Container)
	if n.WorkloadKind != "" {
		add("k8s."+strings.ToLower(n.WorkloadKind)+".name", n.Workload)
	}
	add("k8s.service.name", n.Service)
	return kv
}

// diagnosisEvents puts each diagnosis on the exchange span as an event, so
// a trace view shows the finding, its share and its fix beside the stages.
func diagnosisEvents(span trace.Span, e *record.Exchange, at time.Time) {
	for _, d := range e.Diagnoses {
		span.AddEvent("lattrace.diagnosis", trace.WithTimestamp(at), trace.WithAttributes(
			attribute.String("lattrace.diagnosis.name", string(d.Name)),
			attribute.String("lattrace.diagnosis.severity", string(d.Severity)),
			attribute.Float64("lattrace.diagnosis.share", d.Share),
			attribute.String("lattrace.diagnosis.summary", d.Summary),
			attribute.String("lattrace.diagnosis.fix", d.Fix),
		))
	}
}

// key names an exchange at both ends: (client ISN, server ISN, request
// start sequence number).
type key struct{ clientISN, serverISN, reqSeq uint32 }

func exchangeKey(e *record.Exchange) (key, bool) {
	if e.ISNLocal == 0 && e.ISNRemote == 0 {
		return key{}, false
	}
	if e.Role == record.Responder {
		return key{e.ISNRemote, e.ISNLocal, e.InSeq}, true
	}
	return key{e.ISNLocal, e.ISNRemote, e.OutSeq}, true
}

// hash mixes the key into 64 bits spread evenly (splitmix64's finalizer)
// for the sampler's share test, which runs on every exchange the rate
// sample sees: the trace ID's SHA-256 is left to the exported ones.
func (k key) hash() uint64 {
	x := uint64(k.clientISN)<<32 | uint64(k.serverISN)
	x ^= uint64(k.reqSeq) * 0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// ids derives the trace ID and the requester's exchange span ID.
func (k key) ids() (trace.TraceID, trace.SpanID) {
	return k.derive("lattrace/trace\x00", "lattrace/span\x00")
}

// derive makes a trace ID and a span ID of the key, each the SHA-256 of a
// prefix and the key: two nodes that see the same exchange derive the
// same IDs.
func (k key) derive(tracePrefix, spanPrefix string) (trace.TraceID, trace.SpanID) {
	var b [12]byte
	binary.BigEndian.PutUint32(b[0:], k.clientISN)
	binary.BigEndian.PutUint32(b[4:], k.serverISN)
	binary.BigEndian.PutUint32(b[8:], k.reqSeq)
	th := sha256.Sum256(append([]byte(tracePrefix), b[:]...))
	sh := sha256.Sum256(append([]byte(spanPrefix), b[:]...))
	var tid trace.TraceID
	var sid trace.SpanID
	copy(tid[:], th[:])
	copy(sid[:], sh[:])
	if !tid.IsValid() {
		tid[15] = 1
	}
	if !sid.IsValid() {
		sid[7] = 1
	}
	return tid, sid
}

// TraceIDs returns the trace ID and the requester's span ID that e's span
// gets (ok false when e carries no ISNs and the IDs are random).
func TraceIDs(e *record.Exchange) (trace.TraceID, trace.SpanID, bool) {
	k, ok := exchangeKey(e)
	if !ok {
		return trace.TraceID{}, trace.SpanID{}, false
	}
	t, s := k.ids()
	return t, s, true
}

type idKey struct{}

type forcedIDs struct {
	tid trace.TraceID
	sid trace.SpanID
}

// idGenerator gives a root span the IDs carried in its context (see
// forcedIDs), else random ones.
type idGenerator struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if f, ok := ctx.Value(idKey{}).(forcedIDs); ok {
		return f.tid, f.sid
	}
	var tid trace.TraceID
	binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
	binary.NativeEndian.PutUint64(tid[8:], rand.Uint64()|1)
	return tid, randomSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return randomSpanID() }

func randomSpanID() trace.SpanID {
	var sid trace.SpanID
	binary.NativeEndian.PutUint64(sid[:], rand.Uint64()|1)
	return sid
}

// clock converts CLOCK_MONOTONIC to wall clock.
type clock struct {
	resync time.Duration
	off    atomic.Int64 // realtime - monotonic, ns
	at     atomic.Int64 // monotonic time of the measurement
	mu     sync.Mutex
}

func (c *clock) init(resync time.Duration) {
	c.resync = resync
	c.measure()
}

// measure reads REALTIME between two MONOTONIC reads and keeps the pair
// with the tightest bracket of three tries.
func (c *clock) measure() {
	best, bestOff, bestAt := int64(-1), int64(0), int64(0)
	for range 3 {
		var m0, r, m1 unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &m0)
		_ = unix.ClockGettime(unix.CLOCK_REALTIME, &r)
		_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &m1)
		width := m1.Nano() - m0.Nano()
		if best < 0 || width < best {
			mid := m0.Nano() + width/2
			best, bestOff, bestAt = width, r.Nano()-mid, mid
		}
	}
	c.off.Store(bestOff)
	c.at.Store(bestAt)
}

// offset returns realtime - monotonic, re-measured when now (a monotonic
// time, the exchange's) is more than resync past the last measurement.
func (c *clock) offset(now record.Mono) int64 {
	if int64(now)-c.at.Load() > int64(c.resync) && c.mu.TryLock() {
		c.measure()
		c.mu.Unlock()
	}
	return c.off.Load()
}
