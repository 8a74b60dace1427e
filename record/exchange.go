package record

import "time"

// ExchangeRole says which side of an exchange the local end is.
type ExchangeRole string

// The requester sent the exchange's first message; the responder answered.
const (
	Requester ExchangeRole = "requester"
	Responder ExchangeRole = "responder"
)

// Timeline holds the points of one exchange on the local end, each a
// CLOCK_MONOTONIC timestamp, zero when the point did not happen (a one-way
// message has no response). Points are named as in docs/latency-model.md.
// On the requester the outgoing message is the request and the incoming one
// the response; on the responder it is the other way round.
type Timeline struct {
	// Connect is when the SYN was sent, set on the first exchange of a
	// connection this end opened (the handshake is part of that exchange).
	Connect Mono `json:"connect,omitempty"`
	// Established is when the handshake completed (first exchange only).
	Established Mono `json:"established,omitempty"`
	W0          Mono `json:"w0,omitempty"` // first byte of the outgoing message handed to the kernel
	W1          Mono `json:"w1,omitempty"` // last write of the outgoing message returned
	X1          Mono `json:"x1,omitempty"` // last byte of the outgoing message first transmitted
	A1          Mono `json:"a1,omitempty"` // ACK covering the outgoing message arrived
	R0          Mono `json:"r0,omitempty"` // first byte of the incoming message arrived
	R1          Mono `json:"r1,omitempty"` // last byte of the incoming message arrived
	D1          Mono `json:"d1,omitempty"` // the app read the last byte of the incoming message
}

// Components is where an exchange's time went. The top-level fields
// (Network, SendWait, LossRecovery, Handshake, Receive, Peer, LocalRead,
// Think) sum to the exchange's Duration; the others split one of them.
type Components struct {
	// Network is the path's round trip for this exchange:
	// Propagation (the flow's minimum RTT) + Queueing (above it).
	Network     time.Duration `json:"network_ns"`
	Propagation time.Duration `json:"propagation_ns"`
	Queueing    time.Duration `json:"queueing_ns"`

	// SendWait is the outgoing message waiting in the local kernel, from
	// the first byte handed over to the last byte first sent, split by
	// what it waited for.
	SendWait       time.Duration `json:"send_wait_ns"`
	SendWaitCwnd   time.Duration `json:"send_wait_cwnd_ns"`
	SendWaitRwnd   time.Duration `json:"send_wait_rwnd_ns"`
	SendWaitSndbuf time.Duration `json:"send_wait_sndbuf_ns"`
	SendWaitPacing time.Duration `json:"send_wait_pacing_ns"` // TCP holding data until its departure time
	// SendWaitFlowControl is an HTTP/2 stream's data held by the app's
	// HTTP/2 library until the peer's WINDOW_UPDATE opened its window.
	SendWaitFlowControl time.Duration `json:"send_wait_flow_control_ns,omitempty"`
	SendWaitOther       time.Duration `json:"send_wait_other_ns"` // Nagle, cork, the app writing in pieces

	// LossRecovery is time lost to retransmissions, either direction.
	LossRecovery time.Duration `json:"loss_recovery_ns"`
	// Handshake is connect() until the first write, on the first exchange
	// of a connection this end opened.
	Handshake time.Duration `json:"handshake_ns"`
	// Receive is the incoming message's own transfer time, first byte to
	// last, less loss recovery.
	Receive time.Duration `json:"receive_ns"`

	// Peer is the other side's think time and its own kernel delays, as
	// seen from the requester.
	Peer time.Duration `json:"peer_ns"`
	// LocalRead is the incoming message waiting for the local app to read it.
	LocalRead time.Duration `json:"local_read_ns"`
	// Think is the local app's own think time, on the responder: request
	// read to first response byte written.
	Think time.Duration `json:"think_ns"`
}

// Sum adds the top-level components.
func (c Components) Sum() time.Duration {
	return c.Network + c.SendWait + c.LossRecovery + c.Handshake + c.Receive + c.Peer + c.LocalRead + c.Think
}

