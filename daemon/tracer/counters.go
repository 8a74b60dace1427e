package tracer

import (
	"fmt"
	"math"
)

// Counters are the kernel programs' own accounting, summed over CPUs, plus
// the reader's. Drops are never silent: every one is counted here.
type Counters struct {
	RingbufFull  uint64
	StorageFail  uint64
	Submitted    uint64
	SocksTracked uint64
	Exchanges    uint64
	TstampOff    uint64
	// PathFull counts paths whose RTT history was dropped for another
	// path's (their slot of the path table was in use within a minute).
	PathFull uint64
	// IdleWritten counts exchanges the sweep wrote, complete and quiet,
	// before their next turn; Unfinished those written at the daemon's
	// stop while still in progress.
	IdleWritten uint64
	Unfinished  uint64
	// H2Unsynced counts HTTP/2 connections whose framing was lost in a
	// direction (a gap in the segments), so their frame counts stop there.
	H2Unsynced uint64
	// H2Streams counts exchanges made of HTTP/2 streams; H2ConnReplaced
	// the connection-level exchanges they replaced (dropped). H2Unplaced
	// counts outgoing frames whose write was not seen (their x1 stands in
	// for w0/w1); H2Unread streams written without the read of their
	// incoming message (d1 unknown); H2Ignored frames of streams already
	// written or beyond the streams a connection may keep open.
	H2Streams, H2ConnReplaced, H2Unplaced, H2Unread, H2Ignored uint64
	// NetnsUnswept counts the times the sweep passed over a network
	// namespace it could not enter (their exchanges wait for the turn).
	NetnsUnswept uint64
	Decoded      uint64
	DecodeErrors uint64
	// ReplaySkipped counts the deliveries a restarted daemon withheld from
	// an output because the killed one had already written them (Resume).
	ReplaySkipped uint64
	// ReplayedUnsure counts the exchanges a restarted daemon gave an
	// output again that the killed one may have delivered already: it had
	// handed them to the output, which had not yet confirmed them (an OTLP
	// backend's answer in flight at the kill). It bounds the exchanges
	// that output may hold twice.
	ReplayedUnsure uint64
	// ReleasedUnsynced counts the times records were given back to the
	// kernel before an output (a slow tracing backend) had made them
	// durable, because they held half the ring: a kill then loses that
	// output's copy of them. (Holding on instead would make the kernel
	// drop new records, for every output.)
	ReleasedUnsynced uint64
	// UnwrittenAtStop counts exchanges in progress at the daemon's stop
	// that were not written: the ring stayed full between the sweep's
	// passes (sweepAtStop).
	UnwrittenAtStop uint64
	// SocketsUnfollowed counts connection ends born while new sockets
	// were not followed, for memory (LimitSockets).
	SocketsUnfollowed uint64
	// AdoptedServer, AdoptedClient and AdoptedGuessed count the ends of
	// connections open before lattrace that it follows (both ends of a
	// connection within the node count): a listener on the local port
	// (the server's end), none (the client's), or a network namespace
	// whose listeners were never read, where the role is guessed from the
	// ports. ListenersLost counts listening sockets that could not be
	// counted (the table full); NetnsUnseeded network namespaces whose
	// listeners could not be read at the start.
	AdoptedServer, AdoptedClient, AdoptedGuessed, ListenersLost, NetnsUnseeded uint64
	// H2Resynced counts ends of HTTP/2 connections open before lattrace whose
	// framing was found from frame headers, their streams followed from
	// there; H2ResyncLost those that looked like HTTP/2 but whose framing
	// was not confirmed (their own exchanges stand, no latency samples
	// while it was tried).
	H2Resynced, H2ResyncLost uint64
	// LinksLost counts outbound exchanges whose evidence of the request
	// they served could not be kept (its table full, or evicted before the
	// exchange was written): request trees link them by their timing alone.
	LinksLost uint64
}

