package webhook

import (
	"context"
	"strconv"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/policy"
)

// PolicyEvaluator decides GPU pods (policy.Engine).
type PolicyEvaluator interface {
	Admission(ctx context.Context, in *policy.AdmissionInput) (*policy.AdmissionDecision, error)
}

// Result is a webhook's answer to one admission request.
type Result struct {
	// Patch is the JSON patch to apply; empty for none.
	Patch []jsonpatch.Operation
	// Err refuses the request: a *DenialError with the user's message, or
	// any other error for an internal failure.
	Err error
	// Dialect is the pod's GPU dialect, for the decision log; empty for a
	// pod without GPUs.
	Dialect gpu.Dialect
}

// PodAdmission mutates and validates pods.
type PodAdmission struct {
	policy        PolicyEvaluator
	cluster       ClusterView
	trusted       Identities
	admissionGate bool
	// preemptNever writes preemptionPolicy: Never; see WithPreemptionNever.
	preemptNever bool
	// schedulerName is written into GPU pods when set; see WithSchedulerName.
	schedulerName string
	// mpsDir is the agent's --mps-dir; see WithMPSDir.
	mpsDir string
	// refs reads members' PodGroups; see WithReferences.
	refs *References
	// defaultQueue is the queue of GPU pods that name none; see
	// WithDefaultQueue.
	defaultQueue string
	// backend is the GPU backend and templates, in dra mode, where claim
	// templates are created and read; see WithGPUBackend.
	backend   dra.Backend
	templates TemplateStore
	// claims reads what pods ask for through ResourceClaims; see
	// WithClaims.
	claims ClaimDemand
	// noModels refuses pods that ask for models; see WithModels.
	noModels bool
}

// WithModels says whether the cluster runs the node's model cache (the
// chart's modelCache.enabled). Without it a pod that asks for a model is
// refused, rather than left waiting for a volume no node can mount.
func WithModels(on bool) PodOption { return func(a *PodAdmission) { a.noModels = !on } }

// PodOption configures a PodAdmission.
type PodOption func(*PodAdmission)

// WithAdmissionGate adds the scheduling gate partita.dev/admission to every
// GPU pod, for the queue and gang admission loop.
func WithAdmissionGate(on bool) PodOption { return func(a *PodAdmission) { a.admissionGate = on } }

// WithPreemptionNever writes preemptionPolicy: Never into GPU pods (DESIGN
// §6). Off by default: the API server re-runs its built-in Priority
// admission plugin after any webhook changes a pod, and that plugin refuses
// a pod whose preemptionPolicy differs from its PriorityClass's. Turn it on
// only where every GPU pod's PriorityClass already says Never; otherwise
// the extender's preempt verb keeps kube-scheduler from evicting for GPUs.
func WithPreemptionNever(on bool) PodOption { return func(a *PodAdmission) { a.preemptNever = on } }

// WithMPSDir sets the directory of the MPS daemons' pipes on the nodes (the
// agent's --mps-dir, DefaultMPSDir by default): GPU containers of one-device
// slices mount their own device's pipe directory from it.
func WithMPSDir(dir string) PodOption { return func(a *PodAdmission) { a.mpsDir = cleanDir(dir) } }

// WithSchedulerName writes spec.schedulerName into every GPU pod when name
// is not empty. A cluster that runs Partita's kube-scheduler beside the
// default one (the chart's scheduler.mode=second) needs it: only that
// scheduler calls the extender, so a GPU pod left to the default scheduler
// would wait forever or, worse, be bound without devices by a scheduler that
// knows nothing of them. Empty leaves the pod's own choice (the default
// scheduler configured with the extender).
func WithSchedulerName(name string) PodOption {
	return func(a *PodAdmission) { a.schedulerName = name }
}

// WithReferences reads the PodGroups that pods name through refs: a member
// that names no queue takes its PodGroup's, and one that names another is
// refused (see pod_queue.go). Without it PodGroups are not read.
func WithReferences(refs *References) PodOption { return func(a *PodAdmission) { a.refs = refs } }

