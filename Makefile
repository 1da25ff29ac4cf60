# Partita. `make demo` runs the local demo cluster; `make test` runs every test.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

PARTITA_CACHE ?= $(HOME)/.cache/partita
export PARTITA_CACHE
K8S_VERSION ?= v1.37.2
CLUSTER_BIN := $(PARTITA_CACHE)/bin/k8s-$(K8S_VERSION)
TOOLS := $(PARTITA_CACHE)/tools

CONTROLLER_GEN_VERSION := v0.23.0
GOLANGCI_LINT_VERSION := v2.15.0
CONTROLLER_GEN := $(TOOLS)/controller-gen-$(CONTROLLER_GEN_VERSION)
GOLANGCI_LINT := $(TOOLS)/golangci-lint-$(GOLANGCI_LINT_VERSION)

# go-nvml's cgo prologue calls NVML functions that newer headers mark
# deprecated; the warnings say nothing about our code.
CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations
export CGO_CFLAGS

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/partita-dev/partita/internal/version.Version=$(VERSION)
BIN := bin/partita
IMAGE ?= ghcr.io/partita-dev/partita:$(VERSION)
CHART := helm/partita

# Benchmarks run briefly in `make test`; `make bench` runs them in full.
BENCH_SHORT ?= -bench=. -benchtime=3x -run='^$$'

.PHONY: all build image images real-node-deps cluster-bins demo-bins real-node-bins addon-bins chromium console-vendor demo test test-unit test-e2e test-real-node test-real-node-dra bench generate chart-sync verify-generated lint clean

all: build

# bin/kubectl-partita is the kubectl plugin: the same binary, which acts as
# `partita ctl` when run under that name (docs/ctl.md).
build:
	go build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/partita
	ln -sf partita bin/kubectl-partita

# The container image (Dockerfile). Needs a Docker engine; without one it says
# so and fails, as nothing else can build the image here.
image:
	@command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 || { echo "make image: no Docker engine here (docker missing or not running); the image needs one"; exit 1; }
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

# The cluster binaries (e2e/clusterbins/build.sh says what each group holds
# and how long it takes the first time): demo-bins is what `make demo` runs,
# real-node-bins adds the real node's, addon-bins the workload controllers,
# cluster-bins all of them (what `make test` needs).
cluster-bins:
	bash e2e/clusterbins/build.sh all >/dev/null

demo-bins:
	bash e2e/clusterbins/build.sh demo >/dev/null

real-node-bins:
	bash e2e/clusterbins/build.sh real-node >/dev/null

addon-bins:
	bash e2e/clusterbins/build.sh addons >/dev/null

# Debian's chromium, for the console's browser tests (no-op when present).
chromium:
	hack/install-chromium.sh

# Fetches the console's plotting library (uPlot) from npm into
# console/web/vendor/; its output is committed, so builds need no npm.
console-vendor:
	hack/vendor-uplot.sh

# The images of the dev cluster's real node, without Docker (hack/images):
# Partita's (localhost/partita/partita:dev, from bin/partita), the sample
# workload (localhost/partita/sample:dev), the hami-core tests' preload
# library and probe (localhost/partita/interposer-test:dev, built with the C
# compiler from hack/images/preload-test), and kube-scheduler, CoreDNS and
# the pause image from the cluster binaries, as tarballs in bin/images/
# that `partita dev up --real-node` loads. Unchanged images are kept.
images: build real-node-bins
	mkdir -p bin/images/programs
	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o bin/images/programs/ ./hack/images/sample ./hack/images/pause
	$(CC) -O2 -Wall -Wextra -shared -fPIC -o bin/images/programs/libpreload-test.so hack/images/preload-test/preload.c
	$(CC) -O2 -Wall -Wextra -o bin/images/programs/probe hack/images/preload-test/probe.c
	go run ./hack/images --partita $(BIN) --programs bin/images/programs --cluster-bin $(CLUSTER_BIN) --out bin/images

# The Debian packages the real node needs (runc, CNI plugins, iptables,
# conntrack, iproute2); does nothing when they are installed. Without root
# it only says what is missing (the real-node tests skip without root).
real-node-deps:
	bash hack/real-node-deps.sh --if-root

