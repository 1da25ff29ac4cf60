package partitatest

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Priority sets spec.priority, as the API server resolves it from the
// pod's PriorityClass.
func (w *PodWrapper) Priority(p int32) *PodWrapper {
	w.Spec.Priority = &p
	return w
}

// Created sets the creation time.
func (w *PodWrapper) Created(t time.Time) *PodWrapper {
	w.CreationTimestamp = metav1.NewTime(t)
	return w
}

// Terminating sets a deletion time: the pod is being deleted.
func (w *PodWrapper) Terminating(t time.Time) *PodWrapper {
	mt := metav1.NewTime(t)
	w.DeletionTimestamp = &mt
	return w
}

// NodeSelector adds a node selector term.
func (w *PodWrapper) NodeSelector(key, value string) *PodWrapper {
	if w.Spec.NodeSelector == nil {
		w.Spec.NodeSelector = map[string]string{}
	}
	w.Spec.NodeSelector[key] = value
	return w
}

// RequiredNodeAffinity adds a term of required node affinity with one
// requirement (terms are ORed).
func (w *PodWrapper) RequiredNodeAffinity(req corev1.NodeSelectorRequirement) *PodWrapper {
	if w.Spec.Affinity == nil {
		w.Spec.Affinity = &corev1.Affinity{}
	}
	if w.Spec.Affinity.NodeAffinity == nil {
		w.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := w.Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	rs := na.RequiredDuringSchedulingIgnoredDuringExecution
	rs.NodeSelectorTerms = append(rs.NodeSelectorTerms, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{req}})
	return w
}

// Toleration adds a toleration of key=value for every effect.
func (w *PodWrapper) Toleration(key, value string) *PodWrapper {
	w.Spec.Tolerations = append(w.Spec.Tolerations, corev1.Toleration{Key: key, Operator: corev1.TolerationOpEqual, Value: value})
	return w
}

// OwnedBy sets a controller owner reference.
func (w *PodWrapper) OwnedBy(kind, name string) *PodWrapper {
	yes := true
	w.OwnerReferences = append(w.OwnerReferences, metav1.OwnerReference{APIVersion: "batch/v1", Kind: kind, Name: name, UID: types.UID("uid-" + name), Controller: &yes})
	return w
}

// NodeWrapper builds a Node.
type NodeWrapper struct{ corev1.Node }

// MakeNode starts a schedulable node with 64 CPUs, 512Gi of memory and room
// for 110 pods.
func MakeNode(name string) *NodeWrapper {
	return &NodeWrapper{corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("64"),
			corev1.ResourceMemory: resource.MustParse("512Gi"),
			corev1.ResourcePods:   resource.MustParse("110"),
		}},
	}}
}

// Obj returns the node.
func (w *NodeWrapper) Obj() *corev1.Node { return &w.Node }

// Label sets a label.
func (w *NodeWrapper) Label(key, value string) *NodeWrapper {
	w.Labels[key] = value
	return w
}

// Taint adds a NoSchedule taint.
func (w *NodeWrapper) Taint(key, value string) *NodeWrapper {
	w.Spec.Taints = append(w.Spec.Taints, corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffectNoSchedule})
	return w
}

// Unschedulable cordons the node.
func (w *NodeWrapper) Unschedulable() *NodeWrapper {
	w.Spec.Unschedulable = true
	return w
}

// Allocatable sets an allocatable amount.
func (w *NodeWrapper) Allocatable(name corev1.ResourceName, quantity string) *NodeWrapper {
	w.Status.Allocatable[name] = resource.MustParse(quantity)
	return w
}

// NoAllocatable removes an allocatable resource, as on a node whose
// kubelet (or kwok) has not reported it yet.
func (w *NodeWrapper) NoAllocatable(name corev1.ResourceName) *NodeWrapper {
	delete(w.Status.Allocatable, name)
	return w
}

// PinnedTo pins the ungated pod to node the way the admission loop pins a
// gang member: partita.dev/node and a required node affinity on
// metadata.name in every term.
func (w *PodWrapper) PinnedTo(node string) *PodWrapper {
	w.Annotation(v1alpha1.AnnotationNode, node)
	req := corev1.NodeSelectorRequirement{Key: metav1.ObjectNameField, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}
	if w.Spec.Affinity == nil {
		w.Spec.Affinity = &corev1.Affinity{}
	}
	if w.Spec.Affinity.NodeAffinity == nil {
		w.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := w.Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{}}}
	}
	terms := na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for i := range terms {
		terms[i].MatchFields = append(terms[i].MatchFields, req)
	}
	return w
}

// Unschedulable sets the PodScheduled condition kube-scheduler writes when
// no node takes the pod, with its message.
func (w *PodWrapper) Unschedulable(message string) *PodWrapper {
	w.Status.Conditions = append(w.Status.Conditions, corev1.PodCondition{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: message,
	})
	return w
}
