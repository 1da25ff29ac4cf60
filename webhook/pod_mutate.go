package webhook

import (
	"context"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/gpu"
)

// subresourceEphemeral is the subresource `kubectl debug` adds containers
// through.
const subresourceEphemeral = "ephemeralcontainers"

// Mutate answers the mutating webhook: pod CREATE is canonicalised, and
// containers added through pods/ephemeralcontainers get
// NVIDIA_VISIBLE_DEVICES=void. Anything else passes unchanged.
func (a *PodAdmission) Mutate(ctx context.Context, ar *admissionv1.AdmissionRequest) Result {
	if !isPod(ar) {
		return Result{}
	}
	switch {
	case ar.SubResource == "" && ar.Operation == admissionv1.Create:
		return a.mutateCreate(ctx, ar)
	case ar.SubResource == subresourceEphemeral && ar.Operation == admissionv1.Update:
		return a.mutateEphemeral(ar)
	}
	return Result{}
}

// isMirrorPod reports whether a kubelet creates the API copy of a static
// pod: its spec comes from a file on the node and must not change, and
// Partita never places it. Only a node's own request counts, so that a user
// cannot skip the webhook by adding the annotation.
func isMirrorPod(ar *admissionv1.AdmissionRequest, pod *corev1.Pod) bool {
	_, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]
	return mirror && strings.HasPrefix(ar.UserInfo.Username, "system:node:") && slices.Contains(ar.UserInfo.Groups, "system:nodes")
}

func isPod(ar *admissionv1.AdmissionRequest) bool {
	return ar.Kind.Group == "" && ar.Kind.Kind == "Pod"
}

// mutateCreate checks a new pod, asks the policy if it wants GPUs, and
// patches it into canonical form.
func (a *PodAdmission) mutateCreate(ctx context.Context, ar *admissionv1.AdmissionRequest) Result {
	pod, err := decodePod(ar.Object, ar.Namespace, "pod")
	if err != nil {
		return Result{Err: err}
	}
	if isMirrorPod(ar, pod) {
		return Result{}
	}
	req, err := a.checkPod(pod, ar.UserInfo)
	if err != nil {
		return Result{Err: err}
	}
	if req == nil {
		// A pod whose ResourceClaims ask for GPUs (pod_claims.go).
		creq, errs := a.claimRequest(pod)
		if len(errs) > 0 {
			return Result{Err: &DenialError{Reason: ReasonInvalidRequest, Errs: errs}}
		}
		req = creq
	}
	base := pod
	if req != nil {
		patched, preq, err := a.resolveQueue(ctx, ar, pod, req)
		if err != nil {
			return Result{Err: err, Dialect: req.Dialect}
		}
		base, req = patched, preq
	}
	// A model's volume and mounts go in before canonical form: the seal
	// and the device env then cover the pod as it will be.
	if base, err = a.withModels(ctx, base); err != nil {
		return Result{Err: err, Dialect: dialectOf(req)}
	}
	out, templates, err := a.canonical(base, req)
	if err != nil {
		return Result{Err: err, Dialect: dialectOf(req)}
	}
	if err := a.ensureTemplates(ctx, ar.DryRun != nil && *ar.DryRun, templates); err != nil {
		return Result{Err: err, Dialect: dialectOf(req)}
	}
	return Result{Patch: podPatch(pod, out), Dialect: dialectOf(req)}
}

// mutateEphemeral gives each new ephemeral container NVIDIA_VISIBLE_DEVICES
// =void: a debug container must not see the node's GPUs either. Existing
// ephemeral containers cannot change, so they are left alone.
func (a *PodAdmission) mutateEphemeral(ar *admissionv1.AdmissionRequest) Result {
	old, pod, err := decodeOldNew(ar)
	if err != nil {
		return Result{Err: err}
	}
	if err := a.checkEphemeral(ar, old, pod, false); err != nil {
		return Result{Err: err}
	}
	out := pod.DeepCopy()
	for i := range out.Spec.EphemeralContainers {
		ec := &out.Spec.EphemeralContainers[i]
		if hasEphemeral(old, ec.Name) {
			continue
		}
		c := corev1.Container(ec.EphemeralContainerCommon)
		addEnv(&c, voidEnv())
		ec.EphemeralContainerCommon = corev1.EphemeralContainerCommon(c)
	}
	return Result{Patch: podPatch(pod, out)}
}

func decodeOldNew(ar *admissionv1.AdmissionRequest) (*corev1.Pod, *corev1.Pod, error) {
	old, err := decodePod(ar.OldObject, ar.Namespace, "old pod")
	if err != nil {
		return nil, nil, err
	}
	pod, err := decodePod(ar.Object, ar.Namespace, "pod")
	if err != nil {
		return nil, nil, err
	}
	return old, pod, nil
}

// checkEphemeral refuses ephemeral containers an update adds with device
// env of their own, (once mutated, requireVoid) without
// NVIDIA_VISIBLE_DEVICES=void, privileged in a GPU pod, or with a mount
// that reaches GPUs (podSpecErrors).
func (a *PodAdmission) checkEphemeral(ar *admissionv1.AdmissionRequest, old, pod *corev1.Pod, requireVoid bool) error {
	env := a.ephemeralEnvErrors(ar, old, pod, requireVoid)
	req, _ := gpu.ParsePod(pod)
	spec := podSpecErrors(pod, a.mpsDir, specCheck{gpuPod: req != nil, isNew: func(name string) bool { return !hasEphemeral(old, name) }})
	switch {
	case len(env) > 0:
		return &DenialError{Reason: ReasonSystemKey, Errs: append(env, spec...)}
	case len(spec) > 0:
		return &DenialError{Reason: ReasonDeviceAccess, Errs: spec}
	}
	return nil
}

func hasEphemeral(pod *corev1.Pod, name string) bool {
	for _, ec := range pod.Spec.EphemeralContainers {
		if ec.Name == name {
			return true
		}
	}
	return false
}
