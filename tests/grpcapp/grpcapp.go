// Package grpcapp gives the tests a gRPC server and client (module ./app,
// grpc-go from the Go module proxy at its defaults), built once by
// build.sh.
//
//	LATTRACE_GRPCAPP_BIN=/path   use this binary instead of running build.sh
package grpcapp

import "github.com/lattrace/lattrace/tests/buildonce"

var binary = buildonce.New("grpcapp", "build.sh", "LATTRACE_GRPCAPP_BIN")

// Binary returns the path of the grpcapp binary, building it on first use
// (once per test process).
func Binary() (string, error) { return binary.Path() }
