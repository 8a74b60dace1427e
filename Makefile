# lattrace: build, run and test. Every target installs what it needs first
# (make setup is idempotent and quick when everything is present).
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(HOME)/go/bin:/var/cache/lattrace/bin:$(PATH)

GO      ?= go
BIN     := bin/lattrace
VERSION := $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/lattrace/lattrace/cli.version=$(VERSION)

# Debian packages: build tools, and what the tests drive (network lab, peers).
PKGS := clang llvm libbpf-dev bpftool ethtool iproute2 iputils-ping iperf3 tcpdump tshark util-linux tmux
# Only the tests need a browser (tests/report opens lattrace report's page
# headless); it is large, so `make run` does not install it.
TEST_PKGS := chromium
# The servers and clients of the real-application suite (tests/apps). The
# tests start them in lab namespaces: installing them must not start them
# as services, so a policy-rc.d refuses that for the time of the install.
APP_PKGS := nginx-light wrk redis-server redis-tools nghttp2-server nghttp2-client postgresql mariadb-server mariadb-client curl python3-psycopg2 python3-redis

GENERATED := daemon/tracer/lattrace_bpfel.go daemon/tracer/lattrace_bpfel.o

.PHONY: all setup browser apps kernels mounts generate check-generate vmlinux build run test soak lint clean otelcol gateway jaeger prometheus kubeapi grpcapp goreqapp image helm manifests bench bench-quick bench-tools pgo

all: build

