/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sockops.bpf.h: the sockops callbacks, one function per op:
 * establishment (role, connection open record), RTT samples for the path
 * table, and BPF TX timestamps (x1, a1) of the out message's last byte.
 * They read the sockops context, so they belong to that program alone.
 */
#ifndef LATTRACE_SOCKOPS_BPF_H
#define LATTRACE_SOCKOPS_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"
#include "exchange.bpf.h"
#include "path_rtt.bpf.h"
#include "ringbuf.bpf.h"
#include "send_wait.bpf.h"
#include "sock_state.bpf.h"
#include "tcp.bpf.h"

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;
extern int bpf_sock_ops_enable_tx_tstamp(struct bpf_sock_ops_kern *skops, __u64 flags) __ksym __weak;

/* The connection open record, its flow as the sockops context has it. */
static __always_inline void conn_open_record(struct bpf_sock_ops *skops, struct lt_sock *st, __u64 now)
{
	struct lt_conn_open *rec;

	rec = reserve(sizeof(*rec), LT_RECORD_CONN_OPEN, now);
	if (!rec)
		return;
	rec->cookie = bpf_get_socket_cookie(skops);
	__builtin_memset(&rec->flow, 0, sizeof(rec->flow));
	rec->flow.family = skops->family;
	rec->flow.sport = skops->local_port;
	rec->flow.dport = bpf_ntohl(skops->remote_port);
	if (skops->family == AF_INET) {
		__u32 s = skops->local_ip4, d = skops->remote_ip4;

		__builtin_memcpy(rec->flow.saddr, &s, 4);
		__builtin_memcpy(rec->flow.daddr, &d, 4);
	} else {
		__u32 a[4];

		a[0] = skops->local_ip6[0];
		a[1] = skops->local_ip6[1];
		a[2] = skops->local_ip6[2];
		a[3] = skops->local_ip6[3];
		__builtin_memcpy(rec->flow.saddr, a, 16);
		a[0] = skops->remote_ip6[0];
		a[1] = skops->remote_ip6[1];
		a[2] = skops->remote_ip6[2];
		a[3] = skops->remote_ip6[3];
		__builtin_memcpy(rec->flow.daddr, a, 16);
	}
	rec->flow.netns = st->flow.netns;
	rec->syn_ns = st->role == LT_ROLE_CLIENT ? st->syn_ns : 0;
	rec->role = st->role;
	rec->handshake_rtt_us = skops->srtt_us >> 3;
	submit(rec, sizeof(*rec));
}

/* Switches BPF TX timestamping on for the socket: from then on its
 * sendmsg calls run the SENDMSG callback, which asks for a timestamp of
 * the writes that will wait in the send queue. */
static __always_inline void tstamp_on(struct bpf_sock_ops *skops, struct lt_sock *st)
{
	int flags = SK_BPF_CB_TX_TIMESTAMPING;

	if (bpf_setsockopt(skops, SOL_SOCKET, SK_BPF_CB_FLAGS, &flags, sizeof(flags))) {
		st->tstamp = TSTAMP_REFUSED;
		count(LT_CNT_TSTAMP_OFF);
	} else {
		st->tstamp = TSTAMP_ON;
	}
}

/* Will TCP pace the new connection? Its congestion control is set up only
 * after the established callback, so BBR's request for pacing is not there
 * yet: its name says it. A rate cap (SO_MAX_PACING_RATE) set on the
 * listener came with the accepted socket. A paced socket's writes of more
 * than one skb wait in the send queue from its first message on, so it
 * gets TX timestamping at once, not at its first ACK. */
static __always_inline bool will_pace(struct bpf_sock *bsk)
{
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(bsk);
	char ca[4] = {};

	if (!tp)
		return false;
	if (paced((struct sock *)tp) || rate_capped((struct sock *)tp))
		return true;
	BPF_CORE_READ_STR_INTO(&ca, &tp->inet_conn, icsk_ca_ops, name);
	return ca[0] == 'b' && ca[1] == 'b' && ca[2] == 'r';
}

/* ACTIVE_ESTABLISHED_CB (role LT_ROLE_CLIENT) and PASSIVE_ESTABLISHED_CB
 * (LT_ROLE_SERVER): the handshake completed. */
static __always_inline void sockops_established(struct bpf_sock_ops *skops, struct bpf_sock *bsk, __u32 role)
{
	__u64 now = bpf_ktime_get_ns();
	struct lt_sock *st;

	st = bpf_sk_storage_get(&socks, bsk, 0, 0);
	if (!st && !sockets_paused(true)) {
		st = bpf_sk_storage_get(&socks, bsk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		if (!st)
			count(LT_CNT_STORAGE_FAIL);
		else
			count_followed();
	}
	if (!st)
		return;
	if (!st->established_ns) {
		/* Not seen at the state change (a filtered softirq). */
		count(LT_CNT_SOCKS_TRACKED);
		st->established_ns = now;
	}
	/* The state change to ESTABLISHED, just before, read the flow;
	 * without it (a filtered softirq) read it now: at SYN_SENT the
	 * local port was not chosen yet. */
	if (!st->flow.sport) {
		struct tcp_sock *tp = bpf_skc_to_tcp_sock(bsk);

		if (tp)
			read_flow((struct sock *)tp, &st->flow);
	}
	st->role = role;
	st->partial = 0;
	if (!st->last_activity_ns)
		st->last_activity_ns = now;
	/* RTT samples for the path (only clean ones are kept). The RTT
	 * callback is also where TX timestamping is switched on once a
	 * write was held back (see tstamp_state): the kernel refuses
	 * flag changes from the TX timestamping callbacks themselves. */
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG);
	if (!cfg.use_tx_tstamp || !bpf_sock_ops_enable_tx_tstamp || !bpf_cast_to_kern_ctx) {
		st->tstamp = TSTAMP_REFUSED;
		count(LT_CNT_TSTAMP_OFF);
	} else if (st->tstamp == TSTAMP_NONE && will_pace(bsk)) {
		tstamp_on(skops, st);
	}
	conn_open_record(skops, st, now);
}

