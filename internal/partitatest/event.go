package partitatest

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// EventWrapper builds a core/v1 Event.
type EventWrapper struct{ corev1.Event }

// MakeEvent starts a Normal event about the object kind/namespace/name with
// the given reason, reported by component (set both as the legacy
// source.component and as reportingController, the way the events.k8s.io
// recorder's events read back through core/v1).
func MakeEvent(name, namespace, kind, object, component, reason string) *EventWrapper {
	return &EventWrapper{corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: name, Namespace: namespace},
		InvolvedObject:      corev1.ObjectReference{Kind: kind, Namespace: namespace, Name: object},
		Reason:              reason,
		Type:                corev1.EventTypeNormal,
		Source:              corev1.EventSource{Component: component},
		ReportingController: component,
		Count:               1,
	}}
}

// Obj returns the event.
func (w *EventWrapper) Obj() *corev1.Event { return &w.Event }

// Message sets the message.
func (w *EventWrapper) Message(m string) *EventWrapper {
	w.Event.Message = m
	return w
}

// Warning makes it a Warning event.
func (w *EventWrapper) Warning() *EventWrapper {
	w.Type = corev1.EventTypeWarning
	return w
}

// At sets when the event was last seen (lastTimestamp).
func (w *EventWrapper) At(t time.Time) *EventWrapper {
	w.LastTimestamp = metav1.NewTime(t)
	if w.FirstTimestamp.IsZero() {
		w.FirstTimestamp = w.LastTimestamp
	}
	return w
}

// Count sets how many times the event happened.
func (w *EventWrapper) Count(n int32) *EventWrapper {
	w.Event.Count = n
	return w
}

// InvolvedUID sets the UID of the object the event is about.
func (w *EventWrapper) InvolvedUID(uid types.UID) *EventWrapper {
	w.InvolvedObject.UID = uid
	return w
}
