/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * lattrace.h: the one description of everything that crosses between the
 * kernel and user space: records, counters and the configuration. It is
 * included by the BPF programs and read by bpf2go (-type ...), which
 * generates the matching Go types in daemon/tracer; never mirror these
 * structs by hand in Go.
 *
 * Rules for changing it: only fixed-width types, explicit padding, and a new
 * field goes at the end of its struct (pinned maps refuse a changed layout).
 */
#ifndef LATTRACE_H
#define LATTRACE_H

#define LT_COMM_LEN 16

/* The programs' load-time configuration, one value in the object's
 * read-only data: the loader (tracer.Open) sets it before loading, and the
 * programs cannot change it. */
struct lt_config {
	__u64 wakeup_bytes;   /* wake user space each time the backlog grows by this many bytes (a power of two) */
	__u8 use_tx_tstamp;   /* use BPF TX timestamping for x1/a1 where the kernel has it (>= 6.15) */
	__u8 filter_cgroup;   /* trace only sockets of tasks in the cgroup_filter subtree (--cgroup) */
	__u8 no_links;        /* gather no evidence of the requests outbound exchanges serve (request_links.bpf.h) */
	__u8 _pad[5];
	__u64 path_window_ns; /* window of a path's recent clean RTT (a windowed minimum) */
	/* A complete exchange whose connection has been quiet this long is
	 * written by the sweep, not at its next turn; 0: only at the turn. */
	__u64 idle_write_ns;
};

/* What the daemon tells the running programs (element LT_CONTROL_SET of
 * the "control" array, written by the daemon alone) and what they tell it
 * back (element LT_CONTROL_SEEN, written by the programs alone, so that
 * neither write undoes the other's). The array is pinned with the other
 * maps: programs adopted across a restart hear the next daemon. */
struct lt_control {
	/* Set while the daemon's memory cgroup nears its limit
	 * (daemon/memguard): sockets not followed yet stay so, since each
	 * followed socket's storage is charged to that cgroup. */
	__u32 sockets_paused;
	/* SEEN: sockets given state so far, modulo 2^32. SET: while nonzero,
	 * a budget: sockets are followed from their birth only until SEEN's
	 * count reaches it, and none first seen later (open before, or born
	 * while paused). The memory guard gives it at each of its looks as
	 * the room left, which a burst of new sockets cannot outrun however
	 * late the daemon's next look comes on a busy node. */
	__u32 sockets;
	/* Connection ends born (SYN_SENT, or ESTABLISHED from SYN_RECV) and
	 * not followed while paused. */
	__u64 sockets_unfollowed;
};

enum lt_control_slot {
	LT_CONTROL_SET = 0,
	LT_CONTROL_SEEN = 1,
	LT_CONTROL_SLOTS,
};

/* Kinds of record on the events ring buffer; every record starts with struct lt_header. */
enum lt_record_kind {
	LT_RECORD_CONN_CLOSE = 1, /* a connection ended: its lifetime and totals */
	LT_RECORD_CONN_OPEN = 2,  /* a connection was established */
	LT_RECORD_EXCHANGE = 3,   /* one exchange (a message each way) was closed */
	LT_RECORD_H2 = 4,         /* an HTTP/2 frame, write or read on a connection whose streams are followed */
};

/* Counters the programs keep about themselves, one slot each in the per-CPU
 * "counters" array. The daemon sums the CPUs and reports them, so that no
 * loss in the kernel is silent. */
enum lt_counter {
	LT_CNT_RINGBUF_FULL = 0,   /* a record could not be reserved: the ring buffer was full */
	LT_CNT_STORAGE_FAIL,       /* socket storage could not be allocated */
	LT_CNT_RECORDS,            /* records submitted to the ring buffer */
	LT_CNT_SOCKS_TRACKED,      /* sockets that got lattrace state */
	LT_CNT_EXCHANGES,          /* exchanges closed (submitted or dropped) */
	LT_CNT_TSTAMP_OFF,         /* sockets refused BPF TX timestamping, or on a kernel without it (reconstructed x1/a1) */
	LT_CNT_PATH_FULL,          /* a path's RTT history was dropped for another's (its slot was used within a minute) */
	LT_CNT_IDLE_WRITTEN,       /* exchanges the sweep wrote: complete, their connection quiet */
	LT_CNT_UNFINISHED,         /* exchanges written unfinished: the daemon stopped while they were in progress */
	LT_CNT_H2_UNSYNCED,        /* HTTP/2 connections whose framing was lost in a direction (a gap in the segments, or more frames in one than followed) */
	LT_CNT_ADOPTED_SERVER,     /* ends of connections open before lattrace followed: a listener on the local port, so the server's end */
	LT_CNT_ADOPTED_CLIENT,     /* the same, no listener on the local port: the client's end */
	LT_CNT_ADOPTED_GUESSED,    /* the same, in a network namespace whose listeners were never read: the role guessed from the ports */
	LT_CNT_LISTENERS_LOST,     /* a listening socket could not be counted (storage or table full): roles in its namespace may be wrong */
	LT_CNT_H2_RESYNCED,        /* ends of HTTP/2 connections open before lattrace whose framing was found from frame headers: their streams followed */
	LT_CNT_H2_RESYNC_LOST,     /* ends of connections open before lattrace that looked like HTTP/2 but whose framing was not confirmed: their own exchanges, no samples while it was tried */
	LT_CNT_LINKS_LOST,         /* an outbound exchange's evidence of the request it served could not be kept (its table full, or evicted before the exchange was written): it is linked by its timing alone */
	LT_CNT_MAX,
};

