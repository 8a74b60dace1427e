/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * request_links.bpf.h: the kernel's evidence that an outbound exchange ran
 * inside an inbound one, for the request trees of daemon/requests
 * (docs/latency-model.md, "Requests across services"). The traffic is not
 * touched: no byte is added to it and none is read.
 *
 * An execution context (a thread; in a Go program whose goroutines are
 * followed, a goroutine) that reads an inbound request serves it
 * from then on, until it reads another one; an outbound request written by
 * that context carries, in its record, the request the context served as
 * it began and the one before (struct lt_link). Where a thread hands the
 * request to another (a queue and a worker pool), the reading thread's
 * first wake-up of a thread of its process, made from a futex wake after
 * the read, hands the request to the woken thread; a hand-off is kept
 * apart from what a thread read itself, and not passed on (a chain of
 * wake-ups is no evidence). User space checks
 * every such claim against the exchanges' own timelines, and where the
 * evidence names no single request the outbound exchange is counted
 * ambiguous, never guessed.
 */
#ifndef LATTRACE_REQUEST_LINKS_BPF_H
#define LATTRACE_REQUEST_LINKS_BPF_H

#include "common.bpf.h"
#include "counters.bpf.h"
#include "sock_state.bpf.h"

/* What one thread serves: the inbound request it read last, the one
 * before, whether it handed the last one on already, and the last one a
 * wake-up handed to it. A hand-off never replaces what the thread read
 * itself: a thread woken by another for any reason (a runtime's own
 * scheduling wakes threads all the time) keeps its own evidence. */
struct serving {
	struct lt_served cur;
	struct lt_served prev;
	struct lt_served handoff;
	__u32 handed;
	__u32 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct serving);
} served_by_thread SEC(".maps");

/* Go programs (daemon/goroutines fills it): a goroutine moves between
 * threads, so in these the execution context is the goroutine. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32); /* tgid */
	__type(value, struct lt_go_offsets);
} go_procs SEC(".maps");

struct go_key {
	__u32 tgid;
	__u32 _pad;
	__u64 goid;
};

/* What each goroutine of a followed Go program serves. Bounded: a
 * goroutine that served a request long ago ages out. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct go_key);
	__type(value, struct serving);
} served_by_goroutine SEC(".maps");

/* What the current thread runs, for the evidence. */
enum ctx_kind {
	CTX_THREAD = 0,    /* not a Go program: the thread is the context */
	CTX_GOROUTINE = 1, /* a followed Go program's goroutine (key, parent) */
	/* A Go program whose goroutine cannot be read (a system call from C,
	 * a binary lattrace cannot follow): its threads run any goroutine,
	 * so they are no evidence, and none is gathered. */
	CTX_NONE = 2,
};

/* The goroutine the current thread runs, in a followed Go program: its
 * id and its parent's. In the register ABI (Go 1.17 and later) R14 holds
 * the running goroutine's g in Go code and across its system calls, which
 * the kernel saved at the call's entry. */
static __always_inline enum ctx_kind current_goroutine(__u32 tgid, struct go_key *key, __u64 *parent)
{
	struct lt_go_offsets *off = bpf_map_lookup_elem(&go_procs, &tgid);
	struct pt_regs *regs;
	__u64 g;

	if (!off)
		return CTX_THREAD;
	if (off->goid == LT_GO_UNFOLLOWED)
		return CTX_NONE;
	regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	if (!regs)
		return CTX_NONE;
	g = BPF_CORE_READ(regs, r14); /* x86-64; arm64 keeps g in X28 */
	key->tgid = tgid;
	key->_pad = 0;
	if (!g)
		return CTX_NONE;
	/* Without the offsets (a binary without DWARF) the g itself names
	 * the goroutine: the runtime reuses a g only once its goroutine has
	 * ended. Its parent is then unknown. */
	if (!off->goid) {
		key->goid = g;
		*parent = 0;
		return CTX_GOROUTINE;
	}
	if (bpf_probe_read_user(&key->goid, sizeof(key->goid), (void *)(g + off->goid)) ||
	    bpf_probe_read_user(parent, sizeof(*parent), (void *)(g + off->parent_goid)) || !key->goid)
		return CTX_NONE;
	return CTX_GOROUTINE;
}

/* The current goroutine's state, made if absent. */
static __always_inline struct serving *goroutine_serving(struct go_key *key)
{
	struct serving *c = bpf_map_lookup_elem(&served_by_goroutine, key);
	struct serving zero = {};

	if (c)
		return c;
	bpf_map_update_elem(&served_by_goroutine, key, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&served_by_goroutine, key);
}

/* The link of a socket's current outbound exchange, made as its first
 * byte is written (and the exchange flagged LT_EX_LINKED), taken when the
 * exchange is written; gen names the exchange (lt_sock.gen), so that a
 * link left from an earlier one is never reported. Keyed by socket cookie:
 * the exchange is written from hooks that hold no trusted socket. Bounded:
 * a link whose exchange is never written (a socket gone in between) ages
 * out. */
struct sock_link {
	__u32 gen;
	__u32 _pad;
	struct lt_link link;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct sock_link);
} links SEC(".maps");

static __always_inline void served_set(struct serving *c, __u64 cookie, __u32 in_seq, __u32 method)
{
	if (c->cur.cookie == cookie && c->cur.in_seq == in_seq)
		return;
	c->prev = c->cur;
	c->cur.cookie = cookie;
	c->cur.in_seq = in_seq;
	c->cur.method = method;
	c->handed = 0;
}

/* Names the current execution context as st's exchange's (ctx): a
 * goroutine of a followed Go program (key and parent set), the thread, or
 * none (0). */