setup:
	@missing=$$(for p in $(PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@command -v $(GO) >/dev/null || { echo "Go is not installed (want go >= 1.24 on PATH)"; exit 1; }

browser:
	@dpkg-query -W -f='$${Status}\n' $(TEST_PKGS) 2>/dev/null | grep -q '^install ok installed' || { \
		echo "installing:" $(TEST_PKGS); \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(TEST_PKGS) >/dev/null; }

# The peers make bench measures lattrace beside (tests/bench).
BENCH_PKGS := sockperf bpftrace libbpf-tools

bench-tools:
	@missing=$$(for p in $(BENCH_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

apps:
	@missing=$$(for p in $(APP_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		own=; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own=1; }; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; status=$$?; \
		[ -z "$$own" ] || rm -f /usr/sbin/policy-rc.d; exit $$status; \
	fi

# The kernel matrix (tests/kernels): qemu, virtme-ng and Debian's 6.1 and
# 6.12 kernels, unpacked into /var/cache/lattrace/kernels once per release.
kernels:
	@tests/kernels/setup.sh

# bpffs for pinned maps, tracefs for classic tracepoints: neither is mounted
# at boot on every machine.
mounts:
	@mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
	@mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing

# bpf2go compiles bpf/*.c and writes the Go bindings next to the package that
# loads them. The outputs are committed (see README: "Generated files").
generate:
	cd daemon/tracer && $(GO) generate ./...

check-generate: generate
	@git diff --quiet --exit-code -- $(GENERATED) || { \
		echo "generated BPF files are stale: run 'make generate' and commit them"; git diff --stat -- $(GENERATED); exit 1; }

# vmlinux.h is committed (see bpf/README.md); this rewrites it from the
# running kernel's BTF.
vmlinux:
	bpftool btf dump file /sys/kernel/btf/vmlinux format c > bpf/vmlinux.h

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/lattrace

# helm, for the chart's tests, built once from the Go module proxy (the
# only registry here that has it) into the same cache as the Collector.
HELM_VERSION := v3.22.0
helm:
	@[ -x /var/cache/lattrace/bin/helm ] && [ -e /var/cache/lattrace/bin/.helm-$(HELM_VERSION) ] || { \
		echo "building helm $(HELM_VERSION) (once)"; \
		mkdir -p /var/cache/lattrace/bin && GOBIN=/var/cache/lattrace/bin $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION) && \
		touch /var/cache/lattrace/bin/.helm-$(HELM_VERSION); }

# deploy/kubernetes/ holds the charts rendered with their defaults.
manifests: helm
	helm template lattrace deploy/helm/lattrace --namespace lattrace --set createNamespace=true > deploy/kubernetes/lattrace.yaml
	helm template lattrace-gateway deploy/helm/lattrace-gateway --namespace lattrace-gateway --set createNamespace=true > deploy/kubernetes/lattrace-gateway.yaml

# The container image (Dockerfile). Needs docker or podman; without one,
# tests/e2e builds and starts the binary the image would ship.
image:
	@engine=$$(command -v docker || command -v podman); \
	if [ -z "$$engine" ]; then echo "make image needs docker or podman; none is installed (the image's binary is built and started by make test)"; exit 1; fi; \
	$$engine build --build-arg VERSION=$(VERSION) -t lattrace:$(VERSION) .

# The live view: it reads a running daemon's API, or traces in-process when
# there is none.
run: setup mounts build
	./$(BIN) top

lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); [ -z "$$fmt" ] || { echo "not gofmt'd: $$fmt"; exit 1; }
	$(GO) vet ./...

# A real OpenTelemetry Collector for the exporter tests, built once from the
# Go module proxy and cached by the hash of its module (tests/otelcol).
otelcol:
	@tests/otelcol/build.sh >/dev/null

# The fleet gateway's Collector (load balancing, tail sampling) for the
# gateway chart's tests, built the same way (tests/gateway).
gateway:
	@tests/gateway/build.sh >/dev/null

# Jaeger v2 and Prometheus 3 for the fleet gateway's test (tests/e2e
# TestFleetGateway), built the same way (tests/jaeger, tests/prometheus;
# cold: ~4 min each on 2 cores).
jaeger:
	@tests/jaeger/build.sh >/dev/null
prometheus:
	@tests/prometheus/build.sh >/dev/null

# A real kube-apiserver with an embedded etcd for the Kubernetes names tests,
# built the same way (tests/kubeapi; cold: ~8 min on 2 cores).
kubeapi:
	@tests/kubeapi/build.sh >/dev/null

# The gRPC workload (grpc-go at its defaults) for tests/apps, built the same
# way (tests/grpcapp).
grpcapp:
	@tests/grpcapp/build.sh >/dev/null

# The Go application of tests/apps TestRequestTreesGo (net/http, lib/pq,
# go-redis), built the same way (tests/goreqapp; cold: ~15 s on 2 cores).
goreqapp:
	@tests/goreqapp/build.sh >/dev/null

# Packages run one at a time (-p 1): the network lab's timing tests must not
# share the two vCPUs with another package's traffic. gotestsum runs them and
# keeps their events; tests/reruns then reads them: a failed test runs once
# more only if .ci/reruns.txt names it (with the reason), any other failure
# fails the run at once, and every rerun is printed at the end. A package's
# time limit only catches a hang: the kernel matrix's two VMs on an emulated
# CPU took 21 minutes on a busy two-vCPU machine.
GOTESTSUM_VERSION := v1.13.0
GOTESTSUM := bin/gotestsum-$(GOTESTSUM_VERSION)

$(GOTESTSUM):
	@mkdir -p bin && GOBIN=$(CURDIR)/bin/.gotestsum $(GO) install gotest.tools/gotestsum@$(GOTESTSUM_VERSION) \
		&& mv bin/.gotestsum/gotestsum $@ && rmdir bin/.gotestsum

test: setup browser apps kernels mounts check-generate lint build otelcol gateway jaeger prometheus kubeapi grpcapp goreqapp helm $(GOTESTSUM)
	@$(GO) build -o bin/reruns ./tests/reruns && rm -f bin/test-events.json
	@status=0; $(GOTESTSUM) --format standard-quiet --jsonfile bin/test-events.json --packages ./... -- -count=1 -p 1 -timeout 45m || status=$$?; \
	bin/reruns -list .ci/reruns.txt -events bin/test-events.json -status $$status -timeout 45m

# The long versions of the fault tests (tests/faults: a backend down for
# ten minutes, 200,000 connections under a memory limit, floods of a
# minute) and of the fuzzers (tests/fuzz); their figures go into
# docs/reliability.md. About 50 minutes.
SOAK_FUZZTIME ?= 2m
soak: setup mounts build otelcol
	LTTEST_SOAK=1 $(GO) test -count=1 -p 1 -timeout 90m -v ./tests/faults/
	LTTEST_FUZZTIME=$(SOAK_FUZZTIME) $(GO) test -count=1 -p 1 -timeout 90m -v ./tests/fuzz/

# Cost, scale and accuracy side by side with an untraced baseline and the
# tools a user would otherwise run (about 50 minutes); writes BENCHMARKS.md
# and its plots in docs/bench/, and the raw numbers in bench-out/.
bench: setup bench-tools mounts build otelcol
	$(GO) build -o bin/lattrace-bench ./tests/bench/cmd/bench
	./bin/lattrace-bench --md BENCHMARKS.md

# The same, shorter (under 5 minutes): its report goes to bench-out/quick/.
bench-quick: setup bench-tools mounts build otelcol
	$(GO) build -o bin/lattrace-bench ./tests/bench/cmd/bench
	./bin/lattrace-bench --quick --out bench-out/quick --md bench-out/quick/BENCHMARKS.md

# Profile-guided optimisation: a CPU profile of the daemon under the daemon
# cost workload of make bench (50k exchanges/s), written where go build
# takes it by itself (cmd/lattrace/default.pgo; the daemon spends about 7 %
# less CPU per exchange with it). Run it again when the daemon's hot path
# changes much: a stale profile only optimises less.
pgo: setup mounts build otelcol
	$(GO) build -o bin/lattrace-bench ./tests/bench/cmd/bench
	./bin/lattrace-bench --pgo cmd/lattrace/default.pgo

clean:
	rm -rf bin bench-out
