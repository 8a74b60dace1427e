/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * tcp.bpf.h: reading the kernel's TCP sockets: sequence arithmetic, the
 * tcp_sock behind a struct sock, and a connection's flow (addresses, ports,
 * namespace).
 *
 * tp_btf and fentry arguments are trusted BTF pointers: their fields are
 * read with plain (CO-RE relocated) loads, several times cheaper than a
 * bpf_probe_read_kernel call each. BPF_CORE_READ stays where a pointer is
 * cast beyond its BTF type, or where the kernel lacks the cast kfunc.
 */
#ifndef LATTRACE_TCP_BPF_H
#define LATTRACE_TCP_BPF_H

#include "common.bpf.h"

extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;

/* Sequence numbers wrap: compare them as the kernel's before()/after() do. */
static __always_inline bool after(__u32 a, __u32 b) { return (__s32)(a - b) > 0; }
static __always_inline bool before_eq(__u32 a, __u32 b) { return (__s32)(a - b) <= 0; }
static __always_inline bool before(__u32 a, __u32 b) { return (__s32)(a - b) < 0; }

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
 * (a tp_btf argument, or bpf_skc_to_tcp_sock's result in sockops), so its
 * fields are plain loads: a connection's state change reads a dozen of
 * them, and a probe-read call each would double its cost. */
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

/* The connection's initial sequence numbers, from what the socket has
 * acknowledged and received since. bytes_received counts data only,
 * which follows the SYN's sequence number; bytes_acked counts the SYN too
 * on the end that sent it first (the ACK of our SYN moves snd_una), not on
 * the accepting end (whose snd_una starts past its SYN-ACK). */
static __always_inline __u32 isn_local(struct tcp_sock *tp, bool client)
{
	return tp->snd_una - (__u32)tp->bytes_acked - !client;
}

static __always_inline __u32 isn_remote(struct tcp_sock *tp)
{
	return tp->rcv_nxt - (__u32)tp->bytes_received - 1;
}

/* tcp_skb_cb.tcp_flags: the header's flags byte. */
#define TCPHDR_FIN 0x01

/* Bytes the app has written on the connection, in 64 bits (sequence
 * numbers wrap at 4 GiB): the kernel's count of acknowledged bytes plus
 * those written and not yet acknowledged. */
static __always_inline __u64 written64(struct tcp_sock *tp)
{
	return tp->bytes_acked + (__u32)(tp->write_seq - tp->snd_una);
}

/* Packets in flight, as the kernel's tcp_packets_in_flight() counts them. */
static __always_inline __u32 in_flight(struct tcp_sock *tp)
{
	return tp->packets_out - (tp->sacked_out + tp->lost_out) + tp->retrans_out;
}

#endif /* LATTRACE_TCP_BPF_H */