// Counters reads the per-CPU counters map.
func (t *Tracer) Counters() (Counters, error) {
	m := t.maps.Maps["counters"]
	sum := func(k lattraceLtCounter) (uint64, error) {
		var perCPU []uint64
		if err := m.Lookup(uint32(k), &perCPU); err != nil {
			return 0, fmt.Errorf("reading counter %d: %w", k, err)
		}
		var s uint64
		for _, v := range perCPU {
			s += v
		}
		return s, nil
	}
	var c Counters
	var err error
	for _, f := range []struct {
		k   lattraceLtCounter
		dst *uint64
	}{
		{lattraceLtCounterLT_CNT_RINGBUF_FULL, &c.RingbufFull},
		{lattraceLtCounterLT_CNT_STORAGE_FAIL, &c.StorageFail},
		{lattraceLtCounterLT_CNT_RECORDS, &c.Submitted},
		{lattraceLtCounterLT_CNT_SOCKS_TRACKED, &c.SocksTracked},
		{lattraceLtCounterLT_CNT_EXCHANGES, &c.Exchanges},
		{lattraceLtCounterLT_CNT_TSTAMP_OFF, &c.TstampOff},
		{lattraceLtCounterLT_CNT_PATH_FULL, &c.PathFull},
		{lattraceLtCounterLT_CNT_IDLE_WRITTEN, &c.IdleWritten},
		{lattraceLtCounterLT_CNT_UNFINISHED, &c.Unfinished},
		{lattraceLtCounterLT_CNT_H2UNSYNCED, &c.H2Unsynced},
		{lattraceLtCounterLT_CNT_ADOPTED_SERVER, &c.AdoptedServer},
		{lattraceLtCounterLT_CNT_ADOPTED_CLIENT, &c.AdoptedClient},
		{lattraceLtCounterLT_CNT_ADOPTED_GUESSED, &c.AdoptedGuessed},
		{lattraceLtCounterLT_CNT_LISTENERS_LOST, &c.ListenersLost},
		{lattraceLtCounterLT_CNT_H2RESYNCED, &c.H2Resynced},
		{lattraceLtCounterLT_CNT_H2RESYNC_LOST, &c.H2ResyncLost},
		{lattraceLtCounterLT_CNT_LINKS_LOST, &c.LinksLost},
	} {
		if *f.dst, err = sum(f.k); err != nil {
			return c, err
		}
	}
	c.Decoded = t.decoded.Load()
	c.DecodeErrors = t.decodeErrors.Load()
	c.ReplaySkipped = t.replaySkipped.Load()
	c.ReplayedUnsure = t.replayedUnsure.Load()
	c.ReleasedUnsynced = t.releasedUnsynced.Load()
	c.UnwrittenAtStop = t.unwrittenAtStop.Load()
	c.NetnsUnswept = t.unswept.Load()
	c.NetnsUnseeded = t.unseeded.Load()
	c.H2ConnReplaced = t.h2Replaced.Load()
	c.H2Streams = t.streams.Stats.Streams.Load()
	c.H2Unplaced = t.streams.Stats.Unplaced.Load()
	c.H2Unread = t.streams.Stats.Unread.Load()
	c.H2Ignored = t.streams.Stats.Ignored.Load()
	// Last: every counter above is filled even when this fails.
	var ctl lattraceLtControl
	if err := t.maps.Maps["control"].Lookup(uint32(lattraceLtControlSlotLT_CONTROL_SEEN), &ctl); err != nil {
		return c, fmt.Errorf("reading the programs' control: %w", err)
	}
	c.SocketsUnfollowed = ctl.SocketsUnfollowed
	return c, nil
}

// LimitSockets bounds the sockets the programs begin to follow: n < 0,
// every one; n = 0, none for now; n > 0, at most n more from their birth
// until the next call, and none first seen later (open before lattrace,
// or born while none were followed). The daemon's memory guard asks for
// it since each followed socket's storage is charged to the daemon's
// memory cgroup: a budget of the room left, given at each of its looks,
// holds a burst of new sockets to that room however late the next look
// comes. Sockets followed already are followed on.
func (t *Tracer) LimitSockets(n int64) error {
	var c lattraceLtControl
	switch {
	case n == 0:
		c.SocketsPaused = 1
	case n > 0:
		var seen lattraceLtControl
		if err := t.maps.Maps["control"].Lookup(uint32(lattraceLtControlSlotLT_CONTROL_SEEN), &seen); err != nil {
			return fmt.Errorf("reading the programs' control: %w", err)
		}
		// The programs compare modulo 2^32; 0 means no budget.
		c.Sockets = seen.Sockets + uint32(min(n, math.MaxInt32))
		if c.Sockets == 0 {
			c.Sockets = 1
		}
	}
	if err := t.maps.Maps["control"].Update(uint32(lattraceLtControlSlotLT_CONTROL_SET), &c, 0); err != nil {
		return fmt.Errorf("writing the programs' control: %w", err)
	}
	return nil
}
