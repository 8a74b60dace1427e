/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * path_rtt.bpf.h: RTT per path (this namespace to one peer address),
 * shared by every flow on it: a bulk flow's samples tell a chatty flow
 * beside it how much queue there is.
 *
 * Clean samples go into short time buckets, so an exchange can take the
 * minimum of those taken while it was in flight, and into a longer
 * windowed minimum for exchanges that saw none. Every sample (clean or
 * not: none is below the propagation delay) lowers the path's minimum, the
 * clean ones as they come and the others through their socket's minimum
 * RTT at each exchange's end; it ages out so a route change is learnt.
 *
 * The table is an array used as a two-way set-associative cache: an
 * exchange's end reads it, and an array slot costs a few instructions
 * where a hash map's lookup costs more than the rest of the hook. A path
 * takes the less recently used of its two slots; taking one that is still
 * in use counts in LT_CNT_PATH_FULL.
 */
#ifndef LATTRACE_PATH_RTT_BPF_H
#define LATTRACE_PATH_RTT_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"

/* A windowed minimum kept as two half-window buckets: cheap, bounded, and
 * within a factor of the window of the exact sliding minimum. */
struct winmin {
	__u64 cur_start;
	__u32 cur;
	__u32 prev;
};

static __always_inline void winmin_add(struct winmin *w, __u32 v, __u64 now)
{
	if (now - w->cur_start > cfg.path_window_ns >> 1) {
		w->prev = (now - w->cur_start > cfg.path_window_ns) ? 0 : w->cur;
		w->cur = v;
		w->cur_start = now;
	} else if (!w->cur || v < w->cur) {
		w->cur = v;
	}
}

static __always_inline __u32 winmin_get(const struct winmin *w, __u64 now)
{
	if (!w->cur_start || now - w->cur_start > cfg.path_window_ns)
		return 0;
	if (w->prev && (now - w->cur_start) <= cfg.path_window_ns >> 1 && w->prev < w->cur)
		return w->prev;
	return w->cur;
}

#define PATH_BUCKETS 16
/* 2^25 ns (33.6 ms): a shift, where a division costs the hot path. */
#define PATH_BUCKET_SHIFT 25
#define PATH_MIN_AGE_NS (300ULL * 1000 * 1000 * 1000)

struct path_key {
	__u8 addr[16];
	__u32 netns;
	__u16 family;
	__u16 _pad;
};

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

static __always_inline void path_key_of(const struct lt_flow *f, struct path_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->addr, f->daddr, 16);
	k->netns = f->netns;
	k->family = f->family;
}

/* Any sample lowers the path's minimum; a minimum older than
 * PATH_MIN_AGE_NS gives way to the next sample. */
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

/* The RTTs of the flow's path, its slot taken (and cleared) if the path
 * has none; 0 only if the table cannot be read. */
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

/* The RTTs of the flow's path if it has a slot, 0 otherwise: a lookup
 * that takes no slot, for readers that add no sample. */
static __always_inline struct path_rtt *path_find(const struct lt_flow *f)
{
	struct path_slot *v;
	struct path_key k;
	__u32 i;

	path_key_of(f, &k);
	i = (path_hash(&k) & (PATH_SETS - 1)) * 2;
	v = bpf_map_lookup_elem(&paths, &i);
	if (v && path_key_eq(&v->key, &k))
		return &v->rtt;
	i++;
	v = bpf_map_lookup_elem(&paths, &i);
	if (v && path_key_eq(&v->key, &k))
		return &v->rtt;
	return 0;
}

/* A clean RTT sample of the flow's path: it lowers the path's minimum and
 * fills its buckets and windowed minimum. */
static __always_inline void path_add_clean(const struct lt_flow *f, __u32 rtt, __u64 now)
{
	struct path_rtt *p = path_get(f, now);

	if (!p)
		return;
	path_min_add(p, rtt, now);
	path_clean_add(p, rtt, now);
}

#endif /* LATTRACE_PATH_RTT_BPF_H */
