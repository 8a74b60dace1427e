#!/usr/bin/env bash
# Builds Jaeger v2 (module ./server requires github.com/jaegertracing/jaeger/cmd/jaeger as a tool)
# once and caches the binary as jaeger-<hash of the module> (tests/buildonce/build.sh: where, and
# when it rebuilds).
#
#   tests/jaeger/build.sh            -> prints the absolute path of the binary on stdout
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec nice -n 5 "$here/../buildonce/build.sh" "$here/server" jaeger \
	"first time: ~4 min on 2 cores, ~1 GB module+build cache" github.com/jaegertracing/jaeger/cmd/jaeger
