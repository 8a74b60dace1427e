// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * lattrace.bpf.c: the kernel side of lattrace, one program per attach
 * point, each a few lines handing the event to its handler.
 *
 * lattrace follows every TCP connection and cuts its traffic into
 * exchanges: a message one way, then the message the other way, closed at
 * the next turn (change of direction). Each exchange leaves the kernel as
 * one record with its timeline (docs/latency-model.md); per-segment work
 * stays here.
 *
 * Hooks are tp_btf tracepoints and sockops where the kernel has them, so
 * that kernels refusing trampolines still run every program; fentry and
 * fexit programs stand in for tracepoints older kernels lack. The handlers
 * (handlers.bpf.h) take the kernel's objects as trusted BTF pointers, the
 * way tp_btf and fentry programs receive them, so such a program for
 * another attach point of the same event calls the same handler. Only
 * metadata is read (socket fields, TCP control-block sequence numbers),
 * never a payload byte. bpf/README.md lists the headers.
 */
#include "common.bpf.h"
#include "handlers.bpf.h"
#include "http2.bpf.h"
#include "request_links.bpf.h"
#include "sockops.bpf.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* bpf2go -type needs each exported type to be used by a global. */
const struct lt_conn_close *unused_lt_conn_close __attribute__((unused));
const struct lt_conn_open *unused_lt_conn_open __attribute__((unused));
const struct lt_exchange *unused_lt_exchange __attribute__((unused));
const enum lt_counter *unused_lt_counter __attribute__((unused));
const enum lt_record_kind *unused_lt_record_kind __attribute__((unused));
const enum lt_role *unused_lt_role __attribute__((unused));
const enum lt_layout *unused_lt_layout __attribute__((unused));
const enum lt_exchange_role *unused_lt_exchange_role __attribute__((unused));
const struct lt_inflight *unused_lt_inflight __attribute__((unused));
const enum lt_exchange_flag *unused_lt_exchange_flag __attribute__((unused));
const enum lt_h2_flag *unused_lt_h2_flag __attribute__((unused));
const enum lt_h2_frame *unused_lt_h2_frame __attribute__((unused));
const struct lt_h2_event *unused_lt_h2_event __attribute__((unused));
const enum lt_h2_event_kind *unused_lt_h2_event_kind __attribute__((unused));
const enum lt_wait_cause *unused_lt_wait_cause __attribute__((unused));
const struct lt_control *unused_lt_control __attribute__((unused));
const enum lt_control_slot *unused_lt_control_slot __attribute__((unused));
const enum lt_link_method *unused_lt_link_method __attribute__((unused));
const struct lt_go_offsets *unused_lt_go_offsets __attribute__((unused));

/* sockops: connection establishment, RTT samples and TX timestamps. */
SEC("sockops")
int lattrace_sockops(struct bpf_sock_ops *skops)
{
	struct bpf_sock *bsk = skops->sk;
	__u32 op = skops->op;

	if (!bsk)
		return 1;
	switch (op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		sockops_established(skops, bsk, op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB ? LT_ROLE_CLIENT : LT_ROLE_SERVER);
		break;
	case BPF_SOCK_OPS_RTT_CB:
		sockops_rtt(skops, bsk);
		break;
	case BPF_SOCK_OPS_TSTAMP_SENDMSG_CB:
		sockops_tstamp_sendmsg(skops, bsk);
		break;
	case BPF_SOCK_OPS_TSTAMP_SCHED_CB:
		sockops_tstamp_sched(skops, bsk);
		break;
	case BPF_SOCK_OPS_TSTAMP_ACK_CB:
		sockops_tstamp_ack(skops, bsk);
		break;
	}
	return 1;
}

/* HTTP/2 framing, segment by segment as each leaves or arrives. */
SEC("cgroup_skb/egress")
int lattrace_h2_egress(struct __sk_buff *skb)
{
	h2_segment(skb, H2_OUT);
	return 1;
}

SEC("cgroup_skb/ingress")
int lattrace_h2_ingress(struct __sk_buff *skb)
{
	h2_segment(skb, H2_IN);
	return 1;
}

SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(lattrace_sendmsg_locked, struct sock *sk, struct msghdr *msg, struct sk_buff *skb, int size_goal)
{
	handle_sendmsg(sk);
	return 0;
}

SEC("tp_btf/sock_send_length")
int BPF_PROG(lattrace_send_length, struct sock *sk, int ret, int flags)
{
	handle_send_done(sk, ret);
	return 0;
}

SEC("tp_btf/tcp_probe")
int BPF_PROG(lattrace_probe, struct sock *sk, struct sk_buff *skb)
{
	handle_segment_in(sk, skb);
	return 0;
}

SEC("tp_btf/sock_recv_length")
int BPF_PROG(lattrace_recv_length, struct sock *sk, int ret, int flags)
{
	handle_recv_done(sk, ret, flags);
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(lattrace_retransmit, struct sock *sk, struct sk_buff *skb, int err)
{
	if (!err)
		handle_retransmit(sk, skb);
	return 0;
}

/* Before 6.16 the tracepoint has no err argument: it fires only for a
 * retransmission that was sent. */
SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(lattrace_retransmit_sent, struct sock *sk, struct sk_buff *skb)
{
	handle_retransmit(sk, skb);
	return 0;
}

SEC("tp_btf/tcp_cong_state_set")
int BPF_PROG(lattrace_cong_state, struct sock *sk, u8 ca_state)
{
	handle_ca_state(sk, ca_state);
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(lattrace_set_state, struct sock *sk, int oldstate, int newstate)
{
	handle_state_change(sk, oldstate, newstate);
	return 0;
}

/* A thread wakes another: a request handed to a worker (request_links.bpf.h). */
SEC("tp_btf/sched_waking")
int BPF_PROG(lattrace_waking, struct task_struct *p)
{
	links_wakeup(p);
	return 0;
}

/* Stand-ins for the tracepoints a kernel lacks (tcp_sendmsg_locked came in
 * 6.16, sock_send_length and sock_recv_length in 6.3): fentry and fexit
 * programs on the functions that fire them, calling the same handlers.
 * What they see differently is said in the hook table (daemon/tracer). */

SEC("fentry/tcp_sendmsg_locked")
int BPF_PROG(lattrace_sendmsg_fentry, struct sock *sk, struct msghdr *msg, size_t size)
{
	handle_sendmsg(sk);
	return 0;
}

SEC("fexit/tcp_sendmsg")
int BPF_PROG(lattrace_sendmsg_fexit, struct sock *sk, struct msghdr *msg, size_t size, int ret)
{
	handle_send_done(sk, ret);
	return 0;
}

SEC("fexit/tcp_recvmsg")
int BPF_PROG(lattrace_recvmsg_fexit, struct sock *sk, struct msghdr *msg, size_t len, int flags, int *addr_len, int ret)
{
	handle_recv_done(sk, ret, flags);
	return 0;
}

SEC("fentry/tcp_rcv_established")
int BPF_PROG(lattrace_rcv_fentry, struct sock *sk, struct sk_buff *skb)
{
	handle_segment_in(sk, skb);
	return 0;
}

SEC("fentry/tcp_set_state")
int BPF_PROG(lattrace_set_state_fentry, struct sock *sk, int state)
{
	handle_state_change(sk, sk->__sk_common.skc_state, state);
	return 0;
}

/* Where the kernel has no BPF TX timestamps (before 6.15): each segment
 * as TCP builds its header, before IP and the device (clone_it: one that
 * carries data and stays queued for retransmission), whatever sent it. */
SEC("fentry/__tcp_transmit_skb")
int BPF_PROG(lattrace_xmit_fentry, struct sock *sk, struct sk_buff *skb, int clone_it, gfp_t gfp_mask, __u32 rcv_nxt)
{
	if (clone_it)
		handle_data_sent(sk, skb);
	return 0;
}

/* Its stand-in: each data segment once IP and the device took it. */
SEC("fentry/tcp_rate_skb_sent")
int BPF_PROG(lattrace_sent_fentry, struct sock *sk, struct sk_buff *skb)
{
	handle_data_sent(sk, skb);
	return 0;
}

/* The last stand-in: data queued and not yet sent was just pushed (an ACK
 * opened the window or ended Nagle's wait, a cork was pulled, a write
 * ended). */
SEC("fexit/__tcp_push_pending_frames")
int BPF_PROG(lattrace_push_fexit, struct sock *sk, unsigned int cur_mss, int nonagle)
{
	handle_pushed(sk);
	return 0;
}

/* Before 6.5 sendfile() and splice() reach TCP through tcp_sendpage, not
 * tcp_sendmsg: its own data and end. */
SEC("fentry/do_tcp_sendpages")
int BPF_PROG(lattrace_sendpages_fentry, struct sock *sk, struct page *page, int offset, size_t size, int flags)
{
	handle_sendmsg(sk);
	return 0;
}

SEC("fexit/tcp_sendpage")
int BPF_PROG(lattrace_sendpage_fexit, struct sock *sk, struct page *page, int offset, size_t size, int flags, int ret)
{
	handle_send_done(sk, ret);
	return 0;
}

/* The iterator over the socket storage: every followed socket of the node. */
SEC("iter/bpf_sk_storage_map")
int lattrace_inflight(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	struct sock *sk = ctx->sk;
	struct lt_sock *st = ctx->value;

	if (sk && st)
		handle_inflight(ctx->meta->seq, sk, st);
	return 0;
}

/* A TCP iterator's socket, as a full TCP socket, and its state; 0 when it
 * has none (a request or time-wait socket, or one lattrace never saw). */
static __always_inline struct lt_sock *tcp_iter_state(struct sock_common *skc, struct sock **sk)
{
	struct tcp_sock *tp;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	*sk = (struct sock *)tp;
	return bpf_sk_storage_get(&socks, tp, 0, 0);
}

/* The fallback where the kernel refuses iterators over map elements: the
 * TCP sockets of the reader's network namespace, each looked up in the
 * socket storage. */
SEC("iter/tcp")
int lattrace_inflight_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock *sk = 0;
	struct lt_sock *st = tcp_iter_state(ctx->sk_common, &sk);

	if (st && sk)
		handle_inflight(ctx->meta->seq, sk, st);
	return 0;
}

/* The seeding of the listener table (listeners.bpf.h): the listening
 * sockets of the reader's network namespace, run once in each namespace
 * at the daemon's start, before the hooks that adopt sockets attach. */
SEC("iter/tcp")
int lattrace_listeners(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct tcp_sock *tp;

	if (!skc || skc->skc_state != TCP_LISTEN)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (tp)
		listener_opened((struct sock *)tp);
	return 0;
}

/* Set by the daemon before its last sweeps, at its stop (handle_sweep). */
volatile __u32 sweep_stopping;
/* Exchanges a sweep at the stop left for its next pass, the ring full:
 * the daemon drains, zeroes it and sweeps again until a pass leaves none
 * (Tracer.sweepAtStop). */
volatile __u64 sweep_deferred;

/* The sweep over every followed socket of the node. */
SEC("iter/bpf_sk_storage_map")
int lattrace_sweep(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	struct sock *sk = ctx->sk;
	struct lt_sock *st;

	if (!sk)
		return 0;
	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (st && handle_sweep(sk, st, sweep_stopping))
		__sync_fetch_and_add(&sweep_deferred, 1);
	return 0;
}

/* The sweep where the kernel refuses iterators over map elements: the TCP
 * sockets of the reader's network namespace, each locked while its
 * program runs (the daemon opens it in each namespace in turn). */
SEC("iter/tcp")
int lattrace_sweep_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock *sk = 0;
	struct lt_sock *st = tcp_iter_state(ctx->sk_common, &sk);

	if (st && sk && handle_sweep(sk, st, sweep_stopping))
		__sync_fetch_and_add(&sweep_deferred, 1);
	return 0;
}
