package policy

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/api/v1alpha1"
)

func mustObject(t *testing.T, m map[string]any) *Object {
	t.Helper()
	o, err := NewObject(m)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func rayCluster(t *testing.T) *Object {
	return mustObject(t, map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayCluster", "namespace": "team-a", "name": "rc", "uid": "u-rc",
		"labels": map[string]any{"partita.dev/queue": "team-a"}, "annotations": map[string]any{},
		"spec": map[string]any{
			"headGroupSpec": map[string]any{"template": map[string]any{"gpu": false}},
			"workerGroupSpecs": []any{map[string]any{"groupName": "gpu", "minReplicas": int64(2), "maxReplicas": int64(6),
				"template": map[string]any{"gpu": true}}},
		},
	})
}

// jobSet is JobSet team-a/ft of two replicas of 2 GPU pods each.
func jobSet(t *testing.T, annotations map[string]any) *Object {
	return mustObject(t, map[string]any{
		"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "namespace": "team-a", "name": "ft", "uid": "u-ft",
		"labels": map[string]any{}, "annotations": annotations,
		"spec": map[string]any{"replicatedJobs": []any{map[string]any{
			"name": "workers", "replicas": int64(2),
			"template": map[string]any{"spec": map[string]any{"parallelism": int64(2), "template": map[string]any{"gpu": true}}},
		}}},
	})
}

func TestWorkloadDecision(t *testing.T) {
	ctx := t.Context()
	e, err := NewEngine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		in   *WorkloadInput
		want *WorkloadDecision
	}{
		"a RayCluster worker is an elastic member of its gang": {
			in: &WorkloadInput{
				Pod:   WorkloadPod{Namespace: "team-a", Name: "rc-worker-x", Labels: map[string]string{"ray.io/node-type": "worker"}},
				Chain: []*Object{rayCluster(t)},
			},
			want: &WorkloadDecision{Gang: &WorkloadGang{Name: "raycluster-rc", MinMember: 2, Elastic: true, Queue: "team-a", Kind: "RayCluster", OwnerName: "rc"}, Errors: []string{}},
		},
		"a bare pod is a single pod": {
			in:   &WorkloadInput{Pod: WorkloadPod{Namespace: "team-a", Name: "p"}},
			want: &WorkloadDecision{Errors: []string{}},
		},
		"a JobSet's replicas are sub-groups within the job's topology": {
			in: &WorkloadInput{
				Pod: WorkloadPod{Namespace: "team-a", Name: "ft-workers-1-0-x", Labels: map[string]string{
					"jobset.sigs.k8s.io/replicatedjob-name": "workers", "jobset.sigs.k8s.io/job-index": "1",
				}},
				Chain: []*Object{jobSet(t, map[string]any{
					v1alpha1.AnnotationKAITopology:               "dc",
					v1alpha1.AnnotationTopologyRequired:          "example.com/block",
					v1alpha1.AnnotationSubGroupTopologyRequired:  "example.com/rack",
					v1alpha1.AnnotationSubGroupTopologyPreferred: "kubernetes.io/hostname",
				})},
			},
			want: &WorkloadDecision{Gang: &WorkloadGang{
				Name: "jobset-ft", MinMember: 4, Kind: "JobSet", OwnerName: "ft",
				Topology: v1alpha1.TopologyRequest{Topology: "dc", Required: "example.com/block"},
				SubGroups: []v1alpha1.SubGroup{
					{Name: "workers-0", MinMember: 2, TopologyRequired: "example.com/rack", TopologyPreferred: "kubernetes.io/hostname"},
					{Name: "workers-1", MinMember: 2, TopologyRequired: "example.com/rack", TopologyPreferred: "kubernetes.io/hostname"},
				},
				SubGroup: "workers-1",
			}, Errors: []string{}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := e.Workload(ctx, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			tc.want.Version = e.Version()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWorkloadAnswersOfTheWrongShape: a rule that answers a gang the
// admission loop cannot use is an evaluation error (the pod waits), with a
// message that says what is wrong.
func TestWorkloadAnswersOfTheWrongShape(t *testing.T) {
	cases := map[string]struct {
		gang    string
		wantErr string
	}{
		"no name":         {gang: `{"minMember": 2}`, wantErr: "has no name"},
		"a bad name":      {gang: `{"name": "Not_A_Name", "minMember": 2}`, wantErr: `name "Not_A_Name" is not a valid PodGroup name`},
		"minMember 0":     {gang: `{"name": "g", "minMember": 0}`, wantErr: "minMember is 0, want a whole number from 1 to 100000"},
		"half a member":   {gang: `{"name": "g", "minMember": 1.5}`, wantErr: "minMember is 1.5"},
		"a typo":          {gang: `{"name": "g", "minMembers": 2}`, wantErr: `has "minMembers"; it may set name, minMember`},
		"elastic as text": {gang: `{"name": "g", "minMember": 2, "elastic": "yes"}`, wantErr: "elastic is a string, want true or false"},
		"topology as text": {
			gang:    `{"name": "g", "minMember": 2, "topology": "rack"}`,
			wantErr: `gang.topology is a string, want an object {"topology", "required", "preferred"}`,
		},
		"a typo in topology": {
			gang:    `{"name": "g", "minMember": 2, "topology": {"require": "rack"}}`,
			wantErr: `gang.topology has "require"; it may set topology, required and preferred`,
		},
		"a level as a number": {
			gang:    `{"name": "g", "minMember": 2, "topology": {"required": 3}}`,
			wantErr: "gang.topology.required is a number, want a string",
		},
		"a level that is no label key": {
			gang:    `{"name": "g", "minMember": 2, "topology": {"preferred": "two racks"}}`,
			wantErr: `gang.topology.preferred "two racks" is not a node label key`,
		},
		"a bad Topology name": {
			gang:    `{"name": "g", "minMember": 2, "topology": {"topology": "DC_1"}}`,
			wantErr: `gang.topology.topology "DC_1" is not a valid Topology name`,
		},
		"sub-groups as an object": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": {"a": 1}}`,
			wantErr: "gang.subGroups is an object, want a list of objects",
		},
		"a sub-group as text": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": ["a"]}`,
			wantErr: "gang.subGroups[0] is a string, want an object",
		},
		"a sub-group without a name": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"minMember": 1}]}`,
			wantErr: "gang.subGroups[0] has no name",
		},
		"a sub-group without a minimum": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"name": "a"}]}`,
			wantErr: "gang.subGroups[0] has no minMember",
		},
		"a sub-group of no members": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"name": "a", "minMember": 0}]}`,
			wantErr: "gang.subGroups[0].minMember is 0, want a whole number from 1 to 100000",
		},
		"a sub-group name no label can say": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"name": "a b", "minMember": 1}]}`,
			wantErr: `gang.subGroups[0].name "a b" is not a valid sub-group name`,
		},
		"a typo in a sub-group": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"name": "a", "minMember": 1, "topology_required": "rack"}]}`,
			wantErr: `gang.subGroups[0] has "topology_required"; it may set name, minMember, topologyRequired and topologyPreferred`,
		},
		"a sub-group's level as a list": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"name": "a", "minMember": 1, "topologyPreferred": ["rack"]}]}`,
			wantErr: "gang.subGroups[0].topologyPreferred is a list, want a string",
		},
		"a sub-group's level that is no label key": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"name": "a", "minMember": 1, "topologyRequired": "-rack"}]}`,
			wantErr: `gang.subGroups[0].topologyRequired "-rack" is not a node label key`,
		},
		"two sub-groups of one name": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"name": "a", "minMember": 1}, {"name": "a", "minMember": 1}]}`,
			wantErr: `gang.subGroups[1].name "a" names a sub-group listed before`,
		},
		"sub-groups larger than the gang": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"name": "a", "minMember": 2}, {"name": "b", "minMember": 1}]}`,
			wantErr: "gang.subGroups ask for 3 members in all, more than the gang's minMember 2",
		},
		"more sub-groups than a PodGroup holds": {
			gang:    `{"name": "g", "minMember": 100, "subGroups": [{"name": sprintf("s%d", [i]), "minMember": 1} | some i in numbers.range(1, 65)]}`,
			wantErr: "gang.subGroups has 65 sub-groups; a PodGroup holds at most 64",
		},
		"the pod's sub-group unlisted": {
			gang:    `{"name": "g", "minMember": 2, "subGroups": [{"name": "a", "minMember": 1}], "subGroup": "b"}`,
			wantErr: `gang.subGroup "b" is none of the gang's subGroups`,
		},
		"the pod's sub-group as a number": {
			gang:    `{"name": "g", "minMember": 2, "subGroup": 1}`,
			wantErr: "gang.subGroup is a number, want a string",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			e, err := NewEngine(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b := DefaultBundle().Overlay(map[string]string{"custom.rego": "package partita.workload.custom\n\nrules contains " + tc.gang + "\n"})
			if _, err := e.Load(ctx, b, "test"); err != nil {
				t.Fatal(err)
			}
			_, err = e.Workload(ctx, &WorkloadInput{Pod: WorkloadPod{Namespace: "ns", Name: "p"}})
			if err == nil || !IsEvaluation(err) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Workload: %v, want an evaluation error with %q", err, tc.wantErr)
			}
		})
	}
}

