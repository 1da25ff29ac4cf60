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
		`"priorityClassName":"train","queue":"team-a","scheduleTimeoutSeconds":0,` +
		`"subGroups":[],"topology":{"name":"","preferred":"","required":""},"topologyKey":""},` +
		`"request":{"minMember":4,"podGroup":"train","queue":"team-a","topology":{"name":"","preferred":"","required":""}},` +
		`"user":{"groups":["team-a-devs"],"username":"alice"}}`
	if diff := cmp.Diff([]string{want}, got.Deny); diff != "" {
		t.Errorf("input (-want,+got):\n%s", diff)
	}
}

// TestTopologyInput: the topology request and sub-groups of a PodGroup and
// of a pod, as a policy reads them (docs/policy.md).
func TestTopologyInput(t *testing.T) {
	topo := TopologyRequest{Name: "dc-1", Required: "network.example.com/block", Preferred: "network.example.com/rack"}
	pg := podGroupInput("team-a", "team-a")
	pg.PodGroup.Topology = topo
	pg.PodGroup.SubGroups = []SubGroup{{Name: "r0", MinMember: 2, TopologyRequired: "network.example.com/rack"}, {Name: "r1", MinMember: 2}}
	pod := input("team-a", "team-a", 1000)
	pod.Request.Topology, pod.Request.SubGroup = topo, "r0"
	cases := map[string]struct {
		rule string
		in   any
		want []string
	}{
		"a PodGroup's topology, twice": {
			rule: `json.marshal([input.podGroup.topology, input.request.topology])`,
			in:   pg,
			want: []string{`[{"name":"dc-1","preferred":"network.example.com/rack","required":"network.example.com/block"},` +
				`{"name":"dc-1","preferred":"network.example.com/rack","required":"network.example.com/block"}]`},
		},
		"a PodGroup's sub-groups": {
			rule: `json.marshal(input.podGroup.subGroups)`,
			in:   pg,
			want: []string{`[{"minMember":2,"name":"r0","topologyPreferred":"","topologyRequired":"network.example.com/rack"},` +
				`{"minMember":2,"name":"r1","topologyPreferred":"","topologyRequired":""}]`},
		},
		"a pod's topology and sub-group": {
			rule: `json.marshal([input.request.topology, input.request.subGroup])`,
			in:   pod,
			want: []string{`[{"name":"dc-1","preferred":"network.example.com/rack","required":"network.example.com/block"},"r0"]`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t)
			if _, err := e.Load(t.Context(), Bundle{"probe.rego": "package partita.admission\ndeny contains " + tc.rule}, "test"); err != nil {
				t.Fatal(err)
			}
			var got *AdmissionDecision
			var err error
			switch in := tc.in.(type) {
			case *PodGroupAdmissionInput:
				got, err = e.PodGroupAdmission(t.Context(), in)
			case *AdmissionInput:
				got, err = e.Admission(t.Context(), in)
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Deny); diff != "" {
				t.Errorf("input (-want,+got):\n%s", diff)
			}
		})
	}
}

// TestTopologyRuleForLargeGangs: one rule on request.minMember and
// request.topology holds a large gang to a topology whether it comes as a
// PodGroup or as pods with partita.dev/min-member, as docs/policy.md shows.
func TestTopologyRuleForLargeGangs(t *testing.T) {
	const rule = `package partita.admission

deny contains msg if {
	input.request.minMember >= 16
	input.request.topology.required == ""
	msg := sprintf("a gang of %d must name a level it needs to run within: set partita.dev/topology-required", [input.request.minMember])
}`
	large := podGroupInput("team-a", "team-a")
	large.PodGroup.MinMember = 32
	placed := podGroupInput("team-a", "team-a")
	placed.PodGroup.MinMember = 32
	placed.PodGroup.Topology = TopologyRequest{Required: "network.example.com/block"}
	member := input("team-a", "team-a", 1000)
	member.Request.MinMember = 16
	cases := map[string]struct {
		in   any
		want []string
	}{
		"a large PodGroup without a topology": {in: large, want: []string{"a gang of 32 must name a level it needs to run within: set partita.dev/topology-required"}},
		"a large PodGroup within a block":     {in: placed},
		"a small PodGroup":                    {in: podGroupInput("team-a", "team-a")},
		"a member of a large gang of pods":    {in: member, want: []string{"a gang of 16 must name a level it needs to run within: set partita.dev/topology-required"}},
		"a single pod":                        {in: input("team-a", "team-a", 1000)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t)
			if _, err := e.Load(t.Context(), Bundle{"large.rego": rule}, "test"); err != nil {
				t.Fatal(err)
			}
			var got *AdmissionDecision
			var err error
			switch in := tc.in.(type) {
			case *PodGroupAdmissionInput:
				got, err = e.PodGroupAdmission(t.Context(), in)
			case *AdmissionInput:
				got, err = e.Admission(t.Context(), in)
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Deny, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Deny (-want,+got):\n%s", diff)
			}
		})
	}
}
