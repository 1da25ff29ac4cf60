package cycle

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	. "github.com/partita-dev/partita/internal/partitatest"
)

const (
	labelBlock = "network.example.com/block"
	labelRack  = "network.example.com/rack"
)

// rackedNodes is blocks × racks × nodes of gpus each, named b0-r1-0 and
// labelled with their block and rack; rack names repeat across blocks, as
// a Topology's domains are told apart by every broader level.
func rackedNodes(blocks, racks, nodes, gpus int) ([]*corev1.Node, []*v1alpha1.GPUNode) {
	var ns []*corev1.Node
	var gns []*v1alpha1.GPUNode
	for b := range blocks {
		for r := range racks {
			for i := range nodes {
				name := fmt.Sprintf("b%d-r%d-%d", b, r, i)
				ns = append(ns, MakeNode(name).Label(labelBlock, fmt.Sprintf("b%d", b)).Label(labelRack, fmt.Sprintf("r%d", r)).Obj())
				gns = append(gns, MakeGPUNode(name).Devices(gpus, "NVIDIA H100 80GB HBM3", 81559).Obj())
			}
		}
	}
	return ns, gns
}

// rackOf is "b0-r1" for node b0-r1-0.
func rackOf(node string) string { return node[:strings.LastIndex(node, "-")] }

// racksUsed are the racks each admitted workload's members were placed
// in, and the waits, from a cycle's result.
type racksUsed struct {
	Racks   map[string][]string
	Waiting map[string]string
	Evicted []string
}

func racksOf(o outcome, evictedOn map[string]string) racksUsed {
	out := racksUsed{Racks: map[string][]string{}, Waiting: o.Waiting}
	for w, members := range o.Admitted {
		var racks []string
		for _, m := range members {
			racks = append(racks, rackOf(m[strings.Index(m, "@")+1:]))
		}
		slices.Sort(racks)
		out.Racks[w] = slices.Compact(racks)
	}
	for _, e := range o.Evicted {
		name := strings.TrimPrefix(strings.Fields(e)[0], "ns/")
		out.Evicted = append(out.Evicted, rackOf(evictedOn[name]))
	}
	slices.Sort(out.Evicted)
	if len(out.Waiting) == 0 {
		out.Waiting = nil
	}
	return out
}

// topoGang is a gang of n pods of q asking gpus each, with annotations
// on its pods.
func topoGang(name, q string, n, gpus int, ann map[string]string) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, gated(fmt.Sprintf("%s-%d", name, i), q, gpus).PodGroup(name).Annotations(ann).Obj())
	}
	return pods
}

