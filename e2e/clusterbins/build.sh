#!/usr/bin/env bash
# Builds the cluster binaries the dev cluster and the tests run on, from the Go
# module proxy, into a versioned cache outside the repository. Does nothing for a
# binary that is already there, so a warm run takes a second.
#
#   PARTITA_CACHE   cache root (default ~/.cache/partita)
#
# Prints the bin directory on its last line.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
STAGING_VERSION=v0${K8S_VERSION#v1}
ETCD_VERSION=${ETCD_VERSION:-v3.6.8}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}

cache=${PARTITA_CACHE:-$HOME/.cache/partita}
bin=$cache/bin/k8s-$K8S_VERSION
scratch=$cache/build
mkdir -p "$bin" "$scratch"

log() { printf 'cluster-bins: %s\n' "$*" >&2; }

# Staging modules that k8s.io/kubernetes replaces with ./staging/...; each is
# pinned to the matching v0.x release so the build resolves from the proxy.
staging=(api apiextensions-apiserver apimachinery apiserver cli-runtime client-go
  cloud-provider cluster-bootstrap code-generator component-base component-helpers
  controller-manager cri-api cri-client cri-streaming csi-translation-lib
  dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator
  kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
  mount-utils pod-security-admission sample-apiserver sample-cli-plugin
  sample-controller streaming)

need() { for b in "$@"; do [ -x "$bin/$b" ] || return 0; done; return 1; }

if need kube-apiserver kube-controller-manager kube-scheduler; then
  log "building kube-apiserver, kube-controller-manager, kube-scheduler $K8S_VERSION (about 6 minutes on 2 cores the first time)"
  dir=$scratch/kubernetes-$K8S_VERSION
  mkdir -p "$dir"
  {
    echo "module partita.dev/clusterbins/kubernetes"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    for m in "${staging[@]}"; do echo "replace k8s.io/$m => k8s.io/$m $STAGING_VERSION"; done
  } >"$dir/go.mod"
  cat >"$dir/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  (cd "$dir" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
   cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/" \
     k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler)
fi

# kubectl is for people using the dev cluster (and kwokctl's kubectl
# subcommand); a fresh machine has none.
if need kubectl; then
  log "building kubectl $K8S_VERSION"
  dir=$scratch/kubernetes-$K8S_VERSION
  [ -f "$dir/go.mod" ] || { log "missing $dir/go.mod: remove $bin/kube-apiserver and run again"; exit 1; }
  grep -q cmd/kubectl "$dir/tools.go" || sed -i 's#_ "k8s.io/kubernetes/cmd/kube-scheduler"#&\n\t_ "k8s.io/kubernetes/cmd/kubectl"#' "$dir/tools.go"
  (cd "$dir" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
   cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/" k8s.io/kubernetes/cmd/kubectl)
fi

if need etcd; then
  log "building etcd $ETCD_VERSION"
  dir=$scratch/etcd-$ETCD_VERSION
  mkdir -p "$dir"
  printf 'module partita.dev/clusterbins/etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$dir/tools.go"
  (cd "$dir" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
   cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
fi

if need kwok kwokctl; then
  log "installing kwok and kwokctl $KWOK_VERSION"
  GOBIN=$bin CGO_ENABLED=0 go install -trimpath "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
fi

if need helm; then
  log "installing helm $HELM_VERSION"
  GOBIN=$bin CGO_ENABLED=0 go install -trimpath "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

echo "$bin"
