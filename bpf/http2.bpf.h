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
 * HTTP/2 gets framing state (h2socks). The client's direction opens with
 * the whole preface in its first segment, the server's with the whole
 * header of a SETTINGS frame; a preface or header cut there is not taken
 * for HTTP/2. The client's first frame after its preface must be its
 * SETTINGS (RFC 9113, 3.4): anything else there, whatever frames it seems
 * to hold, loses the framing, as below. Each direction keeps where its
 * next frame header starts as a sequence number, so retransmissions and
 * GSO/GRO segment sizes change nothing; a header split across two segments
 * is completed from the bytes kept, one split across three (a segment of a
 * few bytes inside it) loses the framing. A gap (a lost segment on the way
 * in, whose successors arrive first) loses the framing of that direction
 * once the walk would need bytes that already went by. A loss is counted
 * (LT_CNT_H2_UNSYNCED), and flagged on the connection.
 *
 * Once the client's preface is seen (H2_STREAMS), the connection's streams
 * are followed: each frame of a stream (DATA, HEADERS, RST_STREAM) and
 * each incoming WINDOW_UPDATE leaves an event when its last byte crosses
 * the socket's edge, and each write
 * and read one with its sequence numbers (LT_RECORD_H2). User space
 * (daemon/streams) cuts them into one exchange per stream; the
 * connection's own exchanges are then flagged LT_EX_H2_STREAMS. Losing
 * the framing either way ends that: the connection falls back to its own
 * exchanges.
 */
#ifndef LATTRACE_HTTP2_BPF_H
#define LATTRACE_HTTP2_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"
#include "h2_resync.bpf.h"
#include "path_rtt.bpf.h"
#include "ringbuf.bpf.h"
#include "send_wait.bpf.h"
#include "sock_state.bpf.h"
#include "tcp.bpf.h"

#define H2_END_STREAM 0x1
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
 * first), its first sequence number and whether it is pushed (PSH). */
static __always_inline bool tcp_payload(struct __sk_buff *skb, __u32 *off, __u32 *seq, bool *psh)
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
	*psh = th.psh;
	return true;
}

/* v, known to be 1..8, in a form older verifiers (6.1) can bound: they
 * lose a range checked as (v - 1) > 7, which is how clang compiles it.
 * The empty asm hides v's range from clang, which would otherwise drop
 * the mask as redundant. */
static __always_inline __u32 one_to_eight(__u32 v)
{
	v -= 1;
	barrier_var(v);
	return (v & 7) + 1;
}

/* The framing of this direction is lost: it is followed no further. */

/* A frame's payload length, from its header's first bytes (hdr4, in wire
 * order from the low byte: the 24-bit length, then the type). */
static __always_inline __u32 h2_length(__u64 hdr4)
{
	return ((hdr4 & 0xff) << 16) | (hdr4 & 0xff00) | ((hdr4 >> 16) & 0xff);
}

/* A frame's stream id, from its header's first eight bytes (lo, as
 * h2_length has them) and its ninth (b8); the reserved bit left out. */
static __always_inline __u32 h2_stream_id(__u64 lo, __u8 b8)
{
	return (((lo >> 40) & 0x7f) << 24) | (((lo >> 48) & 0xff) << 16) | (((lo >> 56) & 0xff) << 8) | b8;
}

/* Whether a frame header is the SETTINGS a client follows its preface
 * with (RFC 9113, 3.4): on stream 0, no ACK, whole settings. */
static __always_inline bool h2_client_settings(__u64 lo, __u8 b8)
{
	return ((lo >> 24) & 0xff) == LT_H2_SETTINGS && !((lo >> 32) & 0xff) && !h2_stream_id(lo, b8) && h2_length(lo) % 6 == 0;
}

/* An event of a followed connection, its common part filled; 0 when the
 * ring buffer is full (counted). */
static __always_inline struct lt_h2_event *h2_event(struct lt_sock *st, __u32 kind, __u64 now)
{
	struct lt_h2_event *ev = reserve(sizeof(*ev), LT_RECORD_H2, now);

	if (!ev)
		return 0;
	ev->cookie = st->cookie;
	ev->flow = st->flow;
	ev->owner = st->owner;
	ev->kind = kind;
	ev->conn_role = st->role;
	ev->seq = 0;
	ev->end_seq = 0;
	ev->t0 = 0;
	ev->t1 = now;
	ev->stream = 0;
	ev->type = 0;
	ev->flags = 0;
	ev->wait_cause = LT_WAIT_OTHER;
	ev->adopted = st->partial;
	ev->srtt_us = 0;
	ev->min_rtt_us = 0;
	ev->path_rtt_us = 0;
	ev->path_min_rtt_us = 0;
	ev->isn_local = 0;
	ev->isn_remote = 0;
	ev->syn_ns = st->syn_ns;
	return ev;
}