// WithDefaultQueue sets the queue of GPU pods that name none, whose
// namespace has no default and whose PodGroup names none
// (v1alpha1.DefaultQueueName unless set); empty refuses such pods, as
// --require-queue does.
func WithDefaultQueue(name string) PodOption { return func(a *PodAdmission) { a.defaultQueue = name } }

// WithTrusted sets the identities that may write system annotations and
// device env.
func WithTrusted(id Identities) PodOption { return func(a *PodAdmission) { a.trusted = id } }

// NewPodAdmission returns the pod handlers. With no options no one is
// trusted and there is no admission gate.
func NewPodAdmission(p PolicyEvaluator, cv ClusterView, opts ...PodOption) *PodAdmission {
	a := &PodAdmission{policy: p, cluster: cv, mpsDir: DefaultMPSDir, defaultQueue: v1alpha1.DefaultQueueName}
	for _, o := range opts {
		o(a)
	}
	return a
}

// checkPod reads the pod's GPU request and refuses what nobody but Partita
// may create: parser errors, (unless the user is trusted) system
// annotations and device env, and (from anyone) the routes to a GPU around
// Partita (podSpecErrors).
func (a *PodAdmission) checkPod(pod *corev1.Pod, user authenticationv1.UserInfo) (*gpu.PodRequest, error) {
	req, errs := gpu.ParsePod(pod)
	var sys field.ErrorList
	if !a.trusted.Trusts(user) {
		sys = systemAnnotationErrors(pod.Annotations)
		if len(errs) == 0 {
			sys = append(sys, deviceEnvErrors(pod, req)...)
		}
	}
	spec := podSpecErrors(pod, a.mpsDir, specCheck{gpuPod: req != nil, gpuContainers: gpuContainers(req), create: true})
	switch {
	case len(errs) > 0:
		return nil, &DenialError{Reason: ReasonInvalidRequest, Errs: append(append(errs, sys...), spec...)}
	case len(sys) > 0:
		return nil, &DenialError{Reason: ReasonSystemKey, Errs: append(sys, spec...)}
	case len(spec) > 0:
		return nil, &DenialError{Reason: ReasonDeviceAccess, Errs: spec}
	}
	return req, nil
}

// canonical is pod as Partita writes it for req: ApplyCanonical, the device
// env (in dra mode the claims instead, and the templates they need), and
// for GPU pods preemptionPolicy Never, the scheduler name and the
// admission gate.
func (a *PodAdmission) canonical(pod *corev1.Pod, req *gpu.PodRequest) (*corev1.Pod, []*resourceapi.ResourceClaimTemplate, error) {
	if isClaimRequest(req) {
		// Its claims are its request: only the queue (already written) and
		// the admission gate are Partita's (pod_claims.go).
		out := gpu.ApplyCanonical(pod, nil, 0)
		injectEnv(out, nil, a.cluster.IsolationModes(), a.mpsDir)
		if a.admissionGate && !v1alpha1.HasAdmissionGate(out) {
			out.Spec.SchedulingGates = append(out.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: v1alpha1.SchedulingGateAdmission})
		}
		return out, nil, nil
	}
	var out *corev1.Pod
	var templates []*resourceapi.ResourceClaimTemplate
	if a.backend == dra.BackendDRA {
		var err error
		if out, templates, err = a.canonicalDRA(pod, req); err != nil {
			return nil, nil, err
		}
	} else {
		out = gpu.ApplyCanonical(pod, req, a.cluster.ReferenceDeviceMemoryMiB())
		injectEnv(out, req, a.cluster.IsolationModes(), a.mpsDir)
		// The agent's NRI plugin decides what a GPU container gets; the
		// claims' CDI specs do in dra mode.
		if err := requireNRIPlugin(out, req); err != nil {
			return nil, nil, err
		}
	}
	if req == nil {
		return out, templates, nil
	}
	// kube-scheduler's own preemption must never evict for a GPU request:
	// the extender's admission loop preempts whole gangs (DESIGN §6).
	if a.preemptNever {
		never := corev1.PreemptNever
		out.Spec.PreemptionPolicy = &never
	}
	if a.schedulerName != "" {
		out.Spec.SchedulerName = a.schedulerName
	}
	if a.admissionGate && !v1alpha1.HasAdmissionGate(out) {
		out.Spec.SchedulingGates = append(out.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: v1alpha1.SchedulingGateAdmission})
	}
	if a.backend != dra.BackendDRA {
		// Spares the pod the validating webhook's call (seal.go). In dra
		// mode that call also checks the claim templates, so it stays.
		seal(out)
	}
	return out, templates, nil
}

