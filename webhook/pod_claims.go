package webhook

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// Pods that ask for GPUs through ResourceClaims of any DRA driver only
// (their own claims, claim templates, an extended resource a GPU DeviceClass
// backs; dra.Demand) are GPU pods of their queue as well (docs/queues.md,
// "Pods with ResourceClaims"): the mutating webhook gives them a queue like
// any GPU pod (their label, their PodGroup's, their namespace's default,
// the cluster's default), asks the admission policy about them, and gates
// them for the admission loop, which charges them what their claims ask.
// Nothing else of them changes: kube-scheduler's DRA plugin allocates
// their devices, and the driver's CDI spec gives the container its GPUs.
// Pods whose claims ask for no GPU class are not touched.

// ClaimDemand reads what a pod asks for through ResourceClaims
// (claims.Cache.Demand over live reads).
type ClaimDemand func(pod *corev1.Pod) dra.Demand

// WithClaims makes pods that ask for GPUs through ResourceClaims only GPU
// pods of their queue, gated for the admission loop; without it the
// webhook leaves them alone.
func WithClaims(read ClaimDemand) PodOption { return func(a *PodAdmission) { a.claims = read } }

// claimRequest is the request of a pod that asks for GPUs through
// ResourceClaims only: no containers, DialectClaims, its queue, gang,
// topology request and sub-group; nil when it asks for no GPU that way.
func (a *PodAdmission) claimRequest(pod *corev1.Pod) (*gpu.PodRequest, field.ErrorList) {
	if a.claims == nil || !dra.HasClaims(pod) {
		return nil, nil
	}
	if d := a.claims(pod); !d.GPU() {
		return nil, nil
	}
	return claimReread(pod, &gpu.PodRequest{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Dialect: gpu.DialectClaims})
}

// isClaimRequest reports whether req is a claim request (claimRequest).
func isClaimRequest(req *gpu.PodRequest) bool { return req != nil && req.Dialect == gpu.DialectClaims }

// claimReread reads pod's queue, gang, topology request and sub-group
// again into a copy of prev, a claim request. They are checked as ParsePod
// checks them, but not rewritten in Partita's keys: a claim pod keeps the
// dialect it was written in, as it does for its queue (the admission loop
// reads every dialect).
func claimReread(pod *corev1.Pod, prev *gpu.PodRequest) (*gpu.PodRequest, field.ErrorList) {
	q, g, errs := gpu.QueueAndGroup(pod)
	topo, sub, topoErrs := gpu.PodTopology(pod)
	if errs = append(errs, topoErrs...); len(errs) > 0 {
		return nil, errs
	}
	out := *prev
	out.Queue, out.PodGroup, out.Topology, out.SubGroup = q, g, topo, sub
	return &out, nil
}

// reparse is gpu.ParsePod, or for a claim request (prev) the pod's queue
// and gang read again: how the queue steps read a pod after writing to it.
func reparse(pod *corev1.Pod, prev *gpu.PodRequest) (*gpu.PodRequest, field.ErrorList) {
	if isClaimRequest(prev) {
		return claimReread(pod, prev)
	}
	return gpu.ParsePod(pod)
}