func TestTopologyPlacement(t *testing.T) {
	nodes, gns := rackedNodes(2, 2, 2, 4) // 8 nodes, 4 racks of 8 GPUs
	topo := MakeTopology("net", labelBlock, labelRack, "kubernetes.io/hostname").Obj()
	queueA := MakeQueue("a").Obj()
	required := map[string]string{v1alpha1.AnnotationTopology: "net", v1alpha1.AnnotationTopologyRequired: labelRack}
	// busy fills n GPUs of node with single pods of queue a.
	busy := func(node string, n int) []*corev1.Pod {
		var out []*corev1.Pod
		for i := range n {
			out = append(out, running(fmt.Sprintf("busy-%s-%d", node, i), "a", node, 1, t0).Obj())
		}
		return out
	}
	pg := func(name string, n int32) *v1alpha1.PodGroup { return MakePodGroup(name, "ns").MinMember(n).Obj() }

	cases := map[string]struct {
		pods      []*corev1.Pod
		podGroups []*v1alpha1.PodGroup
		topos     []*v1alpha1.Topology
		want      racksUsed
	}{
		"a required gang lands in one rack, the fullest that takes it": {
			// b1-r1 has 6 free, the others 8: best fit keeps a whole rack.
			pods:      append(busy("b1-r1-0", 2), topoGang("train", "a", 6, 1, required)...),
			podGroups: []*v1alpha1.PodGroup{pg("train", 6)},
			want:      racksUsed{Racks: map[string][]string{"ns/train": {"b1-r1"}}},
		},
		"a gang that fits the cluster but no rack waits, naming the roomiest": {
			pods:      append(busy("b0-r0-0", 1), topoGang("big", "a", 10, 1, required)...),
			podGroups: []*v1alpha1.PodGroup{pg("big", 10)},
			want: racksUsed{Racks: map[string][]string{}, Waiting: map[string]string{
				"ns/big": "WaitingForCapacity: gang needs 10 × 1 GPU; it needs 10 GPUs in one network.example.com/rack; the roomiest, r1, has 8 free",
			}},
		},
		"a preferred gang spans the fewest racks": {
			pods:      topoGang("wide", "a", 12, 1, map[string]string{v1alpha1.AnnotationTopology: "net", v1alpha1.AnnotationTopologyPreferred: labelRack}),
			podGroups: []*v1alpha1.PodGroup{pg("wide", 12)},
			want:      racksUsed{Racks: map[string][]string{"ns/wide": {"b0-r0", "b0-r1"}}},
		},
		"a preferred gang that fits one rack takes the fullest that does": {
			pods:      append(busy("b0-r1-1", 3), topoGang("small", "a", 5, 1, map[string]string{v1alpha1.AnnotationTopologyPreferred: labelRack})...),
			podGroups: []*v1alpha1.PodGroup{pg("small", 5)},
			topos:     []*v1alpha1.Topology{},
			// Without any Topology the rack label alone is the domain: r1
			// of both blocks is one, with 13 free; r0 has 16.
			want: racksUsed{Racks: map[string][]string{"ns/small": {"b0-r1"}}},
		},
		"KAI's annotations place as Partita's do": {
			pods: append(busy("b1-r1-0", 2), topoGang("train", "a", 6, 1, map[string]string{
				v1alpha1.AnnotationKAITopology: "net", v1alpha1.AnnotationKAITopologyRequired: labelRack,
			})...),
			podGroups: []*v1alpha1.PodGroup{pg("train", 6)},
			want:      racksUsed{Racks: map[string][]string{"ns/train": {"b1-r1"}}},
		},
		"Kueue's annotations place as Partita's do": {
			pods: append(busy("b1-r1-0", 2), topoGang("train", "a", 6, 1, map[string]string{
				v1alpha1.AnnotationKueueTopologyRequired: labelRack,
			})...),
			podGroups: []*v1alpha1.PodGroup{pg("train", 6)},
			// Kueue names no Topology: its level is read in the one that
			// has it.
			want: racksUsed{Racks: map[string][]string{"ns/train": {"b1-r1"}}},
		},
		"the PodGroup's annotations ask for the gang": {
			pods: append(busy("b1-r1-0", 2), topoGang("train", "a", 6, 1, nil)...),
			podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(6).
				Annotation(v1alpha1.AnnotationTopology, "net").Annotation(v1alpha1.AnnotationTopologyRequired, labelRack).Obj()},
			want: racksUsed{Racks: map[string][]string{"ns/train": {"b1-r1"}}},
		},
		"sub-groups each land in a rack of their own, within one block": {
			// Block b0 has 10 free in racks of 6 and 4 (b0-r0 busy 2,
			// b0-r1 busy 4); b1 has 16. The gang of 2 × 4 needs one block
			// and a rack for each part: b0 takes it, one part a rack.
			pods: func() []*corev1.Pod {
				out := append(busy("b0-r0-0", 2), busy("b0-r1-0", 4)...)
				for i := range 8 {
					part := fmt.Sprintf("part-%d", i/4)
					out = append(out, gated(fmt.Sprintf("job-%d", i), "a", 1).PodGroup("job").Label(v1alpha1.LabelSubGroup, part).Obj())
				}
				return out
			}(),
			podGroups: []*v1alpha1.PodGroup{MakePodGroup("job", "ns").MinMember(8).
				Annotation(v1alpha1.AnnotationTopology, "net").Annotation(v1alpha1.AnnotationTopologyRequired, labelBlock).
				SubGroup("part-0", 4, labelRack, "").SubGroup("part-1", 4, labelRack, "").Obj()},
			want: racksUsed{Racks: map[string][]string{"ns/job": {"b0-r0", "b0-r1"}}},
		},
		"a topology that does not exist: the gang waits and says so": {
			pods:      topoGang("train", "a", 2, 1, map[string]string{v1alpha1.AnnotationTopology: "nope", v1alpha1.AnnotationTopologyRequired: labelRack}),
			podGroups: []*v1alpha1.PodGroup{pg("train", 2)},
			want: racksUsed{Racks: map[string][]string{}, Waiting: map[string]string{
				"ns/train": "WaitingForCapacity: gang needs 2 × 1 GPU; it names topology nope, which does not exist: create it (kubectl get topologies lists those that do), or name another in partita.dev/topology",
			}},
		},
		"a level the topology does not have: the gang waits and says so": {
			pods:      topoGang("train", "a", 2, 1, map[string]string{v1alpha1.AnnotationTopology: "net", v1alpha1.AnnotationTopologyRequired: "zone"}),
			podGroups: []*v1alpha1.PodGroup{pg("train", 2)},
			want: racksUsed{Racks: map[string][]string{}, Waiting: map[string]string{
				"ns/train": "WaitingForCapacity: gang needs 2 × 1 GPU; it asks for required level zone, which is not a level of topology net (its levels: network.example.com/block, network.example.com/rack, kubernetes.io/hostname)",
			}},
		},
		"members that need a node each still get one rack": {
			// Host ports: one member a node. A rack has 2 nodes, so 3
			// members need... no rack: they wait.
			pods: func() []*corev1.Pod {
				var out []*corev1.Pod
				for i := range 3 {
					p := gated(fmt.Sprintf("hp-%d", i), "a", 1).PodGroup("hp").Annotations(required).Obj()
					p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 8080}}
					out = append(out, p)
				}
				return out
			}(),
			podGroups: []*v1alpha1.PodGroup{pg("hp", 3)},
			want: racksUsed{Racks: map[string][]string{}, Waiting: map[string]string{
				"ns/hp": "WaitingForCapacity: gang needs 3 × 1 GPU; it needs 3 GPUs in one network.example.com/rack; the roomiest, r0, has 8 free, but not in a shape the members fit (place gang: member 3 of 3 does not fit: no candidate node fits main: 1 × 1)",
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			topos := tc.topos
			if topos == nil {
				topos = []*v1alpha1.Topology{topo}
			}
			got, _ := runWorld(t, world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{queueA}, pods: tc.pods, podGroups: tc.podGroups, topologies: topos}, Options{})
			// Waiting busy pods are none; admitted ones are the gang's.
			if diff := cmp.Diff(tc.want, racksOf(got, nil)); diff != "" {
				t.Errorf("placement (-want +got):\n%s\nfull outcome: %+v", diff, got)
			}
		})
	}
}

