# The lattrace image: one static binary with the BPF objects embedded.
# Built with `make image` (docker or podman); tests/e2e/image_test.go runs
# the build line below on the host and starts what it produces, so the
# binary the image ships is tested even where no container engine exists.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# The BPF objects are generated and committed (make generate): no clang
# here. CGO off: a static binary that runs on a distroless base.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/lattrace/lattrace/cli.version=${VERSION}" -o /out/lattrace ./cmd/lattrace

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/lattrace /lattrace
# Loading BPF programs needs capabilities that Kubernetes grants a non-root
# user only as ambient capabilities, which it cannot set: the process runs
# as uid 0 with every capability dropped but the ones it needs
# (deploy/helm: CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN) and a
# read-only root filesystem.
USER 0:0
ENTRYPOINT ["/lattrace"]
CMD ["daemon", "--output", "none"]
