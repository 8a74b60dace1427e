/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * http2.bpf.h: HTTP/2's framing on cleartext connections (h2c, gRPC
 * without TLS), read from each segment as it leaves or arrives
 * (cgroup_skb). What is read, and nothing else: the first 24 bytes of the
 * client's direction (the connection preface), the first 9 bytes of the
 * server's (the frame header of its SETTINGS), and the 9-byte header of
 * every frame (length, type, flags, stream id). Never a header block
 * (HPACK) or DATA content: the walk jumps from header to header by the
 * length field. `lattrace daemon --http2-framing=false` leaves these
 * programs unattached.
 *
 * A connection's first byte each way decides: only one that opens as
 * HTTP/2 gets framing state (h2socks), where each direction keeps where
 * its next frame header starts as a sequence number, so retransmissions
 * and GSO/GRO segment sizes change nothing; a header split across two
 * segments is completed from the bytes kept. A gap (a lost segment on the
 * way in, whose successors arrive first) loses the framing of that
 * direction once the walk would need bytes that already went by: counted
 * (LT_CNT_H2_UNSYNCED), and flagged on the connection.
 */
#ifndef LATTRACE_HTTP2_BPF_H
#define LATTRACE_HTTP2_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"
#include "sock_state.bpf.h"
#include "tcp.bpf.h"

#define H2_HEADER_LEN 9
#define H2_PREFACE_LEN 24
/* Frame headers followed in one segment: a GSO segment holds up to 64 KB,
 * and frames are at least 9 bytes; more in one segment is counted as lost
 * framing rather than walked. */
#define H2_MAX_FRAMES 128

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD

/* "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" as three little-endian words. */
#define H2_PREFACE_0 0x5448202a20495250ULL
#define H2_PREFACE_1 0x0a0d302e322f5054ULL
#define H2_PREFACE_2 0x0a0d0a0d4d530a0dULL

/* Where the TCP payload of skb starts (cgroup_skb sees the IP header
 * first) and its first sequence number. */
static __always_inline bool tcp_payload(struct __sk_buff *skb, __u32 *off, __u32 *seq)
{
	struct tcphdr th;
	__u32 l3;
	__u8 b;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, 0, &b, 1))
			return false;
		l3 = (b & 0xf) * 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		/* No extension headers between IPv6 and TCP on a TCP socket's
		 * own segments. */
		if (bpf_skb_load_bytes(skb, 6, &b, 1) || b != IPPROTO_TCP)
			return false;
		l3 = 40;
	} else {
		return false;
	}
	if (bpf_skb_load_bytes(skb, l3, &th, sizeof(th)))
		return false;
	*seq = bpf_ntohl(th.seq);
	*off = l3 + th.doff * 4;
	return true;
}

/* v, known to be 1..8, in a form older verifiers (6.1) can bound: they
 * lose a range checked as (v - 1) > 7, which is how clang compiles it. */
static __always_inline __u32 one_to_eight(__u32 v)
{
	return ((v - 1) & 7) + 1;
}

/* The framing of this direction is lost: it is followed no further. */
static __always_inline void h2_unsync(struct h2_state *h2, struct h2_dir *dir)
{
	dir->on = 0;
	if ((h2->flags & (LT_H2_SEEN | LT_H2_UNSYNCED)) == LT_H2_SEEN)
		count(LT_CNT_H2_UNSYNCED);
	__sync_fetch_and_or(&h2->flags, LT_H2_UNSYNCED);
}

/* A frame's payload length, from its header's first bytes (hdr4, in wire
 * order from the low byte: the 24-bit length, then the type). */
static __always_inline __u32 h2_length(__u64 hdr4)
{
	return ((hdr4 & 0xff) << 16) | (hdr4 & 0xff00) | ((hdr4 >> 16) & 0xff);
}

/* One frame header (hdr4 as for h2_length): counted by type; returns the
 * frame's payload length. */
static __always_inline __u32 h2_frame(struct h2_state *h2, __u64 hdr4)
{
	__u8 type = hdr4 >> 24;

	h2->frames[type < LT_H2_OTHER ? type : LT_H2_OTHER]++;
	return h2_length(hdr4);
}

