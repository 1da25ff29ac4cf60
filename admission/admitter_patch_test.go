package admission

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// TestReleasePatch applies the release's hand-written patch as the API
// server does (strategicpatch) and checks it gives the released pod: the
// annotations set, the admission gate gone and other gates kept, the node
// affinity added to every term of the user's.
func TestReleasePatch(t *testing.T) {
	gated := func() *pt.PodWrapper {
		return pt.MakePod("p", "ns").Annotation("team", "a").GPUFraction("0.5").
			SchedulingGates("example.com/other", v1alpha1.SchedulingGateAdmission, "example.com/last")
	}
	term := func(reqs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: reqs}
	}
	zone := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}
	cases := map[string]struct {
		orig    *corev1.Pod
		release func(*corev1.Pod)
	}{
		"ungate and stamp": {
			orig: gated().Obj(),
			release: func(p *corev1.Pod) {
				p.Annotations[v1alpha1.AnnotationAdmitted] = "2026-12-02T00:00:00Z"
			},
		},
		"no annotations before": {
			orig: pt.MakePod("p", "ns").SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj(),
			release: func(p *corev1.Pod) {
				p.Annotations = map[string]string{v1alpha1.AnnotationAdmitted: "now"}
			},
		},
		"pinned, no affinity before": {
			orig: gated().Obj(),
			release: func(p *corev1.Pod) {
				p.Annotations[v1alpha1.AnnotationAdmitted] = "now"
				p.Annotations[v1alpha1.AnnotationNode] = "n1"
				p.Annotations[v1alpha1.AnnotationReservation] = `{"node":"n1"}`
				pinToNode(p, "n1")
			},
		},
		"pinned, the user's terms kept": {
			orig: func() *corev1.Pod {
				p := gated().Obj()
				p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution:  &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term(zone), term()}},
					PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1, Preference: term(zone)}},
				}}
				return p
			}(),
			release: func(p *corev1.Pod) { pinToNode(p, "n2") },
		},
		"kept in its topology domain, the user's terms kept": {
			orig: func() *corev1.Pod {
				p := gated().Obj()
				p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term(zone), term()}},
				}}
				return p
			}(),
			release: func(p *corev1.Pod) {
				keepInDomain(p, map[string]string{"example.com/rack": "r1", "example.com/block": "b0"})
				terms := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
				if len(terms) != 2 || len(terms[0].MatchExpressions) != 3 || terms[0].MatchExpressions[1].Key != "example.com/block" {
					t.Errorf("keepInDomain gives terms %+v, want block then rack added to each", terms)
				}
			},
		},
		"kept in its topology domain, no affinity before": {
			orig:    gated().Obj(),
			release: func(p *corev1.Pod) { keepInDomain(p, map[string]string{"example.com/rack": "r1"}) },
		},
		"an annotation removed": {
			orig:    gated().Annotation(v1alpha1.AnnotationReservation, "old").Obj(),
			release: func(p *corev1.Pod) { delete(p.Annotations, v1alpha1.AnnotationReservation) },
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			want := tc.orig.DeepCopy()
			tc.release(want)
			gates := want.Spec.SchedulingGates[:0:0]
			for _, g := range want.Spec.SchedulingGates {
				if g.Name != v1alpha1.SchedulingGateAdmission {
					gates = append(gates, g)
				}
			}
			want.Spec.SchedulingGates = gates
			patch, err := releasePatch(tc.orig, want)
			if err != nil {
				t.Fatal(err)
			}
			origJSON, err := json.Marshal(tc.orig)
			if err != nil {
				t.Fatal(err)
			}
			gotJSON, err := strategicpatch.StrategicMergePatch(origJSON, patch, &corev1.Pod{})
			if err != nil {
				t.Fatalf("apply %s: %v", patch, err)
			}
			var got corev1.Pod
			if err := json.Unmarshal(gotJSON, &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, &got, cmp.Comparer(func(a, b metav1.Time) bool { return a.Equal(&b) })); diff != "" {
				t.Errorf("patch %s gives (-want +got):\n%s", patch, diff)
			}
		})
	}
}
