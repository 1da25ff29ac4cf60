#!/usr/bin/env bash
# Runs the fragmented-trace topology measurement against KAI-Scheduler on a
# throwaway kwok cluster (not Partita's dev cluster). See README.md.
#
#   hack/peers/kai-topology/run.sh [trace flags, e.g. --seed 2]
#
# Environment (all optional):
#   K8S_BIN   Kubernetes/kwok binaries  (default ~/.cache/partita/bin/k8s-v1.37.2)
#   KAI_REF   KAI commit or tag to build (default 72de64fc, see README.md)
#   KAI_GIT   bare git dir of KAI's mirror (default /work/.mirror/NVIDIA+KAI-Scheduler/repo)
#   KAI_HOME  build cache                (default ~/.cache/partita/peers/kai-v0.17)
#   OUT       results directory          (default $KAI_HOME/out)
#   KEEP=1    leave the cluster and KAI running afterwards
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
K8S_BIN=${K8S_BIN:-$HOME/.cache/partita/bin/k8s-v1.37.2}
KAI_REF=${KAI_REF:-72de64fc}
KAI_GIT=${KAI_GIT:-/work/.mirror/NVIDIA+KAI-Scheduler/repo}
KAI_HOME=${KAI_HOME:-$HOME/.cache/partita/peers/kai-v0.17}
OUT=${OUT:-$KAI_HOME/out}
NAME=kai-topo
export KWOK_WORKDIR=$KAI_HOME/kwok
export KUBECONFIG=$KWOK_WORKDIR/kubeconfig
mkdir -p "$OUT" "$KAI_HOME/bin" "$KWOK_WORKDIR"
ts() { date -u +%H:%M:%S; }

# 1. KAI's sources and binaries (cached; rebuilt when KAI_REF changes).
KAI_REF=$KAI_REF KAI_HOME=$KAI_HOME KAI_GIT=$KAI_GIT "$HERE/../kai-build.sh"
SRC=$KAI_HOME/src-$KAI_REF
(cd "$ROOT" && go build -o "$KAI_HOME/bin/kai-topology" ./hack/peers/kai-topology)

# 2. A fresh kwok cluster (no kube-scheduler: only KAI schedules here).
"$K8S_BIN/kwokctl" delete cluster --name $NAME >/dev/null 2>&1 || true
T0=$(date +%s)
"$K8S_BIN/kwokctl" create cluster --name $NAME --runtime binary --kubeconfig "$KUBECONFIG" \
  --timeout 180s --wait 120s --disable kube-scheduler \
  --etcd-binary "$K8S_BIN/etcd" --kube-apiserver-binary "$K8S_BIN/kube-apiserver" \
  --kube-controller-manager-binary "$K8S_BIN/kube-controller-manager" \
  --kwok-controller-binary "$K8S_BIN/kwok" >"$OUT/kwokctl.log" 2>&1
echo "$(ts) kwok cluster $NAME up in $(( $(date +%s) - T0 ))s"

PIDS=()
cleanup() {
  if [ "${KEEP:-}" = 1 ]; then echo "KEEP=1: cluster and KAI left running (pids ${PIDS[*]:-})"; return; fi
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  "$K8S_BIN/kwokctl" delete cluster --name $NAME >/dev/null 2>&1 || true
}
trap cleanup EXIT

# 3. KAI's CRDs (from its Helm chart) and its components as host processes,
# with their default settings (the scheduler's built-in default configuration,
# which includes the topology plugin), on ports that collide with nothing.
"$K8S_BIN/kubectl" apply --server-side -f "$SRC/deployments/kai-scheduler/crds/" >"$OUT/crds.log"
for f in "$SRC"/deployments/kai-scheduler/templates/priorityclasses/*.yaml; do
  "$K8S_BIN/kubectl" apply -f "$f" >>"$OUT/crds.log"   # train 50, build-preemptible 75, build 100, inference 125
done
"$K8S_BIN/kubectl" create namespace kai-scheduler >/dev/null
B=$KAI_HOME/bin
"$B/scheduler-$KAI_REF" --listen-address 127.0.0.1:19180 --plugin-server-port 19181 --profiler-port 19182 \
  >"$OUT/scheduler.log" 2>&1 & PIDS+=($!)
"$B/binder-$KAI_REF" --metrics-bind-address 127.0.0.1:19183 --health-probe-bind-address 127.0.0.1:19184 \
  >"$OUT/binder.log" 2>&1 & PIDS+=($!)
"$B/podgrouper-$KAI_REF" --metrics-bind-address 127.0.0.1:19185 --health-probe-bind-address 127.0.0.1:19186 \
  >"$OUT/podgrouper.log" 2>&1 & PIDS+=($!)
"$B/queuecontroller-$KAI_REF" --enable-webhook=false --metrics-listen-address 127.0.0.1:19187 \
  >"$OUT/queuecontroller.log" 2>&1 & PIDS+=($!)
sleep 5
for p in "${PIDS[@]}"; do kill -0 "$p" || { echo "a KAI component exited; see $OUT/*.log"; exit 1; }; done
echo "$(ts) KAI components running: ${PIDS[*]}"

# 4. The trace.
T0=$(date +%s)
"$B/kai-topology" --kubeconfig "$KUBECONFIG" --out "$OUT/result.json" "$@" | tee "$OUT/trace.log"
echo "$(ts) trace done in $(( $(date +%s) - T0 ))s; result in $OUT/result.json"
