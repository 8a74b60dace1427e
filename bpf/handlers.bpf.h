/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * handlers.bpf.h: what lattrace does at each socket event, whichever
 * program delivers it. A handler takes the kernel's own objects (struct
 * sock, struct sk_buff) as a tp_btf or fentry program receives them, so a
 * program for another attach point of the same event is a few lines
 * calling the same handler. Handlers return nothing: each program returns
 * what its attach type wants.
 */
#ifndef LATTRACE_HANDLERS_BPF_H
#define LATTRACE_HANDLERS_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"
#include "exchange.bpf.h"
#include "http2.bpf.h"
#include "request_links.bpf.h"
#include "ringbuf.bpf.h"
#include "send_wait.bpf.h"
#include "sock_state.bpf.h"
#include "tcp.bpf.h"

/* A write queues data on sk (tcp_sendmsg_locked, again for each skb a
 * large write fills): the first of a message is w0. */
static __always_inline void handle_sendmsg(struct sock *sk)
{
	struct lt_sock *st = sock_state(sk, task_in_scope());
	struct tcp_sock *tp;
	__u64 now;

	if (!st)
		return;
	st->send_skbs++;
	tp = tcp_sk_of(sk);
	if (!tp)
		return;
	now = bpf_ktime_get_ns();
	h2_write_begins(st, sk, now);
	if (st->phase != PHASE_OUT) {
		begin_out(st, sk, tp, now);
		if (st->cur.role == LT_REQUESTER)
			links_request_written(st);
	} else if (server_pushes(st, tp, now)) {
		begin_push(st, sk, tp, now);
		start_out(st, sk, tp, now);
	} else if (st->cur.x1) {
		/* A further write before any reply extends the same message.
		 * At a write's first call (nothing of it queued yet) with all
		 * of the message sent, the time since the last byte left or
		 * the last write returned, whichever is later, is the app's:
		 * the kernel holds nothing. A later call of the same write
		 * (one per skb) follows the kernel's own waits. */
		if (tp->write_seq == st->out_seq_end && now > st->cur.x1 && now > st->cur.w1)
			st->cur.write_gaps_ns += now - (st->cur.x1 > st->cur.w1 ? st->cur.x1 : st->cur.w1);
		reopen_x1(st, sk, tp, now);
	} else {
		/* A later skb of a long write, or a later write of the
		 * message. A write pushes its data only at its end, so unsent
		 * data is normal here; data the window will hold is not. */
		if (st->tstamp == TSTAMP_NONE && held_back(st, tp, now))
			st->want_tstamp = 1;
		wait_account(st, now);
		st->wait_cause = classify(sk, tp, now);
	}
}

/* A sendmsg()/write() on any socket returned ret: w1. */
static __always_inline void handle_send_done(struct sock *sk, int ret)
{
	struct tcp_sock *tp;
	struct lt_sock *st;
	__u64 now;

	if (ret <= 0)
		return;
	/* Only TCP sockets get state: an existing entry spares the type checks. */
	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (!st && (!is_tcp(sk) || !task_in_scope() || !(st = sock_state(sk, true))))
		return;
	st->sendmsg_calls++;
	st->bytes_sent += ret;
	note_owner(&st->owner);
	tp = tcp_sk_of(sk);
	if (!tp)
		return;
	if (st->partial)
		st->write_end = tp->write_seq;
	h2_write_done(st, sk, tp, ret);
	if (st->phase != PHASE_OUT)
		return;
	now = bpf_ktime_get_ns();
	st->cur.w1 = now;
	if (after(tp->write_seq, st->out_seq_end))
		reopen_x1(st, sk, tp, now);
	st->out_seq_end = tp->write_seq;
	st->last_activity_ns = now;
	if (tp->snd_cwnd < st->cur.cwnd_start && st->cur.idle_ns && !(st->cur.flags & LT_EX_CWND_RESTART)) {
		st->cur.flags |= LT_EX_CWND_RESTART;
		/* Whose restart: cubic and reno restart, BBR keeps its window
		 * (the fix the diagnosis offers). Read only here, it is rare. */
		BPF_CORE_READ_STR_INTO(&st->cur.cong, (struct inet_connection_sock *)sk, icsk_ca_ops, name);
	}
	/* Without TX timestamps: if everything written has left TCP, the last
	 * byte went out inside this write, just before now. */
	if (!st->msg_tstamp && !after(tp->write_seq, tp->snd_nxt)) {
		mark_x1(st, tp, now);
	} else {
		st->want_tstamp = 1;
		wait_account(st, now);
		st->wait_cause = classify(sk, tp, now);
	}
}

