/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * sock_state.bpf.h: what lattrace keeps per socket (struct lt_sock) and
 * where: socket local storage, freed with the socket, so no map grows
 * without bound. Also who may adopt a socket (the cgroup filter) and the
 * per-socket facts read once and kept (owner, cookie).
 */
#ifndef LATTRACE_SOCK_STATE_BPF_H
#define LATTRACE_SOCK_STATE_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"
#include "listeners.bpf.h"
#include "tcp.bpf.h"

enum phase {
	PHASE_NONE = 0,
	PHASE_OUT = 1, /* the local app is sending the current message */
	PHASE_IN = 2,  /* the peer's message is arriving */
};

/* BPF TX timestamping on a socket. It is switched on at establishment
 * for a socket TCP will pace, else once one of the socket's writes waited
 * in the send queue: with it on, every sendmsg runs the SENDMSG callback,
 * a sockops run that unpaced request/response traffic, whose writes leave
 * at once, never needs. */
enum tstamp_state {
	TSTAMP_NONE = 0,   /* not needed so far */
	TSTAMP_ON = 1,
	TSTAMP_REFUSED = 2, /* the kernel refused it, or it is unavailable */
};

struct lt_sock {
	struct lt_progress cur; /* the exchange being built */
	struct lt_flow flow;
	struct lt_owner owner;
	__u64 syn_ns, established_ns, last_activity_ns;
	__u64 sendmsg_calls, bytes_sent, send_skbs;
	__u64 wait_last_ns; /* send-wait accounting: last classification time */
	__u64 hole_start_ns;
	__u64 cookie;       /* the socket's, asked once (sock_cookie) */
	__u32 out_seq_start, out_seq_end; /* the out message's sequence range */
	/* Where writes begin, for finding HTTP/2's framing mid-way
	 * (h2_resync.bpf.h): write_seq as the last write returned, and the
	 * end of the last incoming segment the peer pushed (PSH: the end of
	 * one of its writes). */
	__u32 write_end, in_push_end;
	/* Each direction's data segments that started no write since its
	 * last try (h2_resync.bpf.h), while its framing is looked for. */
	__u16 h2_skipped[2];
	__u32 in_seq_start, in_seq_end;   /* the in message's range as it arrived */
	/* Where the messages start in 64-bit byte counts (written64,
	 * bytes_received), so a message past 4 GiB keeps its exact size. */
	__u64 out_bytes0, in_bytes0;
	__u32 data_segs_out0, total_retrans0;
	__u32 turns;
	__u32 turns_emitted; /* turns at the previous exchange's emit */
	__u32 role;
	/* Exchanges begun on the socket (reset_exchange), naming cur, and
	 * the last of them written: the sweep and the hooks each claim an
	 * exchange before writing it, so it is written once (emit_exchange). */
	__u32 gen, written_gen;
	__u8 phase;
	__u8 wait_cause;       /* enum lt_wait_cause */
	__u8 last_in_len_zero; /* the last incoming segment was a pure ACK */
	__u8 tstamp;           /* enum tstamp_state */
	__u8 partial;          /* socket first seen after it was established */
	__u8 emitted_any;
	__u8 msg_tstamp;       /* the out message's last write is TX timestamped */
	__u8 want_tstamp;      /* a write was held back: switch TX timestamping on */
	/* enum h2_sock: how far HTTP/2 framing got (http2.bpf.h); both
	 * directions set it, from different CPUs: atomic ors only. */
	__u32 h2;
};

/* The kernel allocates a socket's storage as its element header (72
 * bytes up to the value on 6.1 to 6.18) and the value: lt_sock keeps the
 * element in kmalloc-512. */
_Static_assert(sizeof(struct lt_sock) <= 512 - 72, "lt_sock outgrows kmalloc-512");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct lt_sock);
} socks SEC(".maps");

/* HTTP/2 framing (http2.bpf.h). lt_sock.h2 says how far a connection's
 * framing got; only one that opened as HTTP/2 gets the state below, in a
 * storage of its own, so that other connections carry none of it. */
