#!/usr/bin/env bash
# Runs KAI-Scheduler's own scale scenarios against KAI on a throwaway kwok
# cluster (not Partita's dev cluster), for comparison with Partita's
# TestKAIScaleScenarios. See README.md.
#
#   hack/peers/kai-scale/run.sh [driver flags, e.g. --nodes 100 --scenarios fill,gang,reclaim,big-reclaim]
#
# Environment (all optional):
#   K8S_BIN       Kubernetes/kwok binaries  (default ~/.cache/partita/bin/k8s-v1.37.2)
#   KWOK_VERSION  kwok whose stage files are used (default v0.8.0, the kwokctl in K8S_BIN)
#   KAI_REF       KAI commit or tag to build (default 72de64fc, as hack/peers/kai-topology)
#   KAI_GIT       bare git dir of KAI's mirror (default /work/.mirror/NVIDIA+KAI-Scheduler/repo)
#   KAI_HOME      build cache, shared with kai-topology (default ~/.cache/partita/peers/kai-v0.17)
#   OUT           results directory          (default $KAI_HOME/out-scale)
#   BINDER_QPS, BINDER_BURST   binder's client limits (default 20, 100: what KAI's operator passes)
#   KCM_QPS, KCM_BURST         kube-controller-manager's client limits (default 5000, 10000)
#   KEEP=1        leave the cluster and KAI running afterwards
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
K8S_BIN=${K8S_BIN:-$HOME/.cache/partita/bin/k8s-v1.37.2}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
KAI_REF=${KAI_REF:-72de64fc}
KAI_GIT=${KAI_GIT:-/work/.mirror/NVIDIA+KAI-Scheduler/repo}
KAI_HOME=${KAI_HOME:-$HOME/.cache/partita/peers/kai-v0.17}
OUT=${OUT:-$KAI_HOME/out-scale}
BINDER_QPS=${BINDER_QPS:-20}
BINDER_BURST=${BINDER_BURST:-100}
KCM_QPS=${KCM_QPS:-5000}
KCM_BURST=${KCM_BURST:-10000}
NAME=kai-scale
export KWOK_WORKDIR=$KAI_HOME/kwok
export KUBECONFIG=$KWOK_WORKDIR/kubeconfig-$NAME
mkdir -p "$OUT" "$KAI_HOME/bin" "$KWOK_WORKDIR"
ts() { date -u +%H:%M:%S; }

# 1. KAI's sources and binaries (cached, shared with kai-topology: the same
# KAI_HOME and binary names, so KAI is built once for both).
KAI_REF=$KAI_REF KAI_HOME=$KAI_HOME KAI_GIT=$KAI_GIT "$HERE/../kai-build.sh"
SRC=$KAI_HOME/src-$KAI_REF
(cd "$ROOT" && go build -o "$KAI_HOME/bin/kai-scale" ./hack/peers/kai-scale)

