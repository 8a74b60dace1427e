/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * h2_resync.bpf.h: finding HTTP/2's framing on a connection that was open
 * before lattrace started, whose preface went by unseen. From frame
 * headers alone, as on a connection followed from its start: never a
 * header block or DATA content.
 *
 * A direction's candidate is a segment that starts one of its sender's
 * writes (on the way out where the last write returned, on the way in
 * right after a segment the peer pushed, PSH marking the end of a write):
 * an HTTP/2 sender writes whole frames, so a write begins with a frame
 * header. From there the walk chains frame to frame
 * by the length field as on a followed connection, each header checked
 * against RFC 9113's rules (a known type; its length, flags and stream id
 * as that type allows; a stream the client opens has an odd id; a length
 * within what any peer allows, H2_RESYNC_MAX_LEN). H2_RESYNC_CONFIRM
 * headers in a row confirm the direction; one that breaks a rule drops
 * the candidate. Once both directions are confirmed the connection's
 * streams are followed (H2_STREAMS) exactly as from a preface; streams in
 * progress then are partial in user space (daemon/streams). A direction
 * whose framing is lost later is looked for again. A connection one of
 * whose directions spent H2_RESYNC_TRIES tries (a failed candidate, a
 * write too short for a frame header, or H2_RESYNC_SKIPS data segments
 * without a candidate) is not HTTP/2 (a redis, PostgreSQL or HTTP/1.1
 * connection fails at its first byte): both directions are decided and
 * its programs return at once from then on, as for any connection that
 * is not HTTP/2.
 *
 * Only where the role is known (listeners.bpf.h): the stream ids' parity
 * needs the client's side.
 */
#ifndef LATTRACE_H2_RESYNC_BPF_H
#define LATTRACE_H2_RESYNC_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"
#include "sock_state.bpf.h"

#define H2_RESYNC_CONFIRM 3
#define H2_RESYNC_TRIES 4
#define H2_RESYNC_SKIPS 64
/* SETTINGS_MAX_FRAME_SIZE goes up to 2^24-1, but servers that raise it
 * stop at 1 MiB (Go's net/http2). */
#define H2_RESYNC_MAX_LEN (1U << 20)

/* Could a frame header with these fields start a frame sent by the client
 * (from_client) or the server? reserved is the stream id's top bit. */
static __always_inline bool h2_plausible(__u32 len, __u8 type, __u8 flags, __u32 stream, __u8 reserved, bool from_client)
{
	if (len > H2_RESYNC_MAX_LEN || reserved)
		return false;
	switch (type) {
	case LT_H2_DATA:
		return stream && !(flags & ~0x09) && (!from_client || stream & 1);
	case LT_H2_HEADERS:
		return stream && !(flags & ~0x2d) && (!from_client || stream & 1);
	case LT_H2_CONTINUATION:
		return stream && !(flags & ~0x04) && (!from_client || stream & 1);
	case LT_H2_PRIORITY:
		return stream && !flags && len == 5;
	case LT_H2_RST_STREAM:
		return stream && !flags && len == 4;
	case LT_H2_SETTINGS:
		return !stream && !(flags & ~0x01) && len % 6 == 0 && (!(flags & 1) || !len);
	case LT_H2_PUSH_PROMISE:
		return !from_client && stream & 1 && !(flags & ~0x0c) && len >= 4;
	case LT_H2_PING:
		return !stream && !(flags & ~0x01) && len == 8;
	case LT_H2_GOAWAY:
		return !stream && !flags && len >= 8;
	case LT_H2_WINDOW_UPDATE:
		return !flags && len == 4;
	}
	return false;
}

/* Does direction d's segment at seq start one of its sender's writes, and
 * so a frame? Ours: it starts where the last write returned. The peer's:
 * it follows the segment that ended the peer's last write (PSH). */
static __always_inline bool h2_resync_candidate(const struct lt_sock *st, int d, __u32 seq)
{
	return seq == (d == H2_OUT ? st->write_end : st->in_push_end);
}

/* Is the connection's end the one that sends way d the client? */
static __always_inline bool h2_from_client(const struct lt_sock *st, int d)
{
	return (d == H2_OUT) == (st->role == LT_ROLE_CLIENT);
}

static __always_inline __u32 h2_decided_bit(int d)
{
	return d == H2_OUT ? H2_OUT_DECIDED : H2_IN_DECIDED;
}

static __always_inline __u32 h2_tries(const struct lt_sock *st, int d)
{
	return (st->h2 / (d == H2_OUT ? H2_RESYNC_TRY_OUT : H2_RESYNC_TRY_IN)) & H2_RESYNC_TRY_MASK;
}

static __always_inline __u32 h2_confirmed_bit(int d)
{
	return d == H2_OUT ? H2_OUT_CONFIRMED : H2_IN_CONFIRMED;
}

/* One try of direction d spent. */
static __always_inline void h2_resync_tried(struct lt_sock *st, int d)
{
	if (h2_tries(st, d) < H2_RESYNC_TRY_MASK)
		__sync_fetch_and_add(&st->h2, d == H2_OUT ? H2_RESYNC_TRY_OUT : H2_RESYNC_TRY_IN);
}

