// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * lattrace.bpf.c: the kernel side of lattrace.
 *
 * Follows every TCP connection and cuts its traffic into exchanges: a
 * message one way, then the message the other way, closed at the next turn
 * (change of direction). Each exchange leaves the kernel as one record with
 * its timeline (docs/latency-model.md); per-segment work stays here.
 *
 * Hooks are tp_btf tracepoints and sockops only: kernels that refuse
 * trampolines (fentry) and kprobes still run every program. Per-socket
 * state lives in socket local storage, freed with the socket. Only
 * metadata is read (socket fields, TCP control-block sequence numbers),
 * never a payload byte.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>

#include "lattrace.h"

#define AF_INET 2
#define AF_INET6 10
#define SOL_SOCKET 1
#define MSG_PEEK 2
/* enum tcp_state values, stable since the beginning of Linux TCP. */
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3
#define TCP_CLOSE 7

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

/* Set by the loader. */
/* Wake user space each time the backlog grows by this many bytes (a power
 * of two); between wakeups the daemon drains on a timer. A wakeup costs
 * microseconds here, far more than a record. */
const volatile __u64 wakeup_bytes = 1024 * 1024;
/* Use BPF TX timestamping for x1/a1 where the kernel has it (>= 6.15). */
const volatile bool use_tx_tstamp = true;
/* Trace only sockets of tasks in the cgroup subtree held in cgroup_filter
 * (lattrace daemon --cgroup). Softirq hooks cannot tell whose a socket is,
 * so with a filter they only follow sockets adopted in process context. */
const volatile bool filter_cgroup = false;
/* Window of the path's recent clean RTT (a windowed minimum). */
const volatile __u64 path_window_ns = 2000000000ULL;

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym __weak;
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;
extern int bpf_sock_ops_enable_tx_tstamp(struct bpf_sock_ops_kern *skops, __u64 flags) __ksym __weak;

enum phase {
	PHASE_NONE = 0,
	PHASE_OUT = 1, /* the local app is sending the current message */
	PHASE_IN = 2,  /* the peer's message is arriving */
};

/* BPF TX timestamping on a socket. It is switched on only once one of
 * the socket's writes waited in the send queue: with it on, every
 * sendmsg runs the SENDMSG callback, a sockops run that request/response
 * traffic, whose writes leave at once, never needs (it was a fifth of the
 * BPF time of a loopback round trip). */
enum tstamp_state {
	TSTAMP_NONE = 0,   /* not needed so far */
	TSTAMP_ON = 1,
	TSTAMP_REFUSED = 2, /* the kernel refused it, or it is unavailable */
};

/* Send-wait causes, in the order of precedence classify() applies. */
enum wait_cause {
	WAIT_OTHER = 0,
	WAIT_CWND,
	WAIT_RWND,
	WAIT_SNDBUF,
};

/* A windowed minimum kept as two half-window buckets: cheap, bounded, and
 * within a factor of the window of the exact sliding minimum. */
struct winmin {
	__u64 cur_start;
	__u32 cur;
	__u32 prev;
};

struct lt_sock {
	struct lt_exchange cur; /* the exchange being built */
	struct lt_flow flow;
	struct lt_owner owner;
	__u64 syn_ns, established_ns, last_activity_ns;
	__u64 sendmsg_calls, bytes_sent, send_skbs;
	__u64 wait_last_ns; /* send-wait accounting: last classification time */
	__u64 hole_start_ns;
	__u64 cookie;       /* the socket's, asked once (sock_cookie) */
	__u32 out_seq_start, out_seq_end; /* the out message's sequence range */
	__u32 in_seq_start, in_seq_end;   /* the in message's range as it arrived */
	__u32 data_segs_out0, total_retrans0;
	__u32 turns;
	__u32 turns_emitted; /* turns at the previous exchange's emit */
	__u32 role;
	__u8 phase;
	__u8 wait_cause;
	__u8 last_in_len_zero; /* the last incoming segment was a pure ACK */
	__u8 tstamp;           /* enum tstamp_state */
	__u8 partial;          /* socket first seen after it was established */
	__u8 emitted_any;
	__u8 msg_tstamp;       /* the out message's last write is TX timestamped */
	__u8 want_tstamp;      /* a write was held back: switch TX timestamping on */
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct lt_sock);
} socks SEC(".maps");

struct path_key {
	__u8 addr[16];
	__u32 netns;
	__u16 family;
	__u16 _pad;
};

/* RTT per path (this namespace to one peer address), shared by every flow
 * on it: a bulk flow's samples tell a chatty flow beside it how much queue
 * there is. Clean samples go into short time buckets, so an exchange can
 * take the minimum of those taken while it was in flight, and into a
 * longer windowed minimum for exchanges that saw none. Every sample (clean
 * or not: none is below the propagation delay) lowers the path's minimum,
 * the clean ones as they come and the others through their socket's
 * minimum RTT at each exchange's end; it ages out so a route change is
 * learnt.
 *
 * The table is an array used as a two-way set-associative cache: an
 * exchange's end reads it, and an array slot costs a few instructions
 * where a hash map's lookup cost more than the rest of the hook. A path
 * takes the less recently used of its two slots; taking one that was
 * still in use counts in LT_CNT_PATH_FULL. */
