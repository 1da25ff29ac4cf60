package prefetch

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// TestRequestAsksOnlyNodesWithoutTheModel: nodes that hold or fetch the
// model are left alone; each other node gets a Pending entry, and requests
// for different nodes keep each other.
func TestRequestAsksOnlyNodesWithoutTheModel(t *testing.T) {
	_, c := envtestutil.Start(t)
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "llama"},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "s3://models/llama"}}}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Model",
		"metadata": map[string]any{"name": "llama", "namespace": "team-a"},
		"status":   map[string]any{"nodes": []any{map[string]any{"name": "n1", "phase": "Ready"}}},
	}}
	//nolint:staticcheck // as n1's cache applies it
	if err := c.Status().Patch(ctx, u, client.Apply, client.FieldOwner("partita-model-cache/n1"), client.ForceOwnership); err != nil {
		t.Fatal(err)
	}
	r := &Requester{Reader: c, Client: c, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))}
	if err := r.Request(ctx, "team-a", []string{"llama", "gone"}, []string{"n1", "n2"}, "admitted team-a/serve"); err != nil {
		t.Fatalf("Request() = %v", err)
	}
	if err := r.Request(ctx, "team-a", []string{"llama"}, []string{"n3"}, "admitted team-a/other"); err != nil {
		t.Fatalf("Request() = %v", err)
	}
	got := &v1alpha1.Model{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
		t.Fatal(err)
	}
	type entry struct{ Name, Phase, Message string }
	var entries []entry
	for _, n := range got.Status.Nodes {
		entries = append(entries, entry{n.Name, string(n.Phase), n.Message})
	}
	want := []entry{
		{"n1", "Ready", ""},
		{"n2", "Pending", "prefetch requested: admitted team-a/serve"},
		{"n3", "Pending", "prefetch requested: admitted team-a/other"},
	}
	if diff := cmp.Diff(want, entries); diff != "" {
		t.Errorf("status.nodes (-want,+got):\n%s", diff)
	}
}
