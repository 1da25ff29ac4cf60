package webhook

import (
	"context"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/partitatest"
)

// podGroupReview is a PodGroup CREATE (old nil) or UPDATE from alice.
func podGroupReview(t testing.TB, pg, old *v1alpha1.PodGroup) *admissionv1.AdmissionRequest {
	t.Helper()
	req := &admissionv1.AdmissionRequest{
		UID: "topology", Kind: metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Kind: "PodGroup"},
		Resource:  metav1.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "podgroups"},
		Namespace: pg.Namespace, Operation: admissionv1.Create, UserInfo: testUsers()[""], Object: runtime.RawExtension{Raw: mustJSON(t, pg)},
	}
	if old != nil {
		req.Operation, req.OldObject = admissionv1.Update, runtime.RawExtension{Raw: mustJSON(t, old)}
	}
	return req
}

// TestPodGroupTopology: a PodGroup's topology request (any dialect) and
// sub-groups are checked for syntax always, and against the named Topology
// when it exists (testObjects' dc-1: zone, block, rack, host).
func TestPodGroupTopology(t *testing.T) {
	const (
		zone  = "topology.kubernetes.io/zone"
		block = "network.example.com/block"
		rack  = "network.example.com/rack"
		host  = "kubernetes.io/hostname"
	)
	gang := func() *partitatest.PodGroupWrapper {
		return partitatest.MakePodGroup("train", "team-a").MinMember(8).Queue("team-a")
	}
	inDC1 := func() *partitatest.PodGroupWrapper { return gang().Annotation(v1alpha1.AnnotationTopology, "dc-1") }
	dc1 := "Topology dc-1 (broadest first: " + strings.Join([]string{zone, block, rack, host}, ", ") + ")"
	cases := map[string]struct {
		pg, old *v1alpha1.PodGroup
		// wantMsgs are the refusal's parts, none when allowed; wantCode its
		// HTTP code.
		wantMsgs []string
		wantCode int32
	}{
		"no topology":                          {pg: gang().Obj()},
		"plain node labels without a Topology": {pg: gang().Annotation(v1alpha1.AnnotationTopologyRequired, "example.com/any-label").Annotation(v1alpha1.AnnotationTopologyPreferred, zone).Obj()},
		"a Topology that does not exist yet":   {pg: gang().Annotation(v1alpha1.AnnotationTopology, "dc-9").Annotation(v1alpha1.AnnotationTopologyRequired, "example.com/any").SubGroup("a", 4, "example.com/other", "").Obj()},
		"levels of dc-1, preferred narrower":   {pg: inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, block).Annotation(v1alpha1.AnnotationTopologyPreferred, rack).Obj()},
		"the same level required and preferred": {
			pg: inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, rack).Annotation(v1alpha1.AnnotationTopologyPreferred, rack).Obj(),
		},
		"KAI's keys": {
			pg: gang().Annotation(v1alpha1.AnnotationKAITopology, "dc-1").Annotation(v1alpha1.AnnotationKAITopologyRequired, block).Obj(),
		},
		"Kueue's keys name no Topology": {
			pg: gang().Annotation(v1alpha1.AnnotationKueueTopologyRequired, "cloud.example.com/block").Obj(),
		},
		"sub-groups within the gang's level": {
			pg: inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, block).
				SubGroup("r0", 4, rack, host).SubGroup("r1", 4, "", rack).Obj(),
		},
		"sub-groups that add up to the gang": {pg: gang().SubGroup("a", 4, "", "").SubGroup("b", 4, "", "").Obj()},
		"a required level that is not dc-1's": {
			pg: inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, "network.example.com/pod").Obj(),
			wantMsgs: []string{`metadata.annotations[partita.dev/topology-required]: Invalid value: "network.example.com/pod": is not a level of ` +
				dc1 + `; name one of them, or name no Topology to use any node label`},
			wantCode: 422,
		},
		"a KAI preferred level that is not dc-1's": {
			pg:       gang().Annotation(v1alpha1.AnnotationKAITopology, "dc-1").Annotation(v1alpha1.AnnotationKAITopologyPreferred, "network.example.com/pod").Obj(),
			wantMsgs: []string{`metadata.annotations[kai.scheduler/topology-preferred-placement]: Invalid value: "network.example.com/pod": is not a level of Topology dc-1`},
			wantCode: 422,
		},
		"preferred broader than required": {
			pg: inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, rack).Annotation(v1alpha1.AnnotationTopologyPreferred, zone).Obj(),
			wantMsgs: []string{`metadata.annotations[partita.dev/topology-preferred]: Invalid value: "topology.kubernetes.io/zone": is broader than the required level network.example.com/rack, ` +
				`within one domain of which the members already run; name network.example.com/rack or a level after it in ` + dc1},
			wantCode: 422,
		},
		"a sub-group broader than the gang": {
			pg: inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, rack).SubGroup("r0", 4, block, "").Obj(),
			wantMsgs: []string{`spec.subGroups[0].topologyRequired: Invalid value: "network.example.com/block": is broader than the gang's required level network.example.com/rack, ` +
				`within one domain of which the whole gang already runs; name network.example.com/rack or a level after it in ` + dc1},
			wantCode: 422,
		},
		"a sub-group preferring broader than it requires": {
			pg:       inDC1().SubGroup("r0", 4, rack, zone).Obj(),
			wantMsgs: []string{`spec.subGroups[0].topologyPreferred: Invalid value: "topology.kubernetes.io/zone": is broader than the sub-group's required level network.example.com/rack`},
			wantCode: 422,
		},
		"a sub-group preferring broader than the gang requires": {
			pg:       inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, block).SubGroup("r0", 4, "", zone).Obj(),
			wantMsgs: []string{`spec.subGroups[0].topologyPreferred: Invalid value: "topology.kubernetes.io/zone": is broader than the gang's required level network.example.com/block`},
			wantCode: 422,
		},
		"a sub-group level that is not dc-1's": {
			pg:       inDC1().SubGroup("r0", 4, "example.com/other", "").Obj(),
			wantMsgs: []string{`spec.subGroups[0].topologyRequired: Invalid value: "example.com/other": is not a level of Topology dc-1`},
			wantCode: 422,
		},
		"sub-groups larger than the gang": {
			pg: gang().SubGroup("a", 4, "", "").SubGroup("b", 5, "", "").Obj(),
			wantMsgs: []string{`spec.subGroups: Invalid value: 9: the sub-groups' minMember add up to 9, more than the gang's spec.minMember 8: ` +
				`sub-groups are parts of the gang; lower theirs or raise spec.minMember to at least 9`},
			wantCode: 422,
		},
		"a sub-group level that is no label key": {
			pg:       gang().SubGroup("a", 4, "rack!", "").Obj(),
			wantMsgs: []string{`spec.subGroups[0].topologyRequired: Invalid value: "rack!": must be a node label key`},
			wantCode: 422,
		},
		"dialects that disagree": {
			pg:       gang().Annotation(v1alpha1.AnnotationTopology, "dc-1").Annotation(v1alpha1.AnnotationKAITopology, "dc-2").Obj(),
			wantMsgs: []string{`metadata.annotations[kai.scheduler/topology]: Invalid value: "dc-2": names a different Topology than metadata.annotations[partita.dev/topology]="dc-1"`},
			wantCode: 422,
		},
		"a Topology name that is no name": {
			pg:       gang().Annotation(v1alpha1.AnnotationTopology, "DC 1").Obj(),
			wantMsgs: []string{`metadata.annotations[partita.dev/topology]: Invalid value: "DC 1": must be the name of a Topology`},
			wantCode: 422,
		},
		"an update that adds a bad level": {
			old:      inDC1().Obj(),
			pg:       inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, "example.com/other").Obj(),
			wantMsgs: []string{`metadata.annotations[partita.dev/topology-required]: Invalid value: "example.com/other": is not a level of Topology dc-1`},
			wantCode: 422,
		},
		"an update of another field keeps a level dc-1 lost since": {
			old: inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, "example.com/lost").Obj(),
			pg:  inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, "example.com/lost").PriorityClassName("batch").Obj(),
		},
		"an update of labels only": {
			old: inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, "example.com/lost").Obj(),
			pg:  inDC1().Annotation(v1alpha1.AnnotationTopologyRequired, "example.com/lost").Label("a", "b").Obj(),
		},
	}
	engine := newTestEngine(t)
	a := NewPodGroupAdmission(engine, NewReferences(testObjects(t), nil))
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			res := a.Validate(t.Context(), podGroupReview(t, tc.pg, tc.old))
			if len(tc.wantMsgs) == 0 {
				if res.Err != nil {
					t.Fatalf("refused: %v", res.Err)
				}
				return
			}
			de, ok := asDenial(res.Err)
			if !ok {
				t.Fatalf("got %v, want a refusal", res.Err)
			}
			if de.Reason != ReasonInvalidTopology {
				t.Errorf("reason %s, want %s", de.Reason, ReasonInvalidTopology)
			}
			if code := de.status().Code; code != tc.wantCode {
				t.Errorf("code %d, want %d", code, tc.wantCode)
			}
			for _, want := range tc.wantMsgs {
				if !strings.Contains(de.Error(), want) {
					t.Errorf("message %q\nwant it to contain %q", de.Error(), want)
				}
			}
		})
	}
}