#define PATH_BUCKETS 16
/* 2^25 ns (33.6 ms): a shift, where a division costs the hot path. */
#define PATH_BUCKET_SHIFT 25
#define PATH_MIN_AGE_NS (300ULL * 1000 * 1000 * 1000)

struct path_rtt {
	__u64 epoch[PATH_BUCKETS]; /* time >> PATH_BUCKET_SHIFT of the bucket's samples */
	__u32 min[PATH_BUCKETS];
	struct winmin recent;
	__u64 min_rtt_ns_at;
	__u32 min_rtt_us;
	__u32 _pad;
};

#define PATH_SETS 8192 /* of two slots: 16384 paths */
#define PATH_RECENT_NS (60ULL * 1000 * 1000 * 1000)

struct path_slot {
	struct path_key key; /* all zero: free */
	__u64 last_ns;       /* last use */
	struct path_rtt rtt;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * PATH_SETS);
	__type(key, __u32);
	__type(value, struct path_slot);
} paths SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_CGROUP_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} cgroup_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LT_CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &which);

	if (v)
		*v += 1;
}

/* May a hook running in the context of the current task adopt a socket? */
static __always_inline bool task_in_scope(void)
{
	return !filter_cgroup || bpf_current_task_under_cgroup(&cgroup_filter, 0) == 1;
}

static __always_inline bool after(__u32 a, __u32 b) { return (__s32)(a - b) > 0; }
static __always_inline bool before_eq(__u32 a, __u32 b) { return (__s32)(a - b) <= 0; }

static __always_inline void winmin_add(struct winmin *w, __u32 v, __u64 now)
{
	if (now - w->cur_start > path_window_ns >> 1) {
		w->prev = (now - w->cur_start > path_window_ns) ? 0 : w->cur;
		w->cur = v;
		w->cur_start = now;
	} else if (!w->cur || v < w->cur) {
		w->cur = v;
	}
}

static __always_inline __u32 winmin_get(const struct winmin *w, __u64 now)
{
	if (!w->cur_start || now - w->cur_start > path_window_ns)
		return 0;
	if (w->prev && (now - w->cur_start) <= path_window_ns >> 1 && w->prev < w->cur)
		return w->prev;
	return w->cur;
}

/* tp_btf arguments are trusted BTF pointers: their fields are read with
 * plain (CO-RE relocated) loads, several times cheaper than a
 * bpf_probe_read_kernel call each. BPF_CORE_READ stays where a pointer
 * is cast beyond its BTF type. */
/* A socket known to be TCP (the hook is TCP's, or the socket has state,
 * which only TCP sockets get) as its tcp_sock, read-only. The kfunc is a
 * cast resolved when the program loads; bpf_skc_to_tcp_sock, for kernels
 * without it, is a helper call that checks the type again on every run. */
static __always_inline struct tcp_sock *tcp_sk_of(struct sock *sk)
{
	if (bpf_rdonly_cast)
		return bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct tcp_sock));
	return bpf_skc_to_tcp_sock(sk);
}

static __always_inline bool is_tcp(const struct sock *sk)
{
	__u16 family = sk->__sk_common.skc_family;

	if (family != AF_INET && family != AF_INET6)
		return false;
	return sk->sk_protocol == IPPROTO_TCP && sk->sk_type == SOCK_STREAM;
}

/* read_flow for kernels without bpf_rdonly_cast (before 6.6). */
static __always_inline void read_flow_probed(const struct sock *sk, struct lt_flow *f)
{
	f->family = BPF_CORE_READ(sk, __sk_common.skc_family);
	f->sport = bpf_ntohs(BPF_CORE_READ((struct inet_sock *)sk, inet_sport));
	f->dport = bpf_ntohs(BPF_CORE_READ(sk, __sk_common.skc_dport));
	f->netns = BPF_CORE_READ(sk, __sk_common.skc_net.net, ns.inum);
	if (f->family == AF_INET) {
		__u32 s = BPF_CORE_READ(sk, __sk_common.skc_rcv_saddr);
		__u32 d = BPF_CORE_READ(sk, __sk_common.skc_daddr);

		__builtin_memcpy(f->saddr, &s, 4);
		__builtin_memcpy(f->daddr, &d, 4);
	} else {
		BPF_CORE_READ_INTO(&f->saddr, sk, __sk_common.skc_v6_rcv_saddr.in6_u.u6_addr8);
		BPF_CORE_READ_INTO(&f->daddr, sk, __sk_common.skc_v6_daddr.in6_u.u6_addr8);
	}
}

/* The connection's addresses, ports and namespace. sk is a BTF pointer
 * (a tp_btf argument, or bpf_skc_to_tcp_sock's result in sockops): its
 * fields are plain loads, where BPF_CORE_READ is a bpf_probe_read_kernel
 * call for each (eight of them made a connection's state change cost
 * twice as much). */
