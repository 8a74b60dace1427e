/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * exchange.bpf.h: the exchange a socket is building (lt_sock.cur) and its
 * emit. A message one way, then the message the other way; the next turn
 * (change of direction) closes it, and it leaves the kernel as one
 * struct lt_exchange with its timeline (docs/latency-model.md).
 */
#ifndef LATTRACE_EXCHANGE_BPF_H
#define LATTRACE_EXCHANGE_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"
#include "path_rtt.bpf.h"
#include "request_links.bpf.h"
#include "ringbuf.bpf.h"
#include "send_wait.bpf.h"
#include "sock_state.bpf.h"

/* The last byte of the out message was first sent at now. */
static __always_inline void mark_x1(struct lt_sock *st, struct tcp_sock *tp, __u64 now)
{
	if (st->cur.x1 || !st->cur.w0)
		return;
	wait_account(st, now);
	st->wait_last_ns = 0;
	st->cur.x1 = now;
	if (tp)
		st->cur.cwnd_end = tp->snd_cwnd;
}

/* The out message starts at the socket's present end of written data: its
 * sequence range and its place in the 64-bit count of bytes written. */
static __always_inline void out_starts_here(struct lt_sock *st, struct tcp_sock *tp)
{
	st->out_seq_start = st->out_seq_end = tp->write_seq;
	st->out_bytes0 = written64(tp);
}

/* The in message starts at the socket's present end of received data
 * (rcv_nxt, not a segment's seq: a retransmission may overlap data
 * already received). */
static __always_inline void in_starts_here(struct lt_sock *st, struct tcp_sock *tp)
{
	st->in_seq_start = st->in_seq_end = tp->rcv_nxt;
	st->in_bytes0 = tp->bytes_received;
}

/* A write added bytes to the out message after its last byte so far had
 * left: its last byte, and so x1 and a1, move on. ACKs processed in the
 * middle of a write (the socket's backlog, while it waits for memory) see
 * the message's end as it was before the write and may mark x1 there, so
 * the end of each write, the SENDMSG callback and the reply's arrival
 * check too. */
static __always_inline void reopen_x1(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u64 now)
{
	if (!st->cur.x1)
		return;
	st->cur.x1 = 0;
	st->cur.a1 = 0;
	st->cur.flags &= ~(LT_EX_ACK_PURE | LT_EX_X1_XMIT);
	st->cur.ack_rtt_us = 0;
	st->wait_last_ns = now;
	st->wait_cause = classify(sk, tp, now);
}

/* The out message is fully acknowledged at now. */
static __always_inline void mark_a1(struct lt_sock *st, __u64 now)
{
	if (st->cur.a1 || !st->cur.w0)
		return;
	st->cur.a1 = now;
	if (!st->cur.r0 && st->last_in_len_zero && st->cur.x1 && now > st->cur.x1) {
		st->cur.flags |= LT_EX_ACK_PURE;
		st->cur.ack_rtt_us = (now - st->cur.x1) / 1000;
	}
}

/* Fills ex, a record reserved in the ring buffer with its header, with
 * the socket's exchange and what the socket and the path say of it now.
 * It changes nothing of the socket's: the sweep's record may be dropped
 * (write_idle). Every field is written: a reserved record is not
 * cleared. */
