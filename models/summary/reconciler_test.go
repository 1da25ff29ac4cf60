package summary

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// TestReconcileKeepsTheNodesEntries: the summary and the nodes' entries are
// written by different field managers, and neither removes the other's.
func TestReconcileKeepsTheNodesEntries(t *testing.T) {
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
	applyNode := func(phase v1alpha1.ModelPhase) {
		t.Helper()
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Model",
			"metadata": map[string]any{"name": "llama", "namespace": "team-a"},
			"status":   map[string]any{"nodes": []any{map[string]any{"name": "n1", "phase": string(phase)}}},
		}}
		//nolint:staticcheck // as the model cache applies it
		if err := c.Status().Patch(ctx, u, client.Apply, client.FieldOwner("partita-model-cache/n1"), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
	}
	r := &Reconciler{Client: c, Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))}
	check := func(want v1alpha1.ModelPhase, wantCond metav1.ConditionStatus) {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)}); err != nil {
			t.Fatal(err)
		}
		got := &v1alpha1.Model{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
			t.Fatal(err)
		}
		cond := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ModelConditionReady)
		if got.Status.Phase != want || cond == nil || cond.Status != wantCond || len(got.Status.Nodes) != 1 {
			t.Errorf("status = phase %q, Ready %+v, nodes %+v; want %s, %s, and n1's entry kept", got.Status.Phase, cond, got.Status.Nodes, want, wantCond)
		}
	}
	applyNode(v1alpha1.ModelFetching)
	check(v1alpha1.ModelFetching, metav1.ConditionFalse)
	applyNode(v1alpha1.ModelReady)
	check(v1alpha1.ModelReady, metav1.ConditionTrue)
}
