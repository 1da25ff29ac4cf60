package admission

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// tablemap is the workload map as a table (package workloadmap computes
// it from the rules; its tests run the real thing).
type tablemap map[string]cycle.Mapping

func (m tablemap) Map(p *corev1.Pod) cycle.Mapping { return m[p.Name] }
func (tablemap) Forget(types.UID)                  {}

// TestAdmitterKeepsMappedPodGroups: a mapped gang gets a PodGroup owned by
// its top owner, with the rule's spec and the gang's status; a tenant's
// edit of its spec is written over; its members carry the workload's name.
func TestAdmitterKeepsMappedPodGroups(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	owner := cycle.Owner{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "llama-ft", UID: "uid-js"}
	m := cycle.Mapping{Gang: "jobset-llama-ft", MinMember: 2, Kind: "JobSet", Name: "llama-ft", Owner: owner}
	var pods []*corev1.Pod
	for _, n := range []string{"w-0", "w-1"} {
		pods = append(pods, pt.MakePod(n, "ns").Queue("default").GPUCount(1).SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(clk.Now()).Obj())
	}
	objs := []client.Object{pt.MakeQueue("default").Obj()}
	for _, p := range pods {
		objs = append(objs, p.DeepCopy())
	}
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Queue{}, &corev1.Pod{}, &v1alpha1.PodGroup{}).Build()
	ledger := gpu.BuildLedger([]v1alpha1.GPUNode{*pt.MakeGPUNode("n").Devices(1, "NVIDIA H100 80GB HBM3", 81559).Obj()}, nil)
	opts := DefaultAdmitterOptions()
	opts.Mapper = tablemap{"w-0": m, "w-1": m}
	a := NewAdmitter(ledger, c, nil, nil, nil, func() bool { return true }, opts, nil, clk)
	cache := a.Cache()
	cache.UpsertNode(pt.MakeNode("n").Obj())
	cache.UpsertQueue(pt.MakeQueue("default").Obj())
	for _, p := range pods {
		cache.UpsertPod(p)
	}
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var pg v1alpha1.PodGroup
	if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "jobset-llama-ft"}, &pg); err != nil {
		t.Fatalf("the mapped gang's PodGroup: %v", err)
	}
	want := v1alpha1.PodGroupSpec{MinMember: 2}
	if diff := cmp.Diff(want, pg.Spec); diff != "" {
		t.Errorf("PodGroup spec (-want +got):\n%s", diff)
	}
	wantOwners := []metav1.OwnerReference{{APIVersion: owner.APIVersion, Kind: owner.Kind, Name: owner.Name, UID: owner.UID}}
	if diff := cmp.Diff(wantOwners, pg.OwnerReferences); diff != "" {
		t.Errorf("PodGroup owners (-want +got):\n%s", diff)
	}
	if pg.Labels[v1alpha1.LabelWorkloadKind] != "JobSet" || pg.Annotations[v1alpha1.AnnotationWorkload] != "JobSet/llama-ft" {
		t.Errorf("PodGroup labels %v, annotations %v", pg.Labels, pg.Annotations)
	}

	// The informer shows the PodGroup; a tenant raises its minMember: the
	// gang is still sized by its rule, and the spec is written back.
	pg.Spec.MinMember = 1000
	if err := c.Update(ctx, &pg); err != nil {
		t.Fatal(err)
	}
	cache.UpsertPodGroup(&pg)
	clk.Step(podGroupSettle + time.Second)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(&pg), &pg); err != nil {
		t.Fatal(err)
	}
	if pg.Spec.MinMember != 2 {
		t.Errorf("PodGroup minMember %d after a tenant's edit, want the rule's 2 written back", pg.Spec.MinMember)
	}
	if pg.Status.Phase != v1alpha1.PodGroupPending || pg.Status.Reason != "gang needs 2 × 1 GPU; at most 1 fit now" {
		t.Errorf("PodGroup status %q %q, want Pending with the gang's reason (sized by the rule, not the edit)", pg.Status.Phase, pg.Status.Reason)
	}
	// The members' conditions carry the workload's name for the writers.
	for _, p := range pods {
		pc, ok := conditionQueueFor(a.conditions, p.UID).take()
		if !ok || pc.annotations[v1alpha1.AnnotationWorkload] != "JobSet/llama-ft" || pc.annotations[v1alpha1.AnnotationWorkloadPodGroup] != "jobset-llama-ft" {
			t.Errorf("pod %s: queued %+v, want the workload's annotations", p.Name, pc.annotations)
		}
	}
}