enum h2_sock {
	H2_OUT_DECIDED = 1 << 0, /* the first outgoing byte was seen, or went by */
	H2_IN_DECIDED = 1 << 1,  /* the same, incoming */
	H2_FOLLOWED = 1 << 2,    /* it opened as HTTP/2: h2socks holds its framing */
	/* The client's preface was seen and no direction's framing is lost:
	 * its streams are followed (LT_RECORD_H2), its exchanges flagged
	 * LT_EX_H2_STREAMS. */
	H2_STREAMS = 1 << 3,
	/* A connection adopted mid-way: candidates of a direction that failed
	 * (h2_resync.bpf.h), H2_RESYNC_TRY_IN's and H2_RESYNC_TRY_OUT's unit
	 * each counting in a 3-bit field; added atomically. */
	H2_RESYNC_TRY_OUT = 1 << 8,
	H2_RESYNC_TRY_IN = 1 << 12,
	/* Each direction's framing confirmed, on a connection adopted
	 * mid-way: both, and its streams are followed. */
	H2_OUT_CONFIRMED = 1 << 16,
	H2_IN_CONFIRMED = 1 << 17,
};

#define H2_RESYNC_TRY_MASK 7

#define H2_OUT 0
#define H2_IN 1
#define H2_HEADER_LEN 9

/* One direction's framing. */
struct h2_dir {
	__u32 next_seq; /* the next frame header */
	__u32 max_end;  /* the furthest sequence number seen this way */
	__u64 part;     /* the first bytes of the next header, when a segment boundary split it */
	__u8 have;      /* how many: 1..8 */
	__u8 on;        /* followed: its opening was seen and the framing not lost */
	/* A frame of a stream whose header was read and whose last byte
	 * (next_seq) is still to pass: its event waits for it. */
	__u8 pend_on, pend_type, pend_flags;
	/* The next frame is the first after the client's preface: it must be
	 * the client's SETTINGS. */
	__u8 settings_next;
	/* On a connection adopted mid-way, frame headers still to check
	 * before this direction's framing is confirmed (h2_resync.bpf.h). */
	__u8 checking;
	__u8 _pad;
	__u32 pend_stream, pend_seq;
	__u64 pend_t0;
};

struct h2_state {
	struct h2_dir dir[2];      /* H2_OUT, H2_IN */
	__u32 frames[LT_H2_TYPES]; /* both ways, by enum lt_h2_frame */
	__u32 flags;               /* enum lt_h2_flag */
	__u32 _pad;
	__u64 write_t0; /* the write in progress began (0: none) */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct h2_state);
} h2socks SEC(".maps");

/* A connection's HTTP/2 state, made now or found. Its two directions may
 * open at once on two CPUs: the one that loses the race to create the
 * state finds it. 0, counted, when there is no room. */
static __always_inline struct h2_state *h2_state_new(struct bpf_sock *sk)
{
	struct h2_state *h2 = bpf_sk_storage_get(&h2socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);

	if (!h2)
		h2 = bpf_sk_storage_get(&h2socks, sk, 0, 0);
	if (!h2)
		count(LT_CNT_STORAGE_FAIL);
	return h2;
}

/* The cgroup of lattrace daemon --cgroup, when cfg.filter_cgroup. */
struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} cgroup_filter SEC(".maps");

/* May a hook running in the context of the current task adopt a socket?
 * With a cgroup filter, only tasks of its subtree may: softirq hooks cannot
 * tell whose a socket is, so they only follow sockets adopted in process
 * context. */
static __always_inline bool task_in_scope(void)
{
	return !cfg.filter_cgroup || bpf_current_task_under_cgroup(&cgroup_filter, 0) == 1;
}

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LT_CONTROL_SLOTS);
	__type(key, __u32);
	__type(value, struct lt_control);
} control SEC(".maps");