# 2. A fresh kwok cluster (no kube-scheduler: only KAI schedules here). Its
# stages are kwokctl's defaults less pod-complete, as KAI's scale setup
# deletes that stage: kwok would otherwise complete every Job's pod at once,
# and the scenarios want them running. kube-controller-manager (Job
# controller, garbage collector) gets client limits that do not throttle
# the Jobs' pods.
KWOK_SRC=$(cd / && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
STAGES=$KWOK_SRC/kustomize/stage
[ -d "$STAGES" ] || { echo "no kwok stage files at $STAGES"; exit 1; }
CONFIG=$OUT/kwokctl.yaml
{
  cat <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
componentsPatches:
- name: kube-controller-manager
  extraArgs:
  - {key: kube-api-qps, value: "$KCM_QPS"}
  - {key: kube-api-burst, value: "$KCM_BURST"}
EOF
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$STAGES/$f"
  done
} >"$CONFIG"

"$K8S_BIN/kwokctl" delete cluster --name $NAME >/dev/null 2>&1 || true
T0=$(date +%s)
"$K8S_BIN/kwokctl" --config "$CONFIG" create cluster --name $NAME --runtime binary --kubeconfig "$KUBECONFIG" \
  --timeout 180s --wait 120s --disable kube-scheduler \
  --etcd-binary "$K8S_BIN/etcd" --kube-apiserver-binary "$K8S_BIN/kube-apiserver" \
  --kube-controller-manager-binary "$K8S_BIN/kube-controller-manager" \
  --kwok-controller-binary "$K8S_BIN/kwok" >"$OUT/kwokctl.log" 2>&1
echo "$(ts) kwok cluster $NAME up in $(( $(date +%s) - T0 ))s"
CLUSTER_DIR=$KWOK_WORKDIR/clusters/$NAME

PIDS=()
cleanup() {
  if [ "${KEEP:-}" = 1 ]; then echo "KEEP=1: cluster and KAI left running (pids ${PIDS[*]:-}; KUBECONFIG=$KUBECONFIG)"; return; fi
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  "$K8S_BIN/kwokctl" delete cluster --name $NAME >/dev/null 2>&1 || true
}
trap cleanup EXIT

if grep -q 'name: pod-complete' "$CLUSTER_DIR/kwok.yaml"; then
  echo "the cluster's kwok configuration has a pod-complete stage; see $CLUSTER_DIR/kwok.yaml"; exit 1
fi

# 3. KAI's CRDs and PriorityClasses (from its Helm chart) and its components
# as host processes, on ports apart from kai-topology's (19180-19187), with
# the settings KAI's scale setup (hack/setup-scale-test-env.sh) gives them
# where a flag carries them: consolidation off on the scheduler
# (max-consolidation-preemptees 0, the SchedulingShard arg), 100 concurrent
# reconciles on the binder; and what KAI's operator passes: GOGC=400 for
# the scheduler, client QPS 20 / burst 100 for the binder.
"$K8S_BIN/kubectl" apply --server-side -f "$SRC/deployments/kai-scheduler/crds/" >"$OUT/crds.log"
for f in "$SRC"/deployments/kai-scheduler/templates/priorityclasses/*.yaml; do
  "$K8S_BIN/kubectl" apply -f "$f" >>"$OUT/crds.log"   # train 50, build-preemptible 75, build 100, inference 125
done
"$K8S_BIN/kubectl" create namespace kai-scheduler >/dev/null
B=$KAI_HOME/bin
GOGC=400 "$B/scheduler-$KAI_REF" --listen-address 127.0.0.1:19190 --plugin-server-port 19191 --profiler-port 19192 \
  --max-consolidation-preemptees=0 \
  >"$OUT/scheduler.log" 2>&1 & PIDS+=($!); SCHED=$!
"$B/binder-$KAI_REF" --metrics-bind-address 127.0.0.1:19193 --health-probe-bind-address 127.0.0.1:19194 \
  --max-concurrent-reconciles=100 --qps "$BINDER_QPS" --burst "$BINDER_BURST" \
  >"$OUT/binder.log" 2>&1 & PIDS+=($!); BINDER=$!
"$B/podgrouper-$KAI_REF" --metrics-bind-address 127.0.0.1:19195 --health-probe-bind-address 127.0.0.1:19196 \
  >"$OUT/podgrouper.log" 2>&1 & PIDS+=($!); PODGROUPER=$!
"$B/queuecontroller-$KAI_REF" --enable-webhook=false --metrics-listen-address 127.0.0.1:19197 \
  >"$OUT/queuecontroller.log" 2>&1 & PIDS+=($!); QUEUECTL=$!
sleep 5
for p in "${PIDS[@]}"; do kill -0 "$p" || { echo "a KAI component exited; see $OUT/*.log"; exit 1; }; done
echo "$(ts) KAI components running: ${PIDS[*]}"

# The processes whose CPU time and peak memory the driver reads: KAI's four
# and the cluster's own (etcd, kube-apiserver, kube-controller-manager, kwok),
# from kwokctl's pid files.
MEASURE="scheduler=$SCHED,binder=$BINDER,podgrouper=$PODGROUPER,queuecontroller=$QUEUECTL"
for f in "$CLUSTER_DIR"/pids/*.pid; do
  [ -f "$f" ] && MEASURE="$MEASURE,$(basename "$f" .pid)=$(tr -d '[:space:]' <"$f")"
done

# 4. The scenarios.
T0=$(date +%s)
"$B/kai-scale" --kubeconfig "$KUBECONFIG" --out "$OUT/result.json" --kai-ref "$KAI_REF" --pids "$MEASURE" "$@" \
  | tee "$OUT/scenarios.log"
echo "$(ts) scenarios done in $(( $(date +%s) - T0 ))s; result in $OUT/result.json"