/* A segment of an established connection arrives, before the stack
 * processes it: ACKs (a1), reply data (r0, r1), receive holes (loss). */
static __always_inline void handle_segment_in(struct sock *sk, struct sk_buff *skb)
{
	struct tcp_skb_cb *cb = (struct tcp_skb_cb *)&skb->cb[0];
	__u32 seq, end_seq, ack_seq, len;
	struct tcp_sock *tp;
	struct lt_sock *st;
	__u64 now;
	bool ooo, fresh;

	st = sock_state(sk, !cfg.filter_cgroup);
	if (!st)
		return;
	tp = tcp_sk_of(sk);
	if (!tp)
		return;
	now = bpf_ktime_get_ns();
	/* skb->cb is a byte array the verifier lets a program read as the
	 * control block it holds. */
	seq = cb->seq;
	end_seq = cb->end_seq;
	ack_seq = cb->ack_seq;
	len = end_seq - seq;
	if (cb->tcp_flags & TCPHDR_FIN) /* FIN takes a sequence number, not data */
		len = len ? len - 1 : 0;
	st->last_in_len_zero = len == 0;
	/* New data only: a retransmitted duplicate is not an arrival. */
	fresh = len && after(seq + len, tp->rcv_nxt);

	/* New data from the peer while our message is out ends that message
	 * (begin_in below). The send's end (handle_send_done) is traced after
	 * tcp_sendmsg has released the socket, so the answer (softirq on the
	 * other CPU) can come first: everything written since w0 is the
	 * message, so its end is taken here, before x1 and a1 are looked
	 * for. */
	if (fresh && st->phase == PHASE_OUT && after(tp->write_seq, st->out_seq_end)) {
		reopen_x1(st, sk, tp, now);
		st->out_seq_end = tp->write_seq;
	}

	/* The out message: acknowledged, or (without TX timestamps) sent. */
	if (st->cur.w0 && st->out_seq_end != st->out_seq_start) {
		if (!st->msg_tstamp && !st->cur.x1 && !after(st->out_seq_end, tp->snd_nxt))
			mark_x1(st, tp, now);
		if (!st->msg_tstamp && before_eq(st->out_seq_end, ack_seq) && st->cur.x1)
			mark_a1(st, now);
		if (st->wait_last_ns) {
			wait_account(st, now);
			st->wait_cause = classify(sk, tp, now);
		}
	}

	if (!fresh)
		return;
	if (st->phase != PHASE_IN) {
		begin_in(st, sk, tp, now);
	} else if (server_pushes(st, tp, now)) {
		begin_push(st, sk, tp, now);
		start_in(st, tp, now);
	}
	st->cur.segs_in++;
	st->cur.r1 = now;
	if (after(seq + len, st->in_seq_end)) {
		st->in_seq_end = seq + len;
		st->cur.d1 = 0; /* more to read: an earlier full read is not d1 */
	}
	st->last_activity_ns = now;
	/* A segment beyond rcv_nxt means one before it was lost: the hole
	 * stays open until the out-of-order queue empties. */
	ooo = tp->out_of_order_queue.rb_node != 0;
	if (after(seq, tp->rcv_nxt) && !st->hole_start_ns)
		st->hole_start_ns = now;
	else if (!ooo && st->hole_start_ns && !after(seq, tp->rcv_nxt)) {
		st->cur.loss_in_ns += now - st->hole_start_ns;
		st->hole_start_ns = 0;
	}
}

/* Queued data was pushed out (kernels without BPF TX timestamps): an
 * ACK let held-back data go (handle_segment_in runs before the ACK is
 * processed), a cork was pulled (TCP_CORK, nginx's tcp_nopush), a write
 * ended. Without this the last byte's departure would be seen only at
 * the next incoming segment, a round trip late. */
