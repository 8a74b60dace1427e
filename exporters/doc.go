// Package exporters is the home of lattrace's outputs, one subpackage each;
// none of them imports the daemon, and the records they write are package
// record's:
//   - jsonl: JSON lines, one object per exchange and connection event
//     (a record.Sink);
//   - otlp: spans and metrics over OTLP with the OpenTelemetry SDK (a
//     record.Sink);
//   - prometheus: /metrics for a Prometheus scrape: the metrics the otlp
//     package counts, through a reader that joins its MeterProvider, plus
//     the daemon's health counters (not a Sink);
//   - recording: the file `lattrace record` writes (its Writer is a
//     record.Sink) and `lattrace report` reads.
package exporters
