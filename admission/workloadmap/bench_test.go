package workloadmap

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	. "github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/policy"
)

// benchMap is a map that knows one JobSet and its Job, as its informers
// would have delivered them, and n pods of the Job.
func benchMap(b *testing.B, n int) (*Mapper, []*corev1.Pod) {
	b.Helper()
	engine, err := policy.NewEngine(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	m := New(engine, noPods)
	m.discovered = true
	jsWatch := &watch{gk: schema.GroupKind{Group: "jobset.x-k8s.io", Kind: "JobSet"}, spec: true, reg: synced{}}
	jobWatch := &watch{gk: schema.GroupKind{Group: "batch", Kind: "Job"}, spec: true, reg: synced{}}
	m.watched[jsWatch.gk], m.watched[jobWatch.gk] = jsWatch, jobWatch
	js := jobSet("ns", "llama-ft", 16, 8)
	js.SetUID("uid-js")
	pruned, _ := pruneTransform(js)
	key, node := m.nodeOf(jsWatch, "jobset.x-k8s.io/v1alpha2", pruned)
	m.objects[key] = node
	job := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "batch/v1", "kind": "Job",
		"metadata": map[string]any{"namespace": "ns", "name": "llama-ft-workers-0", "uid": "uid-job", "ownerReferences": []any{map[string]any{
			"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "llama-ft", "uid": "uid-js", "controller": true,
		}}},
		"spec": map[string]any{"parallelism": int64(8), "completionMode": "Indexed", "template": gpuTemplate()},
	}}
	pruned, _ = pruneTransform(job)
	key, node = m.nodeOf(jobWatch, "batch/v1", pruned)
	m.objects[key] = node
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		p := MakePod(fmt.Sprintf("llama-ft-workers-0-%d", i), "ns").GPUCount(1).Label("jobset.sigs.k8s.io/jobset-name", "llama-ft").Obj()
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "llama-ft-workers-0", UID: "uid-job", Controller: ptr.To(true)}}
		pods[i] = p
	}
	if got := m.Map(pods[0]); got.Gang != "jobset-llama-ft" || got.MinMember != 128 {
		b.Fatalf("map: %+v", got)
	}
	m.Forget(pods[0].UID)
	return m, pods
}

// synced is an informer registration that has synced.
type synced struct {
	toolscache.ResourceEventHandlerRegistration
}

func (synced) HasSynced() bool { return true }

// BenchmarkMapFirst is the cost of a pod's first answer: its chain
// resolved and the policy asked.
func BenchmarkMapFirst(b *testing.B) {
	m, pods := benchMap(b, 1)
	p := pods[0]
	for b.Loop() {
		m.Forget(p.UID)
		m.Map(p)
	}
}

// BenchmarkMapAgain is the cost of a pod event whose pod and owners did
// not change (status updates): the remembered answer.
func BenchmarkMapAgain(b *testing.B) {
	m, pods := benchMap(b, 1)
	p := pods[0]
	m.Map(p)
	for b.Loop() {
		m.Map(p)
	}
}
