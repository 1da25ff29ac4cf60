package gpu

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// A workload's topology request (docs/guide/topology.md) in the dialects Partita
// reads: its own partita.dev/topology* keys first, then KAI's, then
// Kueue's, as v1alpha1.TopologyRequestOf takes them. The parsers below
// read the same keys in the same order and refuse what TopologyRequestOf
// would silently pick between: keys of two dialects that disagree.

// TopologyNameAnnotations, TopologyRequiredAnnotations and
// TopologyPreferredAnnotations are the keys of each part of a request, in
// the order TopologyRequestOf reads them.
func TopologyNameAnnotations() []string {
	return []string{v1alpha1.AnnotationTopology, v1alpha1.AnnotationKAITopology}
}

// TopologyRequiredAnnotations: see TopologyNameAnnotations.
func TopologyRequiredAnnotations() []string {
	return []string{v1alpha1.AnnotationTopologyRequired, v1alpha1.AnnotationKAITopologyRequired, v1alpha1.AnnotationKueueTopologyRequired}
}

// TopologyPreferredAnnotations: see TopologyNameAnnotations.
func TopologyPreferredAnnotations() []string {
	return []string{v1alpha1.AnnotationTopologyPreferred, v1alpha1.AnnotationKAITopologyPreferred, v1alpha1.AnnotationKueueTopologyPreferred}
}

// TopologyAnnotations are the annotations a topology request is read from,
// in every dialect, Partita's first.
func TopologyAnnotations() []string {
	out := append(TopologyNameAnnotations(), TopologyRequiredAnnotations()...)
	return append(out, TopologyPreferredAnnotations()...)
}

// SubGroupLabels are the labels a pod's sub-group is read from, Partita's
// first.
func SubGroupLabels() []string {
	return []string{v1alpha1.LabelSubGroup, v1alpha1.LabelKAISubGroup}
}

// levelDetail is what a level must be, for messages.
const levelDetail = "must be a node label key, such as topology.kubernetes.io/zone or kubernetes.io/hostname (a level of the named Topology, or any node label when it names none)"

// ParseTopology reads the topology request of an object's annotations
// (under base, its metadata.annotations) in any dialect, as
// v1alpha1.TopologyRequestOf does, and checks it: the Topology's name must
// be a DNS subdomain, the levels label keys (IsQualifiedName), and keys of
// different dialects that are both set must agree (the error names both).
// A zero request when none is set, and when there are errors.
func ParseTopology(annotations map[string]string, base *field.Path) (v1alpha1.TopologyRequest, field.ErrorList) {
	var errs field.ErrorList
	part := func(keys []string, what string, check func(string) []string, detail string) string {
		v, e := agree(originsIn(annotations, base, keys), what, check, detail)
		errs = append(errs, e...)
		return v
	}
	r := v1alpha1.TopologyRequest{
		Topology:  part(TopologyNameAnnotations(), "Topology", validation.IsDNS1123Subdomain, "must be the name of a Topology"),
		Required:  part(TopologyRequiredAnnotations(), "required level", validation.IsQualifiedName, levelDetail),
		Preferred: part(TopologyPreferredAnnotations(), "preferred level", validation.IsQualifiedName, levelDetail),
	}
	if len(errs) > 0 {
		return v1alpha1.TopologyRequest{}, errs
	}
	return r, nil
}

// ParseSubGroup reads the sub-group a pod's labels (under base, its
// metadata.labels) name, as v1alpha1.SubGroupOf does, and checks it: a
// label value, and the same in Partita's and KAI's key when both are set.
// Empty when none is set, and when there are errors.
func ParseSubGroup(labels map[string]string, base *field.Path) (string, field.ErrorList) {
	v, errs := agree(originsIn(labels, base, SubGroupLabels()), "sub-group", validation.IsValidLabelValue,
		"must be the name of a sub-group of the pod's PodGroup (spec.subGroups), a label value")
	if len(errs) > 0 {
		return "", errs
	}
	return v, nil
}

// PodTopology reads a pod's topology request and sub-group as ParsePod
// does, for a pod that asks for GPUs by other means (ResourceClaims).
func PodTopology(pod *corev1.Pod) (v1alpha1.TopologyRequest, string, field.ErrorList) {
	topo, errs := ParseTopology(pod.Annotations, annotationsPath())
	sub, subErrs := ParseSubGroup(pod.Labels, labelsPath())
	errs = append(errs, subErrs...)
	if len(errs) > 0 {
		return v1alpha1.TopologyRequest{}, "", errs
	}
	return topo, sub, nil
}

// TopologyCanonicalAnnotations are the canonical annotations of a topology
// request: Partita's keys of the parts that are set.
func TopologyCanonicalAnnotations(r v1alpha1.TopologyRequest) map[string]string {
	out := map[string]string{}
	for k, v := range map[string]string{
		v1alpha1.AnnotationTopology:          r.Topology,
		v1alpha1.AnnotationTopologyRequired:  r.Required,
		v1alpha1.AnnotationTopologyPreferred: r.Preferred,
	} {
		if v != "" {
			out[k] = v
		}
	}
	return out
}

// ValidateLevel checks a level written at path (a PodGroup's sub-group's
// topologyRequired, say) as ParseTopology checks the annotations': a label
// key. Empty is no level and passes.
func ValidateLevel(level string, path *field.Path) field.ErrorList {
	if level == "" {
		return nil
	}
	if msgs := validation.IsQualifiedName(level); len(msgs) > 0 {
		return field.ErrorList{field.Invalid(path, shorten(level), levelDetail+": "+strings.Join(msgs, "; "))}
	}
	return nil
}

// originsIn are the keys of m that are set (not empty), as sources.
func originsIn(m map[string]string, base *field.Path, keys []string) []origin {
	out := make([]origin, 0, len(keys))
	for _, k := range keys {
		if v := m[k]; v != "" {
			out = append(out, origin{path: base.Key(k), raw: v})
		}
	}
	return out
}

// agree returns the one value the set sources agree on. A value check
// refuses is an error (detail, then check's messages), and so is one that
// differs from the first valid value, naming both keys.
func agree(sources []origin, what string, check func(string) []string, detail string) (string, field.ErrorList) {
	var errs field.ErrorList
	var first origin
	for _, s := range sources {
		if !s.set() {
			continue
		}
		if msgs := check(s.raw); len(msgs) > 0 {
			errs = append(errs, field.Invalid(s.path, shorten(s.raw), detail+": "+strings.Join(msgs, "; ")))
			continue
		}
		if !first.set() {
			first = s
			continue
		}
		if s.raw != first.raw {
			errs = append(errs, field.Invalid(s.path, shorten(s.raw), fmt.Sprintf("names a different %s than %s; remove one of them or make them agree", what, first)))
		}
	}
	return first.raw, errs
}
