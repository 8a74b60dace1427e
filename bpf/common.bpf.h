/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * common.bpf.h: what every other part of the BPF side stands on: the libbpf
 * headers, the layouts shared with Go, the loader's configuration, and the
 * kernel constants vmlinux.h cannot carry (BTF holds no #define).
 *
 * The BPF side is one compilation unit (lattrace.bpf.c includes every
 * header), so the maps and globals the headers define exist once.
 */
#ifndef LATTRACE_COMMON_BPF_H
#define LATTRACE_COMMON_BPF_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_endian.h>

#include "lattrace.h"

#define AF_INET 2
#define AF_INET6 10
#define SOL_SOCKET 1
#define MSG_PEEK 2
/* enum tcp_state values, stable since the beginning of Linux TCP. */
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3
#define TCP_CLOSE 7

/* The configuration, set by the loader (tracer.Open) as one value before
 * the programs load; an object loaded as it is runs with these. (Not named
 * config: vmlinux.h has a type of that name.) */
const volatile struct lt_config cfg = {
	.wakeup_bytes = 1024 * 1024,
	.use_tx_tstamp = 1,
	.filter_cgroup = 0,
	.path_window_ns = 2000000000ULL,
	.idle_write_ns = 500000000ULL,
};

#endif /* LATTRACE_COMMON_BPF_H */