// TestPodGroupTopologyPolicy: the policy sees a PodGroup's topology, and
// removing it later is asked about like a change of the spec.
func TestPodGroupTopologyPolicy(t *testing.T) {
	const rule = `package partita.admission

deny contains "a gang of 16 or more runs within one block: set partita.dev/topology-required" if {
	input.request.minMember >= 16
	input.request.topology.required == ""
}`
	big := func() *partitatest.PodGroupWrapper {
		return partitatest.MakePodGroup("big", "team-a").MinMember(16).Queue("team-a")
	}
	withBlock := func() *partitatest.PodGroupWrapper {
		return big().Annotation(v1alpha1.AnnotationKAITopologyRequired, "network.example.com/block")
	}
	cases := map[string]struct {
		pg, old *v1alpha1.PodGroup
		denied  bool
	}{
		"created within a block, in KAI's key": {pg: withBlock().Obj()},
		"created without":                      {pg: big().Obj(), denied: true},
		"its topology removed later":           {old: withBlock().Obj(), pg: big().Obj(), denied: true},
		"a label changed later":                {old: withBlock().Obj(), pg: withBlock().Label("a", "b").Obj()},
	}
	h := newTestServer(t, testOptions{policy: map[string]string{"topology.rego": rule}})
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := outcomeOf(t, post(t, h, PathValidatePodGroups, podGroupReview(t, tc.pg, tc.old)))
			if got.Allowed == tc.denied {
				t.Fatalf("allowed %v, want %v: %+v", got.Allowed, !tc.denied, got.Status)
			}
			if tc.denied && !strings.Contains(got.Status.Message, "refused by policy: a gang of 16 or more runs within one block") {
				t.Errorf("message %q", got.Status.Message)
			}
		})
	}
}

