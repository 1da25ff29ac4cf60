package partitatest

import (
	"encoding/json"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// CreateReview is the body of an AdmissionReview (v1) of user's CREATE of
// obj, a core object of kind (Pod, ConfigMap), as the API server sends it
// to a webhook: what tests forge to call the webhook directly.
func CreateReview(obj runtime.Object, kind, user string) ([]byte, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	meta, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", obj)
	}
	resource := map[string]string{"Pod": "pods", "ConfigMap": "configmaps"}[kind]
	if resource == "" {
		return nil, fmt.Errorf("CreateReview: kind %q is not Pod or ConfigMap", kind)
	}
	return json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "e2e-forged", Kind: metav1.GroupVersionKind{Version: "v1", Kind: kind},
			Resource:  metav1.GroupVersionResource{Version: "v1", Resource: resource},
			Operation: admissionv1.Create, Name: meta.GetName(), Namespace: meta.GetNamespace(),
			UserInfo: authenticationv1.UserInfo{Username: user, Groups: []string{"system:authenticated"}},
			Object:   runtime.RawExtension{Raw: raw},
		},
	})
}

// ReviewResponse decodes b as an AdmissionReview with a response; nil when
// it is none (a refusal before the review was read).
func ReviewResponse(b []byte) *admissionv1.AdmissionResponse {
	var ar admissionv1.AdmissionReview
	if json.Unmarshal(b, &ar) != nil {
		return nil
	}
	return ar.Response
}