// Exchange is one message each way on a connection, as one end saw it.
type Exchange struct {
	// Time is when the exchange was closed (the next turn, close, or idle).
	Time   Mono         `json:"time_mono_ns"`
	Cookie uint64       `json:"cookie"`
	Flow   Flow         `json:"flow"`
	Owner  Owner        `json:"owner"`
	Role   ExchangeRole `json:"role"`
	// ConnRole is who opened the connection, which need not be who
	// requests (a server can speak first).
	ConnRole Role `json:"conn_role"`
	// RoleSource says how ConnRole was told on a connection open before
	// lattrace started (empty: its handshake was seen).
	RoleSource RoleSource `json:"role_source,omitempty"`
	Timeline   Timeline   `json:"timeline"`

	// Start and End bound the exchange; Duration = End - Start = Components.Sum().
	Start      Mono          `json:"start_mono_ns"`
	End        Mono          `json:"end_mono_ns"`
	Duration   time.Duration `json:"duration_ns"`
	Components Components    `json:"components"`

	BytesOut    uint64 `json:"bytes_out"`
	BytesIn     uint64 `json:"bytes_in"`
	SegsOut     uint32 `json:"segs_out"`
	SegsIn      uint32 `json:"segs_in"`
	Retransmits uint32 `json:"retransmits"`
	RTOs        uint32 `json:"rtos"`

	// MinRTT is the kernel's windowed minimum RTT of the flow; SRTT its
	// smoothed RTT. PathRTT is the clean RTT of the path (this namespace to
	// this peer address, from every flow's samples) while the exchange was
	// in flight, or a recent one; PathMinRTT the path's minimum over
	// minutes. AckRTT is the outgoing message's own ACK sample when a pure
	// ACK came before the reply.
	MinRTT     time.Duration `json:"min_rtt_ns"`
	SRTT       time.Duration `json:"srtt_ns"`
	PathRTT    time.Duration `json:"path_rtt_ns"`
	PathMinRTT time.Duration `json:"path_min_rtt_ns"`
	AckRTT     time.Duration `json:"ack_rtt_ns,omitempty"`

	// Raw kernel measurements the components are computed from.
	Raw ExchangeRaw `json:"raw"`

	CwndStart uint32 `json:"cwnd_start"`
	CwndEnd   uint32 `json:"cwnd_end"`
	RwndStart uint32 `json:"rwnd_start"` // the peer's advertised window, bytes
	RwndEnd   uint32 `json:"rwnd_end"`

	// ISNLocal and ISNRemote are the connection's initial sequence numbers;
	// OutSeq and InSeq where the outgoing and incoming messages start. Both
	// ends of a connection see the same numbers (NAT does not rewrite
	// them), so they name an exchange across tracers.
	ISNLocal  uint32 `json:"isn_local"`
	ISNRemote uint32 `json:"isn_remote"`
	OutSeq    uint32 `json:"out_seq"`
	InSeq     uint32 `json:"in_seq"`

	// Turns is the connection's changes of direction so far;
	// ExchangeTurns those since its previous exchange (2 for a plain
	// request and response: to the response, and to the next request).
	Turns         uint32 `json:"turns"`
	ExchangeTurns uint32 `json:"exchange_turns"`
	// IdleGap is the connection's silence before the exchange began.
	IdleGap time.Duration `json:"idle_gap_ns"`
	// CwndRestart: the kernel shrank the congestion window after the idle
	// gap (slow start after idle) before sending this exchange's message.
	CwndRestart bool `json:"cwnd_restart"`
	// SlowStartAfterIdle is the namespace's tcp_slow_start_after_idle.
	SlowStartAfterIdle bool `json:"slow_start_after_idle"`
	// CongestionControl is the socket's algorithm, read when the cwnd
	// restarted (empty otherwise).
	CongestionControl string `json:"congestion_control,omitempty"`
	// TxTimestamps: X1 and A1 came from the kernel's BPF TX timestamps;
	// otherwise they were reconstructed from snd_nxt/snd_una.
	TxTimestamps bool `json:"tx_timestamps"`
	// X1Transmit: X1 was read as the segment holding the message's last
	// byte was handed to IP (kernels without BPF TX timestamps), as exact
	// as a TX timestamp's.
	X1Transmit bool `json:"x1_transmit,omitempty"`
	// First: the connection's first exchange.
	First bool `json:"first,omitempty"`
	// Partial: the connection was open before lattrace started and this is
	// the first exchange seen, so its beginning may be missing.
	Partial bool `json:"partial,omitempty"`
	// Greeting: the server spoke first on the connection (MySQL's
	// greeting, SMTP's banner, HTTP/2's SETTINGS racing the client's
	// preface); that message is not part of this exchange, which begins
	// with the client's first request. On the client's first exchange it
	// falls in the connection setup (Handshake).
	Greeting bool `json:"greeting,omitempty"`
	// Unanswered: the connection closed before this exchange's message got
	// its reply: a protocol's closing message, a request the peer never
	// answered, a one-way stream. Its duration is how long the message
	// waited, not a round trip, so it is no latency sample: the
	// aggregates count it apart (Metrics.Unanswered).
	Unanswered bool `json:"unanswered,omitempty"`
	// Multiplexed: the connection carries overlapping messages (HTTP/2
	// streams, pipelining with overlap): the peer's data of this exchange
	// began before it could have answered this end's message (sooner than
	// the path's minimum round trip after it left, or while it was still
	// being sent), or, on the responder, the request came as soon after
	// the previous answer. A cut at a change of direction is then no
	// request and its answer: Network is not measured (0), the time before
	// the peer's data is in Peer, and like an unanswered message it is
	// kept out of the latency distributions (Metrics.Multiplexed). The
	// connection's RTTs, send-wait causes and loss stay right.
	Multiplexed bool `json:"multiplexed,omitempty"`
	// HTTP2Searching: the connection was open before lattrace started and
	// looks like cleartext HTTP/2 whose framing is not confirmed yet
	// (bpf/h2_resync.bpf.h): its cut at a change of direction may split
	// overlapping streams, so it is Multiplexed too.
	HTTP2Searching bool `json:"http2_searching,omitempty"`
	// Push: the server's message came unprompted after a complete
	// exchange and a silence of two round trips (10 ms at least): server
	// push, PostgreSQL NOTIFY, pub/sub, a PING. The record holds that
	// message alone: no latency sample (Metrics.Pushes).
	Push bool `json:"push,omitempty"`
	// Unfinished: the exchange was still in progress when the daemon
	// stopped (without pinning, which would have kept it for the next
	// daemon), and is written as it stood: no latency sample
	// (Metrics.Unfinished).
	Unfinished bool `json:"unfinished,omitempty"`
	// Rejected names why the latency model's guard refused the exchange
	// as a latency sample, though nothing above excluded it: its parts
	// broke the model's own rules (daemon/latency), or its role is a
	// guess. Empty for a sample.
	Rejected Rejection `json:"rejected,omitempty"`

	// Ctx names the execution context (in Owner.PID) that read the
	// request, on the responder, or wrote the request's first byte, on
	// the requester: a thread id, or a goroutine (CtxGoroutine set).
	// 0: not seen from process context.
	Ctx uint64 `json:"ctx,omitempty"`
	// Served is the requester's evidence of the inbound request it ran
	// inside (bpf/request_links.bpf.h): the one its writing context
	// served as it began, and the one before. Package requests checks it
	// against the timelines before it links anything.
	Served Served `json:"served,omitzero"`

	// Stream is set on an exchange of one HTTP/2 stream, cut from the
	// framing of cleartext HTTP/2 (daemon/streams): the request is the
	// stream's frames from its HEADERS to the client's END_STREAM, the
	// answer the server's, and the points are those of its own bytes.
	Stream *HTTP2Stream `json:"http2_stream,omitempty"`

	// Peer names the remote end in a cluster: the pod or Service behind
	// the remote address (filled in by the daemon).
	Peer *K8s `json:"peer_k8s,omitempty"`

	// Diagnoses say what made this exchange slow, largest share first
	// (filled in by the daemon; see daemon/diagnose).
	Diagnoses []Diagnosis `json:"diagnoses,omitempty"`
}

