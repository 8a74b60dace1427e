package recording

import (
	"errors"
	"fmt"
	"time"

	"github.com/lattrace/lattrace/record"
)

// Format and Version identify the file (see the package comment).
const (
	Format  = "lattrace-recording"
	Version = 1
)

// Line types besides those of exporters/jsonl.
const (
	TypeSample    = "sample"
	TypeDiagnoses = "diagnoses"
	TypeEnd       = "end"
)

// Header is the first line.
type Header struct {
	Format          string `json:"format"`
	Version         int    `json:"version"`
	LattraceVersion string `json:"lattrace_version,omitempty"`
	Host            string `json:"host,omitempty"`
	Kernel          string `json:"kernel,omitempty"`
	// Started and StartedMono are the same instant on both clocks.
	Started     time.Time   `json:"started"`
	StartedMono record.Mono `json:"started_mono_ns"`
	// Duration is how long the recording was asked to run.
	Duration time.Duration `json:"duration_ns"`
	Sampling
	// Notes are what the tracer said about itself when it started (hooks
	// the kernel refused, features off): what a reader of the report
	// should know about what could not be seen.
	Notes []string `json:"notes,omitempty"`
}

// Sampling bounds the RTT/cwnd samples (see the package comment).
type Sampling struct {
	// Interval is the least time between two samples of one flow.
	Interval time.Duration `json:"sample_interval_ns"`
	// MaxPerFlow and Max cap the samples of one flow and of the file.
	MaxPerFlow int `json:"max_samples_per_flow"`
	Max        int `json:"max_samples"`
}

// Validate checks the sampling before a recording starts.
func (s Sampling) Validate() error {
	switch {
	case s.Interval <= 0:
		return fmt.Errorf("--sample-interval %v: want more than 0", s.Interval)
	case s.MaxPerFlow < 1 || s.Max < 1:
		return errors.New("--max-samples-per-flow and --max-samples: want at least 1")
	}
	return nil
}

// Default sampling.
var DefaultSampling = Sampling{Interval: 20 * time.Millisecond, MaxPerFlow: 10_000, Max: 2_000_000}

// withDefaults is s with DefaultSampling's value in each field not above
// zero.
func (s Sampling) withDefaults() Sampling {
	if s.Interval <= 0 {
		s.Interval = DefaultSampling.Interval
	}
	if s.MaxPerFlow <= 0 {
		s.MaxPerFlow = DefaultSampling.MaxPerFlow
	}
	if s.Max <= 0 {
		s.Max = DefaultSampling.Max
	}
	return s
}

// Sample is one flow's RTT and window at one instant.
type Sample struct {
	Time   record.Mono `json:"time_mono_ns"`
	Cookie uint64      `json:"cookie"`
	Flow   record.Flow `json:"flow"`
	// SRTT is the kernel's smoothed RTT (the transport's view); MinRTT its
	// windowed minimum and PathRTT the clean path RTT (the network's
	// view), both zero when the source does not carry them.
	SRTT    time.Duration `json:"srtt_ns"`
	MinRTT  time.Duration `json:"min_rtt_ns,omitempty"`
	PathRTT time.Duration `json:"path_rtt_ns,omitempty"`
	// Cwnd is the congestion window in segments, Rwnd the peer's
	// advertised window in bytes (zero when unknown).
	Cwnd uint32 `json:"cwnd"`
	Rwnd uint32 `json:"rwnd,omitempty"`
	// Retransmits and RTOs happened in the exchange that ended here.
	Retransmits uint32 `json:"retransmits,omitempty"`
	RTOs        uint32 `json:"rtos,omitempty"`
	// CwndRestart: the window had been cut by slow start after idle.
	CwndRestart bool `json:"cwnd_restart,omitempty"`
	// Source is SourceExchange or SourceInFlight.
	Source string `json:"source"`
}

// Sample sources.
const (
	// SourceExchange: taken from an exchange as it ended.
	SourceExchange = "exchange"
	// SourceInFlight: read from an exchange still in progress.
	SourceInFlight = "in_flight"
)

// event reports whether a sample shows something a reader must not miss,
// which the rate bound then does not apply to.
func (s *Sample) event() bool { return s.Retransmits > 0 || s.RTOs > 0 || s.CwndRestart }

// Diagnoses are the findings about one flow or one peer pair.
type Diagnoses struct {
	// Scope is "flow" (Flow set) or "peer" (Peer set).
	Scope     string             `json:"scope"`
	Flow      *record.FlowKey    `json:"flow_key,omitempty"`
	Peer      *record.PeerKey    `json:"peer_key,omitempty"`
	Exchanges uint64             `json:"exchanges"`
	Diagnoses []record.Diagnosis `json:"diagnoses"`
}

// Diagnoses scopes.
const (
	ScopeFlow = "flow"
	ScopePeer = "peer"
)

// End is the last line.
type End struct {
	Ended     record.Mono `json:"ended_mono_ns"`
	EndedWall time.Time   `json:"ended"`
	// Counts of the lines of each type in the file.
	Exchanges  uint64 `json:"exchanges"`
	ConnOpens  uint64 `json:"conn_opens"`
	ConnCloses uint64 `json:"conn_closes"`
	Samples    uint64 `json:"samples"`
	Diagnoses  uint64 `json:"diagnoses"`
	// SamplesThinned counts samples left out by the per-flow interval,
	// SamplesDropped those refused by MaxPerFlow or Max.
	SamplesThinned uint64 `json:"samples_thinned"`
	SamplesDropped uint64 `json:"samples_dropped"`
	// Lost names what the tracer lost while recording (ring buffer full,
	// sockets not followed, records not decoded), by counter name; empty
	// when nothing was.
	Lost map[string]uint64 `json:"lost,omitempty"`
}
