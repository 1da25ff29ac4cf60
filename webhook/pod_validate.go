package webhook

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// subresourceBinding is the subresource a scheduler binds pods through.
const subresourceBinding = "binding"

// subresourceStatus is the subresource the kubelet writes pod status
// through; it also takes labels and annotations.
const subresourceStatus = "status"

// Validate answers the validating webhook, which sees each object after
// every mutation: new pods, pod updates, ephemeral containers and
// bindings.
func (a *PodAdmission) Validate(ctx context.Context, ar *admissionv1.AdmissionRequest) Result {
	switch {
	case ar.SubResource == subresourceBinding && ar.Operation == admissionv1.Create:
		return a.validateBinding(ar)
	case !isPod(ar):
		return Result{}
	case ar.SubResource == "" && ar.Operation == admissionv1.Create:
		return a.validateCreate(ctx, ar)
	case ar.SubResource == "" && ar.Operation == admissionv1.Update:
		return a.validateUpdate(ar)
	case ar.SubResource == subresourceStatus && ar.Operation == admissionv1.Update:
		// The status subresource keeps the labels and annotations it is
		// sent: it is a pod update like any other there.
		return a.validateUpdate(ar)
	case ar.SubResource == subresourceEphemeral && ar.Operation == admissionv1.Update:
		old, pod, err := decodeOldNew(ar)
		if err != nil {
			return Result{Err: err}
		}
		if err := a.checkEphemeral(ar, old, pod, true); err != nil {
			return Result{Err: err}
		}
	}
	return Result{}
}

// validateCreate checks a new pod as it will be stored: its request, its
// system keys, and that Partita's mutation ran (a pod that skipped it, say
// because the mutating configuration is missing, would escape the queues
// and see every GPU).
func (a *PodAdmission) validateCreate(ctx context.Context, ar *admissionv1.AdmissionRequest) Result {
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
	want, _, err := a.canonical(pod, req)
	if err != nil {
		return Result{Err: err, Dialect: dialectOf(req)}
	}
	tolerateDrift(pod, want, req)
	// The seal is no part of the canonical form, only the mutating
	// webhook's word to the API server (seal.go): whatever the pod carries
	// (none, from a webhook before seals, or one a later webhook left
	// stale) is checked here in full instead.
	keepSeal(pod, want)
	if a.backend == dra.BackendDRA {
		tolerateClaimDrift(pod, want)
		if err := a.checkClaimTemplates(ctx, pod, req); err != nil {
			return Result{Err: err, Dialect: dialectOf(req)}
		}
	}
	if !ownedFieldsEqual(pod, want) {
		ops, err := diffPaths(pod, want)
		switch {
		case err != nil:
			return Result{Err: err, Dialect: dialectOf(req)}
		case len(ops) > 0:
			return Result{Dialect: dialectOf(req), Err: &DenialError{Reason: ReasonNotCanonical, Messages: []string{fmt.Sprintf(
				"the pod did not pass Partita's mutating webhook (it lacks %s); check that the MutatingWebhookConfiguration is installed and selects namespace %s",
				patchPaths(ops, 5), pod.Namespace)}}}
		}
	}
	if err := checkModelVolumes(pod); err != nil {
		return Result{Err: err, Dialect: dialectOf(req)}
	}
	return a.validateQueue(ctx, pod, req)
}

// validateQueue checks that a new GPU pod leaves admission with a queue,
// and one its PodGroup agrees with (pod_queue.go).
func (a *PodAdmission) validateQueue(ctx context.Context, pod *corev1.Pod, req *gpu.PodRequest) Result {
	if req == nil {
		return Result{}
	}
	if req.Queue == "" {
		// The mutation gives every GPU pod a queue; one without would be
		// admitted on free room alone, ahead of every queue, and never
		// reclaimed.
		return Result{Dialect: req.Dialect, Err: &DenialError{Reason: ReasonNotCanonical, Messages: []string{fmt.Sprintf(
			"the GPU pod has no queue: it did not pass Partita's mutating webhook, which gives every GPU pod one; check that the MutatingWebhookConfiguration is installed and selects namespace %s",
			pod.Namespace)}}}
	}
	// The membership check again, against the cache only, in case a later
	// mutation changed the queue label.
	if _, _, err := a.joinPodGroup(ctx, pod, req, false); err != nil {
		return Result{Dialect: req.Dialect, Err: err}
	}
	return Result{Dialect: req.Dialect}
}

