package webhook

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	sigsjson "sigs.k8s.io/json"
)

// decodeInto reads an object of the request; an object that does not
// decode is refused as malformed.
func decodeInto(raw runtime.RawExtension, what string, into any) error {
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
	pod := &corev1.Pod{}
	if err := decodeInto(raw, what, pod); err != nil {
		return nil, err
	}
	if pod.Namespace == "" {
		pod.Namespace = namespace
	}
	return pod, nil
}
