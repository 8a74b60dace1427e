#!/usr/bin/env bash
# Builds the gateway's OpenTelemetry Collector (module ./collector: the components of
# deploy/helm/lattrace-gateway at the release its image runs) once and caches the binary as
# gateway-otelcol-<hash of the module> (tests/buildonce/build.sh: where, and when it rebuilds).
#
#   tests/gateway/build.sh            -> prints the absolute path of the binary on stdout
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec nice -n 5 "$here/../buildonce/build.sh" "$here/collector" gateway-otelcol \
	"first time: ~2 min on 2 cores, ~1 GB module+build cache"
