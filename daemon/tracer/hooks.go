package tracer

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
)

// hook is one program and where it attaches. Required hooks are the ones
// without which lattrace has nothing to report; the rest enrich records and
// are switched off, with a line saying so, when the kernel refuses them.
//
// A hook may have alternatives, listed after it with fallbackFor naming
// it, in order of preference: a tracepoint first, then fentry or fexit on
// the function that fires it (for kernels older than the tracepoint).
// The first one the kernel accepts is used, and a required hook is
// missing only when all are refused.
type hook struct {
	program  string
	hook     string
	required bool
	feature  string
	attach   func(*ebpf.Program, *Tracer) (link.Link, error)
	// fallbackFor names the hook this one stands in for: it is tried
	// only when that one and the alternatives before this one are
	// refused.
	fallbackFor string
	// iterator: the program runs only when the daemon reads it, so each
	// daemon makes its own link and none is pinned.
	iterator bool
	// fits, when set, says from the kernel's BTF whether this variant
	// matches the kernel (a tracepoint's arguments changed across
	// versions), so that the choice is never made by version number.
	fits func(*btf.Spec) error
	// only, when set, says from the kernel's BTF whether the kernel needs
	// this hook at all (tcp_sendpage exists before 6.5 only); a kernel
	// that does not is not told about it.
	only func(*btf.Spec) bool
	// reduced says what this alternative sees less than the hook it
	// stands in for, if anything.
	reduced string
	// off, when set, says whether the daemon's options leave this hook
	// out: a feature the user turned off, or a hook whose alternative a
	// test asks for.
	off func(*Options) bool
}

// HookStatus says whether one hook is live, for the log and the daemon's
// health (the API converts it to its own wire type, api.Hook).
type HookStatus struct {
	Program  string
	Hook     string
	Required bool
	Feature  string
	Attached bool
	// FallbackFor names the hook this one stands in for, when it is a
	// fallback.
	FallbackFor string
	// Adopted: taken over, pinned, from the previous daemon.
	Adopted bool
	Error   string
}

// Unavailable says in one line that h's feature is off, and why.
func (h HookStatus) Unavailable() string {
	return fmt.Sprintf("hook %s not attached (%s): %s", h.Hook, h.Feature, h.Error)
}

// FeaturesOff returns the hooks whose features are off: not attached, and
// no alternative attached in their stead.
func FeaturesOff(hooks []HookStatus) []HookStatus {
	covered := map[string]bool{}
	for _, h := range hooks {
		if h.Attached && h.FallbackFor != "" {
			covered[h.FallbackFor] = true
		}
	}
	var off []HookStatus
	for _, h := range hooks {
		if !h.Attached && h.FallbackFor == "" && !covered[h.Program] {
			off = append(off, h)
		}
	}
	return off
}

