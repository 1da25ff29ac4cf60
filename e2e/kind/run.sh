#!/usr/bin/env bash
# Tries Partita's chart on a kind cluster, without GPUs:
#   1. creates the kind cluster (e2e/kind/cluster.yaml) unless it exists,
#   2. builds the image (Dockerfile) and loads it into the nodes,
#   3. installs helm/partita with the agent's simulated backend
#      (agent.simulate=8xH100-80GB on the two labelled workers),
#   4. runs the end-to-end tests that apply to a real install
#      (TestKind*, TestComponentPermissions) against it.
#
# Needs Docker, kind, kubectl, helm and Go. CI here has no Docker engine and
# cannot run it. Environment: KIND_CLUSTER (default partita-e2e), IMAGE
# (default partita:kind), KEEP=1 keeps the cluster afterwards.
set -euo pipefail
cd "$(dirname "$0")/../.."

cluster=${KIND_CLUSTER:-partita-e2e}
image=${IMAGE:-partita:kind}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "kind e2e: '$1' is not installed ($2)" >&2; exit 2; }
}
need docker "https://docs.docker.com/engine/install/"
need kind "go install sigs.k8s.io/kind@latest"
need kubectl "https://kubernetes.io/docs/tasks/tools/"
need helm "https://helm.sh/docs/intro/install/ (or the one make cluster-bins builds)"
need go "https://go.dev/dl/"
docker info >/dev/null 2>&1 || { echo "kind e2e: no Docker engine answers (is the daemon running?)" >&2; exit 2; }

if ! kind get clusters | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --config e2e/kind/cluster.yaml --wait 120s
fi
kind get kubeconfig --name "$cluster" > "$work/kubeconfig"
export KUBECONFIG=$work/kubeconfig

version=$(git describe --tags --always --dirty 2>/dev/null || echo kind)
docker build --build-arg VERSION="$version" -t "$image" .
kind load docker-image "$image" --name "$cluster"

# The admission policies need MutatingAdmissionPolicy in
# admissionregistration.k8s.io/v1 (Kubernetes 1.36): older node images run
# without them, as docs/install.md says.
policies=false
if kubectl api-resources --api-group=admissionregistration.k8s.io -o name | grep -qx mutatingadmissionpolicies.admissionregistration.k8s.io &&
  kubectl get --raw /apis/admissionregistration.k8s.io/v1 | grep -q '"mutatingadmissionpolicies"'; then
  policies=true
fi
helm upgrade --install partita helm/partita --namespace partita-system --create-namespace \
  --set image.repository="${image%:*}" --set image.tag="${image##*:}" --set image.pullPolicy=Never \
  --set agent.simulate=8xH100-80GB --set admissionPolicies.enabled="$policies" \
  --wait --timeout 5m
kubectl -n partita-system get pods -o wide

status=0
PARTITA_E2E_KUBECONFIG=$KUBECONFIG go test -count=1 -v -timeout 15m \
  -run 'TestKind|TestComponentPermissions' ./e2e/ || status=$?

if [[ -z "${KEEP:-}" ]]; then
  kind delete cluster --name "$cluster"
else
  echo "kind e2e: kept cluster $cluster (kind get kubeconfig --name $cluster)"
fi
exit "$status"