/* The connection's streams are followed no more: those in progress end
 * (LT_H2_LOST). */
static __always_inline void h2_streams_end(struct lt_sock *st)
{
	struct lt_h2_event *ev;

	if (!(__sync_fetch_and_and(&st->h2, ~(__u32)H2_STREAMS) & H2_STREAMS))
		return;
	ev = h2_event(st, LT_H2_LOST, bpf_ktime_get_ns());
	if (ev)
		submit(ev, sizeof(*ev));
}

/* The framing of direction d is lost: the connection's streams end. On a
 * connection adopted mid-way the direction's framing is looked for again
 * (h2_resync.bpf.h), as it was from the first; on one followed from its
 * start it is followed no further. UNSYNCED goes up before STREAMS comes
 * down: h2_open, opening the other direction on another CPU, sets STREAMS
 * and then checks UNSYNCED. */
static __always_inline void h2_unsync(struct lt_sock *st, struct h2_state *h2, struct h2_dir *dir, int d)
{
	if (st->partial) {
		h2_resync_drop(st, dir, d);
		h2_streams_end(st);
		return;
	}
	dir->on = 0;
	dir->pend_on = 0;
	if ((h2->flags & (LT_H2_SEEN | LT_H2_UNSYNCED)) == LT_H2_SEEN)
		count(LT_CNT_H2_UNSYNCED);
	__sync_fetch_and_or(&h2->flags, LT_H2_UNSYNCED);
	h2_streams_end(st);
}

/* What a segment's walk needs of its socket: the ISNs, and for an
 * incoming segment the RTTs an answer's network part is taken from, read
 * once per segment. */
struct h2_seg {
	__u32 isn_local, isn_remote;
	__u32 srtt_us, min_rtt_us, path_rtt_us, path_min_rtt_us;
};

static __always_inline void h2_seg_read(struct h2_seg *g, struct lt_sock *st, struct tcp_sock *tp, int d, __u64 now)
{
	struct path_rtt *p;

	__builtin_memset(g, 0, sizeof(*g));
	g->isn_local = isn_local(tp, st->role == LT_ROLE_CLIENT);
	g->isn_remote = isn_remote(tp);
	if (d != H2_IN)
		return;
	g->srtt_us = tp->srtt_us >> 3;
	g->min_rtt_us = tp->rtt_min.s[0].v == ~0U ? 0 : tp->rtt_min.s[0].v;
	p = path_find(&st->flow);
	if (p) {
		g->path_rtt_us = winmin_get(&p->recent, now);
		g->path_min_rtt_us = p->min_rtt_us;
	}
}

/* A frame of a stream, [seq, end), crossed the socket's edge way d: its
 * header at t0, its last byte now. An incoming HEADERS, which opens a
 * request or an answer, carries the RTTs. */
static __always_inline void h2_frame_event(struct lt_sock *st, const struct h2_seg *g, int d, __u32 stream, __u8 type, __u8 flags,
					   __u32 seq, __u32 end, __u64 t0, __u64 now)
{
	struct lt_h2_event *ev = h2_event(st, d == H2_OUT ? LT_H2_FRAME_OUT : LT_H2_FRAME_IN, now);

	if (!ev)
		return;
	ev->seq = seq;
	ev->end_seq = end;
	ev->t0 = t0;
	ev->stream = stream;
	ev->type = type;
	ev->flags = flags;
	ev->isn_local = g->isn_local;
	ev->isn_remote = g->isn_remote;
	if (type == LT_H2_HEADERS) {
		ev->srtt_us = g->srtt_us;
		ev->min_rtt_us = g->min_rtt_us;
		ev->path_rtt_us = g->path_rtt_us;
		ev->path_min_rtt_us = g->path_min_rtt_us;
	}
	submit(ev, sizeof(*ev));
}

/* One whole frame header at fseq, in a segment ending at end: lo holds
 * its first eight bytes in wire order from the low byte (the 24-bit
 * length, the type, the flags, three bytes of the stream id), b8 the
 * ninth. Counted by type; a stream's frame gets its event now if its last
 * byte is in this segment, else when that passes (pend_*). Returns the
 * frame's payload length. */