func TestWorkloadKindsFollowThePolicy(t *testing.T) {
	ctx := t.Context()
	e, err := NewEngine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, k := range e.WorkloadKinds() {
		names = append(names, k.String())
	}
	want := []string{"apps/StatefulSet", "batch/Job", "jobset.x-k8s.io/JobSet", "kubeflow.org/MPIJob", "kubeflow.org/PyTorchJob",
		"leaderworkerset.x-k8s.io/LeaderWorkerSet", "ray.io/RayCluster", "ray.io/RayJob", "scheduling.k8s.io/PodGroup",
		"scheduling.k8s.io/Workload", "trainer.kubeflow.org/TrainJob"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("default kinds (-want +got):\n%s", diff)
	}
	var loaded []string
	e.OnLoad(func(v string) { loaded = append(loaded, v) })
	b := DefaultBundle().Overlay(map[string]string{"custom.rego": `package partita.workload.custom

kinds contains {"group": "example.com", "kind": "Trainer", "spec": true}

# Asked again without its spec: watched with it.
kinds contains {"group": "jobset.x-k8s.io", "kind": "JobSet", "spec": false}
`})
	v, err := e.Load(ctx, b, "test")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{v}, loaded); diff != "" {
		t.Errorf("OnLoad calls (-want +got):\n%s", diff)
	}
	got := e.WorkloadKinds()
	has := func(k WorkloadKind) bool {
		for _, g := range got {
			if g == k {
				return true
			}
		}
		return false
	}
	if !has(WorkloadKind{Group: "example.com", Kind: "Trainer", Spec: true}) || !has(WorkloadKind{Group: "jobset.x-k8s.io", Kind: "JobSet", Spec: true}) {
		t.Errorf("kinds %v: want Trainer added and JobSet kept with its spec", got)
	}
	bad := DefaultBundle().Overlay(map[string]string{"custom.rego": "package partita.workload.custom\n\nkinds contains {\"kind\": \"Pod\"}\n"})
	if _, err := e.Load(ctx, bad, "bad"); err == nil || !strings.Contains(err.Error(), "the core group's kinds are not watched") {
		t.Errorf("Load of a core kind: %v, want it refused", err)
	}
}
