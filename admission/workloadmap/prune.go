package workloadmap

import (
	"hash/fnv"
	"io"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/policy"
)

// What the workload map keeps of an owner, and why (docs/workloads.md,
// "What the extender keeps"): a kind the rules read the spec of (JobSet,
// RayCluster, ...) is watched with a dynamic informer whose transform keeps
// only the metadata the map needs and the spec with every pod template cut
// down to its labels, annotations, its containers' names and resources, and
// a computed "gpu" (whether its pods ask for GPUs, read by the same parser
// the webhook uses). Pod templates are most of such an object (a JobSet's
// replicated Jobs each carry one, often with long command lines and env);
// what remains is a few hundred bytes. A kind that is only a link in a
// chain (StatefulSet) is watched metadata-only. Status is never kept: it
// changes all the time and the rules do not need it.

// pruneTransform is the informer transform of the kinds whose spec the
// rules read.
func pruneTransform(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	out := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": u.GetAPIVersion(),
		"kind":       u.GetKind(),
	}}
	out.SetNamespace(u.GetNamespace())
	out.SetName(u.GetName())
	out.SetUID(u.GetUID())
	out.SetResourceVersion(u.GetResourceVersion())
	out.SetLabels(u.GetLabels())
	out.SetAnnotations(policyAnnotations(u.GetAnnotations()))
	out.SetOwnerReferences(u.GetOwnerReferences())
	if spec, ok := u.Object["spec"].(map[string]any); ok {
		out.Object["spec"] = pruneTemplates(spec)
	}
	return out, nil
}

// metadataTransform keeps what the map reads of a link kind.
func metadataTransform(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta}
	out.Namespace, out.Name, out.UID, out.ResourceVersion = m.Namespace, m.Name, m.UID, m.ResourceVersion
	out.Labels, out.Annotations, out.OwnerReferences = m.Labels, policyAnnotations(m.Annotations), m.OwnerReferences
	return out, nil
}

// policyAnnotations drops what the rules never need and would pay for:
// kubectl's last-applied configuration and long values, as the admission
// policy's input does, and the annotations Partita itself writes on a pod
// as it admits and binds it (v1alpha1.IsSystemAnnotation), which say
// where the pod went, not what workload it belongs to. Left in, each of
// those writes asked the rules again about a pod whose answer could not
// have changed.
func policyAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		if !policyAnnotation(k, v) {
			continue
		}
		if out == nil {
			out = make(map[string]string, len(in))
		}
		out[k] = v
	}
	return out
}

// policyAnnotation reports whether an annotation is in the rules' input.
func policyAnnotation(k, v string) bool {
	return k != corev1.LastAppliedConfigAnnotation && len(v) <= policy.MaxAnnotationValueLen && !v1alpha1.IsSystemAnnotation(k)
}

// pruneTemplates returns v with every pod template (an object whose spec
// has containers) cut down for the rules; v is not changed.
func pruneTemplates(v map[string]any) map[string]any {
	out := make(map[string]any, len(v))
	for k, x := range v {
		out[k] = pruneValue(x)
	}
	return out
}

func pruneValue(x any) any {
	switch t := x.(type) {
	case map[string]any:
		if spec, ok := t["spec"].(map[string]any); ok {
			if _, ok := spec["containers"].([]any); ok {
				return pruneTemplate(t)
			}
		}
		return pruneTemplates(t)
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = pruneValue(e)
		}
		return out
	}
	return x
}

// pruneTemplate is what the rules see of one pod template.
func pruneTemplate(t map[string]any) map[string]any {
	meta := map[string]any{}
	if m, ok := t["metadata"].(map[string]any); ok {
		for _, k := range []string{"labels", "annotations"} {
			if v, ok := m[k]; ok {
				meta[k] = v
			}
		}
	}
	spec, _ := t["spec"].(map[string]any)
	out := map[string]any{"metadata": meta, "spec": map[string]any{
		"containers":     pruneContainers(spec["containers"]),
		"initContainers": pruneContainers(spec["initContainers"]),
	}, "gpu": templateAsksGPU(t)}
	return out
}

func pruneContainers(v any) []any {
	cs, _ := v.([]any)
	out := make([]any, 0, len(cs))
	for _, c := range cs {
		m, ok := c.(map[string]any)
		if !ok {
			continue
		}
		pc := map[string]any{"name": m["name"]}
		if r, ok := m["resources"]; ok {
			pc["resources"] = r
		}
		out = append(out, pc)
	}
	return out
}

// templateAsksGPU reports whether pods made from the template ask for GPUs
// in any dialect the webhook reads.
func templateAsksGPU(t map[string]any) bool {
	var pts corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(t, &pts); err != nil {
		return false
	}
	req, _ := gpu.ParsePod(&corev1.Pod{ObjectMeta: pts.ObjectMeta, Spec: pts.Spec})
	return req != nil
}

// policyMap is what the rules see of an object: apiVersion, kind,
// namespace, name, uid, labels, annotations and (spec kinds) the pruned
// spec.
func policyMap(apiVersion, kind string, m metav1.Object, spec map[string]any) map[string]any {
	out := map[string]any{
		"apiVersion": apiVersion, "kind": kind,
		"namespace": m.GetNamespace(), "name": m.GetName(), "uid": string(m.GetUID()),
		"labels": stringsAny(m.GetLabels()), "annotations": stringsAny(m.GetAnnotations()),
	}
	if spec != nil {
		out["spec"] = spec
	}
	return out
}

func stringsAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// podFingerprint hashes what the workload map reads of a pod: labels,
// annotations, controller and scheduling group. A pod whose fingerprint
// did not change keeps its answer.
func podFingerprint(p *corev1.Pod) uint64 {
	h := fnv.New64a()
	writeMap(h, p.Labels, nil)
	// What the rules see of the annotations, so that Partita's own writes
	// (the admission's, the bind's) do not count as a change.
	writeMap(h, p.Annotations, policyAnnotation)
	if c := metav1.GetControllerOfNoCopy(p); c != nil {
		_, _ = io.WriteString(h, string(c.UID)+"\x00"+c.Kind+"\x00"+c.APIVersion+"\x00"+c.Name)
	}
	if sg := p.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil {
		_, _ = io.WriteString(h, "\x01"+*sg.PodGroupName)
	}
	return h.Sum64()
}

// writeMap writes m's entries (those keep accepts, all when nil) in key
// order.
func writeMap(w io.Writer, m map[string]string, keep func(k, v string) bool) {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if keep == nil || keep(k, v) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		_, _ = io.WriteString(w, k+"\x00"+m[k]+"\x00")
	}
	_, _ = io.WriteString(w, "\x02")
}