// policyInput is the policy's view of one GPU pod.
func (a *PodAdmission) policyInput(ar *admissionv1.AdmissionRequest, pod *corev1.Pod, req *gpu.PodRequest) *policy.AdmissionInput {
	ref := a.cluster.ReferenceDeviceMemoryMiB()
	in := &policy.AdmissionInput{
		Operation: string(ar.Operation),
		User:      policy.UserInfo{Username: ar.UserInfo.Username, Groups: ar.UserInfo.Groups},
		Namespace: pod.Namespace,
		Pod: policy.PodInfo{
			Name:               pod.Name,
			GenerateName:       pod.GenerateName,
			Labels:             pod.Labels,
			Annotations:        pod.Annotations,
			PriorityClassName:  pod.Spec.PriorityClassName,
			ServiceAccountName: pod.Spec.ServiceAccountName,
			Spec:               &pod.Spec,
		},
		Request: policy.Request{
			Dialect:   string(req.Dialect),
			Queue:     req.Queue,
			PodGroup:  req.PodGroup,
			Placement: string(req.Placement),
			MinMember: minMember(pod),
			Topology:  policy.TopologyRequest{Name: req.Topology.Topology, Required: req.Topology.Required, Preferred: req.Topology.Preferred},
			SubGroup:  req.SubGroup,
		},
	}
	if isClaimRequest(req) && a.claims != nil {
		in.Request.GPUMilli = a.claims(pod).Milli
	}
	for _, c := range req.Containers {
		q := c.MilliResource(ref)
		milli := q.Value()
		in.Request.GPUMilli += milli
		in.Request.Containers = append(in.Request.Containers, policy.ContainerRequest{
			Name:           c.Name,
			Count:          int64(c.Count),
			Milli:          c.Milli,
			MemoryMiB:      c.MemoryMiB,
			CoresPercent:   int64(c.CoresPercent),
			MilliPerDevice: c.MilliOn(ref),
			GPUMilli:       milli,
		})
	}
	return in
}

// minMember reads partita.dev/min-member; a missing or unreadable value is
// 0 (the extender's admission loop reports a bad one).
func minMember(pod *corev1.Pod) int64 {
	v, err := strconv.ParseInt(pod.Annotations[v1alpha1.AnnotationMinMember], 10, 32)
	if err != nil || v < 0 {
		return 0
	}
	return v
}

// applyPolicy asks the policy about a GPU pod. It returns the pod with the
// policy's defaults written (pod itself when there are none) and its
// request read again.
func (a *PodAdmission) applyPolicy(ctx context.Context, ar *admissionv1.AdmissionRequest, pod *corev1.Pod, req *gpu.PodRequest) (*corev1.Pod, *gpu.PodRequest, error) {
	d, err := a.policy.Admission(ctx, a.policyInput(ar, pod, req))
	if err != nil {
		return nil, nil, &DenialError{Reason: ReasonPolicyError, Err: err}
	}
	if len(d.Deny) > 0 {
		return nil, nil, &DenialError{Reason: ReasonPolicy, Messages: d.Deny, Err: nil}
	}
	if len(d.Patch.Labels) == 0 && len(d.Patch.Annotations) == 0 {
		// No defaults (the default policy writes none): no copy.
		return pod, req, nil
	}
	patched := pod.DeepCopy()
	changed, errs := applyDefaults(patched, d.Patch)
	if len(errs) > 0 {
		return nil, nil, &DenialError{Reason: ReasonPolicyError, Errs: errs}
	}
	if !changed {
		return pod, req, nil
	}
	req2, errs := reparse(patched, req)
	if len(errs) > 0 {
		return nil, nil, &DenialError{Reason: ReasonInvalidRequest, Errs: errs, Messages: []string{"(after the policy's defaults (version " + d.Version + ") were written)"}}
	}
	return patched, req2, nil
}