// Timed reports whether the exchange is a latency sample: a request and
// its answer, not a message without a reply (Unanswered), a cut between
// overlapping messages (Multiplexed), an unprompted message (Push), one
// cut by the daemon's stop (Unfinished) or one the model's guard refused
// (Rejected). A Partial exchange is one, truncated.
func (e *Exchange) Timed() bool {
	return !e.Unanswered && !e.Multiplexed && !e.Push && !e.Unfinished && e.Rejected == ""
}

// CtxGoroutine marks an Exchange.Ctx that is a goroutine id.
const CtxGoroutine = 1 << 63

// Served is what the kernel saw of the inbound requests an outbound
// exchange's writer served.
type Served struct {
	// Parent is the request the writing context read last as the
	// outbound request began, Prev the one it read before that, and
	// Handoff the one last handed to it by the thread that read it.
	Parent  ServedRequest `json:"parent,omitzero"`
	Prev    ServedRequest `json:"prev,omitzero"`
	Handoff ServedRequest `json:"handoff,omitzero"`
}

// Any reports whether the writing context served any request.
func (s Served) Any() bool { return s.Parent.Cookie != 0 || s.Handoff.Cookie != 0 }

// ServedRequest names an inbound request on this node: its socket
// (Exchange.Cookie of the responder's record) and where it starts
// (Exchange.InSeq), and how the writer came to serve it.
type ServedRequest struct {
	Cookie uint64     `json:"cookie"`
	InSeq  uint32     `json:"in_seq"`
	Method LinkMethod `json:"method"`
}