static __always_inline void finish_exchange(struct lt_sock *st, struct tcp_sock *tp, struct lt_exchange *ex, __u64 now)
{
	struct lt_progress *p = &ex->progress;
	struct path_rtt *pw;
	__u32 rtt;

	*p = st->cur;
	ex->cookie = st->cookie;
	ex->flow = st->flow;
	ex->owner = st->owner;
	ex->conn_role = st->role;
	ex->turns = st->turns;
	ex->turns_exchange = st->turns - st->turns_emitted;
	if (tp) {
		/* In 64 bits: each message's end is near the socket's counts
		 * now, its start anywhere before. */
		ex->bytes_out = written64(tp) - (__u32)(tp->write_seq - st->out_seq_end) - st->out_bytes0;
		ex->bytes_in = tp->bytes_received + (__s32)(st->in_seq_end - tp->rcv_nxt) - st->in_bytes0;
		ex->segs_out = tp->data_segs_out - st->data_segs_out0;
		ex->retrans = tp->total_retrans - st->total_retrans0;
		ex->min_rtt_us = tp->rtt_min.s[0].v == ~0U ? 0 : tp->rtt_min.s[0].v; /* ~0: no sample yet */
		ex->srtt_us = tp->srtt_us >> 3;
		ex->rwnd_end = tp->snd_wnd;
		if (!p->cwnd_end)
			p->cwnd_end = tp->snd_cwnd;
		ex->isn_remote = isn_remote(tp);
		ex->isn_local = isn_local(tp, st->role == LT_ROLE_CLIENT);
	} else {
		ex->bytes_out = st->out_seq_end - st->out_seq_start;
		ex->bytes_in = st->in_seq_end - st->in_seq_start;
		ex->segs_out = ex->retrans = 0;
		ex->min_rtt_us = ex->srtt_us = 0;
		ex->rwnd_end = 0;
		ex->isn_remote = ex->isn_local = 0;
	}
	ex->out_seq = st->out_seq_start;
	ex->in_seq = st->in_seq_start;
	links_fill(st, &ex->link);
	/* The path's clean RTT while this exchange was in flight, or failing
	 * any such sample a recent one; else user space falls back to the
	 * path's minimum (the handshake's sample is in it). */
	pw = path_get(&st->flow, now);
	rtt = 0;
	ex->path_min_rtt_us = 0;
	if (pw) {
		path_min_add(pw, ex->min_rtt_us, now);
		ex->path_min_rtt_us = pw->min_rtt_us;
		rtt = path_rtt_between(pw, p->w0 ? p->w0 : p->r0, p->r0 && p->role == LT_REQUESTER ? p->r0 : now);
		if (!rtt)
			rtt = winmin_get(&pw->recent, now);
	}
	ex->path_rtt_us = rtt;
	if (st->msg_tstamp)
		p->flags |= LT_EX_TX_TSTAMP;
	if (st->h2 & H2_STREAMS)
		p->flags |= LT_EX_H2_STREAMS;
	else if (st->partial && (st->h2 & H2_FOLLOWED))
		p->flags |= LT_EX_H2_RESYNCING;
	if (st->partial) {
		if (!st->emitted_any)
			p->flags |= LT_EX_PARTIAL;
		p->flags |= st->role ? LT_EX_ROLE_LISTENER : LT_EX_ROLE_GUESSED;
	}
}

/* Takes exchange gen for writing, seen being the last exchange written
 * as the caller read it; false when gen is written already or another
 * writer came in between. The sweep over idle sockets may run beside a
 * hook of the same socket (the socket storage iterator does not lock
 * sockets): whoever swaps gen in first writes it. */
static __always_inline bool claim_exchange(struct lt_sock *st, __u32 gen, __u32 seen)
{
	return seen != gen && __sync_val_compare_and_swap(&st->written_gen, seen, gen) == seen;
}

/* What writing an exchange leaves on its socket. */
static __always_inline void exchange_written(struct lt_sock *st)
{
	st->turns_emitted = st->turns;
	st->emitted_any = 1;
}

/* Completes the exchange and writes it to the ring buffer, unless it was
 * written already (the sweep writes an idle one before its next turn). */
static __always_inline void emit_exchange(struct lt_sock *st, struct tcp_sock *tp, __u64 now)
{
	struct lt_exchange *ex;

	if (!st->cur.role || !claim_exchange(st, st->gen, st->written_gen))
		return;
	count(LT_CNT_EXCHANGES);
	if (st->wait_last_ns)
		wait_account(st, now);
	ex = reserve(sizeof(*ex), LT_RECORD_EXCHANGE, now);
	if (ex) {
		finish_exchange(st, tp, ex, now);
		submit(ex, sizeof(*ex));
	}
	exchange_written(st);
}

