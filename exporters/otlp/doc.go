// Package otlp exports lattrace's exchanges over OTLP (gRPC or
// HTTP/protobuf) with the official OpenTelemetry Go SDK: one trace span per
// sampled exchange (with a child span per stage of its timeline) and
// metrics of every exchange (duration and component histograms, TCP
// counters) per peer pair. Its Exporter is a record.Sink and never blocks
// the reading goroutine: spans go through a bounded queue that batches
// them, keeps each exchange's spans together, tries a batch the backend did
// not take again after a backoff and, when full, drops the least important
// exchange's (counted, by reason), and metrics are counted in memory and
// collected by the SDK's readers (a PeriodicReader pushes them over OTLP).
//
// # Clocks
//
// Exchange timestamps are CLOCK_MONOTONIC (bpf_ktime_get_ns); spans need wall
// clock. The exporter measures offset = CLOCK_REALTIME - CLOCK_MONOTONIC by
// reading REALTIME between two MONOTONIC reads (taking their midpoint) when
// it starts, and again whenever an exchange arrives more than
// ClockResyncInterval after the last measurement, so a step of the wall
// clock (NTP, settimeofday) is followed within that interval. A span's start
// and end are shifted by the same offset, so stage durations are exact.
//
// # Both ends in one trace
//
// Both ends of a TCP connection see the same initial sequence numbers and
// the same sequence number where a request starts. The requester names its
// exchange (ISNLocal, ISNRemote, OutSeq), the responder (ISNRemote,
// ISNLocal, InSeq): both are (client ISN, server ISN, request seq). The
// trace ID is SHA-256("lattrace/trace" || those 12 bytes) truncated to 16
// bytes, and the requester's exchange span ID SHA-256("lattrace/span" ||
// ...) truncated to 8. The requester's span gets those IDs from a custom
// sdktrace.IDGenerator (the wanted IDs ride in the context of the root span
// only); the responder starts its span under a remote parent SpanContext
// (trace.ContextWithRemoteSpanContext) with that trace ID and the
// requester's span ID, so two lattrace daemons that never talk to each
// other produce one trace: requester span -> responder span. When both ISNs
// are zero (not known) the IDs are random.
//
// # Sampling
//
// Every exchange is recorded in the metrics. Spans are sampled in one place
// (the sampler, asked by Exporter.Exchange): an exchange whose Duration is
// at least Config.SlowThreshold, or with a warning or critical diagnosis,
// is exported within a budget of
// Config.SlowRatePerSecond (a connection storm makes every exchange slow,
// and a span per exchange then costs more than the tracing); the rest go
// through a token bucket of Config.RatePerSecond (burst Config.Burst). The
// SDK's sampler is AlwaysSample. Stats counts the decisions and the fate of
// exported spans.
package otlp
