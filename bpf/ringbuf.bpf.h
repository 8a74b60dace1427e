/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * ringbuf.bpf.h: the events ring buffer and how a record enters it. The
 * reader drains on a timer; a record wakes it only when the backlog
 * crosses a multiple of cfg.wakeup_bytes.
 */
#ifndef LATTRACE_RINGBUF_BPF_H
#define LATTRACE_RINGBUF_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 * 1024 * 1024);
} events SEC(".maps");

/* Ring buffer records carry an 8-byte header of the kernel's. */
#define RINGBUF_HDR 8

/* Wakeup flags for a record that takes the backlog from before to after
 * bytes. Only a crossing of a multiple of wakeup_bytes wakes the reader,
 * so a burst wakes it early. Waking it on every record past the threshold
 * instead costs an irq_work and a self-IPI per record while the reader is
 * on its way, several times the rest of the hook. */
static __always_inline __u64 wake_flags(__u64 before, __u64 after)
{
	/* wakeup_bytes is a power of two: the quotients differ exactly when
	 * the positions differ in a bit of wakeup_bytes or above. */
	if ((after ^ before) >= cfg.wakeup_bytes)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

/* The ring buffer bytes a record of size bytes takes. */
static __always_inline __u64 ringbuf_len(__u64 size)
{
	return (size + RINGBUF_HDR + 7) & ~7ULL;
}

static __always_inline void fill_header(struct lt_header *hdr, __u32 kind, __u64 now)
{
	hdr->kind = kind;
	hdr->layout = LT_LAYOUT;
	hdr->ts_ns = now;
}

/* Has the ring room for a record of size bytes and slack more of that
 * size (what other CPUs may reserve meanwhile)? The sweep at the daemon's
 * stop writes only then: what it cannot write yet it leaves for its next
 * pass, after the daemon has drained the ring, instead of losing it. */
static __always_inline bool ring_has_room(__u64 size, __u64 slack)
{
	__u64 used = bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA);
	__u64 ring = bpf_ringbuf_query(&events, BPF_RB_RING_SIZE);

	return used + (slack + 1) * ringbuf_len(size) <= ring;
}

/* Reserves a record of size bytes (a constant) and fills its header; 0,
 * counted, when the ring buffer is full. */
static __always_inline void *reserve(__u64 size, __u32 kind, __u64 now)
{
	struct lt_header *hdr = bpf_ringbuf_reserve(&events, size, 0);

	if (!hdr) {
		count(LT_CNT_RINGBUF_FULL);
		return 0;
	}
	fill_header(hdr, kind, now);
	return hdr;
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

#endif /* LATTRACE_RINGBUF_BPF_H */