static __always_inline void read_flow(struct sock *sk, struct lt_flow *f)
{
	struct inet_sock *inet;

	__builtin_memset(f, 0, sizeof(*f));
	if (!bpf_rdonly_cast) {
		read_flow_probed(sk, f);
		return;
	}
	inet = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct inet_sock));
	f->family = sk->__sk_common.skc_family;
	/* inet_sport, not skc_num: on the way to CLOSE the kernel releases the
	 * port (skc_num = 0) before the state change is traced. */
	f->sport = bpf_ntohs(inet->inet_sport);
	f->dport = bpf_ntohs(sk->__sk_common.skc_dport);
	f->netns = sk->__sk_common.skc_net.net->ns.inum;
	if (f->family == AF_INET) {
		__u32 s = sk->__sk_common.skc_rcv_saddr;
		__u32 d = sk->__sk_common.skc_daddr;

		__builtin_memcpy(f->saddr, &s, 4);
		__builtin_memcpy(f->daddr, &d, 4);
	} else {
		__builtin_memcpy(f->saddr, sk->__sk_common.skc_v6_rcv_saddr.in6_u.u6_addr8, 16);
		__builtin_memcpy(f->daddr, sk->__sk_common.skc_v6_daddr.in6_u.u6_addr8, 16);
	}
}

static __always_inline void path_key_of(const struct lt_flow *f, struct path_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->addr, f->daddr, 16);
	k->netns = f->netns;
	k->family = f->family;
}

static __always_inline void path_min_add(struct path_rtt *p, __u32 v, __u64 now)
{
	if (!v)
		return;
	if (!p->min_rtt_us || v <= p->min_rtt_us || now - p->min_rtt_ns_at > PATH_MIN_AGE_NS) {
		p->min_rtt_us = v;
		p->min_rtt_ns_at = now;
	}
}

static __always_inline void path_clean_add(struct path_rtt *p, __u32 v, __u64 now)
{
	__u64 e = now >> PATH_BUCKET_SHIFT;
	__u32 i = e & (PATH_BUCKETS - 1);

	if (p->epoch[i] != e) {
		p->epoch[i] = e;
		p->min[i] = v;
	} else if (v < p->min[i]) {
		p->min[i] = v;
	}
	winmin_add(&p->recent, v, now);
}

/* The minimum clean RTT of samples taken between from and to. */
static __always_inline __u32 path_rtt_between(const struct path_rtt *p, __u64 from, __u64 to)
{
	__u64 lo = from >> PATH_BUCKET_SHIFT, hi = to >> PATH_BUCKET_SHIFT;
	__u32 best = 0;

	if (hi - lo < PATH_BUCKETS) {
		/* A span shorter than the buckets (nearly every exchange fits in
		 * one): epoch e can only be in bucket e % PATH_BUCKETS. */
		for (int k = 0; k < PATH_BUCKETS; k++) {
			__u64 e = lo + k;
			__u32 i = e & (PATH_BUCKETS - 1);

			if (e > hi)
				break;
			if (p->epoch[i] == e && p->min[i] && (!best || p->min[i] < best))
				best = p->min[i];
		}
		return best;
	}
	for (int i = 0; i < PATH_BUCKETS; i++) {
		if (p->epoch[i] < lo || p->epoch[i] > hi || !p->min[i])
			continue;
		if (!best || p->min[i] < best)
			best = p->min[i];
	}
	return best;
}

static __always_inline bool path_key_eq(const struct path_key *a, const struct path_key *b)
{
	const __u64 *x = (const __u64 *)a, *y = (const __u64 *)b;

	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2];
}

/* FNV-1a over the key's words. */
static __always_inline __u32 path_hash(const struct path_key *k)
{
	const __u32 *w = (const __u32 *)k;
	__u32 h = 2166136261U;

	for (int i = 0; i < sizeof(*k) / 4; i++)
		h = (h ^ w[i]) * 16777619U;
	return h ^ (h >> 16);
}