/* Has the exchange in progress been written (by the sweep)? What comes
 * after it on the connection starts a record of its own. */
static __always_inline bool exchange_was_written(const struct lt_sock *st)
{
	return st->cur.role && st->written_gen == st->gen;
}

/* Starts a new exchange of the given role (enum lt_exchange_role). */
static __always_inline void reset_exchange(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u32 role, __u64 now)
{
	__builtin_memset(&st->cur, 0, sizeof(st->cur));
	st->gen++;
	st->cur.role = role;
	sock_cookie(st, sk);
	if (!st->emitted_any) {
		st->cur.flags |= LT_EX_FIRST;
		st->cur.established_ns = st->established_ns;
		if (st->role == LT_ROLE_CLIENT)
			st->cur.connect_ns = st->syn_ns;
	}
	if (st->last_activity_ns)
		st->cur.idle_ns = now - st->last_activity_ns;
	if (tp) {
		st->data_segs_out0 = tp->data_segs_out;
		/* The first exchange of a connection seen from its start holds
		 * the handshake, so its retransmissions (a lost SYN or SYN-ACK)
		 * are the exchange's too. */
		st->total_retrans0 = !st->emitted_any && !st->partial ? 0 : tp->total_retrans;
		st->cur.cwnd_start = tp->snd_cwnd;
		st->cur.rwnd_start = tp->snd_wnd;
		out_starts_here(st, tp);
		in_starts_here(st, tp);
	}
	st->wait_last_ns = 0;
	st->hole_start_ns = 0;
}

/* The role of the exchanges of a socket. The end that connected requests,
 * whatever races the first bytes (a server's SETTINGS or greeting may be
 * written before the client's first request arrives); a socket adopted
 * mid-connection has it from the listening sockets (listeners.bpf.h).
 * Where those were never read, the role is unknown: normally the end that
 * speaks first requests, but it may be seen first in the middle of an
 * exchange (the tail of a response, or a response being written), so
 * there the ports guess: the listening port is usually the lower one and
 * the client has the ephemeral one. */
static __always_inline __u32 first_role(const struct lt_sock *st, __u32 by_direction)
{
	if (st->role == LT_ROLE_CLIENT)
		return LT_REQUESTER;
	if (st->role == LT_ROLE_SERVER)
		return LT_RESPONDER;
	if (!st->partial || st->emitted_any)
		return by_direction;
	return st->flow.sport > st->flow.dport ? LT_REQUESTER : LT_RESPONDER;
}

/* Has the exchange only a message from the server that came before any
 * request: a greeting (MySQL, SMTP, SSH) or a protocol's opening frames
 * (HTTP/2 SETTINGS)? The requester got it in; the responder sent it. On a
 * connection adopted mid-way the first message seen is the tail of an
 * exchange instead: its own partial exchange. */
static __always_inline bool greeting_only(const struct lt_sock *st)
{
	if (st->partial || (st->role != LT_ROLE_CLIENT && st->role != LT_ROLE_SERVER))
		return false;
	return st->cur.role == LT_REQUESTER ? !st->cur.w0 : !st->cur.r0;
}

/* The greeting is not a message of the exchange: the exchange goes on
 * with the request that follows, and says that the server spoke first.
 * The client's first exchange keeps its start at connect, so the greeting
 * shows in its connection setup. */
static __always_inline void drop_greeting(struct lt_sock *st, struct tcp_sock *tp)
{
	struct lt_progress *ex = &st->cur;

	ex->flags |= LT_EX_GREETING;
	if (ex->role == LT_REQUESTER) {
		ex->r0 = ex->r1 = ex->d1 = 0;
		ex->segs_in = 0;
		ex->loss_in_ns = 0;
		in_starts_here(st, tp);
		st->hole_start_ns = 0;
	} else {
		ex->w0 = ex->w1 = ex->x1 = ex->a1 = 0;
		ex->flags &= ~(LT_EX_ACK_PURE | LT_EX_CWND_RESTART | LT_EX_X1_XMIT);
		ex->ack_rtt_us = 0;
		ex->wait_cwnd_ns = ex->wait_rwnd_ns = ex->wait_sndbuf_ns = ex->wait_other_ns = ex->wait_pacing_ns = 0;
		ex->loss_out_ns = 0;
		out_starts_here(st, tp);
		st->wait_last_ns = 0;
	}
}

