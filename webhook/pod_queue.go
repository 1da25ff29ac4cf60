package webhook

import (
	"context"
	"fmt"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Every GPU pod leaves the mutating webhook with a queue, as a label fixed
// at creation, and the admission loop charges it to that queue and no
// other. Where it comes from, first that applies:
//
//  1. the pod's own queue label (any dialect);
//  2. its PodGroup's spec.queue, for a member that names none; a member
//     that names another queue is refused with both names;
//  3. its namespace's default (label partita.dev/default-queue), written
//     by the policy;
//  4. the cluster's default queue (--default-queue), asked about again by
//     the policy as if the pod had named it; with no default queue
//     (--require-queue) the pod is refused.

// queueRule describes the order above for messages.
const queueRule = "a gang's members go to their PodGroup's queue: remove the pod's queue label (it then takes the PodGroup's), or give the pod and its PodGroup the same queue"

// joinPodGroup applies step 2: a member that names no queue takes its
// PodGroup's, one that names another is refused, and so is one whose
// sub-group the PodGroup lacks (checkSubGroup). A PodGroup that does not
// exist (yet), or names no queue, changes nothing: the admission loop holds
// a gang whose members disagree with a PodGroup created later.
func (a *PodAdmission) joinPodGroup(ctx context.Context, pod *corev1.Pod, req *gpu.PodRequest, live bool) (*corev1.Pod, *gpu.PodRequest, error) {
	if a.refs == nil || req == nil || req.PodGroup == "" {
		return pod, req, nil
	}
	pg := &v1alpha1.PodGroup{}
	key := client.ObjectKey{Namespace: pod.Namespace, Name: req.PodGroup}
	var err error
	if live {
		err = a.refs.Get(ctx, key, pg)
	} else {
		err = a.refs.cache.Get(ctx, key, pg)
	}
	switch {
	case apierrors.IsNotFound(err):
		return pod, req, nil
	case err != nil:
		return nil, nil, fmt.Errorf("read PodGroup %s/%s: %w", pod.Namespace, req.PodGroup, err)
	}
	if err := checkSubGroup(pod, req, pg); err != nil {
		return nil, nil, err
	}
	q := pg.Spec.Queue
	switch {
	case q == "" || req.Queue == q:
		return pod, req, nil
	case req.Queue != "":
		return nil, nil, &DenialError{Reason: ReasonQueueConflict, Messages: []string{fmt.Sprintf(
			"the pod names queue %q but its PodGroup %s names queue %q; %s", req.Queue, req.PodGroup, q, queueRule)}}
	}
	return withQueue(pod, req, q)
}

// checkSubGroup refuses a member whose sub-group is not one of its
// PodGroup's: the admission loop would count it in no sub-group's minimum
// and place it under none of their levels. A PodGroup without sub-groups
// takes any (the workload map's own PodGroups, and gangs that leave them
// to the loop, have none).
func checkSubGroup(pod *corev1.Pod, req *gpu.PodRequest, pg *v1alpha1.PodGroup) error {
	if req.SubGroup == "" || len(pg.Spec.SubGroups) == 0 {
		return nil
	}
	names := make([]string, 0, len(pg.Spec.SubGroups))
	for _, sg := range pg.Spec.SubGroups {
		if sg.Name == req.SubGroup {
			return nil
		}
		names = append(names, sg.Name)
	}
	key := v1alpha1.LabelSubGroup
	if pod.Labels[key] == "" {
		key = v1alpha1.LabelKAISubGroup
	}
	return &DenialError{Reason: ReasonSubGroupConflict, Errs: field.ErrorList{field.Invalid(field.NewPath("metadata", "labels").Key(key), req.SubGroup, fmt.Sprintf(
		"is not a sub-group of the pod's PodGroup %s, whose spec.subGroups are %s; label the pod with one of them, or add %q to the PodGroup's spec.subGroups",
		pg.Name, strings.Join(names, ", "), req.SubGroup))}}
}

// withQueue is pod with the canonical queue label q, read again.
func withQueue(pod *corev1.Pod, prev *gpu.PodRequest, q string) (*corev1.Pod, *gpu.PodRequest, error) {
	out := pod.DeepCopy()
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	out.Labels[v1alpha1.LabelQueue] = q
	req, errs := reparse(out, prev)
	if len(errs) > 0 {
		return nil, nil, &DenialError{Reason: ReasonInvalidRequest, Errs: errs, Messages: []string{fmt.Sprintf("(after the queue %q was written)", q)}}
	}
	return out, req, nil
}

// noQueueMessage refuses a GPU pod that ends without a queue.
func noQueueMessage(ns string) string {
	return fmt.Sprintf("pod names no queue: set the label partita.dev/queue to a leaf queue, or give namespace %s a default with the label partita.dev/default-queue", ns)
}

// resolveQueue runs steps 2 to 4 and the policy on a GPU pod: it returns
// the pod with its queue label and the policy's defaults written, and its
// request read again.
func (a *PodAdmission) resolveQueue(ctx context.Context, ar *admissionv1.AdmissionRequest, pod *corev1.Pod, req *gpu.PodRequest) (*corev1.Pod, *gpu.PodRequest, error) {
	pod, req, err := a.joinPodGroup(ctx, pod, req, true)
	if err != nil {
		return nil, nil, err
	}
	pod, req, err = a.applyPolicy(ctx, ar, pod, req)
	if err != nil || req.Queue != "" {
		return pod, req, err
	}
	if a.defaultQueue == "" {
		// Required: the default policy says so itself, but a replaced
		// policy might not.
		return nil, nil, &DenialError{Reason: ReasonPolicy, Messages: []string{noQueueMessage(pod.Namespace)}}
	}
	withDefault, req, err := withQueue(pod, req, a.defaultQueue)
	if err != nil {
		return nil, nil, err
	}
	out, req, err := a.applyPolicy(ctx, ar, withDefault, req)
	if de, ok := asDenial(err); ok && de.Reason == ReasonPolicy {
		de.Messages = append(de.Messages, fmt.Sprintf(
			"(the pod names no queue and namespace %s has no default, so it went to the cluster's default queue %q (the webhook's --default-queue); name a queue with the label partita.dev/queue)",
			pod.Namespace, a.defaultQueue))
	}
	return out, req, err
}
