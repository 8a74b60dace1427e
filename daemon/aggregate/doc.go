// Package aggregate keeps live latency statistics per TCP connection (flow)
// and per peer pair, fed by the records the tracer decodes, for the local
// API, `lattrace top`, the exporters and the diagnoses.
//
// # Why
//
// A single exchange says where one request's time went; a user asks "is it
// always like this, and for whom?". Answering that needs distributions (p99,
// not means) per connection and per service pair, kept while the daemon
// runs, at up to tens of thousands of exchanges per second, in bounded
// memory. Distributions are DDSketches (github.com/DataDog/sketches-go) with
// 1 % relative accuracy: quantiles stay accurate across the nanoseconds to
// seconds that latency components span, and memory per sketch depends on
// the spread of the values, not on how many there were.
//
// # Keys
//
// A flow is one connection: its 4-tuple and network namespace plus the
// kernel's socket cookie, because a 4-tuple is reused once the old
// connection is gone and the two must not be merged.
//
// A peer pair is "this local program talking to that service", which must
// survive restarts and connection churn:
//
//   - the local program is comm + cgroup id, not pid: the pid changes at
//     every restart, the container (cgroup) and the command name do not;
//   - the network namespace, because the same addresses mean different
//     hosts in different namespaces;
//   - on the client side of a connection (the local end opened it): the
//     remote address and remote port; the local port is ephemeral and
//     dropped;
//   - on the server side (the local end accepted it): the local (listening)
//     port and the remote address; the remote port is the client's
//     ephemeral port and is dropped.
//
// The side comes from the connection's role (record.Exchange.ConnRole,
// record.ConnOpen.Role, record.ConnClose.Role). For a connection that was
// open before lattrace started the role is unknown; the side is then taken
// from the first exchange's role (requester = client, responder = server),
// and from the ports (the lower one is taken as the listening port) when
// there is no exchange. The side is fixed for a flow once chosen, so one
// connection never feeds two peer pairs because its direction of speech
// changed. IPv4-mapped IPv6 addresses are unmapped, so a v4 peer reached
// through a v6 socket is the same peer as over a v4 socket.
//
// # Bounds
//
// Every table has a configured maximum (Config.MaxFlows, Config.MaxPeers).
// Inserting into a full table evicts first a closed flow still in its grace
// period, else the least recently updated entry, and counts the eviction
// (Counters). Closed flows stay visible for Config.CloseGrace after their
// ConnClose so a client can still see how a connection ended; flows and
// peers that receive nothing for Config.FlowIdle / Config.PeerIdle are
// dropped too, so a lost close record does not pin an entry. All of this
// happens in Expire, which the caller drives with the monotonic clock: the
// package starts no goroutine and reads no clock, so tests replay time.
// A peer pair's sketches are capped at Config.SketchBins bins (past that
// the lowest quantiles degrade first, never the tail); a flow's sketches
// allocate 32-bin pages only where values fall, so most flows cost a few
// KB (docs/decisions.md, BenchmarkMemory).
//
// # Concurrency
//
// The Add methods and Expire may be called from any goroutine but are
// serialized; they are meant to be called by the single ring-buffer reader.
// Snapshots (Flows, Peers, Flow, Peer, Counters) run concurrently with them
// and only hold one entry's lock at a time, so a large snapshot does not
// stall the reader. Removed entries are recycled with their sketch memory,
// so connection churn does not allocate in steady state either.
package aggregate
