package workloadmap

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/policy"
)

// TestPodFingerprintIgnoresWhatTheRulesDoNotSee: the map asks the rules
// again only when what they see of a pod changed. Partita's own writes
// (the admission's and the bind's annotations) and annotations the input
// leaves out are not changes; a label, a user's annotation or an owner is.
func TestPodFingerprintIgnoresWhatTheRulesDoNotSee(t *testing.T) {
	base := func() *corev1.Pod {
		return pt.MakePod("p", "ns").Label("app", "train").Annotation("team", "a").Obj()
	}
	cases := map[string]struct {
		change   func(*corev1.Pod)
		wantSame bool
	}{
		"admitted": {change: func(p *corev1.Pod) {
			p.Annotations[v1alpha1.AnnotationAdmitted] = "2026-12-02T00:00:00Z"
		}, wantSame: true},
		"reserved and pinned": {change: func(p *corev1.Pod) {
			p.Annotations[v1alpha1.AnnotationReservation] = `{"node":"n1"}`
			p.Annotations[v1alpha1.AnnotationNode] = "n1"
		}, wantSame: true},
		"bound to devices": {change: func(p *corev1.Pod) {
			p.Annotations[v1alpha1.AnnotationDevicesPrefix+"main"] = "GPU-1"
			p.Annotations[v1alpha1.AnnotationMemLimitPrefix+"main"] = "40960M"
			p.Annotations[v1alpha1.AnnotationSMLimitPrefix+"main"] = "50"
		}, wantSame: true},
		"last-applied configuration": {change: func(p *corev1.Pod) {
			p.Annotations[corev1.LastAppliedConfigAnnotation] = "{}"
		}, wantSame: true},
		"a value too long for the input": {change: func(p *corev1.Pod) {
			p.Annotations["blob"] = strings.Repeat("x", policy.MaxAnnotationValueLen+1)
		}, wantSame: true},
		"a user's annotation": {change: func(p *corev1.Pod) { p.Annotations["team"] = "b" }},
		"a Partita key a user writes": {change: func(p *corev1.Pod) {
			p.Annotations[v1alpha1.AnnotationGang] = "g"
		}},
		"a label": {change: func(p *corev1.Pod) { p.Labels["app"] = "serve" }},
		"an owner": {change: func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "j", UID: "uid-j", Controller: ptr.To(true)}}
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := base()
			before := podFingerprint(p)
			tc.change(p)
			if same := podFingerprint(p) == before; same != tc.wantSame {
				t.Errorf("fingerprint unchanged = %v, want %v", same, tc.wantSame)
			}
		})
	}
}

// TestPolicyAnnotationsLeaveOutPartitasOwnWrites: the rules' input is a
// pod's annotations without those Partita writes as it admits and binds.
func TestPolicyAnnotationsLeaveOutPartitasOwnWrites(t *testing.T) {
	in := map[string]string{
		"team":                                    "a",
		v1alpha1.AnnotationGang:                   "g",
		v1alpha1.AnnotationAdmitted:               "2026-12-02T00:00:00Z",
		v1alpha1.AnnotationNode:                   "n1",
		v1alpha1.AnnotationDevicesPrefix + "main": "GPU-1",
		corev1.LastAppliedConfigAnnotation:        "{}",
	}
	want := map[string]string{"team": "a", v1alpha1.AnnotationGang: "g"}
	if diff := cmp.Diff(want, policyAnnotations(in)); diff != "" {
		t.Errorf("policyAnnotations() (-want +got):\n%s", diff)
	}
}
