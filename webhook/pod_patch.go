package webhook

import (
	"maps"
	"reflect"
	"slices"
	"strconv"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// The webhook writes only these fields of a pod: metadata.annotations and
// labels, spec.preemptionPolicy, schedulerName, schedulingGates, volumes
// (the MPS volume) and resourceClaims (dra mode), and the env, volume
// mounts and resources (limits, requests, claims) of its containers, init containers and ephemeral containers. podPatch and ownedFieldsEqual look at these alone,
// which keeps an admission cheap; createPatch, the general diff, is their
// reference in the tests.

// podPatch is the JSON patch from before (the pod as the API server sent
// it, decoded) to after, for the fields the webhook owns. It needs no copy
// of the raw object: a map or list that before lacks (nil) was absent or
// null in the raw object, so it is added whole ("add" replaces a member
// that is there), and one before has is patched key by key, or by
// additions at its end. Fields this build does not know are never touched.
func podPatch(before, after *corev1.Pod) []jsonpatch.Operation {
	p := &patcher{ops: []jsonpatch.Operation{}}
	p.stringMap("/metadata/annotations", before.Annotations, after.Annotations)
	p.stringMap("/metadata/labels", before.Labels, after.Labels)
	lists := []struct {
		key           string
		before, after []corev1.Container
	}{
		{"containers", before.Spec.Containers, after.Spec.Containers},
		{"ephemeralContainers", ephemeralAsContainers(before), ephemeralAsContainers(after)},
		{"initContainers", before.Spec.InitContainers, after.Spec.InitContainers},
	}
	for _, l := range lists {
		for i := range min(len(l.before), len(l.after)) {
			p.container("/spec/"+l.key+"/"+strconv.Itoa(i), &l.before[i], &l.after[i])
		}
	}
	if !equality.Semantic.DeepEqual(before.Spec.PreemptionPolicy, after.Spec.PreemptionPolicy) {
		if after.Spec.PreemptionPolicy == nil {
			p.op("remove", "/spec/preemptionPolicy", nil)
		} else {
			p.op("add", "/spec/preemptionPolicy", *after.Spec.PreemptionPolicy)
		}
	}
	if before.Spec.SchedulerName != after.Spec.SchedulerName {
		// "add" replaces the member the API server's defaulting put there.
		p.op("add", "/spec/schedulerName", after.Spec.SchedulerName)
	}
	if !slices.Equal(before.Spec.SchedulingGates, after.Spec.SchedulingGates) {
		p.list("/spec/schedulingGates", before.Spec.SchedulingGates == nil, toAnySlice(before.Spec.SchedulingGates), toAnySlice(after.Spec.SchedulingGates))
	}
	if !equality.Semantic.DeepEqual(before.Spec.Volumes, after.Spec.Volumes) {
		p.list("/spec/volumes", before.Spec.Volumes == nil, toAnySlice(before.Spec.Volumes), toAnySlice(after.Spec.Volumes))
	}
	if !equality.Semantic.DeepEqual(before.Spec.ResourceClaims, after.Spec.ResourceClaims) {
		if after.Spec.ResourceClaims == nil {
			p.op("remove", "/spec/resourceClaims", nil)
		} else {
			p.list("/spec/resourceClaims", before.Spec.ResourceClaims == nil, toAnySlice(before.Spec.ResourceClaims), toAnySlice(after.Spec.ResourceClaims))
		}
	}
	return p.ops
}

// ownedFieldsEqual reports whether a and b agree on every field the
// webhook owns.
func ownedFieldsEqual(a, b *corev1.Pod) bool {
	if !maps.Equal(a.Annotations, b.Annotations) || !maps.Equal(a.Labels, b.Labels) ||
		!equality.Semantic.DeepEqual(a.Spec.PreemptionPolicy, b.Spec.PreemptionPolicy) ||
		a.Spec.SchedulerName != b.Spec.SchedulerName ||
		!slices.Equal(a.Spec.SchedulingGates, b.Spec.SchedulingGates) ||
		!equality.Semantic.DeepEqual(a.Spec.Volumes, b.Spec.Volumes) ||
		!equality.Semantic.DeepEqual(a.Spec.ResourceClaims, b.Spec.ResourceClaims) {
		return false
	}
	same := func(x, y []corev1.Container) bool {
		return slices.EqualFunc(x, y, func(c, d corev1.Container) bool {
			return equality.Semantic.DeepEqual(c.Env, d.Env) &&
				equality.Semantic.DeepEqual(c.VolumeMounts, d.VolumeMounts) &&
				equality.Semantic.DeepEqual(c.Resources.Limits, d.Resources.Limits) &&
				equality.Semantic.DeepEqual(c.Resources.Requests, d.Resources.Requests) &&
				equality.Semantic.DeepEqual(c.Resources.Claims, d.Resources.Claims)
		})
	}
	return same(a.Spec.Containers, b.Spec.Containers) && same(a.Spec.InitContainers, b.Spec.InitContainers) &&
		same(ephemeralAsContainers(a), ephemeralAsContainers(b))
}

func ephemeralAsContainers(p *corev1.Pod) []corev1.Container {
	if len(p.Spec.EphemeralContainers) == 0 {
		return nil
	}
	out := make([]corev1.Container, len(p.Spec.EphemeralContainers))
	for i, ec := range p.Spec.EphemeralContainers {
		out[i] = corev1.Container(ec.EphemeralContainerCommon)
	}
	return out
}

// patcher collects operations.
type patcher struct {
	ops []jsonpatch.Operation
}

func (p *patcher) op(op, path string, v any) {
	p.ops = append(p.ops, jsonpatch.NewOperation(op, path, v))
}

// stringMap patches a map of strings: whole when before has none, else
// key by key in sorted order.
func (p *patcher) stringMap(path string, before, after map[string]string) {
	if maps.Equal(before, after) {
		return
	}
	switch {
	case after == nil:
		p.op("remove", path, nil)
		return
	case before == nil:
		p.op("add", path, after)
		return
	}
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if bv, ok := before[k]; !ok || bv != after[k] {
			p.op("add", path+"/"+escapePointer(k), after[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if _, ok := after[k]; !ok {
			p.op("remove", path+"/"+escapePointer(k), nil)
		}
	}
}

// quantities is a resource list as JSON strings; nil stays nil.
func quantities(l corev1.ResourceList) map[string]string {
	if l == nil {
		return nil
	}
	out := make(map[string]string, len(l))
	for k, v := range l {
		out[string(k)] = v.String()
	}
	return out
}

// container patches one container's env and resources.
func (p *patcher) container(path string, before, after *corev1.Container) {
	if !equality.Semantic.DeepEqual(before.Env, after.Env) {
		p.list(path+"/env", before.Env == nil, toAnySlice(before.Env), toAnySlice(after.Env))
	}
	if !equality.Semantic.DeepEqual(before.VolumeMounts, after.VolumeMounts) {
		p.list(path+"/volumeMounts", before.VolumeMounts == nil, toAnySlice(before.VolumeMounts), toAnySlice(after.VolumeMounts))
	}
	lb, la := quantities(before.Resources.Limits), quantities(after.Resources.Limits)
	rb, ra := quantities(before.Resources.Requests), quantities(after.Resources.Requests)
	cb, ca := before.Resources.Claims, after.Resources.Claims
	sameClaims := equality.Semantic.DeepEqual(cb, ca)
	if maps.Equal(lb, la) && maps.Equal(rb, ra) && sameClaims {
		return
	}
	if lb == nil && rb == nil && cb == nil {
		// The raw object may lack resources altogether: add it whole.
		whole := map[string]any{}
		if la != nil {
			whole["limits"] = la
		}
		if ra != nil {
			whole["requests"] = ra
		}
		if ca != nil {
			whole["claims"] = ca
		}
		p.op("add", path+"/resources", whole)
		return
	}
	p.stringMap(path+"/resources/limits", lb, la)
	p.stringMap(path+"/resources/requests", rb, ra)
	if !sameClaims {
		if ca == nil {
			p.op("remove", path+"/resources/claims", nil)
		} else {
			p.list(path+"/resources/claims", cb == nil, toAnySlice(cb), toAnySlice(ca))
		}
	}
}

// list patches a list by additions at its end when after extends before,
// else by setting it whole.
func (p *patcher) list(path string, absent bool, before, after []any) {
	if !absent && len(after) >= len(before) && reflect.DeepEqual(before, after[:len(before)]) {
		for i := len(before); i < len(after); i++ {
			p.op("add", path+"/"+strconv.Itoa(i), after[i])
		}
		return
	}
	p.op("add", path, after)
}

func toAnySlice[T any](s []T) []any {
	if s == nil {
		return nil
	}
	out := make([]any, len(s))
	for i := range s {
		out[i] = s[i]
	}
	return out
}