static __always_inline struct path_rtt *path_get(const struct lt_flow *f, __u64 now)
{
	struct path_slot *a, *b, *v;
	struct path_key k;
	__u32 i, j;

	path_key_of(f, &k);
	i = (path_hash(&k) & (PATH_SETS - 1)) * 2;
	j = i + 1;
	a = bpf_map_lookup_elem(&paths, &i);
	b = bpf_map_lookup_elem(&paths, &j);
	if (!a || !b)
		return 0;
	if (path_key_eq(&a->key, &k))
		v = a;
	else if (path_key_eq(&b->key, &k))
		v = b;
	else {
		v = a->last_ns <= b->last_ns ? a : b;
		if (v->last_ns && now - v->last_ns < PATH_RECENT_NS)
			count(LT_CNT_PATH_FULL);
		__builtin_memset(&v->rtt, 0, sizeof(v->rtt));
		v->key = k;
	}
	v->last_ns = now;
	return &v->rtt;
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

/* Ring buffer records carry an 8-byte header of the kernel's. */
#define RINGBUF_HDR 8

/* Wakeup flags for a record that takes the backlog from before to after
 * bytes. The reader drains on a timer; it is woken only when the backlog
 * crosses a multiple of wakeup_bytes, so a burst wakes it early. Waking it
 * on every record past the threshold instead costs an irq_work and a
 * self-IPI per record while the reader is on its way: about 1.3 us a
 * record in this VM, five times the rest of the hook. */
static __always_inline __u64 wake_flags(__u64 before, __u64 after)
{
	/* wakeup_bytes is a power of two: the quotients differ exactly when
	 * the positions differ in a bit of wakeup_bytes or above. */
	if ((after ^ before) >= wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

/* The ring buffer bytes a record of size bytes takes. */
static __always_inline __u64 ringbuf_len(__u64 size)
{
	return (size + RINGBUF_HDR + 7) & ~7ULL;
}

/* Submits a reserved record of size bytes. */
static __always_inline void submit(void *rec, __u64 size)
{
	/* The reservation is already in the backlog. */
	__u64 after = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	__u64 len = ringbuf_len(size);

	bpf_ringbuf_submit(rec, wake_flags(after > len ? after - len : 0, after));
	count(LT_CNT_RECORDS);
}

/* Copies size bytes from data into the ring buffer as one record. */
static __always_inline long output(void *data, __u64 size)
{
	__u64 before = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);

	return bpf_ringbuf_output(&events, data, size, wake_flags(before, before + ringbuf_len(size)));
}

static __always_inline struct lt_sock *sock_state(struct sock *sk, bool create)
{
	struct lt_sock *st;

	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (st || !create)
		return st;
	st = bpf_sk_storage_get(&socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		count(LT_CNT_STORAGE_FAIL);
		return 0;
	}
	count(LT_CNT_SOCKS_TRACKED);
	read_flow(sk, &st->flow);
	/* A socket first seen here, not at SYN_SENT or ESTABLISHED, was open
	 * before lattrace: its first exchange may have begun unseen. */
	if (sk->__sk_common.skc_state == TCP_ESTABLISHED && !st->established_ns)
		st->partial = 1;
	return st;
}

static __always_inline __u32 in_flight(struct tcp_sock *tp)
{
	return tp->packets_out - (tp->sacked_out + tp->lost_out) + tp->retrans_out;
}

/* What is holding back the unsent part of the out message right now. */
static __always_inline __u8 classify(struct sock *sk, struct tcp_sock *tp)
{
	if (after(tp->snd_nxt + tp->mss_cache, tp->snd_una + tp->snd_wnd))
		return WAIT_RWND;
	if (in_flight(tp) >= tp->snd_cwnd)
		return WAIT_CWND;
	if (sk->sk_wmem_queued >= sk->sk_sndbuf)
		return WAIT_SNDBUF;
	return WAIT_OTHER;
}

#define TCP_NAGLE_OFF 1
#define TCP_NAGLE_CORK 2
#define TCP_INIT_CWND 10
#define TCP_RTO_MIN_NS (200ULL * 1000 * 1000)

/* Will the unsent data, this write's included, wait in the send queue
 * rather than leave in this sendmsg? Called before the kernel pushes it:
 * the window (cwnd, restarted after idle when slow start after idle is
 * on, and rwnd), Nagle and corking decide. A wrong "no" only makes x1
 * late by up to an ACK (the fallback); a wrong "yes" costs callbacks. */
static __always_inline bool held_back(const struct lt_sock *st, struct tcp_sock *tp)
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
	if (nonagle & TCP_NAGLE_CORK)
		return true;
	return !(nonagle & TCP_NAGLE_OFF) && tp->packets_out && unsent % mss;
}

static __always_inline void wait_account(struct lt_sock *st, __u64 now)
{
	__u64 dt;

	if (!st->wait_last_ns)
		return;
	dt = now - st->wait_last_ns;
	switch (st->wait_cause) {
	case WAIT_CWND:
		st->cur.wait_cwnd_ns += dt;
		break;
	case WAIT_RWND:
		st->cur.wait_rwnd_ns += dt;
		break;
	case WAIT_SNDBUF:
		st->cur.wait_sndbuf_ns += dt;
		break;
	default:
		st->cur.wait_other_ns += dt;
	}
	st->wait_last_ns = now;
}

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

static __always_inline void emit_exchange(struct lt_sock *st, struct tcp_sock *tp, __u64 now)
{
	struct lt_exchange *ex = &st->cur;
	struct path_rtt *pw;
	__u32 rtt;

	if (!ex->role)
		return;
	count(LT_CNT_EXCHANGES);
	if (st->wait_last_ns)
		wait_account(st, now);
	ex->hdr.kind = LT_RECORD_EXCHANGE;
	ex->hdr.layout = LT_LAYOUT;
	ex->hdr.ts_ns = now;
	ex->flow = st->flow;
	ex->owner = st->owner;
	ex->conn_role = st->role;
	ex->turns = st->turns;
	ex->turns_exchange = st->turns - st->turns_emitted;
	st->turns_emitted = st->turns;
	ex->bytes_out = st->out_seq_end - st->out_seq_start;
	ex->bytes_in = st->in_seq_end - st->in_seq_start;
	if (tp) {
		ex->segs_out = tp->data_segs_out - st->data_segs_out0;
		ex->retrans = tp->total_retrans - st->total_retrans0;
		ex->min_rtt_us = tp->rtt_min.s[0].v == ~0U ? 0 : tp->rtt_min.s[0].v; /* ~0: no sample yet */
		ex->srtt_us = tp->srtt_us >> 3;
		ex->rwnd_end = tp->snd_wnd;
		if (!ex->cwnd_end)
			ex->cwnd_end = tp->snd_cwnd;
		/* bytes_received counts data only, which follows the SYN's
		 * sequence number; bytes_acked counts the SYN too on the end
		 * that sent it first (the ACK of our SYN moves snd_una), not on
		 * the accepting end (whose snd_una starts past its SYN-ACK). */
		ex->isn_remote = tp->rcv_nxt - (__u32)tp->bytes_received - 1;
		ex->isn_local = tp->snd_una - (__u32)tp->bytes_acked;
		if (st->role != LT_ROLE_CLIENT)
			ex->isn_local--;
	}
	ex->out_seq = st->out_seq_start;
	ex->in_seq = st->in_seq_start;
	/* The path's clean RTT while this exchange was in flight, or failing
	 * any such sample a recent one; else user space falls back to the
	 * path's minimum (the handshake's sample is in it). */
	pw = path_get(&st->flow, now);
	rtt = 0;
	if (pw) {
		path_min_add(pw, ex->min_rtt_us, now);
		ex->path_min_rtt_us = pw->min_rtt_us;
		rtt = path_rtt_between(pw, ex->w0 ? ex->w0 : ex->r0, ex->r0 && ex->role == LT_REQUESTER ? ex->r0 : now);
		if (!rtt)
			rtt = winmin_get(&pw->recent, now);
	}
	ex->path_rtt_us = rtt;
	if (st->msg_tstamp)
		ex->flags |= LT_EX_TX_TSTAMP;
	if (st->partial && !st->emitted_any)
		ex->flags |= LT_EX_PARTIAL;
	if (output(ex, sizeof(*ex)))
		count(LT_CNT_RINGBUF_FULL);
	else
		count(LT_CNT_RECORDS);
	st->emitted_any = 1;
}

/* A socket's cookie never changes: asked at every exchange, the helper
 * cost a tenth of the hook. */
static __always_inline __u64 sock_cookie(struct lt_sock *st, struct sock *sk)
{
	if (!st->cookie)
		st->cookie = bpf_get_socket_cookie(sk);
	return st->cookie;
}

static __always_inline void reset_exchange(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u32 role, __u64 now)
{
	__builtin_memset(&st->cur, 0, sizeof(st->cur));
	st->cur.role = role;
	st->cur.cookie = sock_cookie(st, sk);
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
		st->out_seq_start = st->out_seq_end = tp->write_seq;
		st->in_seq_start = st->in_seq_end = tp->rcv_nxt;
	}
	st->wait_last_ns = 0;
	st->hole_start_ns = 0;
}