static __always_inline void handle_pushed(struct sock *sk)
{
	struct tcp_sock *tp;
	struct lt_sock *st;

	st = sock_state(sk, false);
	if (!st || st->msg_tstamp || st->phase != PHASE_OUT || !st->cur.w0 || st->cur.x1 ||
	    st->out_seq_end == st->out_seq_start)
		return;
	tp = tcp_sk_of(sk);
	if (tp && !after(st->out_seq_end, tp->snd_nxt))
		mark_x1(st, tp, bpf_ktime_get_ns());
}

/* A data segment goes out (kernels without BPF TX timestamps; a
 * retransmission does not count: snd_nxt advances after this point, so
 * only new data is beyond it). When it ends at the last byte written, the
 * out message so far leaves now, whoever sends it: the write, an ACK, an
 * uncork, TCP small queues' tasklet or the pacing timer. x1 is then exact,
 * as from a TX timestamp, and flagged so. */
static __always_inline void handle_data_sent(struct sock *sk, struct sk_buff *skb)
{
	struct tcp_skb_cb *cb = (struct tcp_skb_cb *)&skb->cb[0];
	struct tcp_sock *tp;
	struct lt_sock *st;
	__u32 end_seq, write_end;
	__u64 now;

	st = sock_state(sk, false);
	if (!st || st->msg_tstamp || st->phase != PHASE_OUT || !st->cur.w0)
		return;
	tp = tcp_sk_of(sk);
	if (!tp)
		return;
	/* A FIN takes a sequence number (write_seq counts it), not data: a
	 * close does not extend the message. */
	end_seq = cb->end_seq;
	write_end = tp->write_seq;
	if (cb->tcp_flags & TCPHDR_FIN) {
		end_seq--;
		write_end--;
	}
	if (end_seq == cb->seq || end_seq != write_end || !after(end_seq, tp->snd_nxt))
		return;
	now = bpf_ktime_get_ns();
	if (after(end_seq, st->out_seq_end)) {
		/* The message grew since its end was last seen. */
		reopen_x1(st, sk, tp, now);
		st->out_seq_end = end_seq;
	}
	if (st->cur.x1)
		return;
	mark_x1(st, tp, now);
	st->cur.flags |= LT_EX_X1_XMIT;
}

/* A read on any socket returned ret: d1 once the whole in message so far
 * is consumed. */
static __always_inline void handle_recv_done(struct sock *sk, int ret, int flags)
{
	struct tcp_sock *tp;
	struct lt_sock *st;

	if (ret <= 0 || (flags & MSG_PEEK))
		return;
	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (!st && (!is_tcp(sk) || !task_in_scope() || !(st = sock_state(sk, true))))
		return;
	note_owner(&st->owner);
	tp = tcp_sk_of(sk);
	if (!tp)
		return;
	h2_read_done(st, sk, tp);
	if (st->phase != PHASE_IN)
		return;
	/* A connection cut into streams has no exchanges of its own for the
	 * evidence to name. */
	if (st->cur.role == LT_RESPONDER && !(st->h2 & H2_STREAMS))
		links_request_read(st);
	if (!after(st->in_seq_end, tp->copied_seq))
		st->cur.d1 = bpf_ktime_get_ns();
}

/* skb was retransmitted. */
static __always_inline void handle_retransmit(struct sock *sk, struct sk_buff *skb)
{
	struct tcp_skb_cb *cb = (struct tcp_skb_cb *)&skb->cb[0];
	struct lt_sock *st;
	__u32 seq;
	__u64 now;

	st = sock_state(sk, false);
	if (!st || !st->cur.w0 || !st->cur.x1)
		return;
	/* A retransmission of the out message after its last byte was first
	 * sent and before the reply: the time since x1 is lost to recovery
	 * (the last one that happens is the one that got through). */
	seq = cb->seq;
	if (st->phase == PHASE_OUT && !after(st->out_seq_start, seq) && after(st->out_seq_end, seq)) {
		now = bpf_ktime_get_ns();
		st->cur.loss_out_ns = now - st->cur.x1;
	}
}

/* The congestion state changed; to Loss when the retransmission timer
 * fired. */
