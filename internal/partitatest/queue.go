package partitatest

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// QueueWrapper builds a Queue.
type QueueWrapper struct{ v1alpha1.Queue }

// MakeQueue starts a top-level queue.
func MakeQueue(name string) *QueueWrapper {
	return &QueueWrapper{v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: name}}}
}

// Obj returns the queue.
func (w *QueueWrapper) Obj() *v1alpha1.Queue { return &w.Queue }

// Clone returns a deep copy of the wrapper.
func (w *QueueWrapper) Clone() *QueueWrapper {
	return &QueueWrapper{*w.Queue.DeepCopy()}
}

// Parent sets the parent queue.
func (w *QueueWrapper) Parent(p string) *QueueWrapper {
	w.Spec.Parent = p
	return w
}

// Priority sets the priority.
func (w *QueueWrapper) Priority(p int32) *QueueWrapper {
	w.Spec.Priority = &p
	return w
}

// Namespaces sets the namespaces that may submit.
func (w *QueueWrapper) Namespaces(ns ...string) *QueueWrapper {
	w.Spec.Namespaces = append(w.Spec.Namespaces, ns...)
	return w
}

// GPU sets the GPU quota, limit ("-1" for none) and over-quota weight.
func (w *QueueWrapper) GPU(quota, limit string, weight int32) *QueueWrapper {
	w.Spec.Resources.GPU = makeQuota(quota, limit, weight)
	return w
}

// CPU sets the CPU quota, limit ("-1" for none) and over-quota weight.
func (w *QueueWrapper) CPU(quota, limit string, weight int32) *QueueWrapper {
	w.Spec.Resources.CPU = makeQuota(quota, limit, weight)
	return w
}

// Memory sets the memory quota, limit ("-1" for none) and over-quota weight.
func (w *QueueWrapper) Memory(quota, limit string, weight int32) *QueueWrapper {
	w.Spec.Resources.Memory = makeQuota(quota, limit, weight)
	return w
}

func makeQuota(quota, limit string, weight int32) *v1alpha1.ResourceQuota {
	q, l := resource.MustParse(quota), resource.MustParse(limit)
	return &v1alpha1.ResourceQuota{Quota: &q, Limit: &l, OverQuotaWeight: &weight}
}

// PodGroupWrapper builds a PodGroup.
type PodGroupWrapper struct{ v1alpha1.PodGroup }

// MakePodGroup starts a PodGroup with minMember 1.
func MakePodGroup(name, namespace string) *PodGroupWrapper {
	return &PodGroupWrapper{v1alpha1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       v1alpha1.PodGroupSpec{MinMember: 1},
	}}
}

// Obj returns the PodGroup.
func (w *PodGroupWrapper) Obj() *v1alpha1.PodGroup { return &w.PodGroup }

// Clone returns a deep copy of the wrapper.
func (w *PodGroupWrapper) Clone() *PodGroupWrapper {
	return &PodGroupWrapper{*w.PodGroup.DeepCopy()}
}

// MinMember sets minMember.
func (w *PodGroupWrapper) MinMember(n int32) *PodGroupWrapper {
	w.Spec.MinMember = n
	return w
}

// Queue sets the queue.
func (w *PodGroupWrapper) Queue(q string) *PodGroupWrapper {
	w.Spec.Queue = q
	return w
}

// PriorityClassName sets the priority class.
func (w *PodGroupWrapper) PriorityClassName(name string) *PodGroupWrapper {
	w.Spec.PriorityClassName = name
	return w
}

// ScheduleTimeoutSeconds sets the schedule timeout.
func (w *PodGroupWrapper) ScheduleTimeoutSeconds(s int32) *PodGroupWrapper {
	w.Spec.ScheduleTimeoutSeconds = &s
	return w
}

// TopologyKey sets the topology preference.
func (w *PodGroupWrapper) TopologyKey(key string) *PodGroupWrapper {
	w.Spec.TopologyKey = key
	return w
}

// Admitted sets the status of a gang the admission loop admitted: phase
// Admitted with n members admitted.
func (w *PodGroupWrapper) Admitted(n int32) *PodGroupWrapper {
	w.Status.Phase, w.Status.Admitted = v1alpha1.PodGroupAdmitted, n
	return w
}

// Annotation sets an annotation on the PodGroup.
func (w *PodGroupWrapper) Annotation(key, value string) *PodGroupWrapper {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[key] = value
	return w
}

// SubGroup adds a sub-group with its required and preferred levels.
func (w *PodGroupWrapper) SubGroup(name string, minMember int32, required, preferred string) *PodGroupWrapper {
	w.Spec.SubGroups = append(w.Spec.SubGroups, v1alpha1.SubGroup{Name: name, MinMember: minMember, TopologyRequired: required, TopologyPreferred: preferred})
	return w
}