/* The role of the first exchange seen on a socket. Normally the end that
 * speaks first requests. A socket adopted mid-connection may be seen first
 * in the middle of an exchange (the tail of a response, or a response being
 * written), so there the ports decide: the listening port is usually the
 * lower one and the client, the usual requester, has the ephemeral one. */
static __always_inline __u32 first_role(const struct lt_sock *st, __u32 by_direction)
{
	if (!st->partial || st->emitted_any)
		return by_direction;
	return st->flow.sport > st->flow.dport ? LT_REQUESTER : LT_RESPONDER;
}

/* The local app starts writing: a turn if the peer's message came before. */
static __always_inline void begin_out(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u64 now)
{
	if (st->phase == PHASE_IN) {
		st->turns++;
		if (st->cur.role == LT_REQUESTER) {
			emit_exchange(st, tp, now);
			reset_exchange(st, sk, tp, LT_REQUESTER, now);
		}
	} else if (st->phase == PHASE_NONE) {
		reset_exchange(st, sk, tp, first_role(st, LT_REQUESTER), now);
	}
	st->phase = PHASE_OUT;
	st->msg_tstamp = 0;
	st->cur.w0 = now;
	st->out_seq_start = st->out_seq_end = tp->write_seq;
	st->data_segs_out0 = tp->data_segs_out;
	/* cwnd before the kernel's restart after idle, which comes with the
	 * first skb queued after this point. */
	st->cur.cwnd_start = tp->snd_cwnd;
	st->cur.rwnd_start = tp->snd_wnd;
	if (sk->__sk_common.skc_net.net->ipv4.sysctl_tcp_slow_start_after_idle)
		st->cur.flags |= LT_EX_SSAI;
	st->wait_last_ns = now;
	st->wait_cause = classify(sk, tp);
}

/* New data arrives: a turn if the local app had sent before. */
static __always_inline void begin_in(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, __u32 seq, __u64 now)
{
	if (st->phase == PHASE_OUT) {
		st->turns++;
		if (st->cur.role == LT_RESPONDER) {
			emit_exchange(st, tp, now);
			reset_exchange(st, sk, tp, LT_RESPONDER, now);
		}
	} else if (st->phase == PHASE_NONE) {
		reset_exchange(st, sk, tp, first_role(st, LT_RESPONDER), now);
	}
	st->phase = PHASE_IN;
	st->cur.r0 = now;
	/* rcv_nxt, not the segment's seq: a retransmission may overlap data
	 * already received. */
	st->in_seq_start = st->in_seq_end = tp->rcv_nxt;
}