// tolerateDrift makes want agree with pod where the answer depends on the
// cluster and may have moved since the mutation: partita.dev/gpu-milli of a
// memory request (the parser has checked it lies in range) and the device
// env of each isolation mode (checked to be exactly Partita's). A container
// must still have NVIDIA_VISIBLE_DEVICES.
func tolerateDrift(pod, want *corev1.Pod, req *gpu.PodRequest) {
	if req != nil {
		for _, c := range req.Containers {
			got := pod.Spec.Containers[c.Index].Resources
			w := &want.Spec.Containers[c.Index].Resources
			// (In dra mode want has no gpu-milli to tolerate.)
			if q, ok := got.Limits[v1alpha1.ResourceGPUMilli]; ok && w.Limits != nil {
				if _, want := w.Limits[v1alpha1.ResourceGPUMilli]; want {
					w.Limits[v1alpha1.ResourceGPUMilli] = q
				}
			}
			if q, ok := got.Requests[v1alpha1.ResourceGPUMilli]; ok && w.Requests != nil {
				if _, want := w.Requests[v1alpha1.ResourceGPUMilli]; want {
					w.Requests[v1alpha1.ResourceGPUMilli] = q
				}
			}
		}
	}
	keep := func(got []corev1.EnvVar, w *[]corev1.EnvVar) {
		if slices.ContainsFunc(got, func(e corev1.EnvVar) bool { return e.Name == EnvVisibleDevices }) {
			*w = slices.Clone(got)
		}
	}
	for i := range want.Spec.Containers {
		keep(pod.Spec.Containers[i].Env, &want.Spec.Containers[i].Env)
	}
	for i := range want.Spec.InitContainers {
		keep(pod.Spec.InitContainers[i].Env, &want.Spec.InitContainers[i].Env)
	}
}

// validateUpdate refuses, from anyone but Partita, a change to a system
// annotation, and from anyone a change to the GPU request, queue, gang,
// placement, topology request or sub-group: the queues and the ledger
// account a pod as it was created, and the admission loop places its gang
// as it asked then.
func (a *PodAdmission) validateUpdate(ar *admissionv1.AdmissionRequest) Result {
	old, pod, err := decodeOldNew(ar)
	if err != nil {
		return Result{Err: err}
	}
	if !a.trusted.Trusts(ar.UserInfo) {
		errs := changedSystemAnnotations(old.Annotations, pod.Annotations)
		if v1alpha1.HasAdmissionGate(old) && !v1alpha1.HasAdmissionGate(pod) {
			// Removing the gate would skip the queues, their limits and the
			// gang's all-or-nothing start.
			errs = append(errs, field.Forbidden(field.NewPath("spec", "schedulingGates"), gateRemovedText))
		}
		if len(errs) > 0 {
			return Result{Err: &DenialError{Reason: ReasonSystemKey, Errs: errs}}
		}
		if errs := changedCDIAnnotations(old.Annotations, pod.Annotations); len(errs) > 0 {
			return Result{Err: &DenialError{Reason: ReasonDeviceAccess, Errs: errs}}
		}
	}
	oldReq, oldErrs := gpu.ParsePod(old)
	if !a.trusted.Trusts(ar.UserInfo) && len(oldErrs) == 0 && oldReq != nil {
		names := make([]string, 0, len(oldReq.Containers))
		for _, c := range oldReq.Containers {
			names = append(names, c.Name)
		}
		if errs := changedNRIRequirements(old.Annotations, pod.Annotations, names); len(errs) > 0 {
			return Result{Dialect: dialectOf(oldReq), Err: &DenialError{Reason: ReasonDeviceAccess, Errs: errs}}
		}
	}
	if len(oldErrs) > 0 {
		// A pod from before Partita, or one it never could read: nothing to
		// keep fixed.
		return Result{}
	}
	req, errs := gpu.ParsePod(pod)
	if len(errs) > 0 {
		return Result{Dialect: dialectOf(oldReq), Err: &DenialError{Reason: ReasonImmutable, Errs: errs}}
	}
	if oldReq == nil && req == nil && dra.HasClaims(old) {
		// A pod whose claims may ask for GPUs is charged to the queue it
		// was created with (pod_claims.go): that stays fixed too.
		oq, og, _ := gpu.QueueAndGroup(old)
		nq, ng, _ := gpu.QueueAndGroup(pod)
		if oq != nq || og != ng {
			return Result{Err: &DenialError{Reason: ReasonImmutable, Messages: []string{fmt.Sprintf(
				"a pod's queue and pod group are fixed when it is created (queue %q, pod group %q; now %q, %q); delete the pod and create it again", oq, og, nq, ng)}}}
		}
	}
	if diff := requestDiff(oldReq, req); len(diff) > 0 {
		return Result{Dialect: dialectOf(oldReq), Err: &DenialError{Reason: ReasonImmutable, Messages: []string{
			"a pod's GPU request, queue, pod group, placement, topology and sub-group are fixed when it is created (" + strings.Join(diff, "; ") +
				"); delete the pod and create it again"}}}
	}
	return Result{Dialect: dialectOf(req)}
}