var hooks = []hook{
	{program: "lattrace_set_state", hook: "tp_btf/inet_sock_set_state", required: true,
		feature: "connection close records, SYN time", attach: attachTracing},
	{program: "lattrace_set_state_fentry", hook: "fentry/tcp_set_state", fallbackFor: "lattrace_set_state", attach: attachTracing},
	// Right after the state hook, which keeps the listener table from
	// here on, and before any hook that may adopt a socket open before
	// lattrace: the table is whole when the first one is adopted.
	{program: "lattrace_listeners", hook: "iter/tcp", required: false, iterator: true,
		feature: "roles of connections open before lattrace from their listening sockets (else guessed from the ports)", attach: attachTCPIter((*Tracer).seedListeners),
		off: func(o *Options) bool { return o.noListeners }},
	// Then HTTP/2's framing, before the hooks that adopt sockets too: the
	// first segment of a connection adopted mid-way is read, and none of
	// its exchanges comes out as a latency sample before its framing is
	// looked for.
	{program: "lattrace_h2_egress", hook: "cgroup_skb/egress", required: false,
		feature: "HTTP/2 framing of cleartext connections, outgoing: frame headers only (--http2-framing)",
		attach:  attachCgroup(ebpf.AttachCGroupInetEgress), off: func(o *Options) bool { return o.NoHTTP2Framing }},
	{program: "lattrace_h2_ingress", hook: "cgroup_skb/ingress", required: false,
		feature: "HTTP/2 framing of cleartext connections, incoming: frame headers only (--http2-framing)",
		attach:  attachCgroup(ebpf.AttachCGroupInetIngress), off: func(o *Options) bool { return o.NoHTTP2Framing }},
	{program: "lattrace_sendmsg_locked", hook: "tp_btf/tcp_sendmsg_locked", required: true,
		feature: "exchanges: message start (w0) and send-wait causes", attach: attachTracing},
	{program: "lattrace_sendmsg_fentry", hook: "fentry/tcp_sendmsg_locked", fallbackFor: "lattrace_sendmsg_locked", attach: attachTracing,
		reduced: "once per write, not per skb: a long write's send wait is classified at its start and end and at each ACK"},
	{program: "lattrace_send_length", hook: "tp_btf/sock_send_length", required: true,
		feature: "exchanges: message end (w1), send counts, process ownership", attach: attachTracing},
	{program: "lattrace_sendmsg_fexit", hook: "fexit/tcp_sendmsg", fallbackFor: "lattrace_send_length", attach: attachTracing},
	{program: "lattrace_probe", hook: "tp_btf/tcp_probe", required: true,
		feature: "exchanges: replies (r0, r1), ACKs, receive loss", attach: attachTracing},
	{program: "lattrace_rcv_fentry", hook: "fentry/tcp_rcv_established", fallbackFor: "lattrace_probe", attach: attachTracing},
	{program: "lattrace_recv_length", hook: "tp_btf/sock_recv_length", required: false,
		feature: "local read delay (d1)", attach: attachTracing},
	{program: "lattrace_recvmsg_fexit", hook: "fexit/tcp_recvmsg", fallbackFor: "lattrace_recv_length", attach: attachTracing,
		fits: funcArgs("tcp_recvmsg", 5)},
	{program: "lattrace_retransmit", hook: "tp_btf/tcp_retransmit_skb", required: false,
		feature: "loss recovery time of sent messages", attach: attachTracing, fits: tracepointArgs("tcp_retransmit_skb", 3)},
	{program: "lattrace_retransmit_sent", hook: "tp_btf/tcp_retransmit_skb (2 arguments)", fallbackFor: "lattrace_retransmit",
		attach: attachTracing, fits: tracepointArgs("tcp_retransmit_skb", 2)},
	{program: "lattrace_cong_state", hook: "tp_btf/tcp_cong_state_set", required: false,
		feature: "RTO counts", attach: attachTracing},
	{program: "lattrace_sendpages_fentry", hook: "fentry/do_tcp_sendpages", required: false,
		feature: "sendfile and splice: message start (w0)", attach: attachTracing, only: hasFunc("do_tcp_sendpages")},
	{program: "lattrace_sendpage_fexit", hook: "fexit/tcp_sendpage", required: false,
		feature: "sendfile and splice: message end (w1)", attach: attachTracing, only: hasFunc("tcp_sendpage")},
	{program: "lattrace_xmit_fentry", hook: "fentry/__tcp_transmit_skb", required: false,
		feature: "exact departure (x1) of each message's last byte, without BPF TX timestamps", attach: attachTracing, only: lacksTxTimestamps,
		fits: funcArgs("__tcp_transmit_skb", 5)},
	{program: "lattrace_sent_fentry", hook: "fentry/tcp_rate_skb_sent", fallbackFor: "lattrace_xmit_fentry", attach: attachTracing, only: lacksTxTimestamps,
		reduced: "read once IP and the device took the segment: late by the receive work a virtual device does on the way (veth's peer)"},
	{program: "lattrace_push_fexit", hook: "fexit/__tcp_push_pending_frames", fallbackFor: "lattrace_xmit_fentry", attach: attachTracing, only: lacksTxTimestamps,
		reduced: "held-back data seen leaving when an ACK, an uncork or a write pushes it, not when TCP small queues or pacing release it later"},
	{program: "lattrace_waking", hook: "tp_btf/sched_waking", required: false,
		feature: "requests handed from the thread that read them to a worker, for request trees (--request-links)", attach: attachTracing,
		off: func(o *Options) bool { return o.NoRequestLinks }},
	{program: "lattrace_sockops", hook: "sockops (cgroup)", required: false,
		feature: "connection role, connect latency, clean RTT samples, BPF TX timestamps", attach: attachCgroup(ebpf.AttachCGroupSockOps)},
	{program: "lattrace_inflight", hook: "iter/bpf_sk_storage_map", required: false, iterator: true,
		feature: "exchanges in progress in the live view (a running transfer before it ends)", attach: attachStorageIter((*Tracer).inflightIter),
		off: func(o *Options) bool { return o.noStorageIters }},
	{program: "lattrace_inflight_tcp", hook: "iter/tcp", fallbackFor: "lattrace_inflight", iterator: true,
		reduced: "the daemon's own network namespace only", attach: attachTCPIter((*Tracer).inflightIter)},
	{program: "lattrace_sweep", hook: "iter/bpf_sk_storage_map", required: false, iterator: true,
		feature: "exchanges written once complete and idle, not at the next turn; in-progress ones written at the daemon's stop", attach: attachStorageIter((*Tracer).sweepIter),
		off: func(o *Options) bool { return o.noStorageIters }},
	{program: "lattrace_sweep_tcp", hook: "iter/tcp", fallbackFor: "lattrace_sweep", iterator: true,
		reduced: "one network namespace at a time: needs CAP_SYS_ADMIN and the namespaces in /proc or --netns-dir", attach: attachTCPIter((*Tracer).sweepNetnsIter)},
}