$(CONTROLLER_GEN):
	mkdir -p $(TOOLS)
	GOBIN=$(TOOLS)/.gobin go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION)
	mv $(TOOLS)/.gobin/controller-gen $@

$(GOLANGCI_LINT):
	mkdir -p $(TOOLS)
	GOBIN=$(TOOLS)/.gobin go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(TOOLS)/.gobin/golangci-lint $@

generate: $(CONTROLLER_GEN)
	$(CONTROLLER_GEN) object paths=./api/...
	$(CONTROLLER_GEN) crd:crdVersions=v1 paths=./api/... output:crd:artifacts:config=crds
	$(MAKE) chart-sync

# The chart carries copies of the CRDs and of the default Rego policy (Helm
# reads files only from inside the chart), and the admission policies' CEL
# generated from the webhook package; they are copied, never edited.
chart-sync:
	rm -f $(CHART)/crds/*.yaml $(CHART)/files/policy/*.rego
	mkdir -p $(CHART)/crds $(CHART)/files/policy
	cp crds/*.yaml $(CHART)/crds/
	cp policy/rego/*.rego $(CHART)/files/policy/
	rm -f $(CHART)/files/policy/*_test.rego
	go test ./helm/ -run '^TestChartAdmissionCEL$$' -count=1 -update

# Fails when the generated deepcopy or CRDs are stale, or the chart's copies
# drifted from crds/ and policy/rego/.
verify-generated: generate
	@git diff --exit-code -- api crds $(CHART)/crds $(CHART)/files || { echo "generated files are stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- api crds $(CHART)/crds $(CHART)/files)" || { git status --porcelain -- api crds $(CHART)/crds $(CHART)/files; echo "generated files are untracked: run 'make generate' and commit"; exit 1; }
	@diff -r crds $(CHART)/crds --exclude='*.go' >/dev/null || { echo "$(CHART)/crds differs from crds/: run 'make chart-sync'"; exit 1; }

lint: $(GOLANGCI_LINT)
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "not gofmt-clean: run 'gofmt -w .'"; exit 1; }
	go vet ./...
	$(GOLANGCI_LINT) run ./...

# The story on the dev cluster; it prints the URL of the cluster's console,
# which keeps running with the cluster (until `bin/partita dev down`).
# Partita and the cluster binaries build side by side: on a fresh machine one
# downloads modules and links while the other compiles.
demo:
	$(MAKE) --no-print-directory -j2 build demo-bins
	$(BIN) dev demo

# Unit and envtest integration tests, short benchmarks, then end-to-end tests on
# a real dev cluster: the kwok suite (e2e/), then the chart on the real node
# (e2e/realnode/, needs root), one package at a time.
test: build cluster-bins chromium images real-node-deps
	KUBEBUILDER_ASSETS=$(CLUSTER_BIN) go test -count=1 $$(go list ./... | grep -v /e2e)
	go test -count=1 $(BENCH_SHORT) ./gpu/...
	PARTITA_BIN=$(CURDIR)/$(BIN) go test -count=1 -p 1 -timeout 45m ./e2e/...

test-unit:
	KUBEBUILDER_ASSETS=$(CLUSTER_BIN) go test -count=1 $$(go list ./... | grep -v /e2e)

test-e2e: build cluster-bins chromium images real-node-deps
	PARTITA_BIN=$(CURDIR)/$(BIN) go test -count=1 -p 1 -v -timeout 45m ./e2e/...

# Only the chart on the real node (e2e/realnode/).
test-real-node: build real-node-bins images real-node-deps
	PARTITA_BIN=$(CURDIR)/$(BIN) go test -count=1 -v -timeout 20m ./e2e/realnode/

# The chart with gpuBackend dra on the real node: the DRA kubelet plugin,
# CDI specs read by the real containerd (e2e/realnode/dra_test.go).
test-real-node-dra: build real-node-bins images real-node-deps
	PARTITA_E2E_GPU_BACKEND=dra PARTITA_BIN=$(CURDIR)/$(BIN) go test -count=1 -v -timeout 20m ./e2e/realnode/

bench:
	go test -run='^$$' -bench=. -benchmem -benchtime=2s ./gpu/... ./extender/... ./admission/... ./webhook/ ./policy/ ./console/

clean:
	rm -rf bin
