#!/usr/bin/env bash
# Builds the test OpenTelemetry Collector (module ./collector) once and caches the binary as
# otelcol-<hash of the module> (tests/buildonce/build.sh: where, and when it rebuilds).
#
#   tests/otelcol/build.sh            -> prints the absolute path of the binary on stdout
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "$here/../buildonce/build.sh" "$here/collector" otelcol \
	"first time: ~2 min on 2 cores, ~1 GB module+build cache"
