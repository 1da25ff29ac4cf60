package console

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

const h100MiB = 81559

// held is partitatest.Held in namespace ns.
func held(ns, name, node, amount string, uuids ...string) corev1.Pod {
	p := pt.Held(name, node, amount, h100MiB, uuids...)
	p.Namespace = ns
	p.UID = types.UID("uid-" + ns + "-" + name)
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	return *p
}

func node(name string, gpus int) v1alpha1.GPUNode {
	return *pt.MakeGPUNode(name).Devices(gpus, "NVIDIA-H100-80GB-HBM3", h100MiB).Obj()
}

func everything() Coverage {
	return Coverage{GPUNodes: true, Nodes: true, Queues: true, Policy: true, Pods: AllNamespaces(), PodGroups: AllNamespaces(), Jobs: AllNamespaces()}
}

func TestBuildMap(t *testing.T) {
	n1 := node("n1", 2)
	uuid := func(i int32) string { return pt.DeviceUUID("n1", i) }
	a := held("team-a", "nb", "n1", "0.25", uuid(0))
	a.Labels[v1alpha1.LabelQueue] = "team-a"
	b := held("team-b", "train", "n1", "1", uuid(1))
	b.Labels[v1alpha1.LabelQueue] = "team-b"
	// A slice the agent reports in a namespace the Source cannot read.
	withUnseen := n1.DeepCopy()
	withUnseen.Status.Slices = []v1alpha1.GPUSlice{{Namespace: "secret", Pod: "x", Container: "main", DeviceIndex: 0, Milli: 500}}
	cases := map[string]struct {
		lists Lists
		view  Viewer
		want  []MapGPU
	}{
		"everything visible": {
			lists: Lists{GPUNodes: []v1alpha1.GPUNode{n1}, Pods: []corev1.Pod{a, b}, Coverage: everything()},
			view:  Viewer{Pods: AllNamespaces()},
			want: []MapGPU{
				{Index: 0, UUID: uuid(0), Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: h100MiB, Health: "Healthy", Healthy: true, UsedMilli: 250, FreeMilli: 750,
					Slices: []MapSlice{{Namespace: "team-a", Pod: "nb", Container: "main", Queue: "team-a", Milli: 250, MemoryMiB: 20389, Workload: WorkloadRef{Kind: KindPod, Namespace: "team-a", Name: "nb"}}}},
				{Index: 1, UUID: uuid(1), Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: h100MiB, Health: "Healthy", Healthy: true, UsedMilli: 1000,
					Slices: []MapSlice{{Namespace: "team-b", Pod: "train", Container: "main", Queue: "team-b", Milli: 1000, Whole: true, Workload: WorkloadRef{Kind: KindPod, Namespace: "team-b", Name: "train"}}}},
			},
		},
		"another team's slice is counted, not named": {
			lists: Lists{GPUNodes: []v1alpha1.GPUNode{n1}, Pods: []corev1.Pod{a, b}, Coverage: everything()},
			view:  Viewer{Pods: Namespaces("team-a")},
			want: []MapGPU{
				{Index: 0, UUID: uuid(0), Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: h100MiB, Health: "Healthy", Healthy: true, UsedMilli: 250, FreeMilli: 750,
					Slices: []MapSlice{{Namespace: "team-a", Pod: "nb", Container: "main", Queue: "team-a", Milli: 250, MemoryMiB: 20389, Workload: WorkloadRef{Kind: KindPod, Namespace: "team-a", Name: "nb"}}}},
				{Index: 1, UUID: uuid(1), Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: h100MiB, Health: "Healthy", Healthy: true, UsedMilli: 1000,
					Slices: []MapSlice{}, HiddenMilli: 1000},
			},
		},
		"a namespace the Source cannot read shows from the agent's slices": {
			lists: Lists{GPUNodes: []v1alpha1.GPUNode{*withUnseen}, Pods: []corev1.Pod{a},
				Coverage: Coverage{GPUNodes: true, Pods: Namespaces("team-a"), PodGroups: Namespaces("team-a"), Jobs: Namespaces("team-a")}},
			view: Viewer{Pods: Namespaces("team-a")},
			want: []MapGPU{
				{Index: 0, UUID: uuid(0), Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: h100MiB, Health: "Healthy", Healthy: true, UsedMilli: 750, FreeMilli: 250,
					Slices: []MapSlice{{Namespace: "team-a", Pod: "nb", Container: "main", Queue: "team-a", Milli: 250, MemoryMiB: 20389, Workload: WorkloadRef{Kind: KindPod, Namespace: "team-a", Name: "nb"}}}, HiddenMilli: 500},
				{Index: 1, UUID: uuid(1), Model: "NVIDIA-H100-80GB-HBM3", MemoryMiB: h100MiB, Health: "Healthy", Healthy: true, FreeMilli: 1000, Slices: []MapSlice{}},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := Build(tc.lists, BuildOptions{}, 1, time.Unix(100, 0), time.Unix(99, 0))
			if len(s.nodes) != 1 {
				t.Fatalf("got %d nodes, want 1", len(s.nodes))
			}
			got := filterNode(&s.nodes[0], tc.view)
			if diff := cmp.Diff(tc.want, got.GPUs); diff != "" {
				t.Errorf("GPUs (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestBuildMapUnhealthyAndTopology(t *testing.T) {
	gn := pt.MakeGPUNode("n1").Devices(2, "H100", h100MiB).UnhealthyDevice(1).Isolation(v1alpha1.IsolationMPS).Obj()
	n := pt.MakeNode("n1").Label("topology.kubernetes.io/zone", "zone-a").Obj()
	s := Build(Lists{GPUNodes: []v1alpha1.GPUNode{*gn}, Nodes: []corev1.Node{*n}, Coverage: everything()},
		BuildOptions{TopologyKey: "topology.kubernetes.io/zone"}, 1, time.Now(), time.Now())
	got := s.nodes[0]
	if got.Topology != "zone-a" || got.Isolation != v1alpha1.IsolationMPS {
		t.Errorf("topology %q isolation %q, want zone-a, mps", got.Topology, got.Isolation)
	}
	if g := got.GPUs[1]; g.Healthy || g.FreeMilli != 0 || g.Health == "Healthy" {
		t.Errorf("unhealthy device reads %+v", g)
	}
	if s.capacityMilli != 1000 {
		t.Errorf("capacity %d, want 1000 (one healthy GPU)", s.capacityMilli)
	}
}

func TestBuildWorkloads(t *testing.T) {
	gn := node("n1", 8)
	uuid := func(i int32) string { return pt.DeviceUUID("n1", i) }
	created := time.Unix(1000, 0)
	job0 := held("team-a", "job-0", "n1", "1", uuid(0))
	job0.OwnerReferences = pt.MakePod("x", "team-a").OwnedBy("Job", "train").Obj().OwnerReferences
	job0.CreationTimestamp.Time = created
	job1 := *pt.MakePod("job-1", "team-a").GPUCount(1).Queue("team-a").OwnedBy("Job", "train").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(created.Add(time.Second)).Obj()
	g0 := held("team-b", "g-0", "n1", "0.5", uuid(1))
	g0.Labels[v1alpha1.LabelPodGroup] = "gang"
	g1 := *pt.MakePod("g-1", "team-b").GPUFraction("0.5").PodGroup("gang").Obj()
	done := *pt.MakePod("done", "team-b").GPUFraction("0.5").Phase(corev1.PodSucceeded).Obj()
	cpu := *pt.MakePod("cpu-only", "team-b").Obj()
	suspended := true
	job := batchv1.Job{}
	job.Name, job.Namespace, job.Spec.Suspend = "train", "team-a", &suspended
	pg := *pt.MakePodGroup("gang", "team-b").MinMember(2).Queue("team-b").Obj()

	s := Build(Lists{GPUNodes: []v1alpha1.GPUNode{gn}, Pods: []corev1.Pod{job0, job1, g0, g1, done, cpu},
		Jobs: []batchv1.Job{job}, PodGroups: []v1alpha1.PodGroup{pg}, Coverage: everything()}, BuildOptions{}, 1, time.Now(), time.Now())
	type row struct {
		Ref                   WorkloadRef
		Gang, Queue           string
		MinMember             int32
		Phase                 WorkloadPhase
		Requested, Held       int64
		Pods, Bound, Finished int
		Suspended             bool
		WaitingPod            string
	}
	var got []row
	for _, w := range s.workloads {
		r := row{Ref: w.WorkloadRef, Gang: w.Gang, Queue: w.Queue, MinMember: w.MinMember, Phase: w.Phase, Requested: w.RequestedMilli,
			Held: w.HeldMilli, Pods: w.Pods, Bound: w.Bound, Finished: w.Finished, Suspended: w.Suspended}
		if p := w.waitingMember(); p != nil {
			r.WaitingPod = p.Name
		}
		got = append(got, r)
	}
	want := []row{
		{Ref: WorkloadRef{KindJob, "team-a", "train"}, Queue: "team-a", Phase: PhaseWaiting, Requested: 2000, Held: 1000, Pods: 2, Bound: 1, Suspended: true, WaitingPod: "job-1"},
		{Ref: WorkloadRef{KindPod, "team-b", "done"}, Phase: PhaseSucceeded, Finished: 1},
		{Ref: WorkloadRef{KindPodGroup, "team-b", "gang"}, Gang: "gang", Queue: "team-b", MinMember: 2, Phase: PhaseWaiting, Requested: 1000, Held: 500, Pods: 2, Bound: 1, WaitingPod: "g-1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("workloads (-want,+got):\n%s", diff)
	}
	if ref := s.workloadOf(nsName{"team-b", "g-0"}); ref != (WorkloadRef{KindPodGroup, "team-b", "gang"}) {
		t.Errorf("the map's slice of g-0 points to %v", ref)
	}
}

func TestBuildQueues(t *testing.T) {
	q := pt.MakeQueue("team-a").Parent("org").GPU("4", "8", 2).Namespaces("team-a").Obj()
	q.Status.Allocated = corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("6")}
	q.Status.FairShare = corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("5")}
	q.Status.Requested = corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("7.5")}
	org := pt.MakeQueue("org").GPU("-1", "-1", 1).Obj()
	s := Build(Lists{Queues: []v1alpha1.Queue{*q, *org}, Coverage: everything()}, BuildOptions{}, 1, time.Now(), time.Now())
	if len(s.queues) != 2 || s.queues[0].Name != "org" || s.queues[1].Name != "team-a" || s.queues[1].Depth != 1 {
		t.Fatalf("tree order: %+v", s.queues)
	}
	f := func(v float64) *float64 { return &v }
	want := QueueResource{Quota: 4, Limit: 8, OverQuotaWeight: 2, Set: true, Allocated: f(6), FairShare: f(5), Requested: f(7.5),
		Pending: f(1.5), Borrowed: f(2), Reclaimable: f(1)}
	if diff := cmp.Diff(want, s.queues[1].Resources["gpu"]); diff != "" {
		t.Errorf("team-a gpu (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff(QueueResource{Quota: -1, Limit: -1, OverQuotaWeight: 1, Set: true}, s.queues[0].Resources["gpu"]); diff != "" {
		t.Errorf("org gpu (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff(QueueResource{Limit: -1, OverQuotaWeight: 1}, s.queues[1].Resources["cpu"]); diff != "" {
		t.Errorf("team-a cpu, unset (-want,+got):\n%s", diff)
	}
}

// TestBuildQueuesUsage: the queues carry status.usage per resource, and
// its window, only where the admission loop reports it.
func TestBuildQueuesUsage(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	cases := map[string]struct {
		queue      *v1alpha1.Queue
		wantGPU    QueueResource
		wantWindow string
	}{
		"time-based fair share off": {
			queue:   pt.MakeQueue("team-a").GPUStatus("6", "3", "7", 1).Obj(),
			wantGPU: QueueResource{Limit: -1, OverQuotaWeight: 1, Allocated: f(6), FairShare: f(3), Requested: f(7), Pending: f(1), Borrowed: f(6), Reclaimable: f(3)},
		},
		"history decided": {
			queue: pt.MakeQueue("team-a").GPUStatus("6", "3", "7", 1).UsageStatus("410.123456", "0.0004", "5").Obj(),
			wantGPU: QueueResource{Limit: -1, OverQuotaWeight: 1, Allocated: f(6), FairShare: f(3), Requested: f(7), Pending: f(1), Borrowed: f(6), Reclaimable: f(3),
				UsageHours: f(410.123456), UsageShare: f(0.0004), FairShareWithoutUsage: f(5)},
			wantWindow: "sliding 168h window, half-life 24h",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := Build(Lists{Queues: []v1alpha1.Queue{*tc.queue}, Coverage: everything()}, BuildOptions{}, 1, time.Now(), time.Now())
			if diff := cmp.Diff(tc.wantGPU, s.queues[0].Resources["gpu"]); diff != "" {
				t.Errorf("gpu (-want,+got):\n%s", diff)
			}
			if s.queues[0].UsageWindow != tc.wantWindow {
				t.Errorf("usageWindow %q, want %q", s.queues[0].UsageWindow, tc.wantWindow)
			}
		})
	}
}

func TestPolicyFromConfigMaps(t *testing.T) {
	cm := func(name, status string) corev1.ConfigMap {
		var c corev1.ConfigMap
		c.Name, c.Namespace = name, "partita-system"
		c.Annotations = map[string]string{"partita.dev/policy-status": status}
		return c
	}
	cases := map[string]struct {
		cms     []corev1.ConfigMap
		version string
		source  string
	}{
		"loaded":  {cms: []corev1.ConfigMap{cm("p", "Loaded: policy abc123")}, version: "abc123", source: "configmap:partita-system/p"},
		"refused": {cms: []corev1.ConfigMap{cm("b", "Refused: rego_parse_error: x; policy old456 stays in force"), cm("a", "")}, version: "old456", source: "configmap:partita-system/a,partita-system/b"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := policyFromConfigMaps(tc.cms, true)
			if v.Version != tc.version || v.Source != tc.source {
				t.Errorf("version %q source %q, want %q %q", v.Version, v.Source, tc.version, tc.source)
			}
		})
	}
	if v := policyFromConfigMaps(nil, true); v.Source != "default" || len(v.Version) != 12 {
		t.Errorf("no ConfigMaps: %+v, want the default bundle's version", v)
	}
}

func TestHashChangesWithTheNodeOnly(t *testing.T) {
	n1, n2 := node("n1", 1), node("n2", 1)
	a := held("ns", "p", "n1", "0.5", pt.DeviceUUID("n1", 0))
	s1 := Build(Lists{GPUNodes: []v1alpha1.GPUNode{n1, n2}, Coverage: everything()}, BuildOptions{}, 1, time.Now(), time.Now())
	s2 := Build(Lists{GPUNodes: []v1alpha1.GPUNode{n1, n2}, Pods: []corev1.Pod{a}, Coverage: everything()}, BuildOptions{}, 2, time.Now(), time.Now())
	ev := (&call{}).nodesEvent(s1, s2, Viewer{Pods: AllNamespaces()})
	if ev.Full || len(ev.Nodes) != 1 || ev.Nodes[0].Name != "n1" {
		t.Errorf("nodes event after a pod on n1: %+v", ev)
	}
	if ev := (&call{}).nodesEvent(s2, s2, Viewer{Pods: AllNamespaces()}); len(ev.Nodes) != 0 {
		t.Errorf("no change sends %d nodes", len(ev.Nodes))
	}
}

func TestBuildMapTopologies(t *testing.T) {
	const block, rack = "example.com/block", "example.com/rack"
	l := Lists{
		GPUNodes: []v1alpha1.GPUNode{node("n1", 1), node("n2", 1)},
		Nodes: []corev1.Node{
			*pt.MakeNode("n1").Label(block, "b1").Label(rack, "r1").Label("topology.kubernetes.io/zone", "z").Obj(),
			*pt.MakeNode("n2").Obj(),
		},
		Topologies: []v1alpha1.Topology{*pt.MakeTopology("racks", block, rack).Obj(), *pt.MakeTopology("blocks", block).Obj()},
		Coverage:   everything(),
	}
	s := Build(l, BuildOptions{TopologyKey: "topology.kubernetes.io/zone"}, 1, time.Now(), time.Now())
	if diff := cmp.Diff([]TopologyView{{Name: "blocks", Levels: []string{block}}, {Name: "racks", Levels: []string{block, rack}}}, s.topologies); diff != "" {
		t.Errorf("topologies (-want,+got):\n%s", diff)
	}
	// Only the level labels; the topology key's value has a field of its own.
	if diff := cmp.Diff(map[string]string{block: "b1", rack: "r1"}, s.nodes[0].Labels); diff != "" || s.nodes[0].Topology != "z" || s.nodes[1].Labels != nil {
		t.Errorf("n1 labels (-want,+got):\n%s; n1 topology %q, n2 labels %v", diff, s.nodes[0].Topology, s.nodes[1].Labels)
	}
	cases := map[string]struct {
		view Viewer
		want map[string]string
	}{
		"who may list Topologies gets the labels": {view: Viewer{Pods: AllNamespaces(), Topologies: true}, want: map[string]string{block: "b1", rack: "r1"}},
		"who may not does not":                    {view: Viewer{Pods: AllNamespaces()}},
		"nor with some namespaces only":           {view: Viewer{Pods: Namespaces("team-a")}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, filterNode(&s.nodes[0], tc.view).Labels); diff != "" {
				t.Errorf("labels (-want,+got):\n%s", diff)
			}
		})
	}
	other := Build(Lists{GPUNodes: l.GPUNodes, Nodes: l.Nodes, Topologies: l.Topologies[:1], Coverage: everything()}, BuildOptions{}, 2, time.Now(), time.Now())
	if other.topologyHash == s.topologyHash {
		t.Errorf("the topology hash did not change when a Topology went")
	}
}

func TestMapDomains(t *testing.T) {
	const zone, host = "topology.kubernetes.io/zone", "kubernetes.io/hostname"
	gpu := func(healthy bool, used, free int64) MapGPU {
		return MapGPU{Healthy: healthy, UsedMilli: used, FreeMilli: free}
	}
	nodes := []MapNode{
		{Name: "a", Labels: map[string]string{zone: "z1", host: "a"}, GPUs: []MapGPU{gpu(true, 250, 750), gpu(false, 0, 0)}},
		{Name: "b", Labels: map[string]string{zone: "z1", host: "b"}, GPUs: []MapGPU{gpu(true, 1000, 0)}},
		{Name: "c", GPUs: []MapGPU{gpu(true, 0, 1000)}},
	}
	cases := map[string]struct {
		levels []string
		nodes  []MapNode
		want   []MapDomain
	}{
		"zones, then hosts": {
			levels: []string{zone, host}, nodes: nodes,
			want: []MapDomain{
				{Level: zone, Value: "z1", NodeCount: 2, GPUs: 3, HealthyGPUs: 2, UsedMilli: 1250, FreeMilli: 750, Domains: []MapDomain{
					{Level: host, Value: "a", NodeCount: 1, GPUs: 2, HealthyGPUs: 1, UsedMilli: 250, FreeMilli: 750, Nodes: []string{"a"}},
					{Level: host, Value: "b", NodeCount: 1, GPUs: 1, HealthyGPUs: 1, UsedMilli: 1000, Nodes: []string{"b"}},
				}},
				{Level: zone, Missing: true, NodeCount: 1, GPUs: 1, HealthyGPUs: 1, FreeMilli: 1000, Domains: []MapDomain{
					{Level: host, Missing: true, NodeCount: 1, GPUs: 1, HealthyGPUs: 1, FreeMilli: 1000, Nodes: []string{"c"}},
				}},
			},
		},
		"the nodes the filters kept only": {
			levels: []string{zone}, nodes: nodes[1:2],
			want: []MapDomain{{Level: zone, Value: "z1", NodeCount: 1, GPUs: 1, HealthyGPUs: 1, UsedMilli: 1000, Nodes: []string{"b"}}},
		},
		"no nodes": {levels: []string{zone}, want: []MapDomain{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, mapDomains(tc.levels, tc.nodes)); diff != "" {
				t.Errorf("domains (-want,+got):\n%s", diff)
			}
		})
	}
}