/* Are sockets without state left so for now (struct lt_control): paused,
 * or under a budget, spent for one at its birth, and for all others? Asked
 * only for a socket without state: once per socket, but on each of its
 * events while left, it staying without. */
static __always_inline bool sockets_paused(bool birth)
{
	__u32 slot = LT_CONTROL_SET, seen_slot = LT_CONTROL_SEEN;
	struct lt_control *c = bpf_map_lookup_elem(&control, &slot), *seen;

	if (!c)
		return false;
	if (c->sockets_paused)
		return true;
	if (!c->sockets)
		return false;
	if (!birth)
		return true;
	seen = bpf_map_lookup_elem(&control, &seen_slot);
	/* Wrap-safe: the count runs modulo 2^32, a budget is far less. */
	return seen && (__s32)(seen->sockets - c->sockets) >= 0;
}

/* A socket got state: counted for the budget (sockets_paused). */
static __always_inline void count_followed(void)
{
	__u32 slot = LT_CONTROL_SEEN;
	struct lt_control *seen = bpf_map_lookup_elem(&control, &slot);

	if (seen)
		__sync_fetch_and_add(&seen->sockets, 1);
}

/* A connection end was born, at SYN_SENT or ESTABLISHED from SYN_RECV, and
 * not followed: counted when that is for the pause. */
static __always_inline void count_unfollowed(void)
{
	__u32 slot = LT_CONTROL_SEEN;
	struct lt_control *seen;

	if (!sockets_paused(true))
		return;
	seen = bpf_map_lookup_elem(&control, &slot);
	if (seen)
		__sync_fetch_and_add(&seen->sockets_unfollowed, 1);
}

/* The socket's state; with create, made (and its flow read) on first
 * sight, unless new sockets are not followed for now. */
static __always_inline struct lt_sock *sock_state_of(struct sock *sk, bool create, bool birth)
{
	struct lt_sock *st;

	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (st || !create || sockets_paused(birth))
		return st;
	st = bpf_sk_storage_get(&socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		count(LT_CNT_STORAGE_FAIL);
		return 0;
	}
	count(LT_CNT_SOCKS_TRACKED);
	count_followed();
	read_flow(sk, &st->flow);
	/* A socket first seen here, not at SYN_SENT or ESTABLISHED, was open
	 * before lattrace: its first exchange may have begun unseen, and its
	 * role is the listeners' to tell. */
	if (sk->__sk_common.skc_state == TCP_ESTABLISHED && !st->established_ns) {
		st->partial = 1;
		st->role = adopted_role(&st->flow);
	}
	return st;
}

/* sock_state at the socket's birth (SYN_SENT, or ESTABLISHED from
 * SYN_RECV), and anywhere else: a budget of new sockets is spent at
 * births only. */
static __always_inline struct lt_sock *sock_state(struct sock *sk, bool create)
{
	return sock_state_of(sk, create, false);
}

static __always_inline struct lt_sock *sock_state_at_birth(struct sock *sk, bool create)
{
	return sock_state_of(sk, create, true);
}

/* Called from process context only: the current task owns the socket.
 * The same thread keeps using a socket, so the comm and cgroup are read
 * only when the thread changes: they cost more than the rest of a hook. */
static __always_inline void note_owner(struct lt_owner *o)
{
	__u64 id = bpf_get_current_pid_tgid();

	if (o->pid == id >> 32 && o->tid == (__u32)id)
		return;
	o->pid = id >> 32;
	o->tid = (__u32)id;
	o->cgroup_id = bpf_get_current_cgroup_id();
	bpf_get_current_comm(o->comm, sizeof(o->comm));
}

/* A socket's cookie never changes, and the helper that asks for it costs
 * a good part of a hook: it is asked once and kept. */
static __always_inline __u64 sock_cookie(struct lt_sock *st, struct sock *sk)
{
	if (!st->cookie)
		st->cookie = bpf_get_socket_cookie(sk);
	return st->cookie;
}

#endif /* LATTRACE_SOCK_STATE_BPF_H */
