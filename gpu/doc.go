// Package gpu is Partita's domain model, shared by the webhook, the extender,
// the admission loop and the node agent (DESIGN §3, §4):
//
//   - requests: ParsePod reads a pod's GPU request in any supported dialect
//     (canonical partita.dev/*, Run:ai/KAI, HAMi, whole nvidia.com/gpu) into
//     one PodRequest, and ApplyCanonical writes the canonical form back;
//   - allocations: the wire format of a bind decision (PodAllocation) and the
//     pod annotations that carry it;
//   - inventory: a node's devices, read from its GPUNode;
//   - the Ledger: per-device accounting derived from GPUNodes and pods, with
//     Fit, Choose, Score and Assume, and cheap Snapshots on which the
//     admission loop places whole gangs.
//
// gpu is the leaf of the module: it imports api/v1alpha1, k8s.io/api and
// k8s.io/apimachinery only, never another Partita package.
package gpu