/* A message starts in the direction an exchange of role begins with
 * (LT_REQUESTER: out, LT_RESPONDER: in). After a message the other way
 * (phase other) it is a turn, and a turn back to the direction the current
 * exchange began with closes it and starts the next. */
static __always_inline void turn(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u8 other, __u32 role, __u64 now)
{
	if (st->phase == other) {
		st->turns++;
		if (st->cur.role != role)
			return;
		/* Written by the sweep before this turn: the next exchange's
		 * turns count from here. */
		if (exchange_was_written(st))
			st->turns_emitted = st->turns;
		if (st->cur.flags & LT_EX_PUSH) {
			emit_exchange(st, tp, now);
			reset_exchange(st, sk, tp, role, now);
		} else if (greeting_only(st)) {
			drop_greeting(st, tp);
		} else {
			emit_exchange(st, tp, now);
			reset_exchange(st, sk, tp, role, now);
		}
	} else if (st->phase == PHASE_NONE) {
		reset_exchange(st, sk, tp, first_role(st, role), now);
	}
}

/* The out message starts at now. */
static __always_inline void start_out(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u64 now)
{
	st->phase = PHASE_OUT;
	st->msg_tstamp = 0;
	st->cur.w0 = now;
	out_starts_here(st, tp);
	st->data_segs_out0 = tp->data_segs_out;
	/* cwnd before the kernel's restart after idle, which comes with the
	 * first skb queued after this point. */
	st->cur.cwnd_start = tp->snd_cwnd;
	st->cur.rwnd_start = tp->snd_wnd;
	if (sk->__sk_common.skc_net.net->ipv4.sysctl_tcp_slow_start_after_idle)
		st->cur.flags |= LT_EX_SSAI;
	st->wait_last_ns = now;
	st->wait_cause = classify(sk, tp, now);
}

/* The local app starts writing: a turn if the peer's message came before. */
static __always_inline void begin_out(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u64 now)
{
	turn(st, sk, tp, PHASE_IN, LT_REQUESTER, now);
	start_out(st, sk, tp, now);
}

/* The in message starts at now. */
static __always_inline void start_in(struct lt_sock *st, struct tcp_sock *tp, __u64 now)
{
	st->phase = PHASE_IN;
	st->cur.r0 = now;
	in_starts_here(st, tp);
}

/* New data arrives: a turn if the local app had sent before. */
static __always_inline void begin_in(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u64 now)
{
	turn(st, sk, tp, PHASE_OUT, LT_RESPONDER, now);
	start_in(st, tp, now);
}

/* The least silence before the server's data counts as a push: below it,
 * a pause inside a message (an app writing its answer in pieces) on a
 * short path. */
#define PUSH_MIN_QUIET_NS (10ULL * 1000 * 1000)

/* The silence after which the server's data is unprompted. After a push,
 * two smoothed round trips (10 ms at least): longer than a pause inside
 * a message, as a sender held by its window goes on within about a round
 * trip, when the ACKs come. After an answer, also longer than the wait
 * for the answer's lost last segment, which nothing out of order tells
 * the client about: it comes back after its sender's retransmission
 * timeout, which the local RTO estimate (srtt + rttvar, at least 200 ms
 * as TCP bounds it) doubled covers, once backed off. */
static __always_inline __u64 push_quiet(const struct lt_sock *st, struct tcp_sock *tp)
{
	__u64 srtt = (tp->srtt_us >> 3) * 1000ULL;
	__u64 quiet = 2 * srtt;
	__u64 rto;

	if (quiet < PUSH_MIN_QUIET_NS)
		quiet = PUSH_MIN_QUIET_NS;
	if (st->cur.flags & LT_EX_PUSH)
		return quiet;
	rto = 2 * (srtt + tp->rttvar_us * 1000ULL);
	return rto > quiet ? rto : quiet;
}

