/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * counters.bpf.h: the programs' counters about themselves (enum lt_counter),
 * so that no loss in the kernel is silent: the daemon sums the CPUs'
 * slots and reports them.
 */
#ifndef LATTRACE_COUNTERS_BPF_H
#define LATTRACE_COUNTERS_BPF_H

#include "common.bpf.h"

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

#endif /* LATTRACE_COUNTERS_BPF_H */
