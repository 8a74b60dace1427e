// Package record is lattrace's model, the ground floor every other package
// stands on: the values it produces about TCP connections (exchanges with
// their timeline and components, connection opens and closes, exchanges in
// progress, diagnoses), the keys that name a flow and a peer pair, and the
// Sink interface records flow through. It knows nothing of how they were
// read from the kernel: the tracer decodes ring-buffer records into them,
// and the pipeline, every exporter, the CLI and the tests consume them, so
// decoding, aggregation and output are tested without root.
package record

import (
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Flow names one TCP connection as its local end sees it.
type Flow struct {
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	// Netns is the inode number of the socket's network namespace: the same
	// 4-tuple can exist once per namespace.
	Netns uint32 `json:"netns"`
}

// IPv6 reports whether the connection runs over IPv6 (an IPv4 peer reached
// through an IPv6 socket counts as IPv4, as it does on the wire).
func (f Flow) IPv6() bool { return f.Local.Addr().Is6() }

// Owner is the process last seen using the socket from process context.
type Owner struct {
	PID      uint32 `json:"pid"`
	TID      uint32 `json:"tid"`
	CgroupID uint64 `json:"cgroup_id"`
	Comm     string `json:"comm"`
	// ContainerID is the container the process runs in, when it runs in
	// one (from the cgroup's name); filled in by the daemon.
	ContainerID string `json:"container_id,omitempty"`
	// K8s names the container's pod, in a cluster (filled in by the daemon).
	K8s *K8s `json:"k8s,omitempty"`
}

// Known reports whether the owner was seen: a socket adopted from softirq
// has none until its process next touches it.
func (o *Owner) Known() bool { return o.Comm != "" || o.CgroupID != 0 }

// Role says which end of the connection is local.
type Role string

// Roles; RoleUnknown is a connection open before lattrace started whose
// role could not be told from the listening sockets (RoleGuessed).
const (
	RoleUnknown Role = "unknown"
	RoleClient  Role = "client"
	RoleServer  Role = "server"
)

// RoleSource says how a connection end's role was told when lattrace did
// not see its handshake (the connection was open before it started).
type RoleSource string

const (
	// RoleFromListener: from the kernel's listening sockets: a listener
	// on the end's local port in its network namespace (the server), or
	// none (the client).
	RoleFromListener RoleSource = "listener"
	// RoleGuessed: the namespace's listeners were never read, so the
	// role is a guess from the ports (the lower one listens). Nothing is
	// diagnosed on such an exchange.
	RoleGuessed RoleSource = "guessed"
)

// ConnClose is emitted once when a connection ends, with its totals.
type ConnClose struct {
	// Time is when the connection closed, on CLOCK_MONOTONIC.
	Time Mono `json:"time_mono_ns"`
	// Cookie is the kernel's socket cookie: unique per socket while the
	// system runs, so it tells apart connections that reuse a 4-tuple.
	Cookie uint64 `json:"cookie"`
	Flow   Flow   `json:"flow"`
	Owner  Owner  `json:"owner"`
	Role   Role   `json:"role"`
	// Established is when the handshake completed; zero when the connection
	// predates lattrace.
	Established Mono `json:"established_mono_ns,omitempty"`
	// SendCalls and BytesSent count sendmsg/write calls that returned data
	// and the bytes they accepted.
	SendCalls uint64 `json:"send_calls"`
	BytesSent uint64 `json:"bytes_sent"`
	// SendSKBs counts the socket buffers those sends filled; on kernels
	// without the tcp_sendmsg_locked tracepoint (before 6.16), whose
	// stand-in fires once per write, the writes that reached TCP.
	SendSKBs uint64 `json:"send_skbs"`
	// HTTP2 counts the frames of a cleartext HTTP/2 connection, read from
	// their 9-byte headers; nil when the connection is not HTTP/2 or the
	// framing is not read (lattrace daemon --http2-framing=false).
	HTTP2 *HTTP2Frames `json:"http2,omitempty"`
}

// HTTP2Frames counts an HTTP/2 connection's frames both ways, by type.
type HTTP2Frames struct {
	// Frames by type: "DATA", "HEADERS", "PRIORITY", "RST_STREAM",
	// "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY", "WINDOW_UPDATE",
	// "CONTINUATION", and "other" for extension types.
	Frames map[string]uint64 `json:"frames"`
	// Unsynced: the framing was lost in a direction (a gap in the
	// segments it arrived in), so the counts stop there.
	Unsynced bool `json:"unsynced,omitempty"`
	// Resynced: the connection was open before lattrace started and its
	// framing was found mid-way from frame headers: the counts start
	// there.
	Resynced bool `json:"resynced,omitempty"`
}

// HTTP2FrameTypes names HTTP/2's frame types by their number (RFC 9113,
// section 6).
var HTTP2FrameTypes = [...]string{"DATA", "HEADERS", "PRIORITY", "RST_STREAM", "SETTINGS", "PUSH_PROMISE", "PING", "GOAWAY", "WINDOW_UPDATE", "CONTINUATION"}

// Lifetime is how long the connection was established, when known.
func (c ConnClose) Lifetime() time.Duration {
	if c.Established == 0 || c.Time < c.Established {
		return 0
	}
	return c.Time.Sub(c.Established)
}

// Mono is a CLOCK_MONOTONIC timestamp in nanoseconds, the clock of
// bpf_ktime_get_ns.
type Mono uint64

// Sub returns m - o as a duration.
func (m Mono) Sub(o Mono) time.Duration { return time.Duration(int64(m) - int64(o)) }

// Now reads CLOCK_MONOTONIC, the clock of the kernel's timestamps.
func Now() Mono {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail on Linux
	return Mono(ts.Nano())
}

// K8s names one end of a flow with Kubernetes objects: the pod (and the
// container in it, for the local end) and what runs it, or the Service an
// address fronts.
type K8s struct {
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	// WorkloadKind is Deployment, StatefulSet, DaemonSet, Job, ReplicaSet
	// or ReplicationController: the pod's controller, a ReplicaSet's own
	// Deployment when it has one.
	WorkloadKind string `json:"workload_kind,omitempty"`
	Workload     string `json:"workload,omitempty"`
	// Service is a Service whose endpoints or cluster IP the address is.
	Service string `json:"service,omitempty"`
	Node    string `json:"node,omitempty"`
}