/* Is the server's data, now, unprompted? It comes after the exchange was
 * complete (on the client the app read the whole answer; on the server
 * the answer had left) and after a silence (push_quiet). Only a
 * connection whose roles are known can tell the server's data. */
static __always_inline bool server_pushes(const struct lt_sock *st, struct tcp_sock *tp, __u64 now)
{
	bool after_push = st->cur.flags & LT_EX_PUSH;
	__u64 quiet;

	/* The sweep found the exchange complete and quiet for longer than
	 * the silence below. */
	if (exchange_was_written(st))
		return true;
	if (st->role == LT_ROLE_CLIENT) {
		if (st->phase != PHASE_IN || !(st->cur.w0 || after_push) || !st->cur.d1)
			return false;
	} else if (st->role == LT_ROLE_SERVER) {
		if (st->phase != PHASE_OUT || !(st->cur.r0 || after_push) || !st->cur.x1)
			return false;
	} else {
		return false;
	}
	quiet = push_quiet(st, tp);
	/* On the server the answer may have left (x1) after its write's end,
	 * held by pacing or the window. */
	if (st->role == LT_ROLE_SERVER && st->cur.x1 > st->last_activity_ns)
		return now - st->cur.x1 > quiet;
	return now - st->last_activity_ns > quiet;
}

/* The exchange so far is complete and leaves; the next record holds the
 * server's unprompted message (its direction's start_* follows). */
static __always_inline void begin_push(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u64 now)
{
	__u32 role = st->cur.role;

	emit_exchange(st, tp, now);
	reset_exchange(st, sk, tp, role, now);
	st->cur.flags |= LT_EX_PUSH;
}

/* Is the exchange in progress complete, and has its connection been
 * quiet since for at least quiet? Complete: on the requester the app has
 * read the whole reply, on the responder the answer has left, and all
 * the local end wrote is acknowledged. */
static __always_inline bool complete_and_quiet(const struct lt_sock *st, struct tcp_sock *tp, __u64 now, __u64 quiet)
{
	const struct lt_progress *ex = &st->cur;
	bool push = ex->flags & LT_EX_PUSH;
	__u64 last;

	if (!ex->role || st->wait_last_ns)
		return false;
	if (ex->role == LT_REQUESTER) {
		if (st->phase != PHASE_IN || !(ex->w0 || push) || !ex->d1 || tp->copied_seq != tp->rcv_nxt)
			return false;
	} else if (st->phase != PHASE_OUT || !(ex->r0 || push) || !ex->x1) {
		return false;
	}
	if (tp->snd_una != tp->write_seq)
		return false;
	last = st->last_activity_ns;
	if (ex->x1 > last)
		last = ex->x1;
	if (ex->a1 > last)
		last = ex->a1;
	return now >= last + quiet;
}

/* Writes the complete, quiet exchange now, as its next turn would, and
 * leaves it in place: what follows on the connection starts a record of
 * its own (server_pushes, turn). A copy is finished, then claimed: a
 * hook that takes the exchange meanwhile (its next turn, on another CPU)
 * has either found it written or written it itself, and then the copy
 * is dropped. */
static __always_inline void write_idle(struct lt_sock *st, struct tcp_sock *tp, __u64 now)
{
	__u32 gen = st->gen, seen = st->written_gen;
	struct lt_exchange *ex;

	if (seen == gen)
		return;
	ex = reserve(sizeof(*ex), LT_RECORD_EXCHANGE, now);
	if (!ex)
		return;
	finish_exchange(st, tp, ex, now);
	if (!claim_exchange(st, gen, seen)) {
		bpf_ringbuf_discard(ex, 0);
		return;
	}
	count(LT_CNT_EXCHANGES);
	count(LT_CNT_IDLE_WRITTEN);
	submit(ex, sizeof(*ex));
	exchange_written(st);
}

#endif /* LATTRACE_EXCHANGE_BPF_H */