static __always_inline enum ctx_kind note_ctx(struct lt_sock *st, struct go_key *key, __u64 *parent)
{
	__u64 id = bpf_get_current_pid_tgid();
	enum ctx_kind k = current_goroutine(id >> 32, key, parent);

	switch (k) {
	case CTX_GOROUTINE:
		st->cur.ctx = LT_CTX_GOROUTINE | key->goid;
		break;
	case CTX_THREAD:
		st->cur.ctx = (__u32)id;
		break;
	default:
		st->cur.ctx = 0;
	}
	return k;
}

/* The current thread (or, in a followed Go program, goroutine) read bytes
 * of the inbound request that st's responder exchange is receiving: it
 * serves that request. */
static __always_inline void links_request_read(struct lt_sock *st)
{
	struct serving *c;
	struct go_key key;
	__u64 parent;

	if (cfg.no_links)
		return;
	switch (note_ctx(st, &key, &parent)) {
	case CTX_GOROUTINE:
		c = goroutine_serving(&key);
		if (c)
			served_set(c, st->cookie, st->in_seq_start, LT_LINK_GOROUTINE);
		return;
	case CTX_NONE:
		return;
	default:
		break;
	}
	c = bpf_task_storage_get(&served_by_thread, bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (c)
		served_set(c, st->cookie, st->in_seq_start, LT_LINK_THREAD);
}

/* The current thread (or goroutine) writes the first byte of st's new
 * outbound exchange: the request it serves, if any, is its parent. A
 * goroutine that read none itself serves its parent goroutine's (a
 * request's handler starting goroutines for its calls). */
static __always_inline void links_request_written(struct lt_sock *st)
{
	struct sock_link l = {};
	struct serving *c;
	struct go_key key;
	__u64 parent;

	if (cfg.no_links)
		return;
	switch (note_ctx(st, &key, &parent)) {
	case CTX_NONE:
		return;
	case CTX_GOROUTINE:
		c = bpf_map_lookup_elem(&served_by_goroutine, &key);
		if (c && c->cur.cookie) {
			l.link.parent = c->cur;
			l.link.prev = c->prev;
		} else if (parent) {
			key.goid = parent;
			c = bpf_map_lookup_elem(&served_by_goroutine, &key);
			if (!c || !c->cur.cookie)
				return;
			l.link.handoff = c->cur;
			l.link.handoff.method = LT_LINK_GO_PARENT;
		} else {
			return;
		}
		break;
	default:
		c = bpf_task_storage_get(&served_by_thread, bpf_get_current_task_btf(), 0, 0);
		if (!c || !(c->cur.cookie | c->handoff.cookie))
			return;
		l.link.parent = c->cur;
		l.link.prev = c->prev;
		l.link.handoff = c->handoff;
	}
	l.gen = st->gen;
	if (bpf_map_update_elem(&links, &st->cookie, &l, BPF_ANY)) {
		count(LT_CNT_LINKS_LOST);
		return;
	}
	st->cur.flags |= LT_EX_LINKED;
}

/* The link of the exchange being written, or zeros. The sweep's record may
 * be dropped (write_idle), so the link stays until the next exchange's
 * replaces it or it ages out. */
static __always_inline void links_fill(struct lt_sock *st, struct lt_link *out)
{
	struct sock_link *l = 0;

	if (st->cur.flags & LT_EX_LINKED) {
		l = bpf_map_lookup_elem(&links, &st->cookie);
		/* Evicted from the LRU map by newer exchanges' evidence
		 * before this one was written. */
		if (!l || l->gen != st->gen)
			count(LT_CNT_LINKS_LOST);
	}
	if (l && l->gen == st->gen) {
		*out = l->link;
		return;
	}
	__builtin_memset(out, 0, sizeof(*out));
}

/* Futex commands that wake waiters (FUTEX_WAKE, FUTEX_REQUEUE,
 * FUTEX_CMP_REQUEUE, FUTEX_WAKE_OP, FUTEX_WAKE_BITSET), with the private
 * and clock flags masked off. */
static __always_inline bool futex_wakes(__u64 op)
{
	op &= 127;
	return op == 1 || op == 3 || op == 4 || op == 5 || op == 10;
}

#define NR_FUTEX 202      /* x86_64 */
#define NR_FUTEX_WAKE 454 /* futex2's wake, 6.7 */

/* The current thread wakes p (sched_waking, in the waker's context). The
 * first thread of its own process it wakes from a futex wake after it read
 * a request serves that request: a queue and a worker pool. The waker's
 * system call is read from its saved user registers, so that a wake-up
 * made by an interrupt that merely landed in this thread is not taken for
 * its own. */
static __always_inline void links_wakeup(struct task_struct *p)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	struct serving *c, *w;
	struct pt_regs *regs;
	long nr;

	if (cfg.no_links || p->tgid != cur->tgid || p->pid == cur->pid)
		return;
	c = bpf_task_storage_get(&served_by_thread, cur, 0, 0);
	if (!c || !c->cur.cookie || c->handed)
		return;
	regs = (struct pt_regs *)bpf_task_pt_regs(cur);
	if (!regs)
		return;
	nr = BPF_CORE_READ(regs, orig_ax);
	if (!(nr == NR_FUTEX_WAKE || (nr == NR_FUTEX && futex_wakes(BPF_CORE_READ(regs, si)))))
		return;
	c->handed = 1;
	w = bpf_task_storage_get(&served_by_thread, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!w)
		return;
	w->handoff = c->cur;
	w->handoff.method = LT_LINK_HANDOFF;
}

#endif /* LATTRACE_REQUEST_LINKS_BPF_H */
