package webhook

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// A PodGroup's topology request (its partita.dev/topology* annotations, or
// KAI's or Kueue's) and spec.subGroups are what the admission loop places
// the gang by. The webhook refuses what the loop could only report later,
// or would read one way while the user meant another:
//
//   - levels that are not label keys, a Topology name that is not a name,
//     and keys of two dialects that disagree (gpu.ParseTopology);
//   - sub-groups whose minMember add up to more than the gang's: they are
//     parts of it;
//   - when the named Topology exists: a level that is not one of its
//     levels, a preferred level broader than the required one (the members
//     already share one domain of the required level), and a sub-group
//     level broader than the gang's required level (the gang already holds
//     it there).
//
// A level without a Topology name is a plain node label, and a Topology
// that does not exist yet is allowed: the loop waits for it and says so.

// checkTopology checks pg's topology request and sub-groups and returns the
// request. Against the Topology it checks only a PodGroup that is new or
// changes its request or sub-groups (old is nil on CREATE): one whose
// Topology changed since it was created can still change otherwise.
func (a *PodGroupAdmission) checkTopology(ctx context.Context, pg, old *v1alpha1.PodGroup) (v1alpha1.TopologyRequest, error) {
	annotations := field.NewPath("metadata", "annotations")
	subGroups := field.NewPath("spec", "subGroups")
	topo, errs := gpu.ParseTopology(pg.Annotations, annotations)
	sum := int64(0)
	for i, sg := range pg.Spec.SubGroups {
		errs = append(errs, gpu.ValidateLevel(sg.TopologyRequired, subGroups.Index(i).Child("topologyRequired"))...)
		errs = append(errs, gpu.ValidateLevel(sg.TopologyPreferred, subGroups.Index(i).Child("topologyPreferred"))...)
		sum += int64(sg.MinMember)
	}
	if sum > int64(pg.Spec.MinMember) {
		errs = append(errs, field.Invalid(subGroups, sum, fmt.Sprintf(
			"the sub-groups' minMember add up to %d, more than the gang's spec.minMember %d: sub-groups are parts of the gang; lower theirs or raise spec.minMember to at least %d",
			sum, pg.Spec.MinMember, sum)))
	}
	if len(errs) > 0 {
		return v1alpha1.TopologyRequest{}, &DenialError{Reason: ReasonInvalidTopology, Errs: errs}
	}
	if topo.Topology == "" || (old != nil && !topologyChanged(old, pg)) {
		return topo, nil
	}
	t := &v1alpha1.Topology{}
	err := a.objects.Get(ctx, client.ObjectKey{Name: topo.Topology}, t)
	switch {
	case apierrors.IsNotFound(err), meta.IsNoMatchError(err):
		// Not created yet (the loop waits and says so), or no Topology
		// CRD on this API server (the levels' syntax was checked).
		return topo, nil
	case err != nil:
		return v1alpha1.TopologyRequest{}, fmt.Errorf("read Topology %s: %w", topo.Topology, err)
	}
	if errs := levelErrors(pg, topo, t); len(errs) > 0 {
		return v1alpha1.TopologyRequest{}, &DenialError{Reason: ReasonInvalidTopology, Errs: errs}
	}
	return topo, nil
}

// topologyChanged reports whether an update changes the PodGroup's
// topology request, in any dialect's key, or its sub-groups.
func topologyChanged(old, pg *v1alpha1.PodGroup) bool {
	for _, k := range gpu.TopologyAnnotations() {
		if old.Annotations[k] != pg.Annotations[k] {
			return true
		}
	}
	return !slices.Equal(old.Spec.SubGroups, pg.Spec.SubGroups)
}

// sameTopologyAnnotations reports whether old and pg carry the same
// topology keys, in every dialect.
func sameTopologyAnnotations(old, pg *v1alpha1.PodGroup) bool {
	pick := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for _, k := range gpu.TopologyAnnotations() {
			if v, ok := m[k]; ok {
				out[k] = v
			}
		}
		return out
	}
	return maps.Equal(pick(old.Annotations), pick(pg.Annotations))
}

// levelErrors checks the levels of pg's request topo and sub-groups against
// t, the Topology topo names.
func levelErrors(pg *v1alpha1.PodGroup, topo v1alpha1.TopologyRequest, t *v1alpha1.Topology) field.ErrorList {
	levels := make([]string, len(t.Spec.Levels))
	for i, l := range t.Spec.Levels {
		levels[i] = l.NodeLabel
	}
	inTopology := fmt.Sprintf("Topology %s (broadest first: %s)", t.Name, strings.Join(levels, ", "))
	annotations := field.NewPath("metadata", "annotations")
	reqPath := annotations.Key(firstSet(pg.Annotations, gpu.TopologyRequiredAnnotations()))
	prefPath := annotations.Key(firstSet(pg.Annotations, gpu.TopologyPreferredAnnotations()))

	var errs field.ErrorList
	// level checks that level (at path) is one of t's and no broader than
	// the level at index floor (the broadest it may be), whose name and
	// meaning why gives; it returns level's index, -1 when it is none.
	level := func(path *field.Path, level string, floor int, why string) int {
		if level == "" {
			return -1
		}
		i := t.LevelIndex(level)
		switch {
		case i < 0:
			errs = append(errs, field.Invalid(path, level, fmt.Sprintf("is not a level of %s; name one of them, or name no Topology to use any node label", inTopology)))
		case floor >= 0 && i < floor:
			errs = append(errs, field.Invalid(path, level, fmt.Sprintf("is broader than %s; name %s or a level after it in %s", why, levels[floor], inTopology)))
		}
		return i
	}
	gangRequired := level(reqPath, topo.Required, -1, "")
	level(prefPath, topo.Preferred, gangRequired, fmt.Sprintf("the required level %s, within one domain of which the members already run", topo.Required))
	subGroups := field.NewPath("spec", "subGroups")
	for i, sg := range pg.Spec.SubGroups {
		p := subGroups.Index(i)
		gang := fmt.Sprintf("the gang's required level %s, within one domain of which the whole gang already runs", topo.Required)
		r := level(p.Child("topologyRequired"), sg.TopologyRequired, gangRequired, gang)
		floor, why := gangRequired, gang
		if r >= 0 {
			floor, why = r, fmt.Sprintf("the sub-group's required level %s, within one domain of which its members already run", sg.TopologyRequired)
		}
		level(p.Child("topologyPreferred"), sg.TopologyPreferred, floor, why)
	}
	return errs
}

// firstSet is the first of keys set in m, the first key when none is.
func firstSet(m map[string]string, keys []string) string {
	for _, k := range keys {
		if m[k] != "" {
			return k
		}
	}
	return keys[0]
}