/* Roles of a connection's local end. */
enum lt_role {
	LT_ROLE_UNKNOWN = 0, /* the connection was open before lattrace started */
	LT_ROLE_CLIENT = 1,  /* the local end called connect() */
	LT_ROLE_SERVER = 2,  /* the local end accepted it */
};

/* Which way the first message of an exchange went, from the local end. */
enum lt_exchange_role {
	LT_REQUESTER = 1, /* the local end sent first */
	LT_RESPONDER = 2, /* the peer sent first */
};

/* Bits of lt_progress.flags. */
enum lt_exchange_flag {
	LT_EX_TX_TSTAMP = 1 << 0,     /* x1/a1 came from BPF TX timestamping */
	LT_EX_CWND_RESTART = 1 << 1,  /* cwnd shrank after idle before the first send */
	LT_EX_SSAI = 1 << 2,          /* the netns has tcp_slow_start_after_idle=1 */
	LT_EX_PARTIAL = 1 << 3,       /* first exchange of a connection that predates lattrace */
	LT_EX_FIRST = 1 << 4,         /* first exchange of the connection */
	LT_EX_ACK_PURE = 1 << 5,      /* a1 came on a pure ACK before any reply data */
	LT_EX_GREETING = 1 << 6,      /* the server spoke first on the connection (a greeting): not part of this exchange */
	LT_EX_UNANSWERED = 1 << 7,    /* the connection closed before the message of this exchange got its reply */
	LT_EX_PUSH = 1 << 8,          /* the server's message, unprompted, after a complete exchange: it has no request */
	LT_EX_UNFINISHED = 1 << 9,    /* still in progress when the daemon stopped: cut there, not a latency sample */
	LT_EX_X1_XMIT = 1 << 10,      /* x1 read as the last byte's segment was handed to IP (no TX timestamps) */
	LT_EX_H2_STREAMS = 1 << 11,   /* the connection's HTTP/2 streams are followed: exchanges per stream (LT_RECORD_H2) replace this one */
	LT_EX_ROLE_LISTENER = 1 << 12, /* the connection predates lattrace; its role came from the listening sockets */
	LT_EX_ROLE_GUESSED = 1 << 13,  /* the connection predates lattrace; its role is a guess from the ports (no listener table for its namespace) */
	LT_EX_H2_RESYNCING = 1 << 14,  /* HTTP/2 on a connection that predates lattrace, its framing not confirmed yet: the cut may split overlapping streams */
	LT_EX_LINKED = 1 << 15,        /* the request's writer served an inbound request: its link waits in the links map (request_links.bpf.h) */
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

/* HTTP/2 frame types (RFC 9113, section 6) that lattrace counts, from the
 * 9-byte frame headers of cleartext HTTP/2; LT_H2_OTHER for the rest
 * (extensions). */
enum lt_h2_frame {
	LT_H2_DATA = 0,
	LT_H2_HEADERS,
	LT_H2_PRIORITY,
	LT_H2_RST_STREAM,
	LT_H2_SETTINGS,
	LT_H2_PUSH_PROMISE,
	LT_H2_PING,
	LT_H2_GOAWAY,
	LT_H2_WINDOW_UPDATE,
	LT_H2_CONTINUATION,
	LT_H2_OTHER,
	LT_H2_TYPES,
};

/* Bits of lt_conn_close.h2_flags. */
enum lt_h2_flag {
	LT_H2_SEEN = 1 << 0,     /* the connection began with HTTP/2's client preface: its frames are counted */
	LT_H2_UNSYNCED = 1 << 1, /* the framing was lost in a direction: the counts stop there */
	LT_H2_RESYNCED = 1 << 2, /* the connection predates lattrace: its framing was found mid-way (counts start there) */
};

/* What holds back a socket's unsent data (send_wait.bpf.h's classify()
 * tests them in its order); LT_WAIT_OTHER is Nagle, cork or nothing
 * measured. */
enum lt_wait_cause {
	LT_WAIT_OTHER = 0,
	LT_WAIT_CWND = 1,
	LT_WAIT_RWND = 2,
	LT_WAIT_SNDBUF = 3,
	LT_WAIT_PACING = 4,
};

/* Version of the record layouts below, in every record's header. Records
 * outlive the daemon that reads them (the ring buffer is pinned across
 * restarts), so a daemon of another version must recognise records it cannot
 * read: bump it whenever a record struct changes. */
enum lt_layout {
	LT_LAYOUT = 7,
};

struct lt_header {
	__u32 kind;   /* enum lt_record_kind */
	__u32 layout; /* LT_LAYOUT of the program that wrote it */
	__u64 ts_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) when the record was made */
};