/* RTT_CB: an ACK gave an RTT sample (args[0], in us). */
static __always_inline void sockops_rtt(struct bpf_sock_ops *skops, struct bpf_sock *bsk)
{
	__u32 rtt = skops->args[0];
	struct lt_sock *st;

	st = bpf_sk_storage_get(&socks, bsk, 0, 0);
	if (!st)
		return;
	/* This ACK lets the held-back data go: the message's last
	 * write, if still to come (or still in this sendmsg), gets
	 * timestamped. */
	if (st->want_tstamp && st->tstamp == TSTAMP_NONE)
		tstamp_on(skops, st);
	if (!rtt)
		return;
	/* HTTP/2's streams and control frames overlap: the connection's
	 * messages tell no clean sample. */
	if (st->h2 & H2_STREAMS)
		return;
	/* Clean samples only: a pure ACK (no reply data riding on it, so
	 * no peer think time) of the middle of a message, with more of it
	 * in flight (so not the delayed ACK of its last segment). The
	 * other samples reach the path's minimum through the socket's
	 * own minimum, at each exchange's end. */
	if (!st->last_in_len_zero || skops->snd_una == skops->snd_nxt ||
	    st->phase != PHASE_OUT || !after(st->out_seq_end, skops->snd_una))
		return;
	/* The clock is read only for a sample kept: this callback runs at
	 * every ACK and seldom keeps its sample. */
	path_add_clean(&st->flow, rtt, bpf_ktime_get_ns());
}

/* TSTAMP_SENDMSG_CB: the end of a sendmsg, before its data is pushed, so
 * the message's end is known before it can leave. It runs only on
 * sockets that had a write held back before. */
static __always_inline void sockops_tstamp_sendmsg(struct bpf_sock_ops *skops, struct bpf_sock *bsk)
{
	struct bpf_sock_ops_kern *kctx;
	struct tcp_sock *tp;
	struct lt_sock *st;
	__u64 now;

	if (!bpf_cast_to_kern_ctx)
		return;
	kctx = bpf_cast_to_kern_ctx(skops);
	st = bpf_sk_storage_get(&socks, bsk, 0, 0);
	tp = bpf_skc_to_tcp_sock(bsk);
	if (!st || st->phase != PHASE_OUT || !tp)
		return;
	now = bpf_ktime_get_ns();
	if (after(tp->write_seq, st->out_seq_end))
		reopen_x1(st, (struct sock *)tp, tp, now);
	st->out_seq_end = tp->write_seq;
	/* Timestamp the write's last byte only when it will wait in the
	 * send queue; otherwise it leaves in this very call and
	 * handle_send_done sees x1. Each timestamped write costs three
	 * more callbacks. */
	st->msg_tstamp = held_back(st, tp, now);
	if (st->msg_tstamp && bpf_sock_ops_enable_tx_tstamp)
		bpf_sock_ops_enable_tx_tstamp(kctx, 0);
}

/* The socket's state when the skb of this TX timestamp callback holds the
 * out message's last byte (its tskey is the skb's last byte); else 0. */
static __always_inline struct lt_sock *tstamp_of_msg_end(struct bpf_sock_ops *skops, struct bpf_sock *bsk)
{
	struct bpf_sock_ops_kern *kctx;
	struct skb_shared_info *shinfo;
	struct sk_buff *skb;
	struct lt_sock *st;
	__u32 tskey = 0;

	if (!bpf_cast_to_kern_ctx)
		return 0;
	kctx = bpf_cast_to_kern_ctx(skops);
	st = bpf_sk_storage_get(&socks, bsk, 0, 0);
	if (!st || st->phase == PHASE_NONE || st->out_seq_end == st->out_seq_start)
		return 0;
	skb = kctx->skb;
	shinfo = (struct skb_shared_info *)(skb->head + skb->end);
	bpf_probe_read_kernel(&tskey, sizeof(tskey), &shinfo->tskey);
	if (!before_eq(st->out_seq_end, tskey + 1))
		return 0;
	return st;
}

/* TSTAMP_SCHED_CB: an skb enters the qdisc: x1 for the message's last
 * byte. */
static __always_inline void sockops_tstamp_sched(struct bpf_sock_ops *skops, struct bpf_sock *bsk)
{
	struct lt_sock *st = tstamp_of_msg_end(skops, bsk);
	__u64 now;

	if (!st)
		return;
	now = bpf_ktime_get_ns();
	/* Retransmissions fire SCHED again for an old key: only the first
	 * transmission of the message's last byte is x1. */
	if (!st->cur.x1) {
		st->cur.cwnd_end = skops->snd_cwnd;
		mark_x1(st, 0, now);
	}
}

/* TSTAMP_ACK_CB: the skb is fully acknowledged: a1 for the message's
 * last byte. */
static __always_inline void sockops_tstamp_ack(struct bpf_sock_ops *skops, struct bpf_sock *bsk)
{
	struct lt_sock *st = tstamp_of_msg_end(skops, bsk);

	if (st)
		mark_a1(st, bpf_ktime_get_ns());
}

#endif /* LATTRACE_SOCKOPS_BPF_H */
