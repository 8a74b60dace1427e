// Package exporters is the home of lattrace's outputs: each subpackage turns
// the records of package record into one format or protocol (JSON lines
// today; OTLP and Prometheus next), and each implements record.Sink so the
// daemon can fan records out to any set of them.
package exporters
