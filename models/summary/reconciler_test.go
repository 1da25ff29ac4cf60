package summary

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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

// TestPrefetchWarmsTheCount: spec.prefetch asks as many selected, Ready
// nodes as the count lacks, by name, and not a node where it failed.
func TestPrefetchWarmsTheCount(t *testing.T) {
	_, c := envtestutil.Start(t)
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct {
		name  string
		gpu   bool
		ready bool
	}{{"n1", true, true}, {"n2", true, true}, {"n3", true, true}, {"n4", false, true}, {"n0", true, false}, {"nf", true, true}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{}}}
		if n.gpu {
			node.Labels["gpu"] = "true"
		}
		if err := c.Create(ctx, node); err != nil {
			t.Fatal(err)
		}
		st := corev1.ConditionFalse
		if n.ready {
			st = corev1.ConditionTrue
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}}
		if err := c.Status().Update(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "llama"},
		Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "s3://models/llama"},
			Prefetch: &v1alpha1.ModelPrefetch{Count: 3, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gpu": "true"}}}}}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.Status.Nodes = []v1alpha1.ModelNodeStatus{{Name: "n1", Phase: v1alpha1.ModelReady}, {Name: "nf", Phase: v1alpha1.ModelFailed}}
	if err := c.Status().Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	var asked []string
	r := &Reconciler{Client: c, Clock: clocktesting.NewFakePassiveClock(time.Now()),
		Prefetch: func(_ context.Context, ns string, models, nodes []string, why string) error {
			if ns != "team-a" || len(models) != 1 || models[0] != "llama" || why != "spec.prefetch" {
				t.Errorf("Prefetch(%s, %v, %v, %q)", ns, models, nodes, why)
			}
			asked = append(asked, nodes...)
			return nil
		}}
	res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(m)})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"n2", "n3"}, asked); diff != "" {
		t.Errorf("nodes asked (-want,+got):\n%s", diff)
	}
	if res.RequeueAfter != 0 {
		t.Errorf("RequeueAfter = %s, want none: the count is met", res.RequeueAfter)
	}
}
