package partitatest

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// MakeTopology is a Topology with the given levels (node labels), broadest
// first.
func MakeTopology(name string, levels ...string) *v1alpha1.Topology {
	t := &v1alpha1.Topology{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, l := range levels {
		t.Spec.Levels = append(t.Spec.Levels, v1alpha1.TopologyLevel{NodeLabel: l})
	}
	return t
}

// Annotation sets an annotation, such as a topology key.
func (w *PodGroupWrapper) Annotation(key, value string) *PodGroupWrapper {
	if w.Annotations == nil {
		w.Annotations = map[string]string{}
	}
	w.Annotations[key] = value
	return w
}

// Label sets a label.
func (w *PodGroupWrapper) Label(key, value string) *PodGroupWrapper {
	if w.Labels == nil {
		w.Labels = map[string]string{}
	}
	w.Labels[key] = value
	return w
}

// SubGroup adds a sub-group with its minimum and levels ("" for none).
func (w *PodGroupWrapper) SubGroup(name string, minMember int32, required, preferred string) *PodGroupWrapper {
	w.Spec.SubGroups = append(w.Spec.SubGroups, v1alpha1.SubGroup{
		Name: name, MinMember: minMember, TopologyRequired: required, TopologyPreferred: preferred,
	})
	return w
}
