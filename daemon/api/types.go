// Package api is the daemon's local API: HTTP/JSON on a Unix socket (and,
// when asked, on a loopback TCP port) serving the live flows, peer pairs,
// recent exchanges, diagnoses and the daemon's own health. The schema is
// versioned by the /v1 path prefix and documented in docs/api.md; a change
// that removes or renames a field needs /v2. The CLI (`lattrace top`,
// `flows`, `explain`) is its first client, through Client.
package api

import (
	"time"

	"github.com/lattrace/lattrace/daemon/aggregate"
	"github.com/lattrace/lattrace/daemon/history"
	"github.com/lattrace/lattrace/record"
)

// Version is the schema version: the path prefix of every endpoint and
// the api_version field of every response.
const Version = "v1"

// DefaultSocket is where the daemon listens and clients look by default.
const DefaultSocket = "/run/lattrace/api.sock"

// Flow is one connection with its statistics and what is wrong with it.
type Flow struct {
	// ID names the flow in the API and the CLI: the kernel's socket
	// cookie, unique while the system runs.
	ID string `json:"id"`
	aggregate.FlowStats
	// PeerID is the peer pair the flow is counted under, "" before it has
	// one.
	PeerID string `json:"peer_id,omitempty"`
	// Rate is exchanges per second over the last 5 to 10 s.
	Rate      float64            `json:"exchanges_per_s"`
	Split     record.Split       `json:"split"`
	Dominant  string             `json:"dominant"`
	Diagnoses []record.Diagnosis `json:"diagnoses"`
	// InFlight is the exchange in progress now, when there is one: a
	// transfer that has run for minutes has no record until it ends.
	InFlight *record.InFlight `json:"in_flight,omitempty"`
}

// Peer is one peer pair ("this program talking to that service").
type Peer struct {
	// ID names the pair: a hash of its key, stable while the daemon runs.
	ID string `json:"id"`
	aggregate.PeerStats
	// Rate is the sum of its live flows' rates.
	Rate      float64            `json:"exchanges_per_s"`
	Split     record.Split       `json:"split"`
	Dominant  string             `json:"dominant"`
	Diagnoses []record.Diagnosis `json:"diagnoses"`
}

// FlowList answers GET /v1/flows.
type FlowList struct {
	APIVersion string `json:"api_version"`
	// Now is the daemon's CLOCK_MONOTONIC when the list was taken, the
	// clock of every *_mono_ns field.
	Now record.Mono `json:"now_mono_ns"`
	// Total is how many flows matched before the limit.
	Total int    `json:"total"`
	Flows []Flow `json:"flows"`
}

// PeerList answers GET /v1/peers.
type PeerList struct {
	APIVersion string      `json:"api_version"`
	Now        record.Mono `json:"now_mono_ns"`
	Total      int         `json:"total"`
	Peers      []Peer      `json:"peers"`
}

// FlowDetail answers GET /v1/flows/{id}: the flow and its last exchanges,
// oldest first.
type FlowDetail struct {
	APIVersion string           `json:"api_version"`
	Now        record.Mono      `json:"now_mono_ns"`
	Flow       Flow             `json:"flow"`
	Recent     []history.Sample `json:"recent"`
}

// PeerDetail answers GET /v1/peers/{id}: the pair and its live flows.
type PeerDetail struct {
	APIVersion string      `json:"api_version"`
	Now        record.Mono `json:"now_mono_ns"`
	Peer       Peer        `json:"peer"`
	Flows      []Flow      `json:"flows"`
}

// Health answers GET /v1/health: is the daemon tracing, and is it losing
// anything.
type Health struct {
	APIVersion string    `json:"api_version"`
	Version    string    `json:"version"`
	Started    time.Time `json:"started"`
	// Status is "ok", or "degraded" when an optional hook failed or
	// records were lost.
	Status    string             `json:"status"`
	Problems  []string           `json:"problems,omitempty"`
	Hooks     []Hook             `json:"hooks"`
	Kernel    KernelCounters     `json:"kernel"`
	Aggregate aggregate.Counters `json:"aggregate"`
}

// Hook says whether one of the tracer's kernel hooks is live.
type Hook struct {
	Program  string `json:"program"`
	Hook     string `json:"hook"`
	Required bool   `json:"required"`
	// Feature is what the hook gives; it is off while the hook is not
	// attached and no fallback stands in.
	Feature  string `json:"feature"`
	Attached bool   `json:"attached"`
	// FallbackFor names the hook this one stands in for, when it is a
	// fallback.
	FallbackFor string `json:"fallback_for,omitempty"`
	// Adopted: taken over, pinned, from the previous daemon.
	Adopted bool   `json:"adopted,omitempty"`
	Error   string `json:"error,omitempty"`
}

