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
// A flow is keyed by record.FlowKey, a peer pair by record.PeerKey; their
// doc comments say why each field is in the key and which port is dropped.
// A flow's side (client or server, record.SideOf) is fixed once chosen, so
// one connection never feeds two peer pairs because its direction of
// speech changed.
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
// the lowest quantiles degrade first, never the tail). A flow bins only its
// duration and send wait, in 32-bin pages allocated where values fall; its
// other components keep exact statistics, their distributions being the
// pair's (flowSketches), so most flows cost a few KB (docs/decisions.md,
// BenchmarkMemory). Only the Config.ActiveFlows most
// recently updated flows are held so: every other one is packed into a few
// hundred bytes (pack.go), listed like the others and unpacked, as it was,
// by its next record. A node's connections are mostly idle at any moment,
// and every one of them is listed.
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