/* The first bytes of a direction, at off: the client's preface (the
 * connection is HTTP/2), or a frame header that can open the server's
 * side (SETTINGS on stream 0, no flags, whole settings: followed on trust
 * until the client's preface confirms it); anything else is not HTTP/2. */
static __always_inline int h2_opening(struct __sk_buff *skb, __u32 off, __u32 len)
{
	__u64 w[3];
	__u8 *h = (__u8 *)w;

	if (len >= H2_PREFACE_LEN && !bpf_skb_load_bytes(skb, off, w, H2_PREFACE_LEN) &&
	    w[0] == H2_PREFACE_0 && w[1] == H2_PREFACE_1 && w[2] == H2_PREFACE_2)
		return H2_PREFACE_LEN;
	if (len < H2_HEADER_LEN || bpf_skb_load_bytes(skb, off, w, H2_HEADER_LEN))
		return -1;
	if (h[3] == LT_H2_SETTINGS && h[4] == 0 && !h[5] && !h[6] && !h[7] && !h[8] && h2_length(w[0]) % 6 == 0 &&
	    h2_length(w[0]) <= 16 * 6)
		return 0;
	return -1;
}

/* The direction d is decided (its first byte seen, or gone by) and did not
 * open as HTTP/2. A connection its other side opened on trust (a
 * server's SETTINGS) without the client's preface is not HTTP/2: its
 * state goes; one that is HTTP/2 has lost this direction's framing. */
static __always_inline void h2_not_opened(struct lt_sock *st, struct bpf_sock *sk)
{
	struct h2_state *h2;

	if (!(st->h2 & H2_FOLLOWED))
		return;
	h2 = bpf_sk_storage_get(&h2socks, sk, 0, 0);
	if (!h2)
		return;
	if (h2->flags & LT_H2_SEEN) {
		__sync_fetch_and_or(&h2->flags, LT_H2_UNSYNCED);
		count(LT_CNT_H2_UNSYNCED);
		return;
	}
	__sync_fetch_and_and(&st->h2, ~(__u32)H2_FOLLOWED);
	bpf_sk_storage_delete(&h2socks, sk);
}

/* A segment that may hold direction d's first byte (the initial sequence
 * number + 1): does the direction open as HTTP/2? True when it is
 * followed from here, with its state in h2socks. */
static __always_inline bool h2_open(struct lt_sock *st, struct bpf_sock *sk, struct __sk_buff *skb, int d, __u32 off, __u32 seq,
				    __u32 len)
{
	__u32 decided = d == H2_OUT ? H2_OUT_DECIDED : H2_IN_DECIDED;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	struct h2_state *h2;
	__u32 first;
	int opening;

	if (!tp)
		return false;
	first = (d == H2_OUT ? isn_local(tp, st->role == LT_ROLE_CLIENT) : isn_remote(tp)) + 1;
	if (seq != first) {
		/* The first bytes went by unseen (a gap on the way in). */
		if (after(seq, first)) {
			__sync_fetch_and_or(&st->h2, decided);
			h2_not_opened(st, sk);
		}
		return false;
	}
	__sync_fetch_and_or(&st->h2, decided);
	opening = h2_opening(skb, off, len);
	if (opening < 0) {
		h2_not_opened(st, sk);
		return false;
	}
	/* The two directions may open at once on two CPUs (a server writes
	 * its SETTINGS as the client's preface arrives): the one that loses
	 * the race to create the state finds it. */
	h2 = bpf_sk_storage_get(&h2socks, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!h2)
		h2 = bpf_sk_storage_get(&h2socks, sk, 0, 0);
	if (!h2) {
		count(LT_CNT_STORAGE_FAIL);
		return false;
	}
	if (opening == H2_PREFACE_LEN)
		__sync_fetch_and_or(&h2->flags, LT_H2_SEEN);
	h2->dir[d].next_seq = seq + opening;
	h2->dir[d].max_end = seq + opening;
	h2->dir[d].on = 1;
	__sync_fetch_and_or(&st->h2, H2_FOLLOWED);
	return true;
}