static __always_inline void handle_ca_state(struct sock *sk, __u8 ca_state)
{
	struct lt_sock *st;

	if (ca_state != TCP_CA_Loss)
		return;
	st = sock_state(sk, false);
	if (st)
		st->cur.rtos++;
}

/* A connect() sends its SYN. */
static __always_inline void handle_syn_sent(struct sock *sk)
{
	bool create = task_in_scope();
	struct lt_sock *st = sock_state_at_birth(sk, create);

	if (!st && create)
		count_unfollowed();
	if (st) {
		st->syn_ns = bpf_ktime_get_ns();
		st->partial = 0;
	}
}

/* The handshake completed, from SYN_SENT (client) or SYN_RECV (server).
 * The role, the flow (the local port is chosen by now) and the time come
 * from the state change itself, so they are right even where sockops is
 * not attached; sockops, which follows, adds RTT samples and TX
 * timestamps. */
static __always_inline void handle_established(struct sock *sk, int oldstate)
{
	bool create = oldstate == TCP_SYN_RECV && !cfg.filter_cgroup;
	struct lt_sock *st = sock_state_at_birth(sk, create);

	if (!st && create)
		count_unfollowed();
	if (st) {
		st->role = oldstate == TCP_SYN_SENT ? LT_ROLE_CLIENT : LT_ROLE_SERVER;
		st->established_ns = bpf_ktime_get_ns();
		st->last_activity_ns = st->established_ns;
		st->partial = 0;
		read_flow(sk, &st->flow);
	}
}

/* The connection closed: its exchange in progress ends, and it leaves a
 * close record with its lifetime and totals. */
static __always_inline void handle_close(struct sock *sk)
{
	struct lt_conn_close *rec;
	struct tcp_sock *tp;
	struct lt_sock *st;
	__u64 now;

	st = sock_state(sk, false);
	if (!st)
		return;
	now = bpf_ktime_get_ns();
	tp = bpf_skc_to_tcp_sock(sk);
	if (st->phase != PHASE_NONE) {
		/* A message without its reply: a closing message (a protocol's
		 * goodbye), a request the peer never answered, a one-way
		 * stream, or a greeting nobody answered. */
		if (!(st->cur.flags & LT_EX_PUSH)) {
			if (!st->cur.w0 || !st->cur.r0)
				st->cur.flags |= LT_EX_UNANSWERED;
			if (greeting_only(st))
				st->cur.flags |= LT_EX_GREETING;
		}
		emit_exchange(st, tp, now);
		st->phase = PHASE_NONE;
		__builtin_memset(&st->cur, 0, sizeof(st->cur));
	}
	rec = reserve(sizeof(*rec), LT_RECORD_CONN_CLOSE, now);
	if (!rec)
		return;
	rec->cookie = sock_cookie(st, sk);
	/* The flow as read once the local port was chosen; a connect that
	 * failed never got that far. */
	if (st->flow.sport)
		rec->flow = st->flow;
	else
		read_flow(sk, &rec->flow);
	rec->owner = st->owner;
	rec->established_ns = st->established_ns;
	rec->sendmsg_calls = st->sendmsg_calls;
	rec->bytes_sent = st->bytes_sent;
	rec->send_skbs = st->send_skbs;
	rec->role = st->role;
	if (st->h2 & H2_FOLLOWED) {
		struct h2_state *h2 = bpf_sk_storage_get(&h2socks, sk, 0, 0);

		if (h2 && (h2->flags & LT_H2_SEEN)) {
			rec->h2_flags = h2->flags;
			__builtin_memcpy(rec->h2_frames, h2->frames, sizeof(rec->h2_frames));
		}
	}
	rec->_pad = 0;
	submit(rec, sizeof(*rec));
	/* A socket whose connect() failed may connect again: start afresh. */
	st->sendmsg_calls = 0;
	st->bytes_sent = 0;
	st->send_skbs = 0;
}