// requestDiff says, in words, how two readings of a pod's request differ.
func requestDiff(old, cur *gpu.PodRequest) []string {
	var out []string
	describe := func(r *gpu.PodRequest) string {
		if r == nil {
			return "no GPU"
		}
		a := r.CanonicalAnnotations()
		// The topology has its own line below.
		for k := range gpu.TopologyCanonicalAnnotations(r.Topology) {
			delete(a, k)
		}
		parts := make([]string, 0, len(a)+1)
		for _, k := range slices.Sorted(maps.Keys(a)) {
			parts = append(parts, k+"="+a[k])
		}
		names := make([]string, 0, len(r.Containers))
		for _, c := range r.Containers {
			names = append(names, c.Name)
		}
		parts = append(parts, "containers "+strings.Join(names, ","))
		return strings.Join(parts, " ")
	}
	if o, c := describe(old), describe(cur); o != c {
		out = append(out, fmt.Sprintf("GPU request was %q, now %q", o, c))
	}
	get := func(r *gpu.PodRequest) [5]string {
		if r == nil {
			return [5]string{}
		}
		return [...]string{r.Queue, r.PodGroup, string(r.Placement), describeTopology(r.Topology), r.SubGroup}
	}
	o, c := get(old), get(cur)
	for i, what := range [...]string{"queue", "pod group", "placement", "topology", "sub-group"} {
		if o[i] != c[i] {
			out = append(out, fmt.Sprintf("%s was %q, now %q", what, o[i], c[i]))
		}
	}
	return out
}

// describeTopology writes a topology request as Partita's keys say it,
// empty for none.
func describeTopology(t v1alpha1.TopologyRequest) string {
	a := gpu.TopologyCanonicalAnnotations(t)
	parts := make([]string, 0, len(a))
	for _, k := range slices.Sorted(maps.Keys(a)) {
		parts = append(parts, k+"="+a[k])
	}
	return strings.Join(parts, " ")
}

// ephemeralEnvErrors checks the ephemeral containers an update adds: no
// device env of their own, and (once mutated, requireVoid)
// NVIDIA_VISIBLE_DEVICES=void.
func (a *PodAdmission) ephemeralEnvErrors(ar *admissionv1.AdmissionRequest, old, pod *corev1.Pod, requireVoid bool) field.ErrorList {
	if a.trusted.Trusts(ar.UserInfo) {
		return nil
	}
	var errs field.ErrorList
	void := voidEnv()[0]
	for i := range pod.Spec.EphemeralContainers {
		ec := &pod.Spec.EphemeralContainers[i]
		if hasEphemeral(old, ec.Name) {
			continue
		}
		path := field.NewPath("spec", "ephemeralContainers").Index(i).Child("env")
		hasVoid := false
		for j, e := range ec.Env {
			if !isDeviceEnv(e.Name) {
				continue
			}
			if envMatches(e, void) {
				hasVoid = true
				continue
			}
			errs = append(errs, field.Forbidden(path.Index(j), deviceEnvMessage(e, kindEphemeral)))
		}
		if requireVoid && !hasVoid {
			errs = append(errs, field.Required(path, voidMissingText))
		}
	}
	return errs
}

// validateBinding refuses a Binding that carries system annotations unless
// it comes from Partita: the API server copies a Binding's annotations onto
// the pod, so this is where a pod's devices are chosen (DESIGN §2.3).
func (a *PodAdmission) validateBinding(ar *admissionv1.AdmissionRequest) Result {
	if a.trusted.Trusts(ar.UserInfo) {
		return Result{}
	}
	var b corev1.Binding
	if err := decodeInto(ar.Object, "binding", &b); err != nil {
		return Result{Err: err}
	}
	if errs := systemAnnotationErrors(b.Annotations); len(errs) > 0 {
		return Result{Err: &DenialError{Reason: ReasonSystemKey, Errs: errs, Messages: []string{bindingSystemText}}}
	}
	// The API server copies a Binding's annotations onto the pod before its
	// containers are created: a CDI request there would reach the runtime.
	if errs := cdiAnnotationErrors(b.Annotations); len(errs) > 0 {
		return Result{Err: &DenialError{Reason: ReasonDeviceAccess, Errs: errs}}
	}
	return Result{}
}

func dialectOf(req *gpu.PodRequest) gpu.Dialect {
	if req == nil {
		return ""
	}
	return req.Dialect
}
