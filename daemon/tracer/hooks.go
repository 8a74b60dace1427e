package tracer

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
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
}

// HookStatus says whether one hook is live, for the log and the API.
type HookStatus struct {
	Program  string `json:"program"`
	Hook     string `json:"hook"`
	Required bool   `json:"required"`
	Feature  string `json:"feature"`
	Attached bool   `json:"attached"`
	// FallbackFor names the hook this one stands in for, when it is a
	// fallback.
	FallbackFor string `json:"fallback_for,omitempty"`
	// Adopted: taken over, pinned, from the previous daemon.
	Adopted bool   `json:"adopted,omitempty"`
	Error   string `json:"error,omitempty"`
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
	{program: "lattrace_inflight", hook: "iter/bpf_sk_storage_map", required: false,
		feature: "exchanges in progress in the live view (a running transfer before it ends)", attach: attachStorageIter},
	{program: "lattrace_inflight_tcp", hook: "iter/tcp", required: false, fallbackFor: "lattrace_inflight",
		feature: "exchanges in progress, of the daemon's own network namespace only (where iterators over socket storage are refused)", attach: attachTCPIter},
}

// pinned tells whether the hook's link is pinned: the iterator only runs
// when the daemon reads it, so each daemon makes its own.
func (h hook) pinned() bool { return !strings.HasPrefix(h.program, "lattrace_inflight") }

func attachTracing(p *ebpf.Program, _ *Tracer) (link.Link, error) {
	return link.AttachTracing(link.TracingOptions{Program: p})
}

func attachSockops(p *ebpf.Program, t *Tracer) (link.Link, error) {
	return link.AttachCgroup(link.CgroupOptions{Path: t.opts.CgroupPath, Attach: ebpf.AttachCGroupSockOps, Program: p})
}

// attachStorageIter links the iterator over the socket storage: it walks
// that map, so the link names it.
func attachStorageIter(p *ebpf.Program, t *Tracer) (link.Link, error) {
	return attachIter(link.IterOptions{Program: p, Map: t.maps.Maps["socks"]}, t)
}

// attachTCPIter links the iterator over the TCP sockets of the daemon's
// network namespace.
func attachTCPIter(p *ebpf.Program, t *Tracer) (link.Link, error) {
	return attachIter(link.IterOptions{Program: p}, t)
}

func attachIter(opts link.IterOptions, t *Tracer) (link.Link, error) {
	it, err := link.AttachIter(opts)
	if err != nil {
		return nil, err
	}
	t.inflight = it
	return it, nil
}

// Cgroup2Root finds where the unified cgroup hierarchy is mounted: at
// /sys/fs/cgroup on most systems, /sys/fs/cgroup/unified on hybrid ones.
func Cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1], nil
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("reading mounts: %w", err)
	}
	return "", errors.New("no cgroup v2 hierarchy is mounted: mount one (mount -t cgroup2 none /sys/fs/cgroup) or give --cgroup")
}

// CheckCgroup2 tells whether path is a directory of a cgroup v2 hierarchy,
// the only place sockops programs attach.
func CheckCgroup2(path string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fmt.Errorf("cgroup %s: %w", path, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("cgroup %s is not in a cgroup v2 hierarchy (sockops attach only there)", path)
	}
	return nil
}