// TestTopologyReclaim: a gang that needs one rack reclaims room inside
// one rack, not a little from each.
func TestTopologyReclaim(t *testing.T) {
	nodes, gns := rackedNodes(1, 2, 2, 4) // 2 racks of 8 GPUs
	topo := MakeTopology("net", labelBlock, labelRack).Obj()
	// a runs 16 single pods, started in turn on alternate racks, the
	// youngest last; b (fair share 8) asks for a gang of 8 in one rack.
	var pods []*corev1.Pod
	on := map[string]string{}
	for i := range 16 {
		node := fmt.Sprintf("b0-r%d-%d", i%2, (i/2)%2)
		name := fmt.Sprintf("a-%d", i)
		on[name] = node
		pods = append(pods, running(name, "a", node, 1, t0.Add(time.Duration(i)*time.Second)).Obj())
	}
	pods = append(pods, topoGang("train", "b", 8, 1, map[string]string{v1alpha1.AnnotationTopology: "net", v1alpha1.AnnotationTopologyRequired: labelRack})...)
	got, _ := runWorld(t, world{
		nodes: nodes, gpuNodes: gns, topologies: []*v1alpha1.Topology{topo},
		queues:    []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj()},
		pods:      pods,
		podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(8).Obj()},
	}, Options{Now: t0.Add(time.Hour)})
	want := racksUsed{
		Racks:   map[string][]string{},
		Evicted: []string{"b0-r0", "b0-r0", "b0-r0", "b0-r0", "b0-r0", "b0-r0", "b0-r0", "b0-r0"},
	}
	res := racksOf(got, on)
	res.Waiting = nil
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("reclaim (-want +got):\n%s\nfull outcome: %+v", diff, got)
	}
	if w := got.Waiting["ns/train"]; !strings.HasPrefix(w, "WaitingForCapacity: evicting 8 workload(s) to make room") {
		t.Errorf("the gang's wait is %q, want it to say it evicts 8", w)
	}
}

