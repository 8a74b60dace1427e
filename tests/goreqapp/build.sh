#!/usr/bin/env bash
# Builds the Go request-tree workload (module ./app: net/http, database/sql with lib/pq, go-redis v9)
# once and caches the binary as goreqapp-<hash of the module> (tests/buildonce/build.sh: where, and
# when it rebuilds).
#
#   tests/goreqapp/build.sh           -> prints the absolute path of the binary on stdout
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec nice -n 5 "$here/../buildonce/build.sh" "$here/app" goreqapp \
	"first time: ~15 s on 2 cores, ~50 s with an empty Go build cache; lib/pq and go-redis from the Go module proxy"
