// Package recording is the file format of `lattrace record`, read back by
// `lattrace report`: everything lattrace saw on a node for a while, in one
// file a person can copy off the machine and look at later.
//
// # Format, version 1
//
// A recording is one gzip stream (RFC 1952, compress/gzip) of JSON lines
// (one JSON object per line, UTF-8). `zcat run.lattrace | jq` reads it. A
// line is at most 1 MiB, newline included (the longest lattrace writes is a
// few kilobytes); a reader refuses a longer one.
//
// The first line is the header; its "format" is "lattrace-recording" and
// its "version" the format version (Version). A reader refuses a file whose
// first line is not a header, and a version newer than its own.
//
//	{"format":"lattrace-recording","version":1,"lattrace_version":"v0.3",
//	 "host":"node-1","kernel":"6.18.0","started":"2026-11-25T10:00:00Z",
//	 "started_mono_ns":336171877029,"duration_ns":60000000000,
//	 "sample_interval_ns":20000000,"max_samples_per_flow":10000,"max_samples":2000000}
//
// Every other line has a "type":
//
//   - "exchange", "conn_open", "conn_close": the records exactly as the
//     daemon's JSON lines output writes them (exporters/jsonl, described in
//     the README): an exchange with its timeline, components, RTTs, cwnd,
//     retransmissions, turns and its own diagnoses.
//   - "sample": a flow's RTT and congestion window at one instant (Sample),
//     taken from each exchange as it ends and, where the kernel lets the
//     tracer list exchanges in progress, every sample interval from those.
//     Sampling is bounded: per flow at most one sample per interval, except
//     that a sample with retransmissions or a cwnd restart is always kept,
//     and at most max_samples_per_flow per flow and max_samples in all;
//     what the bounds refused is counted in the end line.
//   - "diagnoses": the findings about one flow or one peer pair over the
//     whole recording (Diagnoses), as `lattrace explain` would give them at
//     the end: written just before the end line.
//   - "end": the last line (End): when the recording stopped, how many
//     records of each type it holds, what was not kept and what the tracer
//     lost. A file without it was cut short (the recorder was killed, or
//     the disk filled), and a reader says so.
//
// Timestamps are CLOCK_MONOTONIC nanoseconds like every record's;
// header.started and header.started_mono_ns are the same instant on the
// wall clock and on the monotonic clock, to convert between them.
//
// Lines are written in the order the tracer delivered them, which is close
// to, but not exactly, time order.
package recording
