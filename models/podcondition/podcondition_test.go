package podcondition

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
)

func TestCondition(t *testing.T) {
	m := func(name string, nodes ...v1alpha1.ModelNodeStatus) v1alpha1.Model {
		return v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1alpha1.ModelStatus{Nodes: nodes}}
	}
	ready := v1alpha1.ModelNodeStatus{Name: "n1", Phase: v1alpha1.ModelReady}
	type want struct {
		Status          corev1.ConditionStatus
		Reason, Message string
	}
	cases := map[string]struct {
		models []v1alpha1.Model
		names  []string
		want   want
	}{
		"every model there": {models: []v1alpha1.Model{m("a", ready), m("b", ready)}, names: []string{"a", "b"},
			want: want{corev1.ConditionTrue, ReasonReady, "every model is on n1"}},
		"one still fetching": {models: []v1alpha1.Model{m("a", ready), m("b", v1alpha1.ModelNodeStatus{Name: "n1", Phase: v1alpha1.ModelFetching, Message: "waiting for model b on n1: 34%"})},
			names: []string{"a", "b"}, want: want{corev1.ConditionFalse, ReasonFetching, "waiting for model b on n1: 34%"}},
		"failed": {models: []v1alpha1.Model{m("a", v1alpha1.ModelNodeStatus{Name: "n1", Phase: v1alpha1.ModelFailed, Message: "403 Forbidden"})},
			names: []string{"a"}, want: want{corev1.ConditionFalse, ReasonFailed, "model a failed on n1: 403 Forbidden"}},
		"ready elsewhere only": {models: []v1alpha1.Model{m("a", v1alpha1.ModelNodeStatus{Name: "n2", Phase: v1alpha1.ModelReady})},
			names: []string{"a"}, want: want{corev1.ConditionFalse, ReasonFetching, "waiting for model a on n1: not fetched there yet"}},
		"gone": {names: []string{"a"}, want: want{corev1.ConditionFalse, ReasonMissing, "model a does not exist in the pod's namespace"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			st, reason, msg := Condition(tc.models, tc.names, "n1")
			if diff := cmp.Diff(tc.want, want{st, reason, msg}); diff != "" {
				t.Errorf("Condition() (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestReconcileWritesTheCondition against an API server.
func TestReconcileWritesTheCondition(t *testing.T) {
	_, c := envtestutil.Start(t)
	ctx := t.Context()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); err != nil {
		t.Fatal(err)
	}
	m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "llama"}, Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "s3://models/llama"}}}
	if err := c.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.Status.Nodes = []v1alpha1.ModelNodeStatus{{Name: "n1", Phase: v1alpha1.ModelFetching, Message: "waiting for model llama on n1: 34%"}}
	if err := c.Status().Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "serve", Annotations: map[string]string{v1alpha1.AnnotationModel: "llama"}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{Client: c, Clock: clocktesting.NewFakePassiveClock(time.Now())}
	check := func(wantStatus corev1.ConditionStatus, wantMsg string) {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(pod)}); err != nil {
			t.Fatal(err)
		}
		got := &corev1.Pod{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
			t.Fatal(err)
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == v1alpha1.PodConditionModelsReady {
				if cond.Status != wantStatus || cond.Message != wantMsg {
					t.Errorf("condition %s %q, want %s %q", cond.Status, cond.Message, wantStatus, wantMsg)
				}
				return
			}
		}
		t.Errorf("no %s condition: %+v", v1alpha1.PodConditionModelsReady, got.Status.Conditions)
	}
	check(corev1.ConditionFalse, "waiting for model llama on n1: 34%")
	m.Status.Nodes[0].Phase = v1alpha1.ModelReady
	if err := c.Status().Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	check(corev1.ConditionTrue, "every model is on n1")
}
