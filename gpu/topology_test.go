package gpu_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// TestParseTopology reads a PodGroup's annotations: what it accepts is what
// v1alpha1.TopologyRequestOf reads, and keys that disagree are refused.
func TestParseTopology(t *testing.T) {
	base := field.NewPath("metadata", "annotations")
	cases := map[string]struct {
		annotations map[string]string
		want        v1alpha1.TopologyRequest
		wantErrs    []string
	}{
		"none": {},
		"Partita's keys": {
			annotations: map[string]string{v1alpha1.AnnotationTopology: "dc-1", v1alpha1.AnnotationTopologyRequired: "block", v1alpha1.AnnotationTopologyPreferred: "rack"},
			want:        v1alpha1.TopologyRequest{Topology: "dc-1", Required: "block", Preferred: "rack"},
		},
		"KAI's keys beside Partita's that agree": {
			annotations: map[string]string{v1alpha1.AnnotationTopology: "dc-1", v1alpha1.AnnotationKAITopology: "dc-1", v1alpha1.AnnotationKAITopologyRequired: "block"},
			want:        v1alpha1.TopologyRequest{Topology: "dc-1", Required: "block"},
		},
		"Kueue's keys": {
			annotations: map[string]string{v1alpha1.AnnotationKueueTopologyRequired: "cloud.example.com/block", v1alpha1.AnnotationKueueTopologyPreferred: "kubernetes.io/hostname"},
			want:        v1alpha1.TopologyRequest{Required: "cloud.example.com/block", Preferred: "kubernetes.io/hostname"},
		},
		"other annotations are not read": {
			annotations: map[string]string{"partita.dev/topology-whatever": "!", "partita.dev/sub-group-topology-required": "!"},
		},
		"every part wrong at once": {
			annotations: map[string]string{
				v1alpha1.AnnotationTopology: "a", v1alpha1.AnnotationKAITopology: "b",
				v1alpha1.AnnotationTopologyRequired: "rack", v1alpha1.AnnotationKueueTopologyRequired: "host",
				v1alpha1.AnnotationKAITopologyPreferred: "not a key",
			},
			wantErrs: []string{
				`metadata.annotations[kai.scheduler/topology]: Invalid value: "b": names a different Topology than metadata.annotations[partita.dev/topology]="a"; remove one of them or make them agree`,
				`metadata.annotations[kueue.x-k8s.io/podset-required-topology]: Invalid value: "host": names a different required level than metadata.annotations[partita.dev/topology-required]="rack"; remove one of them or make them agree`,
				`metadata.annotations[kai.scheduler/topology-preferred-placement]: Invalid value: "not a key": must be a node label key, such as topology.kubernetes.io/zone or kubernetes.io/hostname (a level of the named Topology, or any node label when it names none): name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`,
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, errs := gpu.ParseTopology(tc.annotations, base)
			var gotErrs []string
			for _, e := range errs {
				gotErrs = append(gotErrs, e.Error())
			}
			if diff := cmp.Diff(tc.wantErrs, gotErrs); diff != "" {
				t.Fatalf("ParseTopology errors (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseTopology (-want,+got):\n%s", diff)
			}
			if len(errs) == 0 {
				if diff := cmp.Diff(v1alpha1.TopologyRequestOf(tc.annotations), got); diff != "" {
					t.Errorf("ParseTopology and TopologyRequestOf disagree (-TopologyRequestOf,+ParseTopology):\n%s", diff)
				}
			}
		})
	}
}

func TestParseSubGroup(t *testing.T) {
	base := field.NewPath("metadata", "labels")
	cases := map[string]struct {
		labels   map[string]string
		want     string
		wantErrs []string
	}{
		"none":      {},
		"Partita's": {labels: map[string]string{v1alpha1.LabelSubGroup: "r0"}, want: "r0"},
		"KAI's":     {labels: map[string]string{v1alpha1.LabelKAISubGroup: "decode"}, want: "decode"},
		"both agree": {
			labels: map[string]string{v1alpha1.LabelSubGroup: "r0", v1alpha1.LabelKAISubGroup: "r0"},
			want:   "r0",
		},
		"both disagree": {
			labels:   map[string]string{v1alpha1.LabelSubGroup: "r0", v1alpha1.LabelKAISubGroup: "r1"},
			wantErrs: []string{`metadata.labels[kai.scheduler/subgroup-name]: Invalid value: "r1": names a different sub-group than metadata.labels[partita.dev/sub-group]="r0"; remove one of them or make them agree`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, errs := gpu.ParseSubGroup(tc.labels, base)
			var gotErrs []string
			for _, e := range errs {
				gotErrs = append(gotErrs, e.Error())
			}
			if diff := cmp.Diff(tc.wantErrs, gotErrs); diff != "" {
				t.Fatalf("ParseSubGroup errors (-want,+got):\n%s", diff)
			}
			if got != tc.want {
				t.Errorf("ParseSubGroup = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestTopologyKeys: the exported key lists are every key TopologyRequestOf
// and SubGroupOf read, so that what covers them (the seal, a PodGroup's
// change check) misses none.
func TestTopologyKeys(t *testing.T) {
	for _, k := range gpu.TopologyAnnotations() {
		if v1alpha1.TopologyRequestOf(map[string]string{k: "x"}).IsZero() {
			t.Errorf("annotation %s: TopologyRequestOf reads nothing", k)
		}
	}
	if n := len(gpu.TopologyAnnotations()); n != 8 {
		t.Errorf("TopologyAnnotations has %d keys, want 8 (Partita's 3, KAI's 3, Kueue's 2)", n)
	}
	for _, k := range gpu.SubGroupLabels() {
		if v1alpha1.SubGroupOf(map[string]string{k: "x"}) != "x" {
			t.Errorf("label %s: SubGroupOf reads nothing", k)
		}
	}
}
