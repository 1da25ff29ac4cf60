package webhook

import (
	"errors"
	"net/http"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// DenialReason says why a request was refused; it labels
// partita_webhook_denials_total, so the set is closed.
type DenialReason string

// Denial reasons.
const (
	// ReasonInvalidRequest: the GPU request does not parse (gpu.ParsePod).
	ReasonInvalidRequest DenialReason = "InvalidRequest"
	// ReasonSystemKey: the request sets a system annotation or device env
	// that only Partita may write.
	ReasonSystemKey DenialReason = "SystemKey"
	// ReasonDeviceAccess: the pod reaches GPUs around Partita: a privileged
	// container in a GPU pod, a hostPath into the devices or the MPS pipes,
	// a mount where the NVIDIA runtime reads device requests, a CDI
	// annotation.
	ReasonDeviceAccess DenialReason = "DeviceAccess"
	// ReasonPolicy: the Rego policy denied the pod.
	ReasonPolicy DenialReason = "Policy"
	// ReasonPolicyError: the policy failed to decide; the pod is refused
	// (fail closed).
	ReasonPolicyError DenialReason = "PolicyError"
	// ReasonImmutable: an update changes a pod's GPU request, queue, gang,
	// placement, topology request or sub-group.
	ReasonImmutable DenialReason = "Immutable"
	// ReasonNotCanonical: a pod reached validation without Partita's
	// mutation.
	ReasonNotCanonical DenialReason = "NotCanonical"
	// ReasonInvalidPolicy: a policy ConfigMap does not compile.
	ReasonInvalidPolicy DenialReason = "InvalidPolicy"
	// ReasonMalformed: the object in the request does not decode.
	ReasonMalformed DenialReason = "Malformed"
	// ReasonNotFound: the object names one that does not exist (a
	// PodGroup's PriorityClass).
	ReasonNotFound DenialReason = "NotFound"
	// ReasonQueueConflict: a pod names one queue and its PodGroup another.
	ReasonQueueConflict DenialReason = "QueueConflict"
	// ReasonSubGroupConflict: a pod names a sub-group its PodGroup does not
	// have.
	ReasonSubGroupConflict DenialReason = "SubGroupConflict"
	// ReasonInvalidTopology: a PodGroup's topology request or sub-groups
	// are malformed, or do not fit its Topology's levels.
	ReasonInvalidTopology DenialReason = "InvalidTopology"
)

// DenialError is a refused admission request. Its message is what the user
// reads: what is wrong, where, and how to fix it.
type DenialError struct {
	// Reason classifies the refusal.
	Reason DenialReason
	// Errs are field errors with their paths
	// (metadata.annotations[partita.dev/gpu-memory]).
	Errs field.ErrorList
	// Messages are free-form reasons (the policy's deny messages).
	Messages []string
	// Err is an underlying error, when there is one.
	Err error
}

// Error joins the field errors, the underlying error and the messages
// with "; ".
func (e *DenialError) Error() string {
	parts := make([]string, 0, len(e.Errs)+len(e.Messages)+1)
	for _, fe := range e.Errs {
		parts = append(parts, fe.Error())
	}
	if e.Err != nil {
		parts = append(parts, e.Err.Error())
	}
	parts = append(parts, e.Messages...)
	msg := strings.Join(parts, "; ")
	switch e.Reason {
	case ReasonPolicy:
		return "refused by policy: " + msg
	case ReasonPolicyError:
		return "the GPU policy could not decide, so the pod is refused; check the webhook's log and the policy ConfigMaps: " + msg
	}
	return msg
}

// Unwrap returns the underlying error.
func (e *DenialError) Unwrap() error { return e.Err }

// IsDenial reports whether err is, or wraps, a *DenialError.
func IsDenial(err error) bool {
	_, ok := asDenial(err)
	return ok
}

func asDenial(err error) (*DenialError, bool) {
	var de *DenialError
	ok := errors.As(err, &de)
	return de, ok
}

// status is the denial as the API server reports it.
func (e *DenialError) status() *metav1.Status {
	st := &metav1.Status{Status: metav1.StatusFailure, Message: e.Error()}
	switch e.Reason {
	case ReasonInvalidRequest, ReasonMalformed, ReasonInvalidPolicy, ReasonNotFound, ReasonInvalidTopology:
		st.Code, st.Reason = http.StatusUnprocessableEntity, metav1.StatusReasonInvalid
	case ReasonPolicyError:
		st.Code, st.Reason = http.StatusInternalServerError, metav1.StatusReasonInternalError
	default:
		st.Code, st.Reason = http.StatusForbidden, metav1.StatusReasonForbidden
	}
	if len(e.Errs) > 0 {
		st.Details = &metav1.StatusDetails{}
		for _, fe := range e.Errs {
			st.Details.Causes = append(st.Details.Causes, metav1.StatusCause{
				Type:    metav1.CauseType(fe.Type),
				Message: fe.ErrorBody(),
				Field:   fe.Field,
			})
		}
	}
	return st
}
