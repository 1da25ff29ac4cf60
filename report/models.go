package report

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// ModelReport is one Model as people are shown it: where it is held or
// fetched, and the pods that ask for it.
type ModelReport struct {
	Namespace string              `json:"namespace"`
	Name      string              `json:"name"`
	Source    string              `json:"source"`
	Phase     v1alpha1.ModelPhase `json:"phase"`
	// Size in bytes, as a node verified it (0 until one did).
	Size int64 `json:"size"`
	// Message is the Ready condition's.
	Message string                     `json:"message,omitempty"`
	Nodes   []v1alpha1.ModelNodeStatus `json:"nodes"`
	// Pods that ask for it (partita.dev/model), by phase.
	Pods map[corev1.PodPhase][]string `json:"pods"`
}

// ModelsReport is a set of Models.
type ModelsReport struct {
	Models []ModelReport `json:"models"`
}

// Models reports models with the pods (of the same namespaces) that ask
// for them, sorted by namespace and name.
func Models(models []v1alpha1.Model, pods []corev1.Pod) ModelsReport {
	users := map[string]map[corev1.PodPhase][]string{}
	for _, p := range pods {
		for _, m := range v1alpha1.ModelNamesOf(p.Annotations) {
			k := p.Namespace + "/" + m
			if users[k] == nil {
				users[k] = map[corev1.PodPhase][]string{}
			}
			users[k][p.Status.Phase] = append(users[k][p.Status.Phase], p.Name)
		}
	}
	out := ModelsReport{Models: make([]ModelReport, 0, len(models))}
	for _, m := range models {
		r := ModelReport{Namespace: m.Namespace, Name: m.Name, Source: m.Spec.Source.URI, Phase: m.Status.Phase, Size: m.Status.Size,
			Nodes: slices.Clone(m.Status.Nodes), Pods: users[m.Namespace+"/"+m.Name]}
		for _, c := range m.Status.Conditions {
			if c.Type == v1alpha1.ModelConditionReady {
				r.Message = c.Message
			}
		}
		if r.Phase == "" {
			r.Phase = v1alpha1.ModelPending
		}
		if r.Nodes == nil {
			r.Nodes = []v1alpha1.ModelNodeStatus{}
		}
		for _, ps := range r.Pods {
			slices.Sort(ps)
		}
		slices.SortFunc(r.Nodes, func(a, b v1alpha1.ModelNodeStatus) int { return strings.Compare(a.Name, b.Name) })
		out.Models = append(out.Models, r)
	}
	slices.SortFunc(out.Models, func(a, b ModelReport) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}
