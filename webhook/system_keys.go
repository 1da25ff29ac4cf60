package webhook

import (
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/api/v1alpha1"
)

func annotationsPath() *field.Path { return field.NewPath("metadata", "annotations") }

// systemAnnotationErrors refuses every system annotation in annotations, as
// set by a user on a new object.
func systemAnnotationErrors(annotations map[string]string) field.ErrorList {
	var errs field.ErrorList
	for _, k := range sortedKeys(annotations) {
		if v1alpha1.IsSystemAnnotation(k) {
			errs = append(errs, field.Forbidden(annotationsPath().Key(k), systemAnnotationMessage(k)))
		}
	}
	return errs
}

// changedSystemAnnotations refuses an update that adds, changes or removes
// a system annotation.
func changedSystemAnnotations(old, updated map[string]string) field.ErrorList {
	var errs field.ErrorList
	keys := sortedKeys(updated)
	for _, k := range sortedKeys(old) {
		if _, ok := updated[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		if !v1alpha1.IsSystemAnnotation(k) {
			continue
		}
		ov, hadOld := old[k]
		nv, hasNew := updated[k]
		if hadOld == hasNew && ov == nv {
			continue
		}
		errs = append(errs, field.Forbidden(annotationsPath().Key(k), systemAnnotationChangedText))
	}
	return errs
}

// Messages about system annotations, shared with the CEL rules.
const (
	systemAnnotationBindText    = "is written only by Partita when it binds the pod: a pod cannot choose its own GPU or node; remove it"
	systemAnnotationLoopText    = "is written only by Partita's admission loop; remove it"
	systemAnnotationChangedText = "is written only by Partita: no one else may add, change or remove it; leave it as it was"
	bindingSystemText           = "only Partita's extender may bind a pod with device annotations"
	gateRemovedText             = "the scheduling gate " + v1alpha1.SchedulingGateAdmission + " is removed only by Partita's admission loop, when the pod's queue and gang admit it; see why it waits with `kubectl partita why`"
)

func systemAnnotationMessage(key string) string {
	switch {
	case strings.HasPrefix(key, v1alpha1.AnnotationDevicesPrefix),
		strings.HasPrefix(key, v1alpha1.AnnotationMemLimitPrefix),
		strings.HasPrefix(key, v1alpha1.AnnotationSMLimitPrefix),
		key == v1alpha1.AnnotationNode:
		return systemAnnotationBindText
	default:
		return systemAnnotationLoopText
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Identities are the users Partita trusts to write system annotations:
// its own components (the extender binds with device annotations, the
// admission loop marks pods admitted).
type Identities struct {
	// Users are user names (system:serviceaccount:partita-system:partita).
	Users []string
	// Groups are group names; a service account is in
	// system:serviceaccounts:<namespace>.
	Groups []string
}

// Trusts reports whether the requester is one of Partita's identities.
func (id Identities) Trusts(u authenticationv1.UserInfo) bool {
	if slices.Contains(id.Users, u.Username) {
		return true
	}
	for _, g := range u.Groups {
		if slices.Contains(id.Groups, g) {
			return true
		}
	}
	return false
}

// DefaultIdentities trusts every service account in Partita's namespace.
func DefaultIdentities(namespace string) Identities {
	return Identities{Groups: []string{"system:serviceaccounts:" + namespace}}
}
