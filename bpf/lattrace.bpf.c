// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * lattrace.bpf.c: the kernel side of lattrace.
 *
 * Hooks are tp_btf tracepoints and sockops only: kernels that refuse
 * trampolines (fentry) and kprobes still run every program here.
 * Per-socket state lives in socket local storage, so it is freed with the
 * socket and no map grows without bound. Only metadata is read, never a
 * payload byte.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>

#include "lattrace.h"

#define AF_INET 2
#define AF_INET6 10
#define TCP_CLOSE 7 /* enum tcp_state is not in every vmlinux.h as a named enum */

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* bpf2go -type needs each exported type to be used by a global. */
const struct lt_conn_close *unused_lt_conn_close __attribute__((unused));
const enum lt_counter *unused_lt_counter __attribute__((unused));
const enum lt_record_kind *unused_lt_record_kind __attribute__((unused));
const enum lt_role *unused_lt_role __attribute__((unused));

/* Set by the loader: wake user space only once the ring holds this many bytes;
 * below it the daemon drains on a timer. A wakeup costs microseconds here,
 * far more than a record. */
const volatile __u64 wakeup_bytes = 256 * 1024;

struct lt_sock {
	__u64 established_ns;
	__u64 sendmsg_calls;
	__u64 bytes_sent;
	__u64 send_skbs;
	struct lt_owner owner;
	__u32 role;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct lt_sock);
} socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 * 1024 * 1024);
} events SEC(".maps");

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

static __always_inline bool is_tcp(const struct sock *sk)
{
	__u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);

	if (family != AF_INET && family != AF_INET6)
		return false;
	return BPF_CORE_READ(sk, sk_protocol) == IPPROTO_TCP &&
	       BPF_CORE_READ(sk, sk_type) == SOCK_STREAM;
}

static __always_inline struct lt_sock *sock_state(struct sock *sk, bool create)
{
	struct lt_sock *st;

	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (st || !create)
		return st;
	st = bpf_sk_storage_get(&socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		count(LT_CNT_STORAGE_FAIL);
	else
		count(LT_CNT_SOCKS_TRACKED);
	return st;
}

static __always_inline void read_flow(const struct sock *sk, struct lt_flow *f)
{
	__builtin_memset(f, 0, sizeof(*f));
	f->family = BPF_CORE_READ(sk, __sk_common.skc_family);
	/* inet_sport, not skc_num: on the way to CLOSE the kernel releases the
	 * port (skc_num = 0) before the state change is traced. */
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

/* Called from process context only: the current task owns the socket. */
static __always_inline void note_owner(struct lt_owner *o)
{
	__u64 id = bpf_get_current_pid_tgid();

	o->pid = id >> 32;
	o->tid = (__u32)id;
	o->cgroup_id = bpf_get_current_cgroup_id();
	bpf_get_current_comm(o->comm, sizeof(o->comm));
}

static __always_inline void submit(void *rec)
{
	__u64 flags = BPF_RB_NO_WAKEUP;

	if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes)
		flags = BPF_RB_FORCE_WAKEUP;
	bpf_ringbuf_submit(rec, flags);
	count(LT_CNT_RECORDS);
}

/* A new connection gets its state here, from the kernel's own view of who
 * initiated it; STATE_CB is switched on so close is seen by sockops too. */
SEC("sockops")
int lattrace_sockops(struct bpf_sock_ops *skops)
{
	struct lt_sock *st;
	struct bpf_sock *bsk;
	__u32 role;

	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		role = LT_ROLE_CLIENT;
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		role = LT_ROLE_SERVER;
		break;
	default:
		return 1;
	}
	bsk = skops->sk;
	if (!bsk)
		return 1;
	st = bpf_sk_storage_get(&socks, bsk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st) {
		count(LT_CNT_STORAGE_FAIL);
		return 1;
	}
	count(LT_CNT_SOCKS_TRACKED);
	st->role = role;
	st->established_ns = bpf_ktime_get_ns();
	return 1;
}

/* Once per sendmsg()/write() on any socket, with its result. */
SEC("tp_btf/sock_send_length")
int BPF_PROG(lattrace_send_length, struct sock *sk, int ret, int flags)
{
	struct lt_sock *st;

	if (ret <= 0 || !is_tcp(sk))
		return 0;
	st = sock_state(sk, true);
	if (!st)
		return 0;
	st->sendmsg_calls++;
	st->bytes_sent += ret;
	note_owner(&st->owner);
	return 0;
}

/* Once per skb a send fills (a large write fills several). */
SEC("tp_btf/tcp_sendmsg_locked")
int BPF_PROG(lattrace_sendmsg_locked, struct sock *sk, struct msghdr *msg, struct sk_buff *skb, int size_goal)
{
	struct lt_sock *st = sock_state(sk, true);

	if (st)
		st->send_skbs++;
	return 0;
}

SEC("tp_btf/inet_sock_set_state")
int BPF_PROG(lattrace_set_state, struct sock *sk, int oldstate, int newstate)
{
	struct lt_conn_close *rec;
	struct lt_sock *st;

	if (newstate != TCP_CLOSE || !is_tcp(sk))
		return 0;
	st = sock_state(sk, false);
	if (!st)
		return 0;
	rec = bpf_ringbuf_reserve(&events, sizeof(*rec), 0);
	if (!rec) {
		count(LT_CNT_RINGBUF_FULL);
		return 0;
	}
	rec->hdr.kind = LT_RECORD_CONN_CLOSE;
	rec->hdr._pad = 0;
	rec->hdr.ts_ns = bpf_ktime_get_ns();
	rec->cookie = bpf_get_socket_cookie(sk);
	read_flow(sk, &rec->flow);
	rec->owner = st->owner;
	rec->established_ns = st->established_ns;
	rec->sendmsg_calls = st->sendmsg_calls;
	rec->bytes_sent = st->bytes_sent;
	rec->send_skbs = st->send_skbs;
	rec->role = st->role;
	rec->_pad = 0;
	submit(rec);
	/* A socket whose connect() failed may connect again: start afresh. */
	st->sendmsg_calls = 0;
	st->bytes_sent = 0;
	st->send_skbs = 0;
	return 0;
}
