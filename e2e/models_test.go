package e2e

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models/safetensors"
)

// TestModelReplicasGoWhereTheirModelIs (issue 27) on kwok nodes. A gang
// whose pods ask for a model lands on the node that holds it (not the
// emptier ones packing alone would pick first; the holder's copy is written
// into the Model's status by hand, as its cache would); a gang of a model no
// node holds gets its model requested on the nodes it is admitted to, as it
// is admitted, and those nodes' caches (the dev cluster's fleet of
// simulated nodes' model caches) fetch it: Ready there and nowhere else;
// spec.prefetch warms the nodes it selects the same way.
func TestModelReplicasGoWhereTheirModelIs(t *testing.T) {
	if externalKubeconfig != "" {
		t.Skip("the simulated nodes' model caches read file:// models from the dev cluster's model-files directory")
	}
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

	// A gang of a model no node holds: it is requested where the gang goes,
	// and fetched there.
	fileModel := func(name string, prefetch *v1alpha1.ModelPrefetch) {
		t.Helper()
		dir := filepath.Join(cluster.ModelFilesDir(), ns+"-"+name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		ts, n, err := safetensors.Layout([]safetensors.Tensor{{Name: "w", DType: "F16", Shape: []uint64{1024, 64}}})
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := safetensors.WriteHeader(&b, nil, ts); err != nil {
			t.Fatal(err)
		}
		b.Write(bytes.Repeat([]byte{7}, int(n)))
		if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "file://" + dir}, Prefetch: prefetch}}
		if err := c.Create(ctx, m); err != nil {
			t.Fatalf("create Model %s: %v", name, err)
		}
	}
	fileModel("mistral", nil)
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
	readyOn := func(name string, want map[string]bool) func() (bool, string) {
		return func() (bool, string) {
			m := &v1alpha1.Model{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil {
				return false, err.Error()
			}
			got := map[string]bool{}
			for _, n := range m.Status.Nodes {
				got[n.Name] = n.Phase == v1alpha1.ModelReady && strings.HasPrefix(n.Message, "fetched ")
			}
			return maps.Equal(got, want), fmt.Sprintf("want Ready (fetched) on %v only; status.nodes %+v", want, m.Status.Nodes)
		}
	}
	poll(t, time.Minute, "mistral requested on the serve gang's nodes and fetched there", readyOn("mistral", want))

	// spec.prefetch: two of the test's nodes warm a third model ahead of
	// any pod (the first two by name).
	fileModel("gemma", &v1alpha1.ModelPrefetch{Count: 2, NodeSelector: &metav1.LabelSelector{MatchLabels: sel}})
	poll(t, time.Minute, "gemma warmed on two of the test's nodes", readyOn("gemma", map[string]bool{ns + "-model-0": true, ns + "-model-1": true}))
	checkClusterLedger(ctx, t)
}