// TestTopologyMembersOfTheirOwnNode: members with host ports are placed
// one a node inside one rack, left to kube-scheduler (not pinned), and
// released with the rack's labels to stay in.
func TestTopologyMembersOfTheirOwnNode(t *testing.T) {
	nodes, gns := rackedNodes(1, 2, 2, 4)
	var pods []*corev1.Pod
	for i := range 2 {
		p := gated(fmt.Sprintf("hp-%d", i), "a", 1).PodGroup("hp").Annotations(map[string]string{
			v1alpha1.AnnotationTopology: "net", v1alpha1.AnnotationTopologyRequired: labelRack,
		}).Obj()
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 8080}}
		pods = append(pods, p)
	}
	_, res := runWorld(t, world{
		nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{MakeQueue("a").Obj()}, pods: pods,
		podGroups:  []*v1alpha1.PodGroup{MakePodGroup("hp", "ns").MinMember(2).Obj()},
		topologies: []*v1alpha1.Topology{MakeTopology("net", labelBlock, labelRack).Obj()},
	}, Options{})
	if len(res.Admissions) != 1 {
		t.Fatalf("admissions %+v, want the gang's", res.Admissions)
	}
	a := res.Admissions[0]
	if a.Pin {
		t.Errorf("the gang is pinned; members with host ports are left to kube-scheduler")
	}
	got := map[string]map[string]string{}
	var onNodes []string
	for _, m := range a.Members {
		got[m.Member.Pod.Name] = m.Domain
		onNodes = append(onNodes, m.Allocation.Node)
	}
	rack := map[string]string{labelBlock: "b0", labelRack: rackOf(onNodes[0])[len("b0-"):]}
	want := map[string]map[string]string{"hp-0": rack, "hp-1": rack}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("domains (-want +got):\n%s", diff)
	}
	if onNodes[0] == onNodes[1] {
		t.Errorf("both members simulated on %s; each needs a node", onNodes[0])
	}
}