// TestMappedPodGroupOfAnotherOwnerIsLeftAlone: a PodGroup of the gang's
// name that Partita did not make is neither read nor written.
func TestMappedPodGroupOfAnotherOwnerIsLeftAlone(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	m := cycle.Mapping{Gang: "job-train", MinMember: 1, Kind: "Job", Name: "train", Owner: cycle.Owner{APIVersion: "batch/v1", Kind: "Job", Name: "train", UID: "uid-train"}}
	pod := pt.MakePod("p", "ns").Queue("default").GPUCount(1).SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(clk.Now()).Obj()
	foreign := pt.MakePodGroup("job-train", "ns").MinMember(7).Obj()
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(pod.DeepCopy(), foreign.DeepCopy(), pt.MakeQueue("default").Obj()).
		WithStatusSubresource(&v1alpha1.Queue{}, &corev1.Pod{}, &v1alpha1.PodGroup{}).Build()
	ledger := gpu.BuildLedger([]v1alpha1.GPUNode{*pt.MakeGPUNode("n").Devices(1, "NVIDIA H100 80GB HBM3", 81559).Obj()}, nil)
	opts := DefaultAdmitterOptions()
	opts.Mapper = tablemap{"p": m}
	a := NewAdmitter(ledger, c, nil, nil, nil, func() bool { return true }, opts, nil, clk)
	a.Cache().UpsertNode(pt.MakeNode("n").Obj())
	a.Cache().UpsertQueue(pt.MakeQueue("default").Obj())
	a.Cache().UpsertPodGroup(foreign)
	a.Cache().UpsertPod(pod)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.PodGroup
	if err := c.Get(ctx, client.ObjectKeyFromObject(foreign), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.MinMember != 7 || got.Status.Phase != "" || len(got.OwnerReferences) != 0 {
		t.Errorf("the foreign PodGroup was changed: spec %+v, status %+v, owners %v", got.Spec, got.Status, got.OwnerReferences)
	}
	var p corev1.Pod
	if err := c.Get(ctx, client.ObjectKeyFromObject(pod), &p); err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.SchedulingGates) != 0 || p.Annotations[v1alpha1.AnnotationWorkloadPodGroup] != "job-train" {
		t.Errorf("the gang of 1 was not admitted with its workload's name: gates %v, annotations %v", p.Spec.SchedulingGates, p.Annotations)
	}
}

