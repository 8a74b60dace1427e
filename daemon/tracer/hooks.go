package tracer

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// hook is one program and where it attaches. Required hooks are the ones
// without which lattrace has nothing to report; the rest enrich records and
// are switched off, with a line saying so, when the kernel refuses them.
type hook struct {
	program  string
	hook     string
	required bool
	feature  string
	attach   func(*ebpf.Program, *Tracer) (link.Link, error)
	// fallbackFor names the hook this one stands in for: it is tried
	// only when that one is refused.
	fallbackFor string
	// iterator: the program runs only when the daemon reads it, so each
	// daemon makes its own link and none is pinned.
	iterator bool
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
// no attached fallback stands in for them.
func FeaturesOff(hooks []HookStatus) []HookStatus {
	covered := map[string]bool{}
	for _, h := range hooks {
		if h.Attached && h.FallbackFor != "" {
			covered[h.FallbackFor] = true
		}
	}
	var off []HookStatus
	for _, h := range hooks {
		if !h.Attached && !covered[h.Program] {
			off = append(off, h)
		}
	}
	return off
}

var hooks = []hook{
	{program: "lattrace_set_state", hook: "tp_btf/inet_sock_set_state", required: true,
		feature: "connection close records, SYN time", attach: attachTracing},
	{program: "lattrace_sendmsg_locked", hook: "tp_btf/tcp_sendmsg_locked", required: true,
		feature: "exchanges: message start (w0) and send-wait causes", attach: attachTracing},
	{program: "lattrace_send_length", hook: "tp_btf/sock_send_length", required: true,
		feature: "exchanges: message end (w1), send counts, process ownership", attach: attachTracing},
	{program: "lattrace_probe", hook: "tp_btf/tcp_probe", required: true,
		feature: "exchanges: replies (r0, r1), ACKs, receive loss", attach: attachTracing},
	{program: "lattrace_recv_length", hook: "tp_btf/sock_recv_length", required: false,
		feature: "local read delay (d1)", attach: attachTracing},
	{program: "lattrace_retransmit", hook: "tp_btf/tcp_retransmit_skb", required: false,
		feature: "loss recovery time of sent messages", attach: attachTracing},
	{program: "lattrace_cong_state", hook: "tp_btf/tcp_cong_state_set", required: false,
		feature: "RTO counts", attach: attachTracing},
	{program: "lattrace_sockops", hook: "sockops (cgroup)", required: false,
		feature: "connection role, connect latency, clean RTT samples, BPF TX timestamps", attach: attachSockops},
	{program: "lattrace_inflight", hook: "iter/bpf_sk_storage_map", required: false, iterator: true,
		feature: "exchanges in progress in the live view (a running transfer before it ends)", attach: attachStorageIter((*Tracer).inflightIter)},
	{program: "lattrace_inflight_tcp", hook: "iter/tcp", required: false, fallbackFor: "lattrace_inflight", iterator: true,
		feature: "exchanges in progress, of the daemon's own network namespace only (where iterators over socket storage are refused)", attach: attachTCPIter((*Tracer).inflightIter)},
	{program: "lattrace_sweep", hook: "iter/bpf_sk_storage_map", required: false, iterator: true,
		feature: "exchanges written once complete and idle, not at the next turn; in-progress ones written at the daemon's stop", attach: attachStorageIter((*Tracer).sweepIter)},
	{program: "lattrace_sweep_tcp", hook: "iter/tcp", required: false, fallbackFor: "lattrace_sweep", iterator: true,
		feature: "the same, one network namespace at a time (where iterators over socket storage are refused): needs CAP_SYS_ADMIN and the namespaces in /proc or --netns-dir", attach: attachTCPIter((*Tracer).sweepNetnsIter)},
}

// pinned tells whether the hook's link is pinned.
func (h hook) pinned() bool { return !h.iterator }

func attachTracing(p *ebpf.Program, _ *Tracer) (link.Link, error) {
	return link.AttachTracing(link.TracingOptions{Program: p})
}

func attachSockops(p *ebpf.Program, t *Tracer) (link.Link, error) {
	return link.AttachCgroup(link.CgroupOptions{Path: t.opts.CgroupPath, Attach: ebpf.AttachCGroupSockOps, Program: p})
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
