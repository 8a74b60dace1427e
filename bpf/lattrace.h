/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * lattrace.h: the one description of everything that crosses from the kernel
 * to user space. It is included by the BPF programs and read by bpf2go
 * (-type ...), which generates the matching Go types in daemon/tracer; never
 * mirror these structs by hand in Go.
 *
 * Rules for changing it: only fixed-width types, explicit padding, and a new
 * field goes at the end of its struct (pinned maps refuse a changed layout).
 */
#ifndef LATTRACE_H
#define LATTRACE_H

#define LT_COMM_LEN 16

/* Kinds of record on the events ring buffer; every record starts with struct lt_header. */
enum lt_record_kind {
	LT_RECORD_CONN_CLOSE = 1, /* a connection ended: its lifetime and totals */
};

/* Counters the programs keep about themselves, one slot each in the per-CPU
 * "counters" array. The daemon sums the CPUs and reports them, so that no
 * loss in the kernel is silent. */
enum lt_counter {
	LT_CNT_RINGBUF_FULL = 0,   /* a record could not be reserved: the ring buffer was full */
	LT_CNT_STORAGE_FAIL,       /* socket storage could not be allocated */
	LT_CNT_RECORDS,            /* records submitted to the ring buffer */
	LT_CNT_SOCKS_TRACKED,      /* sockets that got lattrace state */
	LT_CNT_MAX,
};

/* Roles of a connection's local end. */
enum lt_role {
	LT_ROLE_UNKNOWN = 0, /* the connection was open before lattrace started */
	LT_ROLE_CLIENT = 1,  /* the local end called connect() */
	LT_ROLE_SERVER = 2,  /* the local end accepted it */
};

/* A connection as both ends and the namespace name it. Addresses are 16 bytes
 * for both families: IPv4 sits in the first four bytes. */
struct lt_flow {
	__u8 saddr[16];
	__u8 daddr[16];
	__u16 sport; /* host byte order */
	__u16 dport; /* host byte order */
	__u16 family; /* AF_INET or AF_INET6 */
	__u16 _pad1;
	__u32 netns; /* inode number of the socket's network namespace */
	__u32 _pad2;
};

/* The owner of a socket as last seen from process context (a send or a read). */
struct lt_owner {
	__u32 pid;  /* thread group id, the pid user space knows */
	__u32 tid;
	__u64 cgroup_id;
	char comm[LT_COMM_LEN];
};

struct lt_header {
	__u32 kind; /* enum lt_record_kind */
	__u32 _pad;
	__u64 ts_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) when the record was made */
};

/* LT_RECORD_CONN_CLOSE */
struct lt_conn_close {
	struct lt_header hdr;
	__u64 cookie; /* socket cookie: stable id of the socket for its lifetime */
	struct lt_flow flow;
	struct lt_owner owner;
	__u64 established_ns; /* 0 when the connection predates lattrace */
	__u64 sendmsg_calls;  /* sendmsg/write calls that returned > 0 */
	__u64 bytes_sent;     /* bytes those calls accepted */
	__u64 send_skbs;      /* tcp_sendmsg_locked firings: skbs the sends filled */
	__u32 role;           /* enum lt_role */
	__u32 _pad;
};

#endif /* LATTRACE_H */
