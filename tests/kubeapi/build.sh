#!/usr/bin/env bash
# Builds the test Kubernetes API server (module ./server: kube-apiserver with an embedded etcd)
# once and caches the binary.
#
#   tests/kubeapi/build.sh            -> prints the absolute path of the binary on stdout
#
# The binary lives at $LATTRACE_CACHE_DIR/kubeapi-<hash> (default /var/cache/lattrace, falling back
# to ${XDG_CACHE_HOME:-$HOME/.cache}/lattrace when that is not writable). <hash> is the sha256 of
# the server module's go.mod, go.sum and *.go files (first 16 hex digits), so a version change
# gets a fresh binary and an unchanged tree never rebuilds. Concurrent callers serialise on a
# flock; the binary is moved into place atomically. Build output goes to stderr; stdout carries
# only the path.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/server"

cache="${LATTRACE_CACHE_DIR:-/var/cache/lattrace}"
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
	cache="${XDG_CACHE_HOME:-$HOME/.cache}/lattrace"
	mkdir -p "$cache"
fi

hash="$(cd "$src" && cat go.mod go.sum $(LC_ALL=C ls *.go) | sha256sum | cut -c1-16)"
bin="$cache/kubeapi-$hash"

if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi

exec 9>"$bin.lock"
flock 9
if [ ! -x "$bin" ]; then
	echo "kubeapi: building $bin (first time: ~8 min on 2 cores, 85 MB of module downloads, ~3 GB of build cache)" >&2
	tmp="$bin.tmp.$$"
	trap 'rm -f "$tmp"' EXIT
	# GOWORK=off: never pick up a go.work from the surroundings. -mod=readonly: go.sum is committed,
	# nothing may be resolved at build time. -buildvcs=false: no git stamping (repo may be dirty/foreign).
	# nice: the build is long and must not starve whatever else runs on the two cores.
	(cd "$src" && GOWORK=off CGO_ENABLED=0 nice -n 5 go build -mod=readonly -buildvcs=false -trimpath \
		-ldflags='-s -w' -o "$tmp" .) >&2
	mv -f "$tmp" "$bin"
	trap - EXIT
fi
rm -f "$bin.lock"
echo "$bin"