/* How the context that wrote an outbound request came to serve an
 * inbound one (request_links.bpf.h). */
enum lt_link_method {
	LT_LINK_NONE = 0,
	LT_LINK_THREAD = 1,    /* the writing thread read the inbound request itself */
	LT_LINK_HANDOFF = 2,   /* the thread that read it woke the writing thread (its first wake-up after the read) */
	LT_LINK_GOROUTINE = 3, /* the writing goroutine read the inbound request itself */
	LT_LINK_GO_PARENT = 4, /* the goroutine that read it started the writing goroutine */
};

/* Execution contexts are threads (their tid) or, in a Go process whose
 * goroutines lattrace reads, goroutines: LT_CTX_GOROUTINE | goid. */
#define LT_CTX_GOROUTINE (1ULL << 63)

/* One inbound request an execution context served: its socket and the
 * first sequence number of the request. */
struct lt_served {
	__u64 cookie;
	__u32 in_seq;
	__u32 method; /* enum lt_link_method */
};

/* Where a Go program keeps its goroutines' ids: the offsets of goid and
 * parentGoid in its runtime.g, from the binary's DWARF (daemon/goroutines),
 * by process in the go_procs map; zeros for a binary without DWARF, whose
 * goroutines are then named by their g. */
struct lt_go_offsets {
	__u32 goid;
	__u32 parent_goid;
};

/* lt_go_offsets.goid of a Go program whose goroutines cannot be followed
 * (another architecture, a Go before 1.21): no evidence is gathered in it,
 * its threads running any goroutine. */
#define LT_GO_UNFOLLOWED 0xffffffffU

struct lt_link {
	/* The inbound request the writing thread read last (cookie 0: none)
	 * and the one it read before. */
	struct lt_served parent;
	struct lt_served prev;
	/* The request last handed to the writing thread by a wake-up. */
	struct lt_served handoff;
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
	__u64 send_skbs;      /* tcp_sendmsg_locked firings: skbs the sends filled (writes, through its fentry stand-in) */
	__u32 role;           /* enum lt_role */
	__u32 h2_flags;       /* enum lt_h2_flag; 0: not HTTP/2, or its framing is not read */
	__u32 h2_frames[LT_H2_TYPES]; /* HTTP/2 frames both ways, by enum lt_h2_frame, when LT_H2_SEEN */
	__u32 _pad;
};

/* LT_RECORD_CONN_OPEN */
struct lt_conn_open {
	struct lt_header hdr;
	__u64 cookie;
	struct lt_flow flow;
	__u64 syn_ns;         /* SYN sent (client); 0 for accepted connections */
	__u32 role;           /* enum lt_role */
	__u32 handshake_rtt_us;
};

/* What a socket builds of its exchange while the exchange runs
 * (lt_sock.cur); the rest of lt_exchange is read from the socket when the
 * record is written, so the socket's storage holds only this part.
 * Timestamps are bpf_ktime_get_ns(); zero means the point did not happen.
 * "out" is the message the local end sent, "in" the one it received. */
struct lt_progress {
	__u32 role;  /* enum lt_exchange_role */
	__u32 flags; /* enum lt_exchange_flag */

	__u64 connect_ns;     /* SYN sent, first exchange of a client connection */
	__u64 established_ns; /* first exchange only */
	__u64 w0, w1, x1, a1; /* out message: first write, last write returned, last byte sent, acked */
	__u64 r0, r1, d1;     /* in message: first byte, last byte arrived, last byte read */

	__u32 segs_in, rtos;
	__u64 loss_out_ns; /* out message: first send of a lost byte to its last retransmission */
	__u64 loss_in_ns;  /* in message: time with a hole in the received sequence */
	__u64 wait_cwnd_ns, wait_rwnd_ns, wait_sndbuf_ns, wait_other_ns;
	__u64 wait_pacing_ns; /* out message held until its pacing departure time */
	/* Out message: time between a write and the next one with all of it
	 * written so far already sent: the app writing it in pieces. */
	__u64 write_gaps_ns;
	__u64 idle_ns; /* connection silence before the exchange */