static __always_inline __u32 h2_frame(struct lt_sock *st, struct h2_state *h2, struct h2_dir *dir, const struct h2_seg *g, int d,
				      __u64 lo, __u8 b8, __u32 fseq, __u32 end, __u64 now)
{
	__u8 type = lo >> 24, flags = lo >> 32;
	__u32 flen = h2_length(lo), stream, fend, i;

	/* The index is checked where it is used: 6.1's verifier loses a
	 * bound that clang checks on a copy. */
	i = type < LT_H2_OTHER ? type : LT_H2_OTHER;
	barrier_var(i);
	if (i < LT_H2_TYPES && !dir->checking)
		h2->frames[i]++;
	stream = h2_stream_id(lo, b8);
	if (!(st->h2 & H2_STREAMS) || dir->checking)
		return flen;
	/* A stream's frames (a header block may go on in CONTINUATION
	 * frames), and the peer's WINDOW_UPDATEs, which a stream held by
	 * HTTP/2's flow control waits for (stream 0: the connection's
	 * window). */
	if (!(stream && (type == LT_H2_DATA || type == LT_H2_HEADERS || type == LT_H2_CONTINUATION || type == LT_H2_RST_STREAM)) &&
	    !(type == LT_H2_WINDOW_UPDATE && d == H2_IN))
		return flen;
	fend = fseq + H2_HEADER_LEN + flen;
	if (!after(fend, end)) {
		h2_frame_event(st, g, d, stream, type, flags, fseq, fend, now, now);
		return flen;
	}
	dir->pend_on = 1;
	dir->pend_type = type;
	dir->pend_flags = flags;
	dir->pend_stream = stream;
	dir->pend_seq = fseq;
	dir->pend_t0 = now;
	return flen;
}

/* The next frame header of a direction being checked on a connection
 * adopted mid-way (h2_resync.bpf.h): false when it breaks a rule. */