// LinkMethod is how an execution context came to serve an inbound request.
type LinkMethod string

const (
	// LinkThread: the writing thread read the request itself.
	LinkThread LinkMethod = "thread"
	// LinkHandoff: the thread that read the request woke the writing
	// thread (its first wake-up of a thread of its process after the
	// read, from a futex wake).
	LinkHandoff LinkMethod = "handoff"
	// LinkGoroutine: the writing goroutine read the request itself.
	LinkGoroutine LinkMethod = "goroutine"
	// LinkGoParent: the goroutine that read the request started the
	// writing goroutine.
	LinkGoParent LinkMethod = "go_parent"
	// LinkWindow: no evidence from process context; the outbound
	// exchange lies inside one inbound exchange's window in its process,
	// and no other's.
	LinkWindow LinkMethod = "window"
)

// Rejection is why the latency model's guard refused an exchange as a
// latency sample.
type Rejection string

const (
	// RejectedNoPathRTT: a request answered, but neither the connection
	// nor its path had an RTT sample, so nothing bounds the network part
	// (it would be 0 and the peer's time the whole wait).
	RejectedNoPathRTT Rejection = "no_path_rtt"
	// RejectedNetworkBelowPath: the network part came out below the
	// path's minimum round trip, which no answer can beat.
	RejectedNetworkBelowPath Rejection = "network_below_path_rtt"
	// RejectedRoleGuessed: the connection predates lattrace and its role
	// is a guess (RoleGuessed): where the exchanges are cut may be wrong.
	RejectedRoleGuessed Rejection = "role_guessed"
)

// Rejections lists every Rejection, for metrics by reason.
var Rejections = []Rejection{RejectedNoPathRTT, RejectedNetworkBelowPath, RejectedRoleGuessed}