	__u32 ack_rtt_us; /* a1 - x1 when LT_EX_ACK_PURE */
	__u32 cwnd_start, cwnd_end;
	__u32 rwnd_start;
	char cong[16]; /* congestion control, read when the cwnd restarted */
	/* The execution context (request_links.bpf.h) that read the request,
	 * on the responder, or wrote the request's first byte, on the
	 * requester; 0: not seen from process context. */
	__u64 ctx;
};

/* LT_RECORD_EXCHANGE: one exchange as the local end saw it: what the
 * socket built while it ran, then what the socket says when it is
 * written. Every field is written (the ring buffer's memory is not
 * cleared). */
struct lt_exchange {
	struct lt_header hdr;
	__u64 cookie;
	struct lt_flow flow;
	struct lt_owner owner;
	struct lt_progress progress;

	__u64 bytes_out, bytes_in;
	__u32 conn_role;      /* enum lt_role */
	__u32 turns;          /* the connection's turns so far */
	__u32 turns_exchange; /* turns since the connection's previous exchange */
	__u32 segs_out, retrans;
	__u32 min_rtt_us, srtt_us;
	__u32 path_rtt_us;     /* recent clean RTT of the path (netns, peer address); 0 = none */
	__u32 path_min_rtt_us; /* the path's minimum RTT over minutes, all flows */
	__u32 rwnd_end;
	/* Sequence numbers both ends see alike (NAT keeps them): the
	 * connection's initial sequence numbers and where each message
	 * starts, so two tracers can name the same exchange. */
	__u32 isn_local, isn_remote;
	__u32 out_seq, in_seq;
	/* The requester's evidence of the inbound request it ran inside
	 * (request_links.bpf.h): the requests its writing context served as
	 * the exchange began, each named by socket cookie and first sequence
	 * number, as the responder's own record names it (cookie, in_seq). */
	struct lt_link link;
};

/* Kinds of lt_h2_event. */
enum lt_h2_event_kind {
	LT_H2_FRAME_OUT = 1, /* a frame of a stream left, its last byte handed to IP */
	LT_H2_FRAME_IN = 2,  /* a frame of a stream, or a WINDOW_UPDATE, arrived, its last byte passed to TCP */
	LT_H2_WRITE = 3,     /* a write returned */
	LT_H2_READ = 4,      /* a read returned */
	LT_H2_LOST = 5,      /* the framing was lost: the connection's streams end here */
};

/* LT_RECORD_H2: what user space needs to cut a followed HTTP/2
 * connection into one exchange per stream (daemon/streams): the frames
 * of streams (DATA, HEADERS, CONTINUATION, RST_STREAM) and the peer's
 * WINDOW_UPDATEs
 * (not the other control frames) as they cross the socket's edge, and the writes and reads,
 * which place the app's side of them by sequence number. */
struct lt_h2_event {
	struct lt_header hdr;
	__u64 cookie;
	struct lt_flow flow;
	struct lt_owner owner;
	__u32 kind;      /* enum lt_h2_event_kind */
	__u32 conn_role; /* enum lt_role */
	__u32 seq;       /* frame: its first byte; write: the first byte written; read: the first byte not yet read */
	__u32 end_seq;   /* frame: after its last byte; write: after the last byte written */
	__u64 t0;        /* frame: its header passed; write: the call began */
	__u64 t1;        /* frame: its last byte passed; write and read: the call returned */
	__u32 stream;    /* frame: its stream id */
	__u8 type;       /* frame: enum lt_h2_frame */
	__u8 flags;      /* frame: its flags (END_STREAM 0x1) */
	__u8 wait_cause; /* write: what holds the bytes it left unsent as it returns (enum lt_wait_cause) */
	__u8 adopted;    /* the connection predates lattrace (its role from the listening sockets) */
	/* Incoming HEADERS: the RTTs when it arrived (see lt_exchange). */
	__u32 srtt_us, min_rtt_us, path_rtt_us, path_min_rtt_us;
	__u32 isn_local, isn_remote;
	__u64 syn_ns; /* the connection's SYN, when the local end connected */
};

/* What a socket is doing now, written by the iterator over the socket
 * storage: an exchange in progress is not in any record until it ends (a
 * bulk transfer can run for minutes), so the live view reads this. */
struct lt_inflight {
	__u64 cookie;
	struct lt_flow flow;
	struct lt_owner owner;
	__u32 role;      /* enum lt_exchange_role of the exchange in progress; 0: none */
	__u32 conn_role; /* enum lt_role */
	__u64 start_ns;  /* its first point: w0 or r0 */
	__u64 last_activity_ns;
	__u64 bytes_out, bytes_in; /* of the exchange so far */
	__u32 cwnd, srtt_us;
	__u32 turns;
	__u32 _pad;
};

#endif /* LATTRACE_H */
