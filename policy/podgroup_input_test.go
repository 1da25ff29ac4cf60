package policy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func podGroupInput(ns, queue string) *PodGroupAdmissionInput {
	return &PodGroupAdmissionInput{
		Operation: "CREATE",
		User:      UserInfo{Username: "alice", Groups: []string{"team-a-devs"}},
		Namespace: ns,
		PodGroup: PodGroupInfo{Name: "train", Queue: queue, MinMember: 4, PriorityClassName: "train", Priority: 1000,
			Labels:      map[string]string{"app": "trainer"},
			Annotations: map[string]string{lastAppliedAnnotation: "{}", "big": strings.Repeat("x", MaxAnnotationValueLen+1), "small": "1"}},
	}
}

func TestEnginePodGroupAdmission(t *testing.T) {
	cases := map[string]struct {
		config Config
		in     *PodGroupAdmissionInput
		want   *AdmissionDecision
	}{
		"own queue": {
			in:   podGroupInput("team-a", "team-a"),
			want: &AdmissionDecision{Deny: []string{}},
		},
		"another team's queue": {
			in: podGroupInput("other", "team-a"),
			want: &AdmissionDecision{Deny: []string{
				`namespace other may not submit to queue "team-a"; add other to the queue's spec.namespaces or match it with spec.namespaceSelector, or name another queue`,
			}},
		},
		"a parent queue": {
			in: podGroupInput("team-a", "research"),
			want: &AdmissionDecision{Deny: []string{
				`queue "research" (spec.queue of PodGroup train) is not a leaf: it has child queues team-a; only leaf queues take work, name one of them`,
			}},
		},
		"no queue, queue required: left to the members": {
			config: Config{RequireQueue: true, MaxGPUMilliPerPod: 1, MinGPUMilli: 900},
			in:     podGroupInput("lent", ""),
			want:   &AdmissionDecision{Deny: []string{}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t)
			if err := e.SetConfig(t.Context(), tc.config); err != nil {
				t.Fatal(err)
			}
			got, err := e.PodGroupAdmission(t.Context(), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(AdmissionDecision{}, "Version"), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("PodGroupAdmission() (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestPodGroupInputShape: the document a policy reads, field by field, as
// docs/policy.md shows it.
func TestPodGroupInputShape(t *testing.T) {
	e := newTestEngine(t)
	_, err := e.Load(t.Context(), Bundle{"probe.rego": `package partita.admission
deny contains json.marshal(input)`}, "test")
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.PodGroupAdmission(t.Context(), podGroupInput("team-a", "team-a"))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"kind":"PodGroup","namespace":"team-a","operation":"CREATE",` +
		`"podGroup":{"annotations":{"small":"1"},"labels":{"app":"trainer"},"minMember":4,"name":"train","priority":1000,` +
		`"priorityClassName":"train","queue":"team-a","scheduleTimeoutSeconds":0,"topologyKey":""},` +
		`"request":{"minMember":4,"podGroup":"train","queue":"team-a"},` +
		`"user":{"groups":["team-a-devs"],"username":"alice"}}`
	if diff := cmp.Diff([]string{want}, got.Deny); diff != "" {
		t.Errorf("input (-want,+got):\n%s", diff)
	}
}
