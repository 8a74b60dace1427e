/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * send_wait.bpf.h: what holds back the unsent part of the out message
 * (congestion window, receive window, send buffer, pacing, other), the time
 * charged to each cause, and whether a write will wait in the send queue
 * (which decides whether it is worth a TX timestamp).
 */
#ifndef LATTRACE_SEND_WAIT_BPF_H
#define LATTRACE_SEND_WAIT_BPF_H

#include "common.bpf.h"
#include "sock_state.bpf.h"
#include "tcp.bpf.h"

/* Does TCP itself hold this socket's skbs until their departure times,
 * one skb's length at the pacing rate apart? BBR asks for it, and so does
 * SO_MAX_PACING_RATE, when no fq qdisc does it instead (SK_PACING_FQ: fq
 * holds them after the qdisc entry, where x1 is read, so its pacing is not
 * seen; this kernel has no fq). */
static __always_inline bool paced(struct sock *sk)
{
	return sk->sk_pacing_status == SK_PACING_NEEDED && sk->sk_pacing_rate != ~0UL;
}

/* Has the app capped the socket's pacing rate (SO_MAX_PACING_RATE)? */
static __always_inline bool rate_capped(struct sock *sk)
{
	return sk->sk_max_pacing_rate != ~0UL;
}

/* What is holding back the unsent part of the out message right now: what
 * holds the head of the send queue first, then a full send buffer, which
 * keeps the rest of the message in the app. A departure time ahead of now
 * is pacing (tcp_wstamp_ns and bpf_ktime_get_ns are both
 * CLOCK_MONOTONIC). A paced queue fills the buffer too: under a rate cap
 * (SO_MAX_PACING_RATE) a bigger buffer would not help, so pacing comes
 * first; a congestion control's own pacing (BBR) follows the delivery
 * rate the buffer allows, so there the full buffer comes first. */
static __always_inline __u8 classify(struct sock *sk, struct tcp_sock *tp, __u64 now)
{
	bool pacing = tp->write_seq != tp->snd_nxt && tp->tcp_wstamp_ns > now;

	if (after(tp->snd_nxt + tp->mss_cache, tp->snd_una + tp->snd_wnd))
		return LT_WAIT_RWND;
	if (in_flight(tp) >= tp->snd_cwnd)
		return LT_WAIT_CWND;
	if (pacing && rate_capped(sk))
		return LT_WAIT_PACING;
	if (sk->sk_wmem_queued >= sk->sk_sndbuf)
		return LT_WAIT_SNDBUF;
	if (pacing)
		return LT_WAIT_PACING;
	return LT_WAIT_OTHER;
}

#define TCP_NAGLE_OFF 1
#define TCP_NAGLE_CORK 2
#define TCP_INIT_CWND 10
#define TCP_RTO_MIN_NS (200ULL * 1000 * 1000)

/* Will the unsent data, this write's included, wait in the send queue
 * rather than leave in this sendmsg? Called before the kernel pushes it:
 * the window (cwnd, restarted after idle when slow start after idle is
 * on, and rwnd), pacing, Nagle and corking decide. A wrong "no" makes x1
 * late by up to an ACK (the fallback); a wrong "yes" only costs callbacks. */
static __always_inline bool held_back(const struct lt_sock *st, struct tcp_sock *tp, __u64 now)
{
	__u32 unsent = tp->write_seq - tp->snd_nxt;
	__u32 mss = tp->mss_cache ? tp->mss_cache : 1;
	__u32 cwnd = tp->snd_cwnd;
	__u8 nonagle = BPF_CORE_READ_BITFIELD(tp, nonagle);

	if (!unsent)
		return false;
	if (after(tp->write_seq, tp->snd_una + tp->snd_wnd))
		return true;
	/* After an idle RTO the first transmission restarts the window. */
	if ((st->cur.flags & LT_EX_SSAI) && !tp->packets_out && st->cur.idle_ns > TCP_RTO_MIN_NS && cwnd > TCP_INIT_CWND)
		cwnd = TCP_INIT_CWND;
	if (in_flight(tp) + (unsent + mss - 1) / mss > cwnd)
		return true;
	/* A paced socket sends one skb per departure time: everything waits
	 * while an earlier skb's time is ahead, and data past the first skb
	 * waits for the pacing timer. */
	if (paced((struct sock *)tp) && (unsent > mss || tp->tcp_wstamp_ns > now))
		return true;
	if (nonagle & TCP_NAGLE_CORK)
		return true;
	return !(nonagle & TCP_NAGLE_OFF) && tp->packets_out && unsent % mss;
}

/* Charges the time since the last classification to its cause. */
static __always_inline void wait_account(struct lt_sock *st, __u64 now)
{
	__u64 dt;

	if (!st->wait_last_ns)
		return;
	dt = now - st->wait_last_ns;
	switch (st->wait_cause) {
	case LT_WAIT_CWND:
		st->cur.wait_cwnd_ns += dt;
		break;
	case LT_WAIT_RWND:
		st->cur.wait_rwnd_ns += dt;
		break;
	case LT_WAIT_SNDBUF:
		st->cur.wait_sndbuf_ns += dt;
		break;
	case LT_WAIT_PACING:
		st->cur.wait_pacing_ns += dt;
		break;
	default:
		st->cur.wait_other_ns += dt;
	}
	st->wait_last_ns = now;
}

#endif /* LATTRACE_SEND_WAIT_BPF_H */