// tracepointArgs fits a tp_btf program to a tracepoint of n arguments.
func tracepointArgs(tp string, n int) func(*btf.Spec) error {
	return func(k *btf.Spec) error {
		var td *btf.Typedef
		if err := k.TypeByName("btf_trace_"+tp, &td); err != nil {
			return fmt.Errorf("tracepoint %s not in the kernel's BTF: %w", tp, err)
		}
		ptr, ok := td.Type.(*btf.Pointer)
		if !ok {
			return fmt.Errorf("tracepoint %s: unexpected BTF type %v", tp, td.Type)
		}
		proto, ok := ptr.Target.(*btf.FuncProto)
		if !ok {
			return fmt.Errorf("tracepoint %s: unexpected BTF type %v", tp, ptr.Target)
		}
		// The first parameter is the tracepoint's context.
		if got := len(proto.Params) - 1; got != n {
			return fmt.Errorf("this variant reads %d arguments; the kernel's tracepoint %s has %d (BTF)", n, tp, got)
		}
		return nil
	}
}

// funcArgs fits a program that reads arguments by position (an fexit finds
// the return value after them) to a function of n arguments (tcp_recvmsg
// lost one in 5.19).
func funcArgs(fn string, n int) func(*btf.Spec) error {
	return func(k *btf.Spec) error {
		var f *btf.Func
		if err := k.TypeByName(fn, &f); err != nil {
			return fmt.Errorf("%s not in the kernel's BTF: %w", fn, err)
		}
		proto, ok := f.Type.(*btf.FuncProto)
		if !ok {
			return fmt.Errorf("%s: unexpected BTF type %v", fn, f.Type)
		}
		if got := len(proto.Params); got != n {
			return fmt.Errorf("this program reads %d arguments; the kernel's %s has %d (BTF)", n, fn, got)
		}
		return nil
	}
}

// lacksTxTimestamps tells a kernel without BPF TX timestamping (before
// 6.15), whose x1 of a held-back message needs the end of the ACK's
// processing.
func lacksTxTimestamps(k *btf.Spec) bool {
	return !hasFunc("bpf_sock_ops_enable_tx_tstamp")(k)
}

// hasFunc tells whether the kernel has the function fn.
func hasFunc(fn string) func(*btf.Spec) bool {
	return func(k *btf.Spec) bool {
		var f *btf.Func
		return k.TypeByName(fn, &f) == nil
	}
}

// pinned tells whether the hook's link is pinned.
func (h hook) pinned() bool { return !h.iterator }

func attachTracing(p *ebpf.Program, _ *Tracer) (link.Link, error) {
	return link.AttachTracing(link.TracingOptions{Program: p})
}

// attachCgroup attaches a program to the daemon's cgroup (the node's root
// by default) as at.
func attachCgroup(at ebpf.AttachType) func(*ebpf.Program, *Tracer) (link.Link, error) {
	return func(p *ebpf.Program, t *Tracer) (link.Link, error) {
		return link.AttachCgroup(link.CgroupOptions{Path: t.opts.CgroupPath, Attach: at, Program: p})
	}
}

// attachStorageIter links an iterator over the socket storage (it walks
// that map, so the link names it) and keeps it where keep says.
func attachStorageIter(keep func(*Tracer, *link.Iter)) func(*ebpf.Program, *Tracer) (link.Link, error) {
	return func(p *ebpf.Program, t *Tracer) (link.Link, error) {
		return attachIter(link.IterOptions{Program: p, Map: t.maps.Maps["socks"]}, t, keep)
	}
}

// attachTCPIter links an iterator over the TCP sockets of the network
// namespace of whoever opens it.
func attachTCPIter(keep func(*Tracer, *link.Iter)) func(*ebpf.Program, *Tracer) (link.Link, error) {
	return func(p *ebpf.Program, t *Tracer) (link.Link, error) {
		return attachIter(link.IterOptions{Program: p}, t, keep)
	}
}

func attachIter(opts link.IterOptions, t *Tracer, keep func(*Tracer, *link.Iter)) (link.Link, error) {
	it, err := link.AttachIter(opts)
	if err != nil {
		return nil, err
	}
	keep(t, it)
	return it, nil
}

func (t *Tracer) inflightIter(it *link.Iter) { t.inflight = it }
func (t *Tracer) sweepIter(it *link.Iter)    { t.sweep = it }

func (t *Tracer) sweepNetnsIter(it *link.Iter) {
	t.sweep = it
	t.sweepNetns = newNamespaces(t.opts.NetnsDirs)
}
