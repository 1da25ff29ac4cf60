package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// TestModelReplicasGoWhereTheirModelIs (issue 27) on kwok nodes, which run
// no model cache: a node's copy is written into the Model's status as its
// cache would. A gang whose pods ask for the model lands on the node that
// holds it (not the emptier ones packing alone would pick first); a gang of
// a model no node holds gets its model requested on the nodes it is
// admitted to, as it is admitted (the node caches start fetching then,
// before the pods bind).
func TestModelReplicasGoWhereTheirModelIs(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns, sel, pg := gangOnItsNodes(ctx, t, "model", 3, 4, 2)
	c := crClient(t)
	model := func(name string) *v1alpha1.Model {
		m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "https://models.example/" + name + "/model.safetensors"}}}
		if err := c.Create(ctx, m); err != nil {
			t.Fatalf("create Model %s: %v", name, err)
		}
		return m
	}
	model("llama")
	holder := ns + "-model-2"
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Model",
		"metadata": map[string]any{"name": "llama", "namespace": ns},
		"status": map[string]any{"size": int64(16 << 30), "nodes": []any{map[string]any{
			"name": holder, "phase": "Ready", "bytes": int64(16 << 30), "total": int64(16 << 30)}}},
	}}
	//nolint:staticcheck // as a node's model cache applies its entry
	if err := c.Status().Patch(ctx, u, client.Apply, client.FieldOwner("partita-model-cache/"+holder), client.ForceOwnership); err != nil {
		t.Fatalf("write the node's copy of llama: %v", err)
	}
	poll(t, 30*time.Second, "Model llama Ready (the extender's summary)", func() (bool, string) {
		m := &v1alpha1.Model{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "llama"}, m); err != nil {
			return false, err.Error()
		}
		return m.Status.Phase == v1alpha1.ModelReady, fmt.Sprintf("%+v", m.Status)
	})

	pods := gangPods(ns, "train", 2, sel)
	for _, p := range pods {
		p.Annotations[v1alpha1.AnnotationModel] = "llama"
	}
	createPods(ctx, t, clientset, pods, 2)
	waitBound(ctx, t, ns, "train-", 2)
	for _, p := range listNS(ctx, t, ns) {
		if strings.HasPrefix(p.Name, "train-") && p.Spec.NodeName != holder {
			t.Errorf("replica %s of llama ran on %s, want %s (which holds the model)", p.Name, p.Spec.NodeName, holder)
		}
	}

	// A gang of a model no node holds: it is requested where the gang goes.
	model("mistral")
	serve := pg.DeepCopy()
	serve.ObjectMeta = metav1.ObjectMeta{Name: "serve", Namespace: ns}
	if err := c.Create(ctx, serve); err != nil {
		t.Fatal(err)
	}
	pods = gangPods(ns, "serve", 2, sel)
	for _, p := range pods {
		p.Annotations[v1alpha1.AnnotationModel] = "mistral"
	}
	createPods(ctx, t, clientset, pods, 2)
	waitBound(ctx, t, ns, "serve-", 2)
	want := map[string]bool{}
	for _, p := range listNS(ctx, t, ns) {
		if strings.HasPrefix(p.Name, "serve-") {
			want[p.Spec.NodeName] = true
		}
	}
	poll(t, 30*time.Second, "mistral requested on the serve gang's nodes", func() (bool, string) {
		m := &v1alpha1.Model{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "mistral"}, m); err != nil {
			return false, err.Error()
		}
		got := 0
		for _, n := range m.Status.Nodes {
			if want[n.Name] && n.Phase == v1alpha1.ModelPending && strings.Contains(n.Message, "admitted "+ns+"/serve") {
				got++
			}
		}
		return got == len(want), fmt.Sprintf("want %v; status.nodes %+v", want, m.Status.Nodes)
	})

	// spec.prefetch: two of the test's nodes warm a third model ahead of
	// any pod (the first two by name).
	warm := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gemma"},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "https://models.example/gemma/model.safetensors"},
			Prefetch: &v1alpha1.ModelPrefetch{Count: 2, NodeSelector: &metav1.LabelSelector{MatchLabels: sel}}}}
	if err := c.Create(ctx, warm); err != nil {
		t.Fatalf("create Model gemma: %v", err)
	}
	poll(t, 30*time.Second, "gemma requested on two of the test's nodes", func() (bool, string) {
		m := &v1alpha1.Model{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(warm), m); err != nil {
			return false, err.Error()
		}
		var got []string
		for _, n := range m.Status.Nodes {
			if n.Phase == v1alpha1.ModelPending && strings.Contains(n.Message, "spec.prefetch") {
				got = append(got, n.Name)
			}
		}
		return strings.Join(got, ",") == ns+"-model-0,"+ns+"-model-1", fmt.Sprintf("status.nodes %+v", m.Status.Nodes)
	})
	checkClusterLedger(ctx, t)
}
