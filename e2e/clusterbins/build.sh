#!/usr/bin/env bash
# Builds the cluster binaries the dev cluster and the tests run on, from the Go
# module proxy, into a versioned cache outside the repository. Does nothing for a
# binary that is already there, so a warm run takes a second.
#
#   build.sh [GROUP...]   what to build (default: all)
#     demo        what `make demo` and a plain `partita dev up` run: etcd,
#                 kube-apiserver, kube-controller-manager, kube-scheduler,
#                 kubectl, kwok, kwokctl and helm (which renders the chart's
#                 RBAC for Partita's host processes); envtest needs the same
#     real-node   the real node (`partita dev up --real-node`, `make images`):
#                 kubelet, kube-proxy, containerd, crictl and CoreDNS
#     addons      the JobSet, LeaderWorkerSet and KubeRay controllers and the
#                 S3 store (`partita dev up --addons`), and Kubeflow's
#                 training CRDs
#     all         every group: what `make test` needs
#
#   PARTITA_CACHE   cache root (default ~/.cache/partita)
#   ADDONS          of the addons group, what to build, of: jobset lws
#                   kuberay s3 (default all four; "none" builds none), into
#                   $PARTITA_CACHE/bin/addons/<name>-<version>/ with their CRDs
#
# Prints the bin directory on its last line.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
STAGING_VERSION=v0${K8S_VERSION#v1}
ETCD_VERSION=${ETCD_VERSION:-v3.6.8}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.37.0}
COREDNS_VERSION=${COREDNS_VERSION:-v1.15.0}

cache=${PARTITA_CACHE:-$HOME/.cache/partita}
bin=$cache/bin/k8s-$K8S_VERSION
scratch=$cache/build
mkdir -p "$bin" "$scratch"

log() { printf 'cluster-bins: %s\n' "$*" >&2; }

want_demo="" want_real_node="" want_addons=""
[ $# -eq 0 ] && set -- all
for g in "$@"; do
  case $g in
    demo) want_demo=1 ;;
    real-node) want_demo=1 want_real_node=1 ;;
    addons) want_addons=1 ;;
    all) want_demo=1 want_real_node=1 want_addons=1 ;;
    *) echo "cluster-bins: unknown group $g (want demo, real-node, addons or all)" >&2; exit 2 ;;
  esac
done

# step NAME: times a build step and says how long it took.
step_start=0
step_done() { log "built $1 in $((SECONDS - step_start))s"; }

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

# The binaries report the release they were built from (kubectl version, a
# chart's kubeVersion check and the API server's /version read it); without
# these they say v0.0.0-master. The recipe stamp rebuilds binaries made by an
# older recipe of this script.
recipe=2
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
version_ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  version_ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  version_ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
if [ "$(cat "$bin/.recipe" 2>/dev/null)" != "$recipe" ]; then
  rm -f "$bin"/kube-apiserver "$bin"/kube-controller-manager "$bin"/kube-scheduler "$bin"/kubectl "$bin"/kubelet "$bin"/kube-proxy
fi

# Kubernetes' commands, kwok and helm, built from one module of our own: they
# share client-go, apimachinery, grpc and protobuf, which one build compiles
# once (kwok's and helm's k8s.io libraries resolve to Kubernetes' own release,
# the staging modules pinned below). Every group writes the same go.mod, so
# the real node's kubelet reuses what the demo's build compiled; each group
# builds only its own commands. etcd keeps a module of its own: its server
# needs its own release of etcd's API, older than the one Kubernetes links.
k8s_pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
  sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl helm.sh/helm/v3/cmd/helm)
k8s_build() { # k8s_build ABOUT PACKAGE...: the binaries are named after the packages' last element
  local about=$1; shift
  local names=() p
  for p in "$@"; do names+=("${p##*/}"); done
  need "${names[@]}" || return 0
  log "building ${names[*]} ($about)"
  step_start=$SECONDS
  local dir=$scratch/kubernetes-$K8S_VERSION
  mkdir -p "$dir"
  {
    echo "module partita.dev/clusterbins/kubernetes"
    echo
    echo "go 1.26"
    echo
    echo "require ("
    echo "	k8s.io/kubernetes $K8S_VERSION"
    echo "	sigs.k8s.io/kwok $KWOK_VERSION"
    echo "	helm.sh/helm/v3 $HELM_VERSION"
    echo ")"
    echo
    for m in "${staging[@]}"; do echo "replace k8s.io/$m => k8s.io/$m $STAGING_VERSION"; done
  } >"$dir/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    for p in "${k8s_pkgs[@]}"; do printf '\t_ "%s"\n' "$p"; done
    printf ')\n'
  } >"$dir/tools.go"
  (cd "$dir" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true)
  (cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $version_ldflags" -o "$bin/" "$@")
  echo "$recipe" >"$bin/.recipe"
  step_done "${names[*]}"
}

if [ -n "$want_demo" ]; then
k8s_build "Kubernetes $K8S_VERSION, kwok $KWOK_VERSION, helm $HELM_VERSION: 10 to 20 minutes on 2 cores the first time" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
  sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl helm.sh/helm/v3/cmd/helm
