package webhook

import (
	"context"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/policy"
)

// PolicyChecker compiles the policy a ConfigMap would put in force
// (policy.ConfigMapLoader).
type PolicyChecker interface {
	CheckConfigMap(ctx context.Context, cm *corev1.ConfigMap) error
}

// PolicyAdmission refuses policy ConfigMaps that do not compile, so that
// `kubectl apply` of a broken policy fails with the compiler's message. The
// loader refuses them too (keeping the last good policy) in case this
// webhook was bypassed; its configuration fails open so that Partita's own
// namespace is never blocked.
type PolicyAdmission struct {
	checker   PolicyChecker
	namespace string
}

// NewPolicyAdmission checks policy ConfigMaps in namespace, Partita's.
func NewPolicyAdmission(checker PolicyChecker, namespace string) *PolicyAdmission {
	return &PolicyAdmission{checker: checker, namespace: namespace}
}

// Validate answers the policy ConfigMap webhook.
func (p *PolicyAdmission) Validate(ctx context.Context, ar *admissionv1.AdmissionRequest) Result {
	if ar.Kind.Group != "" || ar.Kind.Kind != "ConfigMap" || ar.Namespace != p.namespace ||
		(ar.Operation != admissionv1.Create && ar.Operation != admissionv1.Update) {
		return Result{}
	}
	cm := &corev1.ConfigMap{}
	if err := decodeInto(ar.Object, "ConfigMap", cm); err != nil {
		return Result{Err: err}
	}
	cm.Namespace = ar.Namespace
	if err := p.checker.CheckConfigMap(ctx, cm); err != nil {
		if policy.IsCompile(err) {
			return Result{Err: &DenialError{Reason: ReasonInvalidPolicy, Err: err,
				Messages: []string{"the policy in force stays; fix the Rego (check it with `partita policy test DIR`) and apply again"}}}
		}
		return Result{Err: err}
	}
	return Result{}
}