/* Walks direction dir's frame headers through the segment's payload
 * (len bytes at off, from sequence number seq). Bytes load into stack
 * words at fixed places: older verifiers (6.1, 6.12) refuse a load into
 * the map value at a variable offset. */
static __always_inline void h2_walk(struct h2_state *h2, struct h2_dir *dir, struct __sk_buff *skb, __u32 off, __u32 seq, __u32 len)
{
	__u32 end = seq + len, need, flen, want, have;
	__u64 hdr[2], rest;
	__s32 rel;
	int i;

	if (after(end, dir->max_end))
		dir->max_end = end;

	/* The rest of a header whose first bytes ended an earlier segment. */
	have = dir->have;
	if (have) {
		if (have >= H2_HEADER_LEN) {
			h2_unsync(h2, dir);
			return;
		}
		want = dir->next_seq + have;
		rel = want - seq;
		if (rel < 0 || (__u32)rel >= len)
			goto check_gap;
		need = H2_HEADER_LEN - have;
		if (need < 1 || need > 8 || len - rel < need) {
			/* Still not whole (a segment of a few bytes). */
			h2_unsync(h2, dir);
			return;
		}
		rest = 0;
		if (bpf_skb_load_bytes(skb, off + rel, &rest, one_to_eight(need)))
			return;
		/* The length and type (the first four bytes) are in the kept
		 * part, or straddle it and the rest. */
		hdr[0] = dir->part;
		if (have < 4)
			hdr[0] |= rest << (8 * have);
		flen = h2_frame(h2, hdr[0]);
		dir->next_seq += H2_HEADER_LEN + flen;
		dir->have = 0;
	}

	for (i = 0; i < H2_MAX_FRAMES; i++) {
		want = dir->next_seq;
		rel = want - seq;
		if (rel < 0 || (__u32)rel >= len)
			goto check_gap;
		if (len - rel < H2_HEADER_LEN) {
			/* Split by the segment's end: keep its first bytes. */
			need = len - rel;
			if (need < 1 || need > 8)
				return;
			rest = 0;
			if (bpf_skb_load_bytes(skb, off + rel, &rest, one_to_eight(need)))
				return;
			dir->part = rest;
			dir->have = need;
			return;
		}
		if (bpf_skb_load_bytes(skb, off + rel, hdr, H2_HEADER_LEN))
			return;
		flen = h2_frame(h2, hdr[0]);
		dir->next_seq += H2_HEADER_LEN + flen;
	}
	h2_unsync(h2, dir);
	return;

check_gap:
	/* The bytes wanted next are beyond this segment but already went by
	 * (they came before a gap was filled): the framing is lost. Before
	 * this segment (a gap yet to fill) they are still to come. */
	if (rel >= 0 && !before(want, end) && before(want, dir->max_end))
		h2_unsync(h2, dir);
}

/* A segment of the connection leaves (d = H2_OUT) or arrives (H2_IN). */
static __always_inline void h2_segment(struct __sk_buff *skb, int d)
{
	__u32 decided = d == H2_OUT ? H2_OUT_DECIDED : H2_IN_DECIDED;
	struct bpf_sock *sk = skb->sk;
	struct h2_state *h2;
	struct lt_sock *st;
	__u32 off, seq;

	if (!sk)
		return;
	sk = bpf_sk_fullsock(sk);
	if (!sk || sk->protocol != IPPROTO_TCP)
		return;
	/* Only connections lattrace follows from their start. */
	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (!st || st->partial || ((st->h2 & decided) && !(st->h2 & H2_FOLLOWED)))
		return;
	if (!tcp_payload(skb, &off, &seq) || skb->len <= off)
		return;
	if (!(st->h2 & decided) && !h2_open(st, sk, skb, d, off, seq, skb->len - off))
		return;
	h2 = bpf_sk_storage_get(&h2socks, sk, 0, 0);
	if (!h2 || !h2->dir[d].on)
		return;
	h2_walk(h2, &h2->dir[d], skb, off, seq, skb->len - off);
}

#endif /* LATTRACE_HTTP2_BPF_H */