/* sockops: connection establishment, RTT samples and TX timestamps. */
SEC("sockops")
int lattrace_sockops(struct bpf_sock_ops *skops)
{
	struct bpf_sock *bsk = skops->sk;
	struct lt_conn_open *rec;
	struct lt_sock *st;
	__u32 op = skops->op;
	__u64 now;

	if (!bsk)
		return 1;
	/* The clock is read only where it is used: the RTT callback runs at
	 * every ACK and seldom keeps its sample, and reading the clock first
	 * made it 139 ns a run instead of 96 (bpf_ktime_get_ns on a VM's TSC
	 * clocksource). */
	switch (op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: {
		now = bpf_ktime_get_ns();
		st = bpf_sk_storage_get(&socks, bsk, 0, BPF_SK_STORAGE_GET_F_CREATE);
		if (!st) {
			count(LT_CNT_STORAGE_FAIL);
			return 1;
		}
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
		st->role = op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB ? LT_ROLE_CLIENT : LT_ROLE_SERVER;
		st->partial = 0;
		if (!st->last_activity_ns)
			st->last_activity_ns = now;
		/* RTT samples for the path (only clean ones are kept). The RTT
		 * callback is also where TX timestamping is switched on once a
		 * write was held back (see tstamp_state): the kernel refuses
		 * flag changes from the TX timestamping callbacks themselves. */
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_RTT_CB_FLAG);
		if (!use_tx_tstamp || !bpf_sock_ops_enable_tx_tstamp || !bpf_cast_to_kern_ctx) {
			st->tstamp = TSTAMP_REFUSED;
			count(LT_CNT_TSTAMP_OFF);
		}

		rec = bpf_ringbuf_reserve(&events, sizeof(*rec), 0);
		if (!rec) {
			count(LT_CNT_RINGBUF_FULL);
			return 1;
		}
		rec->hdr.kind = LT_RECORD_CONN_OPEN;
		rec->hdr.layout = LT_LAYOUT;
		rec->hdr.ts_ns = now;
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
		return 1;
	}
	case BPF_SOCK_OPS_RTT_CB: {
		__u32 rtt = skops->args[0];
		struct path_rtt *p;

		st = bpf_sk_storage_get(&socks, bsk, 0, 0);
		if (!st)
			return 1;
		/* This ACK lets the held-back data go: the message's last
		 * write, if still to come (or still in this sendmsg), gets
		 * timestamped. */
		if (st->want_tstamp && st->tstamp == TSTAMP_NONE) {
			int flags = SK_BPF_CB_TX_TIMESTAMPING;

			if (bpf_setsockopt(skops, SOL_SOCKET, SK_BPF_CB_FLAGS, &flags, sizeof(flags))) {
				st->tstamp = TSTAMP_REFUSED;
				count(LT_CNT_TSTAMP_OFF);
			} else {
				st->tstamp = TSTAMP_ON;
			}
		}
		if (!rtt)
			return 1;
		/* Clean samples only: a pure ACK (no reply data riding on it, so
		 * no peer think time) of the middle of a message, with more of it
		 * in flight (so not the delayed ACK of its last segment). The
		 * other samples reach the path's minimum through the socket's
		 * own minimum, at each exchange's end. */
		if (!st->last_in_len_zero || skops->snd_una == skops->snd_nxt ||
		    st->phase != PHASE_OUT || !after(st->out_seq_end, skops->snd_una))
			return 1;
		now = bpf_ktime_get_ns();
		p = path_get(&st->flow, now);
		if (!p)
			return 1;
		path_min_add(p, rtt, now);
		path_clean_add(p, rtt, now);
		return 1;
	}
	case BPF_SOCK_OPS_TSTAMP_SENDMSG_CB:
	case BPF_SOCK_OPS_TSTAMP_SCHED_CB:
	case BPF_SOCK_OPS_TSTAMP_ACK_CB: {
		struct bpf_sock_ops_kern *kctx;
		struct skb_shared_info *shinfo;
		struct sk_buff *skb;
		__u32 tskey = 0, end;

		if (!bpf_cast_to_kern_ctx)
			return 1;
		kctx = bpf_cast_to_kern_ctx(skops);
		st = bpf_sk_storage_get(&socks, bsk, 0, 0);
		if (op == BPF_SOCK_OPS_TSTAMP_SENDMSG_CB) {
			struct tcp_sock *tp = bpf_skc_to_tcp_sock(bsk);

			/* Fires at the end of each sendmsg, before the data is
			 * pushed: the message's end is known before it can leave. */
			if (!st || st->phase != PHASE_OUT || !tp)
				return 1;
			st->out_seq_end = tp->write_seq;
			/* Timestamp the write's last byte only when it will wait
			 * in the send queue; otherwise it leaves in this very
			 * call and sock_send_length sees x1. Each timestamped
			 * write costs three more callbacks. (This callback runs
			 * only on sockets that had a write held back before.) */
			st->msg_tstamp = held_back(st, tp);
			if (st->msg_tstamp && bpf_sock_ops_enable_tx_tstamp)
				bpf_sock_ops_enable_tx_tstamp(kctx, 0);
			return 1;
		}
		if (!st || st->phase == PHASE_NONE || st->out_seq_end == st->out_seq_start)
			return 1;
		skb = kctx->skb;
		shinfo = (struct skb_shared_info *)(skb->head + skb->end);
		bpf_probe_read_kernel(&tskey, sizeof(tskey), &shinfo->tskey);
		end = tskey + 1;
		if (!before_eq(st->out_seq_end, end))
			return 1;
		now = bpf_ktime_get_ns();
		if (op == BPF_SOCK_OPS_TSTAMP_SCHED_CB) {
			/* Retransmissions fire SCHED again for an old key: only the
			 * first transmission of the message's last byte is x1. */
			if (!st->cur.x1) {
				st->cur.cwnd_end = skops->snd_cwnd;
				mark_x1(st, 0, now);
			}
			return 1;
		}
		/* ACK_CB: the skb holding the message's last byte is fully acked. */
		mark_a1(st, now);
		return 1;
	}
	}
	return 1;
}

/* Every write starts here (it fires again for each skb a large write
 * fills): the first of a message is w0. */
SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(lattrace_sendmsg_locked, struct sock *sk, struct msghdr *msg, struct sk_buff *skb, int size_goal)
{
	struct lt_sock *st = sock_state(sk, task_in_scope());
	struct tcp_sock *tp;
	__u64 now;

	if (!st)
		return 0;
	st->send_skbs++;
	tp = tcp_sk_of(sk);
	if (!tp)
		return 0;
	now = bpf_ktime_get_ns();
	if (st->phase != PHASE_OUT) {
		begin_out(st, sk, tp, now);
	} else if (st->cur.x1) {
		/* A further write before any reply extends the same message: its
		 * last byte, and so x1 and a1, move on. */
		st->cur.x1 = 0;
		st->cur.a1 = 0;
		st->cur.flags &= ~LT_EX_ACK_PURE;
		st->cur.ack_rtt_us = 0;
		st->wait_last_ns = now;
		st->wait_cause = classify(sk, tp);
	} else {
		/* A later skb of a long write, or a later write of the
		 * message. A write pushes its data only at its end, so unsent
		 * data is normal here; data the window will hold is not. */
		if (st->tstamp == TSTAMP_NONE && held_back(st, tp))
			st->want_tstamp = 1;
		wait_account(st, now);
		st->wait_cause = classify(sk, tp);
	}
	return 0;
}

/* Once per sendmsg()/write() on any socket, with its result: w1. */
SEC("tp_btf/sock_send_length")
int BPF_PROG(lattrace_send_length, struct sock *sk, int ret, int flags)
{
	struct tcp_sock *tp;
	struct lt_sock *st;
	__u64 now;

	if (ret <= 0)
		return 0;
	/* Only TCP sockets get state: an existing entry spares the type checks. */
	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (!st && (!is_tcp(sk) || !task_in_scope() || !(st = sock_state(sk, true))))
		return 0;
	st->sendmsg_calls++;
	st->bytes_sent += ret;
	note_owner(&st->owner);
	tp = tcp_sk_of(sk);
	if (!tp || st->phase != PHASE_OUT)
		return 0;
	now = bpf_ktime_get_ns();
	st->cur.w1 = now;
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
		st->wait_cause = classify(sk, tp);
	}
	return 0;
}

/* Every incoming segment of an established connection, before the stack
 * processes it: ACKs (a1), reply data (r0, r1), receive holes (loss). */
SEC("tp_btf/tcp_probe")
int BPF_PROG(lattrace_probe, struct sock *sk, struct sk_buff *skb)
{
	struct tcp_skb_cb *cb = (struct tcp_skb_cb *)&skb->cb[0];
	__u32 seq, end_seq, ack_seq, len;
	struct tcp_sock *tp;
	struct lt_sock *st;
	__u64 now;
	bool ooo, fresh;

	st = sock_state(sk, !filter_cgroup);
	if (!st)
		return 0;
	tp = tcp_sk_of(sk);
	if (!tp)
		return 0;
	now = bpf_ktime_get_ns();
	/* skb->cb is a byte array the verifier lets a program read as the
	 * control block it holds. */
	seq = cb->seq;
	end_seq = cb->end_seq;
	ack_seq = cb->ack_seq;
	len = end_seq - seq;
	if (cb->tcp_flags & 0x01) /* FIN takes a sequence number, not data */
		len = len ? len - 1 : 0;
	st->last_in_len_zero = len == 0;
	/* New data only: a retransmitted duplicate is not an arrival. */
	fresh = len && after(seq + len, tp->rcv_nxt);

	/* New data from the peer while our message is out ends that message
	 * (begin_in below). sock_send_length, which records its end, runs
	 * after tcp_sendmsg has released the socket, and the answer (softirq
	 * on the other CPU) now and then came first: the exchange went out
	 * with no bytes out and no x1 or a1. Everything written since w0 is
	 * the message, so its end is taken here, before x1 and a1 are
	 * looked for. */
	if (fresh && st->phase == PHASE_OUT && after(tp->write_seq, st->out_seq_end))
		st->out_seq_end = tp->write_seq;

	/* The out message: acknowledged, or (without TX timestamps) sent. */
	if (st->cur.w0 && st->out_seq_end != st->out_seq_start) {
		if (!st->msg_tstamp && !st->cur.x1 && !after(st->out_seq_end, tp->snd_nxt))
			mark_x1(st, tp, now);
		if (!st->msg_tstamp && before_eq(st->out_seq_end, ack_seq) && st->cur.x1)
			mark_a1(st, now);
		if (st->wait_last_ns) {
			wait_account(st, now);
			st->wait_cause = classify(sk, tp);
		}
	}

	if (!fresh)
		return 0;
	if (st->phase != PHASE_IN)
		begin_in(st, sk, tp, seq, now);
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
	return 0;
}

