package webhook

import (
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	sigsjson "sigs.k8s.io/json"
)

// decodeInto reads an object of the request; an object that does not
// decode is refused as malformed. An object decodePodReview has read
// already is copied into into when it is of its type.
func decodeInto(raw runtime.RawExtension, what string, into any) error {
	if len(raw.Raw) == 0 && raw.Object != nil {
		if b, ok := raw.Object.(*corev1.Binding); ok {
			if dst, ok := into.(*corev1.Binding); ok {
				*dst = *b
				return nil
			}
		}
	}
	if len(raw.Raw) == 0 {
		return &DenialError{Reason: ReasonMalformed, Err: fmt.Errorf("the request carries no %s", what)}
	}
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(raw.Raw, into); err != nil {
		return &DenialError{Reason: ReasonMalformed, Err: fmt.Errorf("decode %s: %w", what, err)}
	}
	return nil
}

// decodePod reads a pod; on CREATE the API server may leave its namespace
// empty, so the request's namespace fills it.
func decodePod(raw runtime.RawExtension, namespace, what string) (*corev1.Pod, error) {
	if p, ok := raw.Object.(*corev1.Pod); ok && len(raw.Raw) == 0 {
		// Read with the review (decodePodReview); each request reads each
		// of its objects once, so the pod is the caller's.
		if p.Namespace == "" {
			p.Namespace = namespace
		}
		return p, nil
	}
	pod := &corev1.Pod{}
	if err := decodeInto(raw, what, pod); err != nil {
		return nil, err
	}
	if pod.Namespace == "" {
		pod.Namespace = namespace
	}
	return pod, nil
}

// podReviewIn is an AdmissionReview of the pod webhooks, whose object and
// old object are read as pods (or a Binding, for pods/binding) in the same
// pass as the envelope: the generic envelope (AdmissionRequest's
// RawExtension) makes encoding/json scan the object twice and copy it, and
// the pod's own decode scan it twice more. The outer object fields
// shadow the embedded AdmissionRequest's.
type podReviewIn struct {
	APIVersion string      `json:"apiVersion"`
	Kind       string      `json:"kind"`
	Request    *podRequest `json:"request"`
}

type podRequest struct {
	admissionv1.AdmissionRequest
	Object    *podOrBinding `json:"object"`
	OldObject *podOrBinding `json:"oldObject"`
}

// podOrBinding holds a pod, or a Binding's metadata and target.
type podOrBinding struct {
	corev1.Pod
	Target *corev1.ObjectReference `json:"target,omitempty"`
}

// decodePodReview reads a review of the pod webhooks in one pass. A body it
// cannot read that way (an object that is not a pod, malformed, or with
// keys the types do not have) is read by decodeReview, so that errors and
// refusals are those of the generic path.
func decodePodReview(body []byte) (*admissionv1.AdmissionReview, error) {
	var in podReviewIn
	// A key this build does not know, or knows in another case (which
	// encoding/json would match), sends the body down the generic path.
	strict, err := sigsjson.UnmarshalStrict(body, &in, sigsjson.DisallowUnknownFields)
	if err != nil || len(strict) > 0 || in.Request == nil {
		return decodeReview(body)
	}
	if in.APIVersion != admissionv1.SchemeGroupVersion.String() || in.Kind != "AdmissionReview" {
		return decodeReview(body)
	}
	ar := &admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: in.APIVersion, Kind: in.Kind},
		Request:  &in.Request.AdmissionRequest,
	}
	isBinding := ar.Request.Kind.Group == "" && ar.Request.Kind.Kind == "Binding"
	set := func(o *podOrBinding) runtime.RawExtension {
		switch {
		case o == nil:
			return runtime.RawExtension{}
		case isBinding:
			return runtime.RawExtension{Object: &corev1.Binding{TypeMeta: o.TypeMeta, ObjectMeta: o.ObjectMeta, Target: ptrDeref(o.Target)}}
		}
		return runtime.RawExtension{Object: &o.Pod}
	}
	ar.Request.Object, ar.Request.OldObject = set(in.Request.Object), set(in.Request.OldObject)
	return ar, nil
}

func ptrDeref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