// TestMappedPodGroupShowsTheRulesTopology: the PodGroup of a mapped gang
// shows the topology its rule asks, in Partita's keys, and its sub-groups;
// when the rule's answer changes, the PodGroup follows, levels and
// sub-groups the rule no longer asks included.
func TestMappedPodGroupShowsTheRulesTopology(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	owner := cycle.Owner{APIVersion: "jobset.x-k8s.io/v1alpha2", Kind: "JobSet", Name: "ft", UID: "uid-js"}
	subGroups := []v1alpha1.SubGroup{
		{Name: "workers-0", MinMember: 1, TopologyRequired: "example.com/rack"},
		{Name: "workers-1", MinMember: 1, TopologyRequired: "example.com/rack"},
	}
	mapping := func(pod string, topo v1alpha1.TopologyRequest, sgs []v1alpha1.SubGroup) cycle.Mapping {
		m := cycle.Mapping{Gang: "jobset-ft", MinMember: 2, Kind: "JobSet", Name: "ft", Owner: owner, Topology: topo, SubGroups: sgs}
		if len(sgs) > 0 {
			m.SubGroup = "workers-" + pod[len(pod)-1:]
		}
		return m
	}
	asked := v1alpha1.TopologyRequest{Topology: "dc", Required: "example.com/block", Preferred: "example.com/rack"}
	table := tablemap{"w-0": mapping("w-0", asked, subGroups), "w-1": mapping("w-1", asked, subGroups)}
	var pods []*corev1.Pod
	for _, n := range []string{"w-0", "w-1"} {
		pods = append(pods, pt.MakePod(n, "ns").Queue("default").GPUCount(1).SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(clk.Now()).Obj())
	}
	objs := []client.Object{pt.MakeQueue("default").Obj()}
	for _, p := range pods {
		objs = append(objs, p.DeepCopy())
	}
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Queue{}, &corev1.Pod{}, &v1alpha1.PodGroup{}).Build()
	ledger := gpu.BuildLedger([]v1alpha1.GPUNode{*pt.MakeGPUNode("n").Devices(1, "NVIDIA H100 80GB HBM3", 81559).Obj()}, nil)
	opts := DefaultAdmitterOptions()
	opts.Mapper = table
	a := NewAdmitter(ledger, c, nil, nil, nil, func() bool { return true }, opts, nil, clk)
	cache := a.Cache()
	cache.UpsertNode(pt.MakeNode("n").Obj())
	cache.UpsertQueue(pt.MakeQueue("default").Obj())
	for _, p := range pods {
		cache.UpsertPod(p)
	}
	// cycle runs the loop once more, past the pause after a write, and
	// returns the PodGroup, which the informer then shows.
	cycle := func() *v1alpha1.PodGroup {
		t.Helper()
		clk.Step(podGroupSettle + time.Second)
		if err := a.Cycle(ctx); err != nil {
			t.Fatal(err)
		}
		pg := &v1alpha1.PodGroup{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "jobset-ft"}, pg); err != nil {
			t.Fatalf("the mapped gang's PodGroup: %v", err)
		}
		cache.UpsertPodGroup(pg)
		return pg
	}
	topologyOf := func(pg *v1alpha1.PodGroup) map[string]string {
		out := map[string]string{}
		for _, k := range []string{v1alpha1.AnnotationTopology, v1alpha1.AnnotationTopologyRequired, v1alpha1.AnnotationTopologyPreferred} {
			if v, ok := pg.Annotations[k]; ok {
				out[k] = v
			}
		}
		return out
	}

	pg := cycle()
	wantTopology := map[string]string{
		v1alpha1.AnnotationTopology:          "dc",
		v1alpha1.AnnotationTopologyRequired:  "example.com/block",
		v1alpha1.AnnotationTopologyPreferred: "example.com/rack",
	}
	if diff := cmp.Diff(wantTopology, topologyOf(pg)); diff != "" {
		t.Errorf("created PodGroup's topology (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(v1alpha1.PodGroupSpec{MinMember: 2, SubGroups: subGroups}, pg.Spec); diff != "" {
		t.Errorf("created PodGroup's spec (-want +got):\n%s", diff)
	}

	// A tenant edits the topology: it is written back.
	pg.Annotations[v1alpha1.AnnotationTopologyRequired] = "example.com/zone"
	if err := c.Update(ctx, pg); err != nil {
		t.Fatal(err)
	}
	cache.UpsertPodGroup(pg)
	if pg = cycle(); pg.Annotations[v1alpha1.AnnotationTopologyRequired] != "example.com/block" {
		t.Errorf("PodGroup's required level %q after a tenant's edit, want the rule's written back", pg.Annotations[v1alpha1.AnnotationTopologyRequired])
	}

	// The rule changes: one level and no sub-groups. The PodGroup says so,
	// without the levels and sub-groups it no longer asks.
	one := v1alpha1.TopologyRequest{Required: "example.com/block"}
	table["w-0"], table["w-1"] = mapping("w-0", one, nil), mapping("w-1", one, nil)
	cache.Remap([]types.UID{pods[0].UID, pods[1].UID})
	pg = cycle()
	if diff := cmp.Diff(map[string]string{v1alpha1.AnnotationTopologyRequired: "example.com/block"}, topologyOf(pg)); diff != "" {
		t.Errorf("PodGroup's topology after the rule changed (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(v1alpha1.PodGroupSpec{MinMember: 2}, pg.Spec); diff != "" {
		t.Errorf("PodGroup's spec after the rule changed (-want +got):\n%s", diff)
	}
	if pg.Annotations[v1alpha1.AnnotationWorkload] != "JobSet/ft" {
		t.Errorf("PodGroup annotations %v lost the workload's name", pg.Annotations)
	}

	// In sync: the loop writes nothing more.
	rv := pg.ResourceVersion
	if pg = cycle(); pg.ResourceVersion != rv {
		t.Errorf("PodGroup written again though it says what the rule says: resourceVersion %s, was %s", pg.ResourceVersion, rv)
	}
}
