// Package gateway gives the tests the OpenTelemetry Collector of lattrace's
// fleet gateway (module ./collector: load balancing by trace id, tail
// sampling, OTLP in and out, at the release deploy/helm/lattrace-gateway's
// image runs), built once by build.sh.
//
//	LATTRACE_GATEWAY_OTELCOL_BIN=/path   use this binary instead of running build.sh
package gateway

import "github.com/lattrace/lattrace/tests/buildonce"

var binary = buildonce.New("gateway-otelcol", "build.sh", "LATTRACE_GATEWAY_OTELCOL_BIN")

// Binary returns the path of the gateway Collector, building it on first
// use (once per test process).
func Binary() (string, error) { return binary.Path() }
