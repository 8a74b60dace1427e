#!/usr/bin/env bash
# Builds the gRPC test workload (module ./app: grpc-go at its defaults) once and caches the binary
# as grpcapp-<hash of the module> (tests/buildonce/build.sh: where, and when it rebuilds).
#
#   tests/grpcapp/build.sh            -> prints the absolute path of the binary on stdout
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec nice -n 5 "$here/../buildonce/build.sh" "$here/app" grpcapp \
	"first time: ~1 min on 2 cores, grpc-go from the Go module proxy"