// ExactDeparture reports whether X1 is when the last byte left, read where
// it left (a TX timestamp, or the segment handed to IP), rather than a
// later point that bounds it (a write's return, the next incoming segment).
func (e *Exchange) ExactDeparture() bool { return e.TxTimestamps || e.X1Transmit }

// HTTP2Stream is what an exchange of one HTTP/2 stream adds.
type HTTP2Stream struct {
	ID uint32 `json:"id"`
	// DataOut and DataIn count the stream's DATA frames each way: a
	// streaming call's messages, when each fits a frame (16 KB unless the
	// peer allows more).
	DataOut uint32 `json:"data_frames_out"`
	DataIn  uint32 `json:"data_frames_in"`
	// Reset: the stream ended with RST_STREAM, either way.
	Reset bool `json:"reset,omitempty"`
	// InGaps is time inside the incoming message when the stream was
	// silent for longer than two round trips (1 ms at least): a streamed
	// message's pauses between its parts. It counts as the peer's (Peer),
	// not as receive.
	InGaps time.Duration `json:"in_gaps_ns,omitempty"`
}

// ConnOpen is emitted when a connection is established.
type ConnOpen struct {
	Time   Mono   `json:"time_mono_ns"`
	Cookie uint64 `json:"cookie"`
	Flow   Flow   `json:"flow"`
	Role   Role   `json:"role"`
	// ConnectLatency is SYN sent to ESTABLISHED, for connections this end
	// opened; zero for accepted ones (the request socket that saw the SYN
	// is not followed).
	ConnectLatency time.Duration `json:"connect_latency_ns"`
	// HandshakeRTT is the kernel's RTT sample from the handshake.
	HandshakeRTT time.Duration `json:"handshake_rtt_ns"`
}

// ExchangeRaw holds the kernel's measurements that feed the latency model
// and are not points on the timeline.
type ExchangeRaw struct {
	LossOut    time.Duration `json:"loss_out_ns"`
	LossIn     time.Duration `json:"loss_in_ns"`
	WaitCwnd   time.Duration `json:"wait_cwnd_ns"`
	WaitRwnd   time.Duration `json:"wait_rwnd_ns"`
	WaitSndbuf time.Duration `json:"wait_sndbuf_ns"`
	WaitPacing time.Duration `json:"wait_pacing_ns"`
	WaitOther  time.Duration `json:"wait_other_ns"`
	// WriteGaps is time inside the outgoing message when all of it
	// written so far had left: the app writing it in pieces (a streamed
	// message, a control frame written ahead of an answer). It counts as
	// the local app's (Think), not as send wait.
	WriteGaps time.Duration `json:"write_gaps_ns,omitempty"`
	// WaitFlowControl is the part of the outgoing message's time, outside
	// WriteGaps, that an HTTP/2 stream waited for its flow-control window:
	// all of it written so far had left, and the next write came as the
	// peer's WINDOW_UPDATE arrived.
	WaitFlowControl time.Duration `json:"wait_flow_control_ns,omitempty"`
}

// InFlight is a connection's exchange in progress, read from the kernel
// when asked: no record exists for it until it ends.
type InFlight struct {
	Cookie   uint64 `json:"cookie"`
	Flow     Flow   `json:"flow"`
	Owner    Owner  `json:"owner"`
	ConnRole Role   `json:"conn_role"`
	// Role is the local end's role in the exchange in progress; empty
	// when the connection has not exchanged anything yet.
	Role ExchangeRole `json:"role,omitempty"`
	// Start is the exchange's first point (w0 or r0), LastActivity the
	// connection's last data either way.
	Start        Mono `json:"start_mono_ns,omitempty"`
	LastActivity Mono `json:"last_activity_mono_ns,omitempty"`
	// BytesOut and BytesIn are the exchange's so far.
	BytesOut uint64        `json:"bytes_out"`
	BytesIn  uint64        `json:"bytes_in"`
	Cwnd     uint32        `json:"cwnd"`
	SRTT     time.Duration `json:"srtt_ns"`
	Turns    uint32        `json:"turns"`
}