// TestTopologyPreferredHosts: a gang that prefers hosts runs on as few as
// it can, the roomiest first.
func TestTopologyPreferredHosts(t *testing.T) {
	nodes, gns := rackedNodes(1, 2, 2, 4)
	pods := []*corev1.Pod{
		running("busy-0", "a", "b0-r0-0", 1, t0).Obj(),
		running("busy-1", "a", "b0-r1-0", 2, t0).Obj(),
	}
	pods = append(pods, topoGang("train", "a", 6, 1, map[string]string{v1alpha1.AnnotationTopologyPreferred: "kubernetes.io/hostname"})...)
	got, _ := runWorld(t, world{
		nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{MakeQueue("a").Obj()}, pods: pods,
		podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(6).Obj()},
	}, Options{})
	hosts := map[string]int{}
	for _, m := range got.Admitted["ns/train"] {
		hosts[m[strings.Index(m, "@")+1:]]++
	}
	// b0-r0-1 and b0-r1-1 have 4 free each, b0-r0-0 3, b0-r1-0 2: two
	// whole nodes hold 4 + 2.
	if len(hosts) != 2 || hosts["b0-r1-1"] == 0 {
		t.Errorf("gang train (preferred host) ran on %v, want two hosts, b0-r1-1 one of them (the roomiest)", hosts)
	}
}

// TestTopologyDomainsAcrossCycles: domains kept from cycle to cycle
// (Options.Domains) read each cycle's free room afresh, and are grouped
// again when a node's labels change.
func TestTopologyDomainsAcrossCycles(t *testing.T) {
	nodes, gns := rackedNodes(1, 2, 2, 4) // racks r0 (b0-r0-0, b0-r0-1) and r1, 8 GPUs each
	topo := MakeTopology("net", labelBlock, labelRack, "kubernetes.io/hostname").Obj()
	required := map[string]string{v1alpha1.AnnotationTopology: "net", v1alpha1.AnnotationTopologyRequired: labelRack}
	busy := running("busy", "a", "b0-r1-0", 2, t0).Obj()
	w := world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{MakeQueue("a").Obj()}, topologies: []*v1alpha1.Topology{topo},
		pods:      append(append([]*corev1.Pod{busy}, topoGang("train", "a", 6, 1, required)...), topoGang("later", "a", 8, 1, required)...),
		podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(6).Obj(), MakePodGroup("later", "ns").MinMember(8).Obj()}}
	cache, ledger := w.build(t)
	var domains Domains
	// nodesOf are the nodes gang train was placed on.
	nodesOf := func(res *Result) []string {
		var out []string
		for _, a := range res.Admissions {
			if a.Workload.Key.PodGroup != "train" {
				continue
			}
			for _, m := range a.Members {
				out = append(out, m.Allocation.Node)
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	cycle := func() *Result {
		return Run(t.Context(), cache.State(), ledger.Snapshot(), limitQuota{}, Options{Now: t0.Add(time.Hour), Domains: &domains})
	}
	// r1 has 6 free, r0 8: best fit takes r1 for train, and later, older
	// by name only, takes r0. Nothing is bound, so every cycle finds the
	// room as it was, not as the last cycle left it on its snapshot.
	for i := range 2 {
		res := cycle()
		if got, want := nodesOf(res), []string{"b0-r1-0", "b0-r1-1"}; !slices.Equal(got, want) || len(res.Admissions) != 2 {
			t.Fatalf("cycle %d placed train on %v (want %v), admitted %d workloads (want 2); waiting: %+v", i+1, got, want, len(res.Admissions), res.Waiting)
		}
	}
	// later goes; train stays pending.
	for _, p := range w.pods[7:] {
		cache.DeletePod(p.UID)
	}
	// A pod bound outside the loop takes 3 more GPUs of r1: the next cycle
	// reads r1's room again and goes to r0.
	more := running("more", "a", "b0-r1-1", 3, t0).Obj()
	cache.UpsertPod(more)
	req, errs := gpu.ParsePod(more)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	a, err := ledger.Choose("b0-r1-1", req, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := ledger.Assume(a); err != nil {
		t.Fatal(err)
	}
	if got, want := nodesOf(cycle()), []string{"b0-r0-0", "b0-r0-1"}; !slices.Equal(got, want) {
		t.Fatalf("after r1 filled, the gang was placed on %v, want %v", got, want)
	}
	// b0-r0-1 moves to rack r1: r0 keeps 4 GPUs, r1 has 7 free.
	moved := nodes[1].DeepCopy()
	moved.Labels[labelRack] = "r1"
	cache.UpsertNode(moved)
	got := nodesOf(cycle())
	if !slices.Contains(got, "b0-r0-1") || slices.Contains(got, "b0-r0-0") {
		t.Fatalf("after b0-r0-1 moved to rack r1, the gang was placed on %v, want nodes of r1 including b0-r0-1", got)
	}
}

// TestNodeEpoch: what places a node in domains and candidate sets moves
// the epoch that keeps Domains; a node's status (heartbeats) does not.
func TestNodeEpoch(t *testing.T) {
	base := MakeNode("n").Label(labelRack, "r0").Obj()
	cases := map[string]struct {
		change func(n *corev1.Node)
		want   bool
	}{
		"a heartbeat":                {change: func(n *corev1.Node) { n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady}} }},
		"the same labels, a new map": {change: func(n *corev1.Node) { n.Labels = maps.Clone(n.Labels) }},
		"a label changed":            {change: func(n *corev1.Node) { n.Labels[labelRack] = "r1" }, want: true},
		"a taint added":              {change: func(n *corev1.Node) { n.Spec.Taints = []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}} }, want: true},
		"cordoned":                   {change: func(n *corev1.Node) { n.Spec.Unschedulable = true }, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cache := NewCache()
			cache.UpsertNode(base)
			before := cache.State().NodeEpoch
			n := base.DeepCopy()
			tc.change(n)
			cache.UpsertNode(n)
			if got := cache.State().NodeEpoch != before; got != tc.want {
				t.Errorf("epoch moved = %v, want %v", got, tc.want)
			}
		})
	}
	cache := NewCache()
	cache.UpsertNode(base)
	before := cache.State().NodeEpoch
	cache.DeleteNode("n")
	if cache.State().NodeEpoch == before {
		t.Error("a deleted node did not move the epoch")
	}
}

