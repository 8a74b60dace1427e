// Package workload is lattrace's own TCP request/response workload with
// known ground truth, used by tests that check the tracer's latency
// attribution.
//
// # Why
//
// lattrace splits the latency of each request/response exchange into
// network, transport and application components. To test that, we need a
// workload whose application-level timing is known exactly: when the client
// started writing each request and when it read the last response byte (an
// app-level ping-pong, as in the "latency-tester" measured next to TCP and
// network RTT), and how long the server thought, injected on purpose and
// recorded. The client and server here emit that ground truth as JSON
// records, one per exchange, that tests compare with the tracer's output.
//
// # Protocol
//
// Every message starts with a fixed 40-byte header (see Header for the
// layout): magic "LATR", version, kind, exchange id, request length,
// wanted response length, think time in microseconds and a kind-specific
// 64-bit field. A request is the header plus padding up to the request
// length. The server reads it, sleeps the think time (the request's, or its
// default when the request carries ThinkServerDefault), and answers with a
// header of kind response carrying the same id, padded to exactly the wanted
// response length (or the server's default when the request asks for 0).
// So the client drives sizes and think time per request and the server's
// flags only supply defaults. Requests on one connection may be pipelined:
// by default the server handles each request as soon as it is read, so
// responses may leave out of order and the client matches them by id.
//
// A connection whose first header has kind bulk-up or bulk-down is a bulk
// stream (background traffic): the client streams bytes to the server until
// it shuts down its write side and the server acknowledges the byte count,
// or the server streams bytes to the client.
//
// # Clock
//
// Every *_ns field of the records is CLOCK_MONOTONIC in nanoseconds, read
// with clock_gettime (MonoNow): the clock behind the kernel's
// bpf_ktime_get_ns, so records can be lined up with the tracer's events on
// the same host, network namespaces included. Each record also carries one
// wall-clock time for humans. Read timestamps are taken right after the read
// call that returned the byte in question (the reader never reads ahead of
// an empty buffer, so each buffered byte's read time is exact); write
// timestamps right before the first and right after the last write call.
//
// # Use
//
// Go tests run RunServer (or Listen and Serve, to learn the port first),
// RunClient and RunBulk in-process; the command tests/workload/cmd/workload
// wraps them for shells and other hosts. Listen, RunClient and RunBulk create
// their sockets on the calling goroutine, so a test that has locked its OS
// thread into a network namespace (and uses IP literals, avoiding resolver
// goroutines) gets its sockets in that namespace.
package workload