/* The app read: d1 once the whole in message so far is consumed. */
SEC("tp_btf/sock_recv_length")
int BPF_PROG(lattrace_recv_length, struct sock *sk, int ret, int flags)
{
	struct tcp_sock *tp;
	struct lt_sock *st;

	if (ret <= 0 || (flags & MSG_PEEK))
		return 0;
	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (!st && (!is_tcp(sk) || !task_in_scope() || !(st = sock_state(sk, true))))
		return 0;
	note_owner(&st->owner);
	tp = tcp_sk_of(sk);
	if (!tp || st->phase != PHASE_IN)
		return 0;
	if (!after(st->in_seq_end, tp->copied_seq))
		st->cur.d1 = bpf_ktime_get_ns();
	return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(lattrace_retransmit, struct sock *sk, struct sk_buff *skb, int err)
{
	struct tcp_skb_cb *cb = (struct tcp_skb_cb *)&skb->cb[0];
	struct lt_sock *st;
	__u32 seq;
	__u64 now;

	if (err)
		return 0;
	st = sock_state(sk, false);
	if (!st || !st->cur.w0 || !st->cur.x1)
		return 0;
	/* A retransmission of the out message after its last byte was first
	 * sent and before the reply: the time since x1 is lost to recovery
	 * (the last one that happens is the one that got through). */
	seq = cb->seq;
	if (st->phase == PHASE_OUT && !after(st->out_seq_start, seq) && after(st->out_seq_end, seq)) {
		now = bpf_ktime_get_ns();
		st->cur.loss_out_ns = now - st->cur.x1;
	}
	return 0;
}

SEC("tp_btf/tcp_cong_state_set")
int BPF_PROG(lattrace_cong_state, struct sock *sk, u8 ca_state)
{
	struct lt_sock *st;

	if (ca_state != TCP_CA_Loss)
		return 0;
	st = sock_state(sk, false);
	if (st)
		st->cur.rtos++;
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(lattrace_set_state, struct sock *sk, int oldstate, int newstate)
{
	struct lt_conn_close *rec;
	struct tcp_sock *tp;
	struct lt_sock *st;
	__u64 now;

	if (!is_tcp(sk))
		return 0;
	if (newstate == TCP_SYN_SENT) {
		st = sock_state(sk, task_in_scope());
		if (st) {
			st->syn_ns = bpf_ktime_get_ns();
			st->partial = 0;
		}
		return 0;
	}
	/* The role, the flow (the local port is chosen by now) and the time
	 * come from the state change itself, so they are right even where
	 * sockops is not attached; sockops, which follows, adds RTT samples
	 * and TX timestamps. */
	if (newstate == TCP_ESTABLISHED && (oldstate == TCP_SYN_SENT || oldstate == TCP_SYN_RECV)) {
		st = sock_state(sk, oldstate == TCP_SYN_RECV && !filter_cgroup);
		if (st) {
			st->role = oldstate == TCP_SYN_SENT ? LT_ROLE_CLIENT : LT_ROLE_SERVER;
			st->established_ns = bpf_ktime_get_ns();
			st->last_activity_ns = st->established_ns;
			st->partial = 0;
			read_flow(sk, &st->flow);
		}
		return 0;
	}
	if (newstate != TCP_CLOSE)
		return 0;
	st = sock_state(sk, false);
	if (!st)
		return 0;
	now = bpf_ktime_get_ns();
	tp = bpf_skc_to_tcp_sock(sk);
	if (st->phase != PHASE_NONE) {
		emit_exchange(st, tp, now);
		st->phase = PHASE_NONE;
		__builtin_memset(&st->cur, 0, sizeof(st->cur));
	}
	rec = bpf_ringbuf_reserve(&events, sizeof(*rec), 0);
	if (!rec) {
		count(LT_CNT_RINGBUF_FULL);
		return 0;
	}
	rec->hdr.kind = LT_RECORD_CONN_CLOSE;
	rec->hdr.layout = LT_LAYOUT;
	rec->hdr.ts_ns = now;
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
	rec->_pad = 0;
	submit(rec, sizeof(*rec));
	/* A socket whose connect() failed may connect again: start afresh. */
	st->sendmsg_calls = 0;
	st->bytes_sent = 0;
	st->send_skbs = 0;
	return 0;
}

/* One lt_inflight for a followed socket, for the live view. It reads only
 * socket metadata, like the rest. */
static __always_inline void write_inflight(struct seq_file *seq, struct sock *sk, struct lt_sock *st)
{
	struct lt_inflight rec = {};
	struct tcp_sock *tp;

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
	if (st->phase != PHASE_NONE) {
		rec.role = st->cur.role;
		rec.start_ns = st->cur.w0 ? st->cur.w0 : st->cur.r0;
		if (st->cur.r0 && st->cur.r0 < rec.start_ns)
			rec.start_ns = st->cur.r0;
		rec.bytes_out = tp->write_seq - st->out_seq_start;
		rec.bytes_in = tp->rcv_nxt - st->in_seq_start;
	}
	bpf_seq_write(seq, &rec, sizeof(rec));
}

/* The iterator over the socket storage: every followed socket of the node. */
SEC("iter/bpf_sk_storage_map")
int lattrace_inflight(struct bpf_iter__bpf_sk_storage_map *ctx)
{
	struct sock *sk = ctx->sk;
	struct lt_sock *st = ctx->value;

	if (sk && st)
		write_inflight(ctx->meta->seq, sk, st);
	return 0;
}

/* The fallback where the kernel refuses iterators over map elements: the
 * TCP sockets of the reader's network namespace, each looked up in the
 * socket storage. */
SEC("iter/tcp")
int lattrace_inflight_tcp(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	struct tcp_sock *tp;
	struct lt_sock *st;

	if (!skc)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	st = bpf_sk_storage_get(&socks, tp, 0, 0);
	if (st)
		write_inflight(ctx->meta->seq, (struct sock *)tp, st);
	return 0;
}
