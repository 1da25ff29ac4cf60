package v1alpha1

import (
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Canonical request keys, written by the webhook and read by every other part
// (DESIGN §4). The values are per GPU container.
const (
	// AnnotationGPUFraction is the fraction of one device each GPU container
	// gets, a decimal in (0, 1].
	AnnotationGPUFraction = "partita.dev/gpu-fraction"
	// AnnotationGPUMemory is the GPU memory per device, a Kubernetes quantity.
	AnnotationGPUMemory = "partita.dev/gpu-memory"
	// AnnotationGPUCount is the number of devices per GPU container.
	AnnotationGPUCount = "partita.dev/gpu-count"
	// AnnotationGPUCores is the share of a device's compute (SM) a container may
	// use, a percentage in [1, 100] (HAMi's nvidia.com/gpucores).
	AnnotationGPUCores = "partita.dev/gpu-cores"
	// AnnotationPlacement selects device placement for one pod: binpack or spread.
	AnnotationPlacement = "partita.dev/placement"
	// AnnotationMinMember sets a gang's size for pods grouped by LabelPodGroup
	// without a PodGroup object.
	AnnotationMinMember = "partita.dev/min-member"
	// AnnotationCanonical is the webhook's summary of a GPU pod it put in
	// canonical form: its queue, pod group, each container's
	// partita.dev/gpu-milli and the request's annotations, as the webhook
	// wrote them. While the pod still agrees with it, the API server does
	// not call the validating webhook on the pod's creation (one admission
	// round trip a pod); one the pod is created with is removed before the
	// webhook sees the pod (docs/design.md, section 11).
	AnnotationCanonical = "partita.dev/canonical"

	// LabelQueue names the leaf Queue a pod belongs to.
	LabelQueue = "partita.dev/queue"
	// LabelPodGroup names the gang (PodGroup) a pod belongs to.
	LabelPodGroup = "partita.dev/pod-group"
	// LabelGPUNode marks nodes that Partita manages.
	LabelGPUNode = "partita.dev/gpu-node"
	// LabelDefaultQueue on a Namespace names the queue its pods go to when they
	// name none.
	LabelDefaultQueue = "partita.dev/default-queue"
	// LabelPolicy on a ConfigMap (value "rego") marks it as a policy override.
	LabelPolicy = "partita.dev/policy"

	// AnnotationGang on a workload's top owner (a Job, a JobSet, ...) is
	// "true" or "false": it overrides whether the workload map's built-in
	// rule makes the workload a gang.
	AnnotationGang = "partita.dev/gang"
	// AnnotationWorkload names, for people, the workload the workload map
	// grouped a pod into: "<Kind>/<name>" ("JobSet/llama-ft",
	// "LeaderWorkerSet/vllm group 1"). The admission loop writes it on the
	// PodGroup it keeps for the workload and on the workload's pods; it is
	// informational (nothing decides on it).
	AnnotationWorkload = "partita.dev/workload"
	// AnnotationWorkloadPodGroup on a pod names the PodGroup the admission
	// loop keeps the status of the pod's mapped workload in.
	AnnotationWorkloadPodGroup = "partita.dev/workload-pod-group"
	// LabelWorkloadKind marks a PodGroup the admission loop keeps for a
	// mapped workload, with the kind of the workload's top owner; the
	// PodGroup is owned by that object, so it goes with it.
	LabelWorkloadKind = "partita.dev/workload-kind"

	// ResourceGPUMilli is the extended resource for aggregate GPU demand in
	// milli-GPUs (1000 = one whole device), on containers and node capacity.
	ResourceGPUMilli corev1.ResourceName = "partita.dev/gpu-milli"

	// SchedulingGateAdmission holds a pod until the admission loop admits its
	// workload.
	SchedulingGateAdmission = "partita.dev/admission"

	// PodClaimPrefix starts the names of the pod-level resource claims
	// (spec.resourceClaims) that the webhook writes in dra mode, one per GPU
	// container: PodClaimPrefix + the container's index. A container that
	// uses one is a GPU container (package dra).
	PodClaimPrefix = "partita-gpu-"
)

// System keys: written only by Partita (the webhook refuses them from anyone
// else). A pod must never be able to name its own device.
const (
	// AnnotationDevicesPrefix + container name holds the comma-separated UUIDs
	// of the devices assigned to that container; NVIDIA_VISIBLE_DEVICES reads it
	// through the downward API.
	AnnotationDevicesPrefix = "partita.dev/devices."
	// AnnotationMemLimitPrefix + container name holds the per-device memory limit,
	// in the "<MiB>M" form that both CUDA MPS and HAMi-core accept.
	AnnotationMemLimitPrefix = "partita.dev/mem-limit."
	// AnnotationSMLimitPrefix + container name holds the SM (compute) limit in percent.
	AnnotationSMLimitPrefix = "partita.dev/sm-limit."
	// AnnotationNode is the node chosen at bind.
	AnnotationNode = "partita.dev/node"
	// AnnotationReservation is what the admission loop reserved for a pod it
	// let go and that is not bound yet: a JSON record of the node, each
	// container's devices and the expiry (gpu.Reservation). Only Partita
	// writes it.
	AnnotationReservation = "partita.dev/reservation"
	// AnnotationAdmitted records when the admission loop admitted the pod.
	AnnotationAdmitted = "partita.dev/admitted"
)

// SystemAnnotationKeys and SystemAnnotationPrefixes are the pod
// annotations only Partita writes, once the pod exists (DESIGN §4): a pod
// must never name its own device, node or admission.
func SystemAnnotationKeys() [3]string {
	return [...]string{AnnotationNode, AnnotationReservation, AnnotationAdmitted}
}

// SystemAnnotationPrefixes: see SystemAnnotationKeys.
func SystemAnnotationPrefixes() [3]string {
	return [...]string{AnnotationDevicesPrefix, AnnotationMemLimitPrefix, AnnotationSMLimitPrefix}
}

// IsSystemAnnotation reports whether only Partita may write the annotation.
func IsSystemAnnotation(key string) bool {
	if !strings.HasPrefix(key, GroupVersion.Group+"/") {
		return false
	}
	keys := SystemAnnotationKeys()
	if slices.Contains(keys[:], key) {
		return true
	}
	for _, p := range SystemAnnotationPrefixes() {
		if strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// HasAdmissionGate reports whether the pod still carries Partita's
// admission gate (SchedulingGateAdmission): the admission loop has not
// released it yet.
func HasAdmissionGate(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
		return g.Name == SchedulingGateAdmission
	})
}

// Node labels as NVIDIA's GPU Feature Discovery writes them; simulated nodes
// carry them too.
const (
	LabelNVIDIAGPUCount   = "nvidia.com/gpu.count"
	LabelNVIDIAGPUProduct = "nvidia.com/gpu.product"
	// LabelNVIDIAGPUMemory is the memory of one device in MiB.
	LabelNVIDIAGPUMemory = "nvidia.com/gpu.memory"
)

// GPUNode keys.
const (
	// AnnotationResetHealth on a GPUNode tells its agent that devices it
	// keeps unhealthy after a fault (a critical XID, a lost GPU) were reset
	// and may take work again: "all", or a comma-separated list of device
	// indexes and UUIDs. The agent forgets those faults and removes the
	// annotation. Without it, faults are kept until the node reboots.
	AnnotationResetHealth = "partita.dev/reset-health"

	// UnknownDeviceUUIDPrefix starts the UUID the agent publishes for a
	// device NVML counts but cannot identify (it cannot open the device or
	// read its UUID) and that the node never published before:
	// "unknown-<index>". Such a device is always Unhealthy; no pod can hold
	// it, as only real UUIDs are ever assigned.
	UnknownDeviceUUIDPrefix = "unknown-"
)

// UnknownDeviceUUID is the UUID published for the unidentified device at
// index (see UnknownDeviceUUIDPrefix).
func UnknownDeviceUUID(index int32) string {
	return UnknownDeviceUUIDPrefix + strconv.Itoa(int(index))
}

// IsUnknownDeviceUUID reports whether uuid stands for an unidentified
// device.
func IsUnknownDeviceUUID(uuid string) bool { return strings.HasPrefix(uuid, UnknownDeviceUUIDPrefix) }

// WorkloadOf names the workload the admission loop counts a pod in: for a
// gang of the workload map, the kind and name of its workload ("JobSet",
// "llama-ft"; "LeaderWorkerSet", "vllm group 1") and the PodGroup that holds
// its status; for a pod of an explicit gang, "PodGroup" and the gang's name
// twice; for a single pod, empty strings. It reads the pod alone: the loop
// names a mapped pod's workload (AnnotationWorkload) once it has seen the
// pod, so a pod a moment old may not say yet.
func WorkloadOf(pod *corev1.Pod) (kind, name, podGroup string) {
	if w := pod.Annotations[AnnotationWorkload]; w != "" {
		if k, n, ok := strings.Cut(w, "/"); ok && k != "" && n != "" {
			return k, n, pod.Annotations[AnnotationWorkloadPodGroup]
		}
	}
	if g := pod.Labels[LabelPodGroup]; g != "" {
		return "PodGroup", g, g
	}
	return "", "", ""
}
