// Package webhook is Partita's admission front door (DESIGN §2 step 1, §4):
// every pod in a namespace Partita manages passes through it.
//
//   - Mutation (pod CREATE): read the GPU request in any dialect
//     (gpu.ParsePod), ask the policy (data.partita.admission), and rewrite
//     the pod into canonical form: partita.dev/* annotations and labels,
//     partita.dev/gpu-milli on the GPU containers, downward-API env from the
//     allocation annotations written at bind, preemptionPolicy Never,
//     NVIDIA_VISIBLE_DEVICES=void on containers without a GPU, and the
//     scheduling gate partita.dev/admission when the admission loop is on.
//     The result is a JSON patch; a second pass (reinvocation) adds nothing.
//   - Validation: every parser error; system annotations and device env a
//     user set (a pod must never name its own device), on CREATE, UPDATE,
//     pods/ephemeralcontainers and pods/binding, unless the request comes
//     from Partita's own identities; pods that skipped the mutation;
//     changes to a pod's GPU request after creation; and policy ConfigMaps
//     that do not compile.
//   - Routes to a GPU around Partita (podspec.go): privileged containers
//     in GPU pods, hostPaths into the devices or the MPS directory, mounts
//     of the MPS volume other than a GPU container's own device's pipe,
//     device-list mounts and CDI requests, refused from anyone.
//   - The admission policies (policies.go, cel.go): the same refusals as
//     CEL that the API server runs itself, NVIDIA_VISIBLE_DEVICES=void for
//     pods that ask for no GPU, and the refusal of GPU pods the webhook did
//     not reach; with them the webhooks see only the pods that touch GPUs.
//   - Serving: gin over TLS with certificates reloaded on change, /healthz,
//     /readyz and /metrics, and the webhook configurations and policies
//     themselves.
//
// webhook imports gpu, policy and api/v1alpha1; nothing imports it but
// cmd/partita.
package webhook
