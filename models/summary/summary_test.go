package summary

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

func TestSummarize(t *testing.T) {
	node := func(name string, p v1alpha1.ModelPhase, msg string) v1alpha1.ModelNodeStatus {
		return v1alpha1.ModelNodeStatus{Name: name, Phase: p, Message: msg}
	}
	cases := map[string]struct {
		nodes []v1alpha1.ModelNodeStatus
		want  Summary
	}{
		"no node yet": {want: Summary{Phase: v1alpha1.ModelPending, Status: metav1.ConditionFalse, Reason: v1alpha1.ModelReasonNotFetched,
			Message: "no node holds it yet: a node fetches it when a pod that asks for it (partita.dev/model) starts there"}},
		"one node ready beats one failed": {
			nodes: []v1alpha1.ModelNodeStatus{node("b", v1alpha1.ModelFailed, "disk full"), node("a", v1alpha1.ModelReady, "")},
			want:  Summary{Phase: v1alpha1.ModelReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ModelReasonReady, Message: "held on 1 node(s): a"},
		},
		"fetching says how far": {
			nodes: []v1alpha1.ModelNodeStatus{node("n2", v1alpha1.ModelFetching, "waiting for model m on n2: 34%"), node("n1", v1alpha1.ModelFailed, "x")},
			want: Summary{Phase: v1alpha1.ModelFetching, Status: metav1.ConditionFalse, Reason: v1alpha1.ModelReasonFetching,
				Message: "fetching on n2: waiting for model m on n2: 34%"},
		},
		"every node failed": {
			nodes: []v1alpha1.ModelNodeStatus{node("n2", v1alpha1.ModelFailed, "403 Forbidden"), node("n1", v1alpha1.ModelFailed, "access denied")},
			want: Summary{Phase: v1alpha1.ModelFailed, Status: metav1.ConditionFalse, Reason: v1alpha1.ModelReasonFetchFailed,
				Message: "failed on n1, n2: access denied"},
		},
		"many nodes are named briefly": {
			nodes: []v1alpha1.ModelNodeStatus{node("a", v1alpha1.ModelReady, ""), node("b", v1alpha1.ModelReady, ""), node("c", v1alpha1.ModelReady, ""),
				node("d", v1alpha1.ModelReady, ""), node("e", v1alpha1.ModelReady, ""), node("f", v1alpha1.ModelReady, ""), node("g", v1alpha1.ModelReady, "")},
			want: Summary{Phase: v1alpha1.ModelReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ModelReasonReady, Message: "held on 7 node(s): a, b, c, d, e, and 2 more"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Summarize(tc.nodes)); diff != "" {
				t.Errorf("Summarize() (-want,+got):\n%s", diff)
			}
		})
	}
}
