package webhook

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/policy"
)

// applyDefaults writes the policy's patch into pod: each label and
// annotation the pod does not set yet. A default the pod could not carry
// (a bad key or value, a system annotation) is an error of the policy,
// reported with its path.
func applyDefaults(pod *corev1.Pod, p policy.Patch) (bool, field.ErrorList) {
	var errs field.ErrorList
	changed := false
	labelsPath := field.NewPath("metadata", "labels")
	for _, k := range sortedKeys(p.Labels) {
		v := p.Labels[k]
		if msgs := append(validation.IsQualifiedName(k), validation.IsValidLabelValue(v)...); len(msgs) > 0 {
			errs = append(errs, field.Invalid(labelsPath.Key(k), v, "the policy's default label is not valid: "+strings.Join(msgs, "; ")))
			continue
		}
		if _, ok := pod.Labels[k]; ok {
			continue
		}
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels[k] = v
		changed = true
	}
	for _, k := range sortedKeys(p.Annotations) {
		v := p.Annotations[k]
		if msgs := validation.IsQualifiedName(strings.ToLower(k)); len(msgs) > 0 {
			errs = append(errs, field.Invalid(annotationsPath().Key(k), v, "the policy's default annotation key is not valid: "+strings.Join(msgs, "; ")))
			continue
		}
		if v1alpha1.IsSystemAnnotation(k) {
			errs = append(errs, field.Forbidden(annotationsPath().Key(k), "the policy may not write a system annotation"))
			continue
		}
		if _, ok := pod.Annotations[k]; ok {
			continue
		}
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		pod.Annotations[k] = v
		changed = true
	}
	return changed, errs
}