static __always_inline bool h2_resync_check(struct lt_sock *st, struct h2_state *h2, struct h2_dir *dir, int d, __u64 lo, __u8 b8)
{
	return h2_resync_step(st, h2, dir, d, h2_length(lo), lo >> 24, lo >> 32, h2_stream_id(lo, b8), (lo >> 40) & 0x80);
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
static __always_inline void h2_not_opened(struct lt_sock *st, struct bpf_sock *sk, int d)
{
	struct h2_state *h2;

	if (!(st->h2 & H2_FOLLOWED))
		return;
	h2 = bpf_sk_storage_get(&h2socks, sk, 0, 0);
	if (!h2)
		return;
	if (h2->flags & LT_H2_SEEN) {
		h2_unsync(st, h2, &h2->dir[d & 1], d);
		return;
	}
	__sync_fetch_and_and(&st->h2, ~(__u32)H2_FOLLOWED);
	bpf_sk_storage_delete(&h2socks, sk);
}

/* A segment that may hold direction d's first byte (the initial sequence
 * number + 1): does the direction open as HTTP/2? True when it is
 * followed from here, with its state in h2socks. */
static __always_inline bool h2_open(struct lt_sock *st, struct bpf_sock *sk, struct tcp_sock *tp, struct __sk_buff *skb, int d,
				    __u32 off, __u32 seq, __u32 len)
{
	__u32 decided = d == H2_OUT ? H2_OUT_DECIDED : H2_IN_DECIDED;
	struct h2_state *h2;
	__u32 first;
	int opening;

	first = (d == H2_OUT ? isn_local(tp, st->role == LT_ROLE_CLIENT) : isn_remote(tp)) + 1;
	if (seq != first) {
		/* The first bytes went by unseen (a gap on the way in). */
		if (after(seq, first)) {
			__sync_fetch_and_or(&st->h2, decided);
			h2_not_opened(st, sk, d);
		}
		return false;
	}
	__sync_fetch_and_or(&st->h2, decided);
	opening = h2_opening(skb, off, len);
	if (opening < 0) {
		h2_not_opened(st, sk, d);
		return false;
	}
	/* A server writes its SETTINGS as the client's preface arrives. */
	h2 = h2_state_new(sk);
	if (!h2)
		return false;
	h2->dir[d].next_seq = seq + opening;
	h2->dir[d].max_end = seq + opening;
	h2->dir[d].settings_next = opening == H2_PREFACE_LEN;
	h2->dir[d].on = 1;
	__sync_fetch_and_or(&st->h2, H2_FOLLOWED);
	if (opening == H2_PREFACE_LEN) {
		__sync_fetch_and_or(&h2->flags, LT_H2_SEEN);
		/* Set, then checked: a loss of the other direction meanwhile
		 * (h2_unsync) either sees STREAMS and clears it, or is seen
		 * here. */
		__sync_fetch_and_or(&st->h2, H2_STREAMS);
		if (h2->flags & LT_H2_UNSYNCED)
			__sync_fetch_and_and(&st->h2, ~(__u32)H2_STREAMS);
	}
	return true;
}

/* Walks direction d's frame headers through the segment's payload (len
 * bytes at off, from sequence number seq). Bytes load into stack words at
 * fixed places: older verifiers (6.1, 6.12) refuse a load into the map
 * value at a variable offset. */
static __always_inline void h2_walk(struct lt_sock *st, struct h2_state *h2, struct tcp_sock *tp, int d, struct __sk_buff *skb,
				    __u32 off, __u32 seq, __u32 len)
{
	struct h2_dir *dir = &h2->dir[d & 1];
	__u32 end = seq + len, need, flen, want, have;
	__u64 hdr[2], rest, now = bpf_ktime_get_ns();
	struct h2_seg g;
	__s32 rel;
	int i;

	if (after(end, dir->max_end))
		dir->max_end = end;
	h2_seg_read(&g, st, tp, d, now);

	/* A stream's frame whose last byte is in this segment. On the way
	 * in, a segment after a hole may hold it before the hole is filled:
	 * rcv_nxt cannot tell, as segments that wait in the socket's backlog
	 * pass here before TCP has taken those ahead of them. */
	if (dir->pend_on && !before(end, dir->next_seq)) {
		dir->pend_on = 0;
		if (st->h2 & H2_STREAMS)
			h2_frame_event(st, &g, d, dir->pend_stream, dir->pend_type, dir->pend_flags, dir->pend_seq, dir->next_seq,
				       dir->pend_t0, now);
	}

	/* The rest of a header whose first bytes ended an earlier segment. */
	have = dir->have;
	if (have) {
		if (have >= H2_HEADER_LEN) {
			h2_unsync(st, h2, dir, d);
			return;
		}
		want = dir->next_seq + have;
		rel = want - seq;
		if (rel < 0 || (__u32)rel >= len)
			goto check_gap;
		need = H2_HEADER_LEN - have;
		if (need < 1 || need > 8 || len - rel < need) {
			/* Still not whole (a segment of a few bytes). */
			h2_unsync(st, h2, dir, d);
			return;
		}
		rest = 0;
		if (bpf_skb_load_bytes(skb, off + rel, &rest, one_to_eight(need)))
			return;
		/* The kept part holds the header's first `have` bytes, rest
		 * the others: the ninth is rest's byte need - 1. */
		hdr[0] = dir->part;
		if (have < 8)
			hdr[0] |= rest << (8 * have);
		hdr[1] = rest >> (8 * ((need - 1) & 7));
		if (dir->settings_next && !h2_client_settings(hdr[0], hdr[1]))
			goto lost;
		dir->settings_next = 0;
		if (dir->checking && !h2_resync_check(st, h2, dir, d, hdr[0], hdr[1]))
			goto lost;
		flen = h2_frame(st, h2, dir, &g, d, hdr[0], hdr[1], dir->next_seq, end, now);
		dir->next_seq += H2_HEADER_LEN + flen;
		dir->have = 0;
	}

	/* The client's first frame after its preface must be its SETTINGS
	 * (RFC 9113, 3.4): anything else is not HTTP/2, whatever frames it
	 * seems to hold. Checked here, before the walk, when its header is
	 * whole in this segment; above once completed when a segment's end
	 * cut it. */
	if (dir->settings_next) {
		rel = dir->next_seq - seq;
		if (rel >= 0 && (__u32)rel < len && len - rel >= H2_HEADER_LEN) {
			hdr[1] = 0;
			if (bpf_skb_load_bytes(skb, off + rel, hdr, H2_HEADER_LEN))
				return;
			if (!h2_client_settings(hdr[0], hdr[1]))
				goto lost;
			dir->settings_next = 0;
		}
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
		hdr[1] = 0;
		if (bpf_skb_load_bytes(skb, off + rel, hdr, H2_HEADER_LEN))
			return;
		if (dir->checking && !h2_resync_check(st, h2, dir, d, hdr[0], hdr[1]))
			goto lost;
		flen = h2_frame(st, h2, dir, &g, d, hdr[0], hdr[1], want, end, now);
		dir->next_seq += H2_HEADER_LEN + flen;
	}
	/* More frames in the segment than are walked, or not HTTP/2 (on a
	 * connection adopted mid-way: a candidate that fails its check). */
lost:
	h2_unsync(st, h2, dir, d);
	return;

check_gap:
	/* The bytes wanted next are beyond this segment but already went by
	 * (they came before a gap was filled): the framing is lost. Before
	 * this segment (a gap yet to fill) they are still to come. */
	if (rel >= 0 && !before(want, end) && before(want, dir->max_end))
		h2_unsync(st, h2, dir, d);
}

/* A segment of the connection leaves (d = H2_OUT) or arrives (H2_IN). */
static __always_inline void h2_segment(struct __sk_buff *skb, int d)
{
	__u32 decided = d == H2_OUT ? H2_OUT_DECIDED : H2_IN_DECIDED;
	struct bpf_sock *sk = skb->sk;
	struct h2_state *h2;
	struct tcp_sock *tp;
	struct lt_sock *st;
	__u32 off, seq;
	bool psh, candidate = false;

	if (!sk)
		return;
	sk = bpf_sk_fullsock(sk);
	if (!sk || sk->protocol != IPPROTO_TCP)
		return;
	/* Connections lattrace follows from their start, and those adopted
	 * mid-way whose role is known (the stream ids' parity needs it). */
	st = bpf_sk_storage_get(&socks, sk, 0, 0);
	if (!st || (st->partial && !st->role) || ((st->h2 & decided) && !(st->h2 & H2_FOLLOWED)))
		return;
	if (!tcp_payload(skb, &off, &seq, &psh) || skb->len <= off)
		return;
	/* Adopted mid-way, this direction's framing not found yet: does the
	 * segment start a write, and (pushed) the end of one of the peer's
	 * writes, where its next one begins. A followed connection's
	 * segments skip it. */
	if (st->partial && !(st->h2 & decided)) {
		candidate = h2_resync_candidate(st, d, seq);
		if (d == H2_IN && psh)
			st->in_push_end = seq + skb->len - off;
	}
	tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	if (!st->cookie)
		st->cookie = bpf_get_socket_cookie(skb);
	if (!(st->h2 & decided)) {
		if (st->partial ? !h2_resync_open(st, sk, skb, d, off, seq, skb->len - off, candidate)
				: !h2_open(st, sk, tp, skb, d, off, seq, skb->len - off))
			return;
	}
	h2 = bpf_sk_storage_get(&h2socks, sk, 0, 0);
	if (!h2 || !h2->dir[d & 1].on)
		return;
	h2_walk(st, h2, tp, d, skb, off, seq, skb->len - off);
}

/* A write call begins on a followed connection (its first
 * tcp_sendmsg_locked). A call that returns nothing (EAGAIN) leaves the
 * start set: the retry's data was the app's to write since then, held by
 * a full send buffer. */
static __always_inline void h2_write_begins(struct lt_sock *st, struct sock *sk, __u64 now)
{
	struct h2_state *h2;

	if (!(st->h2 & H2_STREAMS))
		return;
	h2 = bpf_sk_storage_get(&h2socks, sk, 0, 0);
	if (h2 && !h2->write_t0)
		h2->write_t0 = now;
}

/* A write call that accepted ret bytes returned on a followed connection:
 * they are the last ret bytes written. With what holds those it left
 * unsent: the cause of the wait of the stream they end (daemon/streams). */
static __always_inline void h2_write_done(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp, int ret)
{
	struct lt_h2_event *ev;
	struct h2_state *h2;
	__u64 now, t0;

	if (!(st->h2 & H2_STREAMS))
		return;
	h2 = bpf_sk_storage_get(&h2socks, sk, 0, 0);
	if (!h2)
		return;
	now = bpf_ktime_get_ns();
	t0 = h2->write_t0 ? h2->write_t0 : now;
	h2->write_t0 = 0;
	sock_cookie(st, sk);
	ev = h2_event(st, LT_H2_WRITE, now);
	if (!ev)
		return;
	ev->end_seq = tp->write_seq;
	ev->seq = ev->end_seq - ret;
	ev->t0 = t0;
	if (tp->write_seq != tp->snd_nxt)
		ev->wait_cause = classify(sk, tp, now);
	submit(ev, sizeof(*ev));
}

/* A read returned on a followed connection: everything before copied_seq
 * is read. */
static __always_inline void h2_read_done(struct lt_sock *st, struct sock *sk, struct tcp_sock *tp)
{
	struct lt_h2_event *ev;

	if (!(st->h2 & H2_STREAMS))
		return;
	sock_cookie(st, sk);
	ev = h2_event(st, LT_H2_READ, bpf_ktime_get_ns());
	if (!ev)
		return;
	ev->seq = tp->copied_seq;
	submit(ev, sizeof(*ev));
}

#endif /* LATTRACE_HTTP2_BPF_H */
