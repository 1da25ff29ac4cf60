package locate

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
)

func TestHeld(t *testing.T) {
	model := func(name string, size int64, nodes ...v1alpha1.ModelNodeStatus) *v1alpha1.Model {
		return &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name}, Status: v1alpha1.ModelStatus{Size: size, Nodes: nodes}}
	}
	r := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(
		model("big", 300, v1alpha1.ModelNodeStatus{Name: "n1", Phase: v1alpha1.ModelReady}, v1alpha1.ModelNodeStatus{Name: "n2", Phase: v1alpha1.ModelFetching, Bytes: 150, Total: 300},
			v1alpha1.ModelNodeStatus{Name: "n3", Phase: v1alpha1.ModelFailed}, v1alpha1.ModelNodeStatus{Name: "n4", Phase: v1alpha1.ModelPending}),
		model("small", 100, v1alpha1.ModelNodeStatus{Name: "n2", Phase: v1alpha1.ModelReady}),
	).Build()
	l := New(r)
	cases := map[string]struct {
		models []string
		want   map[string]float64
	}{
		"one model":                  {models: []string{"big"}, want: map[string]float64{"n1": 1, "n2": 0.5}},
		"two, weighed by their size": {models: []string{"big", "small"}, want: map[string]float64{"n1": 0.75, "n2": 0.625}},
		"a model that is not there":  {models: []string{"gone"}, want: map[string]float64{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, l.Held(t.Context(), "team-a", tc.models)); diff != "" {
				t.Errorf("Held() (-want,+got):\n%s", diff)
			}
		})
	}
}
