#!/usr/bin/env bash
# Builds Prometheus 3 (module ./server requires github.com/prometheus/prometheus/cmd/prometheus as a
# tool) once and caches the binary as prometheus-<hash of the module> (tests/buildonce/build.sh:
# where, and when it rebuilds). remove_all_sd leaves the service-discovery plugins out: one of
# their dependencies is refused by the module proxy, and the tests scrape nothing.
#
#   tests/prometheus/build.sh            -> prints the absolute path of the binary on stdout
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec nice -n 5 "$here/../buildonce/build.sh" "$here/server" prometheus \
	"first time: ~4 min on 2 cores, ~1 GB module+build cache" \
	github.com/prometheus/prometheus/cmd/prometheus remove_all_sd
