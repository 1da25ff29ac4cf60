package policy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/partitatest"
)

func TestBuildState(t *testing.T) {
	selected := partitatest.MakeQueue("shared").GPU("2", "-1", 1).Obj()
	selected.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}}
	used := partitatest.MakeQueue("team-a").Parent("org").Namespaces("team-a").Priority(200).GPU("4", "8", 1).Obj()
	used.Status.Allocated = corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("2.5")}
	used.Status.Requested = corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("6")}
	used.Status.PendingWorkloads = 3
	badSelector := partitatest.MakeQueue("broken").Obj()
	badSelector.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Nope"}}}

	cases := map[string]struct {
		queues     []v1alpha1.Queue
		namespaces []NamespaceInfo
		want       State
		wantErr    bool
	}{
		"empty": {
			want: State{Queues: map[string]QueueState{}, Namespaces: map[string]NamespaceState{}},
		},
		"tree with usage and a selector": {
			queues: []v1alpha1.Queue{
				*partitatest.MakeQueue("org").GPU("-1", "-1", 1).Obj(),
				*used,
				*selected,
				*partitatest.MakeQueue("orphan").Parent("gone").Obj(),
			},
			namespaces: []NamespaceInfo{
				{Name: "team-a", Labels: map[string]string{v1alpha1.LabelDefaultQueue: "team-a"}},
				{Name: "ml", Labels: map[string]string{"team": "ml"}},
				{Name: "bare"},
			},
			want: State{
				Queues: map[string]QueueState{
					"org": {Children: []string{"team-a"}, Ancestors: []string{}, Namespaces: []string{}, Priority: 100,
						GPU: ResourceState{QuotaMilli: -1, LimitMilli: -1, EffectiveLimitMilli: -1}},
					"team-a": {Parent: "org", Children: []string{}, Ancestors: []string{"org"}, Namespaces: []string{"team-a"}, Priority: 200,
						GPU: ResourceState{QuotaMilli: 4000, LimitMilli: 8000, AllocatedMilli: 2500, RequestedMilli: 6000, EffectiveLimitMilli: 8000}, PendingWorkloads: 3},
					"shared": {Children: []string{}, Ancestors: []string{}, Namespaces: []string{}, NamespaceSelector: true, Priority: 100,
						GPU: ResourceState{QuotaMilli: 2000, LimitMilli: -1, EffectiveLimitMilli: -1}},
					"orphan": {Parent: "gone", Children: []string{}, Ancestors: []string{}, Namespaces: []string{}, Priority: 100,
						GPU: ResourceState{LimitMilli: -1, EffectiveLimitMilli: -1}},
				},
				Namespaces: map[string]NamespaceState{
					"team-a": {Labels: map[string]string{v1alpha1.LabelDefaultQueue: "team-a"}, Queues: []string{}},
					"ml":     {Labels: map[string]string{"team": "ml"}, Queues: []string{"shared"}},
					"bare":   {Labels: map[string]string{}, Queues: []string{}},
				},
			},
		},
		"a cycle ends the walk up": {
			queues: []v1alpha1.Queue{
				*partitatest.MakeQueue("a").Parent("b").Obj(),
				*partitatest.MakeQueue("b").Parent("a").Obj(),
			},
			want: State{
				Queues: map[string]QueueState{
					"a": {Parent: "b", Children: []string{"b"}, Ancestors: []string{"b"}, Namespaces: []string{}, Priority: 100, GPU: ResourceState{LimitMilli: -1, EffectiveLimitMilli: -1}},
					"b": {Parent: "a", Children: []string{"a"}, Ancestors: []string{"a"}, Namespaces: []string{}, Priority: 100, GPU: ResourceState{LimitMilli: -1, EffectiveLimitMilli: -1}},
				},
				Namespaces: map[string]NamespaceState{},
			},
		},
		"a parent's tighter limit caps its children": {
			queues: []v1alpha1.Queue{
				*partitatest.MakeQueue("org").GPU("4", "6", 1).Obj(),
				*partitatest.MakeQueue("team").Parent("org").GPU("4", "-1", 1).Obj(),
			},
			want: State{
				Queues: map[string]QueueState{
					"org": {Children: []string{"team"}, Ancestors: []string{}, Namespaces: []string{}, Priority: 100,
						GPU: ResourceState{QuotaMilli: 4000, LimitMilli: 6000, EffectiveLimitMilli: 6000}},
					"team": {Parent: "org", Children: []string{}, Ancestors: []string{"org"}, Namespaces: []string{}, Priority: 100,
						GPU: ResourceState{QuotaMilli: 4000, LimitMilli: -1, EffectiveLimitMilli: 6000}},
				},
				Namespaces: map[string]NamespaceState{},
			},
		},
		"a bad selector selects nothing": {
			queues:     []v1alpha1.Queue{*badSelector},
			namespaces: []NamespaceInfo{{Name: "x", Labels: map[string]string{"x": "1"}}},
			want: State{
				Queues: map[string]QueueState{
					"broken": {Children: []string{}, Ancestors: []string{}, Namespaces: []string{}, NamespaceSelector: true, Priority: 100, GPU: ResourceState{LimitMilli: -1, EffectiveLimitMilli: -1}},
				},
				Namespaces: map[string]NamespaceState{"x": {Labels: map[string]string{"x": "1"}, Queues: []string{}}},
			},
			wantErr: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := BuildState(tc.queues, tc.namespaces)
			if (err != nil) != tc.wantErr {
				t.Fatalf("BuildState() error = %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("BuildState() (-want,+got):\n%s", diff)
			}
		})
	}
}