// noTopologyCRD answers as an API server without the Topology CRD does,
// and reads the rest from inner.
type noTopologyCRD struct{ inner ObjectReader }

func (r noTopologyCRD) Get(ctx context.Context, key client.ObjectKey, obj client.Object) error {
	if _, ok := obj.(*v1alpha1.Topology); ok {
		return &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: "Topology"}}
	}
	return r.inner.Get(ctx, key, obj)
}

// TestPodGroupTopologyWithoutTheCRD: a chart upgraded without its new CRDs
// (Helm never upgrades them) still admits PodGroups that name a Topology,
// their levels checked by syntax alone.
func TestPodGroupTopologyWithoutTheCRD(t *testing.T) {
	a := NewPodGroupAdmission(newTestEngine(t), noTopologyCRD{inner: NewReferences(testObjects(t), nil)})
	pg := partitatest.MakePodGroup("train", "team-a").MinMember(8).Queue("team-a").
		Annotation(v1alpha1.AnnotationTopology, "dc-1").Annotation(v1alpha1.AnnotationTopologyRequired, "network.example.com/rack").Obj()
	if res := a.Validate(t.Context(), podGroupReview(t, pg, nil)); res.Err != nil {
		t.Errorf("refused without the Topology CRD: %v", res.Err)
	}
	bad := pg.DeepCopy()
	bad.Annotations[v1alpha1.AnnotationTopologyRequired] = "not a label!"
	if res := a.Validate(t.Context(), podGroupReview(t, bad, nil)); res.Err == nil {
		t.Errorf("a level that is no label key was admitted without the Topology CRD")
	}
}