// TestTopologyDomainsSeeNewGPUNodes: a node whose GPUNode appears after
// its Node (its agent started later) joins the kept domains at once.
func TestTopologyDomainsSeeNewGPUNodes(t *testing.T) {
	nodes, gns := rackedNodes(1, 2, 2, 4)
	topo := MakeTopology("net", labelBlock, labelRack, "kubernetes.io/hostname").Obj()
	required := map[string]string{v1alpha1.AnnotationTopology: "net", v1alpha1.AnnotationTopologyRequired: labelRack}
	// Rack r1's agents have not published yet; r0 has 4 GPUs free.
	w := world{nodes: nodes, gpuNodes: gns[:2], queues: []*v1alpha1.Queue{MakeQueue("a").Obj()}, topologies: []*v1alpha1.Topology{topo},
		pods:      append([]*corev1.Pod{running("busy", "a", "b0-r0-0", 4, t0).Obj()}, topoGang("train", "a", 6, 1, required)...),
		podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(6).Obj()}}
	cache, ledger := w.build(t)
	var domains Domains
	cycle := func() *Result {
		return Run(t.Context(), cache.State(), ledger.Snapshot(), limitQuota{}, Options{Now: t0.Add(time.Hour), Domains: &domains})
	}
	if res := cycle(); len(res.Admissions) != 0 {
		t.Fatalf("admitted %d workloads with 4 GPUs free in any rack, want none", len(res.Admissions))
	}
	for _, gn := range gns[2:] {
		ledger.UpsertNode(gn)
	}
	res := cycle()
	if len(res.Admissions) != 1 {
		t.Fatalf("after rack r1's GPUNodes appeared: admitted %d workloads, want the gang; waiting: %+v", len(res.Admissions), res.Waiting)
	}
	for _, m := range res.Admissions[0].Members {
		if rackOf(m.Allocation.Node) != "b0-r1" {
			t.Errorf("member %s placed on %s, want rack b0-r1", m.Member.Pod.Name, m.Allocation.Node)
		}
	}
}
