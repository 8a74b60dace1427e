#!/usr/bin/env bash
# Builds the test Kubernetes API server (module ./server: kube-apiserver with an embedded etcd)
# once and caches the binary as kubeapi-<hash of the module> (tests/buildonce/build.sh: where, and
# when it rebuilds).
#
#   tests/kubeapi/build.sh            -> prints the absolute path of the binary on stdout
#
# nice: the build is long and must not starve whatever else runs on the two cores.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec nice -n 5 "$here/../buildonce/build.sh" "$here/server" kubeapi \
	"first time: ~8 min on 2 cores, 85 MB of module downloads, ~3 GB of build cache"
