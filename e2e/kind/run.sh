#!/usr/bin/env bash
# Tries Partita's chart on a kind cluster, without GPUs:
#   1. creates the kind cluster (e2e/kind/cluster.yaml) unless it exists,
#   2. builds the image (Dockerfile) and loads it into the nodes,
#   3. installs helm/partita with the agent's simulated backend
#      (agent.simulate=8xH100-80GB on the two labelled workers),
#   4. runs the end-to-end tests that apply to a real install
#      (TestKind*, TestComponentPermissions) against it.
#
# Needs Docker, kind, kubectl, helm, openssl and Go. CI here has no Docker engine and
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

# The API server's client certificate for admission webhooks, which the
# webhook requires (docs/install.md): kept in ~/.cache/partita/kind/<cluster>
# because the cluster's kube-apiserver reads it from there (extraMounts).
auth=${PARTITA_CACHE:-$HOME/.cache/partita}/kind/$cluster
if [[ ! -s $auth/webhook-client.crt ]]; then
  mkdir -p "$auth"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj /CN=partita-webhook-client-ca -keyout "$auth/ca.key" -out "$auth/ca.crt" 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=partita-apiserver-client \
    -keyout "$auth/webhook-client.key" -out "$auth/webhook-client.csr" 2>/dev/null
  openssl x509 -req -in "$auth/webhook-client.csr" -CA "$auth/ca.crt" -CAkey "$auth/ca.key" -days 825 \
    -extfile <(printf "extendedKeyUsage=clientAuth") -out "$auth/webhook-client.crt" 2>/dev/null
  cat >"$auth/webhook-client.kubeconfig" <<'KC'
apiVersion: v1
kind: Config
users:
- name: "*.partita-system.svc"
  user:
    client-certificate: /etc/kubernetes/partita/webhook-client.crt
    client-key: /etc/kubernetes/partita/webhook-client.key
KC
  cat >"$auth/admission.yaml" <<'AC'
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: /etc/kubernetes/partita/webhook-client.kubeconfig
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: /etc/kubernetes/partita/webhook-client.kubeconfig
AC
fi
if ! kind get clusters | grep -qx "$cluster"; then
  sed "s|PARTITA_WEBHOOK_CLIENT_DIR|$auth|" e2e/kind/cluster.yaml >"$work/cluster.yaml"
  kind create cluster --name "$cluster" --config "$work/cluster.yaml" --wait 120s
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
  --set-file webhook.clientAuth.caBundle="$auth/ca.crt" \
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
