/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * listeners.bpf.h: the role of a connection open before lattrace started,
 * from the kernel's truth. An accepted socket shares its listener's local
 * port, and connect() never picks a local port a bound socket holds, so
 * an adopted end is the server when its network namespace has a listening
 * socket on its local port, and the client when none has (the table below
 * knows every listener of the namespace). Only where the table cannot
 * know (the namespace was never read) is the role guessed from the ports.
 *
 * The table is kept by the state tracepoint (listen() and a listener's
 * close) and seeded at the daemon's start by a TCP iterator in each
 * network namespace; a mark on each listening socket makes it counted
 * once, whichever of the two sees it first.
 */
#ifndef LATTRACE_LISTENERS_BPF_H
#define LATTRACE_LISTENERS_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"

#define TCP_LISTEN 10

struct listener_key {
	__u32 netns;
	__u32 port; /* host byte order */
};

/* Listening sockets by (namespace, local port): how many (SO_REUSEPORT
 * groups and one per address share a port). An entry that falls to zero
 * stays: deleting it here could lose the count of a listener opening on
 * the same port at once (an SO_REUSEPORT hot restart); the daemon deletes
 * those of namespaces that are gone (Tracer.pruneListeners). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct listener_key);
	__type(value, __u32);
} listeners SEC(".maps");

/* On a listening socket: counted in listeners, under this key. */
struct listening {
	struct listener_key key;
	__u32 counted;
};

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct listening);
} listening SEC(".maps");

/* Network namespaces whose listeners the table holds all of: the daemon
 * adds each one once its seeding iterator has walked it, and deletes
 * those that are gone. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u8);
} netns_seeded SEC(".maps");

/* sk listens (listen(), or found listening by the seeding iterator). */
static __always_inline void listener_opened(struct sock *sk)
{
	struct listening *l = bpf_sk_storage_get(&listening, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	__u32 one = 1, *n;

	if (!l) {
		count(LT_CNT_LISTENERS_LOST);
		return;
	}
	/* listen() without bind() chooses its port after the state change:
	 * that listener is left to the seeding iterator (none here). */
	if (!sk->__sk_common.skc_num || __sync_val_compare_and_swap(&l->counted, 0, 1) != 0)
		return;
	l->key.netns = sk->__sk_common.skc_net.net->ns.inum;
	l->key.port = sk->__sk_common.skc_num;
	n = bpf_map_lookup_elem(&listeners, &l->key);
	if (n) {
		__sync_fetch_and_add(n, 1);
	} else if (bpf_map_update_elem(&listeners, &l->key, &one, BPF_NOEXIST)) {
		n = bpf_map_lookup_elem(&listeners, &l->key);
		if (n)
			__sync_fetch_and_add(n, 1);
		else
			count(LT_CNT_LISTENERS_LOST);
	}
}

/* sk stops listening (closed, or listen() failed after the state was
 * set). The port is the one it was counted under: the kernel releases
 * skc_num before the state change. */
static __always_inline void listener_closed(struct sock *sk)
{
	struct listening *l = bpf_sk_storage_get(&listening, sk, 0, 0);
	__u32 *n;

	if (!l || __sync_val_compare_and_swap(&l->counted, 1, 0) != 1)
		return;
	n = bpf_map_lookup_elem(&listeners, &l->key);
	if (n)
		__sync_fetch_and_sub(n, 1);
}

/* The role of an end adopted mid-connection: LT_ROLE_SERVER or
 * LT_ROLE_CLIENT from the listeners, LT_ROLE_UNKNOWN where its namespace
 * was never read (the exchanges then guess it from the ports, and say
 * so). */
static __always_inline __u32 adopted_role(const struct lt_flow *f)
{
	struct listener_key key = {.netns = f->netns, .port = f->sport};
	__u32 netns = f->netns, *n;

	if (!bpf_map_lookup_elem(&netns_seeded, &netns)) {
		count(LT_CNT_ADOPTED_GUESSED);
		return LT_ROLE_UNKNOWN;
	}
	n = bpf_map_lookup_elem(&listeners, &key);
	if (n && *n > 0) {
		count(LT_CNT_ADOPTED_SERVER);
		return LT_ROLE_SERVER;
	}
	count(LT_CNT_ADOPTED_CLIENT);
	return LT_ROLE_CLIENT;
}

#endif /* LATTRACE_LISTENERS_BPF_H */