/* Direction d's candidate broke a rule, or its framing confirmed before
 * was lost: the direction is undecided again, its next candidate tried,
 * one try spent. */
static __always_inline void h2_resync_drop(struct lt_sock *st, struct h2_dir *dir, int d)
{
	dir->on = 0;
	dir->checking = 0;
	dir->have = 0;
	dir->pend_on = 0;
	h2_resync_tried(st, d);
	__sync_fetch_and_and(&st->h2, ~(h2_decided_bit(d) | h2_confirmed_bit(d)));
}

/* One more frame header of a direction being checked, in its fields:
 * false when it breaks a rule. The last one to check confirms the
 * direction, and with the other one confirmed, the connection: its
 * streams are followed from here. */
static __always_inline bool h2_resync_step(struct lt_sock *st, struct h2_state *h2, struct h2_dir *dir, int d,
					   __u32 len, __u8 type, __u8 flags, __u32 stream, __u8 reserved)
{
	const __u32 both = H2_OUT_CONFIRMED | H2_IN_CONFIRMED;
	__u32 bit = h2_confirmed_bit(d);

	if (!h2_plausible(len, type, flags, stream, reserved, h2_from_client(st, d)))
		return false;
	if (--dir->checking)
		return true;
	/* The directions confirm on two CPUs: the one whose bit completes
	 * both goes on. */
	if (((__sync_fetch_and_or(&st->h2, bit) | bit) & both) != both)
		return true;
	if (!(__sync_fetch_and_or(&h2->flags, LT_H2_SEEN | LT_H2_RESYNCED) & LT_H2_RESYNCED))
		count(LT_CNT_H2_RESYNCED);
	/* Set, then checked: a direction lost meanwhile (h2_unsync) either
	 * sees STREAMS and clears it, or is seen here. */
	__sync_fetch_and_or(&st->h2, H2_STREAMS);
	if ((st->h2 & both) != both)
		__sync_fetch_and_and(&st->h2, ~(__u32)H2_STREAMS);
	return true;
}

/* Direction d of a connection adopted mid-way is undecided: is the
 * segment at seq (len bytes at off) a candidate (h2_resync_candidate)
 * whose first frame header is plausible? True when the direction is followed from it, checking.
 * After H2_RESYNC_TRIES failed candidates the connection is no HTTP/2:
 * decided both ways, its state gone. */
static __always_inline bool h2_resync_open(struct lt_sock *st, struct bpf_sock *sk, struct __sk_buff *skb, int d,
					   __u32 off, __u32 seq, __u32 len, bool candidate)
{
	struct h2_state *h2;
	struct h2_dir *dir;
	__u8 h[H2_HEADER_LEN];
	__u32 flen, stream;

	if (h2_tries(st, d) >= H2_RESYNC_TRIES) {
		__sync_fetch_and_or(&st->h2, H2_OUT_DECIDED | H2_IN_DECIDED);
		if (__sync_fetch_and_and(&st->h2, ~(__u32)H2_FOLLOWED) & H2_FOLLOWED) {
			count(LT_CNT_H2_RESYNC_LOST);
			bpf_sk_storage_delete(&h2socks, sk);
		}
		return false;
	}
	/* A direction whose writes are never seen to start (sendfile's on a
	 * kernel whose hook for it does not return through the write's end,
	 * a peer that never pushes) spends a try every H2_RESYNC_SKIPS data
	 * segments, so that it is decided too. */
	if (!candidate) {
		if (++st->h2_skipped[d & 1] >= H2_RESYNC_SKIPS) {
			st->h2_skipped[d & 1] = 0;
			h2_resync_tried(st, d);
		}
		return false;
	}
	/* An HTTP/2 write holds a frame header at least. */
	if (len < H2_HEADER_LEN || bpf_skb_load_bytes(skb, off, h, H2_HEADER_LEN)) {
		h2_resync_tried(st, d);
		return false;
	}
	flen = (__u32)h[0] << 16 | (__u32)h[1] << 8 | h[2];
	stream = (__u32)(h[5] & 0x7f) << 24 | (__u32)h[6] << 16 | (__u32)h[7] << 8 | h[8];
	if (!h2_plausible(flen, h[3], h[4], stream, h[5] & 0x80, h2_from_client(st, d))) {
		h2_resync_tried(st, d);
		return false;
	}
	h2 = h2_state_new(sk);
	if (!h2)
		return false;
	dir = &h2->dir[d & 1];
	dir->next_seq = seq;
	dir->max_end = seq;
	dir->have = 0;
	dir->pend_on = 0;
	dir->settings_next = 0;
	dir->checking = H2_RESYNC_CONFIRM;
	dir->on = 1;
	__sync_fetch_and_or(&st->h2, h2_decided_bit(d) | H2_FOLLOWED);
	return true;
}

#endif /* LATTRACE_H2_RESYNC_BPF_H */