// KernelCounters are the tracer's accounting: what the kernel side
// recorded, what the daemon decoded, and every record lost on the way.
type KernelCounters struct {
	RingbufFull  uint64 `json:"ringbuf_full"`
	StorageFail  uint64 `json:"storage_fail"`
	Submitted    uint64 `json:"records_submitted"`
	SocksTracked uint64 `json:"socks_tracked"`
	Exchanges    uint64 `json:"exchanges_closed"`
	TstampOff    uint64 `json:"sockets_without_tx_timestamps"`
	// PathFull counts paths whose RTT history was dropped for another
	// path's.
	PathFull uint64 `json:"path_entry_failures"`
	// IdleWritten counts exchanges written complete and idle, before
	// their next turn; Unfinished those written still in progress at a
	// daemon's stop.
	IdleWritten uint64 `json:"exchanges_idle_written"`
	Unfinished  uint64 `json:"exchanges_unfinished"`
	// H2Unsynced counts HTTP/2 connections whose framing was lost in a
	// direction.
	H2Unsynced uint64 `json:"http2_unsynced"`
	// H2Streams counts exchanges made of HTTP/2 streams; H2ConnReplaced
	// the connection-level exchanges they replaced. H2Unplaced counts
	// outgoing frames whose write was not seen, H2Unread streams written
	// without the read of their incoming message, H2Ignored frames of
	// streams already written or beyond the open streams a connection
	// may keep.
	H2Streams      uint64 `json:"http2_streams"`
	H2ConnReplaced uint64 `json:"http2_connection_exchanges_replaced"`
	H2Unplaced     uint64 `json:"http2_frames_unplaced"`
	H2Unread       uint64 `json:"http2_streams_unread"`
	H2Ignored      uint64 `json:"http2_frames_ignored"`
	// NetnsUnswept counts network namespaces the sweep could not enter,
	// once per sweep.
	NetnsUnswept uint64 `json:"netns_unswept"`
	Decoded      uint64 `json:"records_decoded"`
	DecodeErrors uint64 `json:"decode_errors"`
	// ReplaySkipped counts records a restarted daemon withheld from an
	// output because the killed one had written them already.
	ReplaySkipped uint64 `json:"replay_skipped,omitempty"`
	// ReplayedUnsure counts exchanges a restarted daemon gave an output
	// again that the killed one may have delivered (an acknowledgement in
	// flight at the kill): that output may hold them twice.
	ReplayedUnsure uint64 `json:"replayed_unsure,omitempty"`
	// ReleasedUnsynced counts the times records went back to the kernel
	// before a slow output had made them durable.
	ReleasedUnsynced uint64 `json:"released_unsynced,omitempty"`
	// UnwrittenAtStop counts exchanges in progress at the stop that the
	// ring had no room for however often it was drained.
	UnwrittenAtStop uint64 `json:"unwritten_at_stop,omitempty"`
	// SocketsUnfollowed counts connection ends born while new sockets
	// were not followed, the daemon's memory near its limit.
	SocketsUnfollowed uint64 `json:"sockets_unfollowed,omitempty"`
	// AdoptedServer, AdoptedClient and AdoptedGuessed count the ends of
	// connections open before lattrace that it follows, by how the role
	// was told:
	// a listener on the local port (server), none (client), or guessed
	// from the ports where the namespace's listeners were never read.
	// ListenersLost counts listening sockets that could not be counted;
	// NetnsUnseeded namespaces whose listeners could not be read.
	AdoptedServer  uint64 `json:"adopted_server"`
	AdoptedClient  uint64 `json:"adopted_client"`
	AdoptedGuessed uint64 `json:"adopted_guessed"`
	ListenersLost  uint64 `json:"listeners_lost,omitempty"`
	NetnsUnseeded  uint64 `json:"netns_unseeded,omitempty"`
	// H2Resynced counts ends of HTTP/2 connections open before lattrace
	// whose framing was found mid-way; H2ResyncLost those that looked
	// like HTTP/2 but whose framing was not confirmed.
	H2Resynced   uint64 `json:"http2_resynced"`
	H2ResyncLost uint64 `json:"http2_resync_lost"`
	// LinksLost counts outbound exchanges whose evidence of the request
	// they served could not be kept: request trees link them by timing.
	LinksLost uint64 `json:"links_lost,omitempty"`
}

// Error is the body of every 4xx and 5xx answer.
type Error struct {
	Error string `json:"error"`
}