if need etcd; then
  log "building etcd $ETCD_VERSION (about 1 minute the first time)"
  step_start=$SECONDS
  dir=$scratch/etcd-$ETCD_VERSION
  mkdir -p "$dir"
  printf 'module partita.dev/clusterbins/etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$dir/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$dir/tools.go"
  (cd "$dir" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
   cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/etcd" go.etcd.io/etcd/server/v3)
  step_done etcd
fi
fi # demo

if [ -n "$want_real_node" ]; then
k8s_build "Kubernetes $K8S_VERSION: about 2 minutes on 2 cores after the control plane" \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy

# What the dev cluster's real node runs beside kubelet (partita dev up
# --real-node): containerd v2 (Kubernetes 1.36 dropped containerd 1.x), crictl
# for people debugging it, and CoreDNS for in-cluster names. runc and the CNI
# plugins come from Debian (hack/real-node-deps.sh).
if need containerd containerd-shim-runc-v2 ctr; then
  log "building containerd $CONTAINERD_VERSION (about 4 minutes the first time)"
  step_start=$SECONDS
  GOBIN=$bin CGO_ENABLED=0 go install -trimpath -tags no_btrfs \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
  step_done containerd
fi

if need crictl; then
  log "building crictl $CRICTL_VERSION (under a minute the first time)"
  step_start=$SECONDS
  GOBIN=$bin CGO_ENABLED=0 go install -trimpath -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
  step_done crictl
fi

if need coredns; then
  log "building coredns $COREDNS_VERSION (about 4 minutes the first time)"
  step_start=$SECONDS
  GOBIN=$bin CGO_ENABLED=0 go install -trimpath "github.com/coredns/coredns@$COREDNS_VERSION"
  step_done coredns
fi
fi # real-node

# Workload controllers for `partita dev up --addons` and the e2e tests of the
# workload map (docs/workloads.md): JobSet, LeaderWorkerSet and KubeRay's
# operator, each built from its release on the module proxy, with the CRDs
# and webhook configurations of that release copied from the module itself
# (config/...), so the controller and its API always match. Each addon lands
# in its own versioned folder: bin/<controller>, crds/*.yaml, and
# webhooks.yaml where the controller serves admission webhooks.
JOBSET_VERSION=${JOBSET_VERSION:-v0.12.0}
LWS_VERSION=${LWS_VERSION:-v0.8.0}
KUBERAY_VERSION=${KUBERAY_VERSION:-v1.5.0}
# The dev cluster's S3 store for Models (--addons s3): versitygw, a real
# S3 server over a directory (about 2.5 minutes the first time).
S3_VERSION=${S3_VERSION:-v1.8.0}
addons=${ADDONS:-jobset lws kuberay s3}
[ "$addons" = none ] && addons=""
[ -n "$want_addons" ] || addons=""
modcache=$(go env GOMODCACHE)

# addon NAME VERSION MODULE PACKAGE CRD_DIR [WEBHOOK_MANIFEST]; CRD_DIR - for none
addon() {
  local name=$1 version=$2 module=$3 pkg=$4 crds=$5 webhooks=${6:-}
  local dir=$cache/bin/addons/$name-$version
  if [ -x "$dir/bin/$name" ] && [ -f "$dir/.done" ]; then return; fi
  log "building the $name controller $version ($pkg, about 3 minutes the first time)"
  local t0=$SECONDS
  rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/crds"
  # A module of our own that requires the release (as for etcd): `go install
  # pkg@version` also asks the proxy for the module's version list.
  local mod=$scratch/addon-$name-$version
  mkdir -p "$mod"
  printf 'module partita.dev/clusterbins/%s\n\ngo 1.26\n\nrequire %s %s\n' "$name" "$module" "$version" >"$mod/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" >"$mod/tools.go"
  (cd "$mod" && GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
   cd "$mod" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dir/bin/$name" "$pkg")
  local src=$modcache/$module@$version
  if [ "$crds" != - ]; then cp "$src/$crds"/*.yaml "$dir/crds/"; fi
  if [ -n "$webhooks" ]; then cp "$src/$webhooks" "$dir/webhooks.yaml"; fi
  chmod -R u+w "$dir"
  echo "$version" >"$dir/.done"
  log "built $name $version in $((SECONDS - t0))s"
}
for a in $addons; do
  case $a in
    jobset) addon jobset "$JOBSET_VERSION" sigs.k8s.io/jobset sigs.k8s.io/jobset \
      config/components/crd/bases config/components/webhook/manifests.yaml ;;
    lws) addon lws "$LWS_VERSION" sigs.k8s.io/lws sigs.k8s.io/lws/cmd \
      config/crd/bases config/webhook/manifests.yaml ;;
    kuberay) addon kuberay "$KUBERAY_VERSION" github.com/ray-project/kuberay/ray-operator \
      github.com/ray-project/kuberay/ray-operator config/crd/bases ;;
    s3) addon s3 "$S3_VERSION" github.com/versity/versitygw github.com/versity/versitygw/cmd/versitygw - ;;
    *) echo "cluster-bins: unknown addon $a (want jobset, lws, kuberay or s3)" >&2; exit 2 ;;
  esac
done

# The CRDs of Kubeflow's training-operator (PyTorchJob, MPIJob), whose
# controller is not run here: it expects its certificate Secret mounted by a
# kubelet. The e2e test of PyTorchJob installs the real CRD and creates the
# pods the controller would (e2e/workloads_test.go).
TRAINING_OPERATOR_VERSION=${TRAINING_OPERATOR_VERSION:-v1.8.1}
kubeflow_crds=$cache/bin/addons/crds/training-operator-$TRAINING_OPERATOR_VERSION
if [ -n "$addons" ] && [ ! -f "$kubeflow_crds/.done" ]; then
  log "fetching the training-operator $TRAINING_OPERATOR_VERSION CRDs"
  src=$(cd "$scratch" && go mod download -json "github.com/kubeflow/training-operator@$TRAINING_OPERATOR_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  mkdir -p "$kubeflow_crds"
  cp "$src"/manifests/base/crds/kubeflow.org_pytorchjobs.yaml "$src"/manifests/base/crds/kubeflow.org_mpijobs.yaml "$kubeflow_crds/"
  chmod u+w "$kubeflow_crds"/*.yaml
  echo "$TRAINING_OPERATOR_VERSION" >"$kubeflow_crds/.done"
fi

echo "$bin"
