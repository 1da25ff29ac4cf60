# syntax=docker/dockerfile:1
# The one partita image: webhook, extender and agent are subcommands.
#
# Build: make image (docker build --build-arg VERSION=$(git describe ...) .)

# cgo is needed: go-nvml loads libnvidia-ml.so.1 with dlopen through a cgo
# prologue. The builder is Debian bookworm, the same glibc as the runtime.
FROM golang:1.26-bookworm AS build
WORKDIR /src
# Modules first, so a code change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
# go-nvml's cgo prologue calls functions newer NVML headers mark deprecated;
# the warnings say nothing about our code (as in the Makefile).
ENV CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath \
      -ldflags "-s -w -X github.com/partita-dev/partita/internal/version.Version=${VERSION}" \
      -o /out/partita ./cmd/partita

# distroless cc: glibc and libgcc for cgo, no shell, no package manager.
# NVML itself is not in the image: the NVIDIA container toolkit mounts the
# host driver's libnvidia-ml.so.1 (and, with the compute capability,
# nvidia-cuda-mps-control) into the agent's container.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/partita /usr/local/bin/partita
# The webhook and the extender run as this user (65532). The agent's
# DaemonSet overrides it with root: NVML's per-process queries, signalling
# other containers' processes (enforce=kill) and the MPS daemons need it.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/partita"]
