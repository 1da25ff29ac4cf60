package partitatest

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// TopologyWrapper builds a Topology.
type TopologyWrapper struct{ v1alpha1.Topology }

// MakeTopology starts a Topology with the given levels (node labels),
// broadest first.
func MakeTopology(name string, levels ...string) *TopologyWrapper {
	w := &TopologyWrapper{v1alpha1.Topology{ObjectMeta: metav1.ObjectMeta{Name: name}}}
	return w.Level(levels...)
}

// Obj returns the Topology.
func (w *TopologyWrapper) Obj() *v1alpha1.Topology { return &w.Topology }

// Clone returns a deep copy of the wrapper.
func (w *TopologyWrapper) Clone() *TopologyWrapper {
	return &TopologyWrapper{*w.Topology.DeepCopy()}
}

// Level appends narrower levels.
func (w *TopologyWrapper) Level(labels ...string) *TopologyWrapper {
	for _, l := range labels {
		w.Spec.Levels = append(w.Spec.Levels, v1alpha1.TopologyLevel{NodeLabel: l})
	}
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
