#!/usr/bin/env bash
# Builds the Go module in MODULE_DIR once and caches the binary; the test servers' build.sh call it.
#
#   tests/buildonce/build.sh MODULE_DIR NAME NOTE [PACKAGE [TAGS]]
#       -> prints the absolute path of the binary on stdout
#
# PACKAGE is what to build (default: the module's own main package, "."), e.g. an upstream
# server's main package that the module requires as a tool; TAGS its build tags.
# The binary lives at $LATTRACE_CACHE_DIR/NAME-<hash> (default /var/cache/lattrace, falling back to
# ${XDG_CACHE_HOME:-$HOME/.cache}/lattrace when that is not writable). <hash> is the sha256 of the
# module's go.mod, go.sum and *.go files (first 16 hex digits), so a change of a dependency or of
# its code gets a fresh binary and an unchanged tree never rebuilds. Concurrent callers (parallel
# `go test` packages) serialise on a flock; the binary is moved into place atomically. Build output
# goes to stderr, after a line "NAME: building <path> (NOTE)"; stdout carries only the path.
set -euo pipefail

if [ $# -lt 3 ] || [ $# -gt 5 ]; then
	echo "usage: $0 MODULE_DIR NAME NOTE [PACKAGE [TAGS]]" >&2
	exit 2
fi
src="$(cd "$1" && pwd)"
name="$2"
note="$3"
pkg="${4:-.}"
tags="${5:-}"

cache="${LATTRACE_CACHE_DIR:-/var/cache/lattrace}"
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
	cache="${XDG_CACHE_HOME:-$HOME/.cache}/lattrace"
	mkdir -p "$cache"
fi

hash="$(cd "$src" && { cat go.mod go.sum $(LC_ALL=C ls *.go 2>/dev/null); [ "$pkg" = . ] || echo "$pkg $tags"; } | sha256sum | cut -c1-16)"
bin="$cache/$name-$hash"

if [ -x "$bin" ]; then
	echo "$bin"
	exit 0
fi

exec 9>"$bin.lock"
flock 9
if [ ! -x "$bin" ]; then
	echo "$name: building $bin ($note)" >&2
	tmp="$bin.tmp.$$"
	trap 'rm -f "$tmp"' EXIT
	# GOWORK=off: never pick up a go.work from the surroundings. -mod=readonly: go.sum is committed,
	# nothing may be resolved at build time. -buildvcs=false: no git stamping (repo may be dirty/foreign).
	(cd "$src" && GOWORK=off CGO_ENABLED=0 go build -mod=readonly -buildvcs=false -trimpath \
		-tags "$tags" -ldflags='-s -w' -o "$tmp" "$pkg") >&2
	mv -f "$tmp" "$bin"
	trap - EXIT
fi
rm -f "$bin.lock"
echo "$bin"