/* An inet socket changed state: TCP's changes are followed. */
static __always_inline void handle_state_change(struct sock *sk, int oldstate, int newstate)
{
	if (!is_tcp(sk))
		return;
	if (newstate == TCP_LISTEN)
		listener_opened(sk);
	else if (oldstate == TCP_LISTEN)
		listener_closed(sk);
	if (newstate == TCP_SYN_SENT)
		handle_syn_sent(sk);
	else if (newstate == TCP_ESTABLISHED && (oldstate == TCP_SYN_SENT || oldstate == TCP_SYN_RECV))
		handle_established(sk, oldstate);
	else if (newstate == TCP_CLOSE)
		handle_close(sk);
}

/* Records of other CPUs the sweep at the stop leaves room for: the hooks
 * are detached by then, but a program already running may still submit. */
#define SWEEP_STOP_SLACK 8
/* The same while the daemon runs: the hooks of every CPU write on. */
#define SWEEP_SLACK 64

/* The sweep at one followed socket (an iterator the daemon runs every
 * cfg.idle_write_ns): an exchange that is complete, its connection quiet
 * for longer than a pause inside a message, is written now, not at its
 * next turn, which on an idle pooled connection may be hours away. With
 * stopping (the daemon stops, its hooks detached) every exchange in
 * progress is written: complete, or else flagged unfinished. True when
 * the ring had no room for it at the stop: the exchange is left for the
 * next pass, which the daemon runs once it has drained the ring. */
static __always_inline bool handle_sweep(struct sock *sk, struct lt_sock *st, bool stopping)
{
	struct tcp_sock *tp;
	__u64 now, quiet;

	if (st->phase == PHASE_NONE || exchange_was_written(st))
		return false;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return false;
	now = bpf_ktime_get_ns();
	if (stopping) {
		if (!st->cur.role)
			return false;
		if (!ring_has_room(sizeof(struct lt_exchange), SWEEP_STOP_SLACK))
			return true;
		if (!complete_and_quiet(st, tp, now, 0)) {
			st->cur.flags |= LT_EX_UNFINISHED;
			count(LT_CNT_UNFINISHED);
		}
		emit_exchange(st, tp, now);
		return false;
	}
	/* Only where the roles are known: on a connection adopted mid-way in
	 * a namespace whose listeners were never read, no later data could
	 * tell a push from the rest of a paused reply. */
	if (!cfg.idle_write_ns || (st->role != LT_ROLE_CLIENT && st->role != LT_ROLE_SERVER))
		return false;
	quiet = push_quiet(st, tp);
	if (quiet < cfg.idle_write_ns)
		quiet = cfg.idle_write_ns;
	/* The sweep writes what the ring has room for, a hook's worth left
	 * over: the rest waits for its next pass, after a drain, neither lost
	 * nor crowding out the hooks' records (a node of thousands of idle
	 * connections makes them all quiet at once). */
	if (complete_and_quiet(st, tp, now, quiet) && ring_has_room(sizeof(struct lt_exchange), SWEEP_SLACK))
		write_idle(st, tp, now);
	return false;
}

/* One lt_inflight for a followed socket with an exchange in progress, for
 * the live view's iterators; a socket between exchanges (its last one
 * written) writes nothing, so the daemon reads what is moving, not every
 * socket of the node. It reads only socket metadata, like the rest. */
static __always_inline void handle_inflight(struct seq_file *seq, struct sock *sk, struct lt_sock *st)
{
	struct lt_inflight rec = {};
	struct tcp_sock *tp;

	if (st->phase == PHASE_NONE || exchange_was_written(st))
		return;
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	rec.cookie = sock_cookie(st, sk);
	rec.flow = st->flow;
	rec.owner = st->owner;
	rec.conn_role = st->role;
	rec.last_activity_ns = st->last_activity_ns;
	rec.turns = st->turns;
	rec.cwnd = tp->snd_cwnd;
	rec.srtt_us = tp->srtt_us >> 3;
	rec.role = st->cur.role;
	rec.start_ns = st->cur.w0 ? st->cur.w0 : st->cur.r0;
	if (st->cur.r0 && st->cur.r0 < rec.start_ns)
		rec.start_ns = st->cur.r0;
	rec.bytes_out = written64(tp) - st->out_bytes0;
	rec.bytes_in = tp->bytes_received - st->in_bytes0;
	bpf_seq_write(seq, &rec, sizeof(rec));
}

#endif /* LATTRACE_HANDLERS_BPF_H */
