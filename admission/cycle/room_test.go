package cycle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	. "github.com/partita-dev/partita/internal/partitatest"
)

// TestNodeRoom: the cycle weighs what kube-scheduler's NodeResourcesFit
// checks on the node it pins a member to (allocatable pods, CPU and
// memory, less what the pods bound or pinned there request, and the
// members placed in the same cycle), and says so when that is why a
// workload waits.
func TestNodeRoom(t *testing.T) {
	h100 := func(name string, n int) *v1alpha1.GPUNode {
		return MakeGPUNode(name).Devices(n, "NVIDIA H100 80GB HBM3", 81559).Obj()
	}
	two := []*v1alpha1.GPUNode{h100("n-0", 8), h100("n-1", 8)}
	one := two[:1]
	queueA := MakeQueue("a").Obj()
	// busy is a pod without GPUs bound to node: a web server, a sidecar
	// DaemonSet's pod.
	busy := func(name, node string) *PodWrapper {
		return MakePod(name, "ns").Node(node).Created(t0)
	}
	cpu := func(p *PodWrapper, v string) *PodWrapper { return p.Request(DefaultContainer, corev1.ResourceCPU, v) }
	mem := func(p *PodWrapper, v string) *PodWrapper {
		return p.Request(DefaultContainer, corev1.ResourceMemory, v)
	}
	member := func(name string) *PodWrapper { return gated(name, "a", 1).PodGroup("g") }
	gangOf := func(n int32) *v1alpha1.PodGroup { return MakePodGroup("g", "ns").MinMember(n).Obj() }

	cases := map[string]struct {
		world world
		want  outcome
	}{
		"a node at its pods limit is skipped": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "2").Obj(), MakeNode("n-1").Obj()},
				gpuNodes: two, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{busy("web-0", "n-0").Obj(), busy("web-1", "n-0").Obj(), gated("p", "a", 1).Obj()},
			},
			want: outcome{Admitted: map[string][]string{"ns/p": {"p@n-1"}}},
		},
		"a pod waits for room for more pods, and says so": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "2").Obj()},
				gpuNodes: one, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{busy("web-0", "n-0").Obj(), busy("web-1", "n-0").Obj(), gated("p", "a", 1).Obj()},
			},
			want: outcome{Waiting: map[string]string{"ns/p": "WaitingForCapacity: pod needs 1 GPU; node n-0 has no room for more pods (2 of 2)"}},
		},
		"a gang waits when no node has room for more pods": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "1").Obj(), MakeNode("n-1").Allocatable(corev1.ResourcePods, "1").Obj()},
				gpuNodes: two, queues: []*v1alpha1.Queue{queueA}, podGroups: []*v1alpha1.PodGroup{gangOf(2)},
				pods: []*corev1.Pod{busy("web-0", "n-0").Obj(), busy("web-1", "n-1").Obj(), member("g-0").Obj(), member("g-1").Obj()},
			},
			want: outcome{Waiting: map[string]string{"ns/g": "WaitingForCapacity: gang needs 2 × 1 GPU; none of the 2 GPU nodes it may run on has room for pods, CPU and memory: " +
				"node n-0 has no room for more pods (1 of 1); node n-1 has no room for more pods (1 of 1)"}},
		},
		"a node short of CPU is skipped": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourceCPU, "2").Obj(), MakeNode("n-1").Obj()},
				gpuNodes: two, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{cpu(busy("web", "n-0"), "1500m").Obj(), cpu(gated("p", "a", 1), "1").Obj()},
			},
			want: outcome{Admitted: map[string][]string{"ns/p": {"p@n-1"}}},
		},
		"a pod waits for CPU, and says so": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourceCPU, "2").Obj()},
				gpuNodes: one, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{cpu(busy("web", "n-0"), "1500m").Obj(), cpu(gated("p", "a", 1), "1").Obj()},
			},
			want: outcome{Waiting: map[string]string{"ns/p": "WaitingForCapacity: pod needs 1 GPU; node n-0 has 500m of 2 CPUs free and the pod asks for 1"}},
		},
		"a node short of memory is skipped": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourceMemory, "16Gi").Obj(), MakeNode("n-1").Obj()},
				gpuNodes: two, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{mem(busy("cache", "n-0"), "12Gi").Obj(), mem(gated("p", "a", 1), "8Gi").Obj()},
			},
			want: outcome{Admitted: map[string][]string{"ns/p": {"p@n-1"}}},
		},
		"a pod waits for memory, and says so": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourceMemory, "16Gi").Obj()},
				gpuNodes: one, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{mem(busy("cache", "n-0"), "12Gi").Obj(), mem(gated("p", "a", 1), "8Gi").Obj()},
			},
			want: outcome{Waiting: map[string]string{"ns/p": "WaitingForCapacity: pod needs 1 GPU; node n-0 has 4Gi of 16Gi of memory free and the pod asks for 8Gi"}},
		},
		"init containers count as kube-scheduler counts them": {
			// The largest init container (3 CPUs) outweighs the containers
			// (1 CPU): the pod asks for 3, and the node has 2.
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourceCPU, "2").Obj(), MakeNode("n-1").Obj()},
				gpuNodes: two, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{
					cpu(gated("p", "a", 1), "1").InitContainer("setup").Request("setup", corev1.ResourceCPU, "3").Obj(),
				},
			},
			want: outcome{Admitted: map[string][]string{"ns/p": {"p@n-1"}}},
		},
		"a node that publishes no allocatable pods is skipped": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").NoAllocatable(corev1.ResourcePods).Obj(), MakeNode("n-1").Obj()},
				gpuNodes: two, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{gated("p", "a", 1).Obj()},
			},
			want: outcome{Admitted: map[string][]string{"ns/p": {"p@n-1"}}},
		},
		"a node with zero allocatable pods takes none": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "0").Obj()},
				gpuNodes: one, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{gated("p", "a", 1).Obj()},
			},
			want: outcome{Waiting: map[string]string{"ns/p": "WaitingForCapacity: pod needs 1 GPU; node n-0 publishes no allocatable pods (no kubelet, or kwok, has reported its capacity)"}},
		},
		"members on one node respect its remaining room": {
			// Binpacking would put the whole gang on n-0, which has the
			// GPUs but room for two more pods: the third goes to n-1.
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "3").Obj(), MakeNode("n-1").Obj()},
				gpuNodes: two,
				queues:   []*v1alpha1.Queue{queueA}, podGroups: []*v1alpha1.PodGroup{gangOf(3)},
				pods: []*corev1.Pod{busy("web", "n-0").Obj(), member("g-0").Obj(), member("g-1").Obj(), member("g-2").Obj()},
			},
			want: outcome{Admitted: map[string][]string{"ns/g": {"g-0@n-0", "g-1@n-0", "g-2@n-1"}}},
		},
		"a gang the GPUs take but the room does not says so": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "3").Obj()},
				gpuNodes: one, queues: []*v1alpha1.Queue{queueA}, podGroups: []*v1alpha1.PodGroup{gangOf(3)},
				pods: []*corev1.Pod{busy("web", "n-0").Obj(), member("g-0").Obj(), member("g-1").Obj(), member("g-2").Obj()},
			},
			want: outcome{Waiting: map[string]string{"ns/g": "WaitingForCapacity: gang needs 3 × 1 GPU; its GPUs are free, but the nodes' room for pods, CPU and memory takes only 2 of the 3: " +
				"node n-0 has room for 2 more pods (1 of 3)"}},
		},
		"a gang short of GPUs says so, not the room": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "3").Obj()},
				gpuNodes: []*v1alpha1.GPUNode{h100("n-0", 2)}, queues: []*v1alpha1.Queue{queueA}, podGroups: []*v1alpha1.PodGroup{gangOf(3)},
				pods: []*corev1.Pod{busy("web", "n-0").Obj(), member("g-0").Obj(), member("g-1").Obj(), member("g-2").Obj()},
			},
			want: outcome{Waiting: map[string]string{"ns/g": "WaitingForCapacity: gang needs 3 × 1 GPU; at most 2 fit now"}},
		},
		"a pod whose GPUs are free only where there is no room says so": {
			// n-1 has room but no GPU free; n-0 has a GPU but no room.
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "1").Obj(), MakeNode("n-1").Obj()},
				gpuNodes: []*v1alpha1.GPUNode{h100("n-0", 1), h100("n-1", 1)}, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{busy("web", "n-0").Obj(), running("busy", "a", "n-1", 1, t0).Obj(), gated("p", "a", 1).Obj()},
			},
			want: outcome{Waiting: map[string]string{"ns/p": "WaitingForCapacity: pod needs 1 GPU; its GPUs are free, but not on a node with room for pods, CPU and memory: " +
				"node n-0 has no room for more pods (1 of 1)"}},
		},
		"workloads admitted in one cycle share a node's room": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "1").Obj()},
				gpuNodes: one, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{gated("first", "a", 1).Obj(), gated("second", "a", 1).Created(t0.Add(time.Second)).Obj()},
			},
			want: outcome{
				Admitted: map[string][]string{"ns/first": {"first@n-0"}},
				Waiting:  map[string]string{"ns/second": "WaitingForCapacity: pod needs 1 GPU; node n-0 has no room for more pods (1 of 1)"},
			},
		},
		"a member pinned to a node and not bound yet takes its room": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourcePods, "1").Obj(), MakeNode("n-1").Obj()},
				gpuNodes: two, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{
					MakePod("pinned", "ns").Queue("a").GPUCount(1).PodGroup("old").Created(t0).
						Annotation(v1alpha1.AnnotationNode, "n-0").Annotation(v1alpha1.AnnotationAdmitted, t0.Format(time.RFC3339)).Obj(),
					gated("p", "a", 1).Obj(),
				},
			},
			want: outcome{Admitted: map[string][]string{"ns/p": {"p@n-1"}}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, _ := runWorld(t, tc.world, Options{})
			checkOutcome(t, tc.want, got)
		})
	}
}

// TestCacheCountsNodeRoom: a node's pods, CPU and memory follow its pods
// through their life: pinned by the loop, bound, finished or deleted.
func TestCacheCountsNodeRoom(t *testing.T) {
	gatedPod := gated("m", "a", 1).PodGroup("g").Request(DefaultContainer, corev1.ResourceCPU, "2")
	pinned := gatedPod.Clone()
	pinned.Spec.SchedulingGates = nil
	pinned.Annotation(v1alpha1.AnnotationNode, "n-0")
	bound := pinned.Clone().Node("n-0")
	done := bound.Clone().Phase(corev1.PodSucceeded)
	web := MakePod("web", "ns").Node("n-0").Request(DefaultContainer, corev1.ResourceMemory, "1Gi")

	type room struct{ Pods, CPUMilli, Memory int64 }
	cases := map[string]struct {
		pods    []*corev1.Pod
		deleted bool
		want    room
	}{
		"a gated member takes no room":        {pods: []*corev1.Pod{gatedPod.Obj()}},
		"a pinned member takes its node's":    {pods: []*corev1.Pod{gatedPod.Obj(), pinned.Obj()}, want: room{Pods: 1, CPUMilli: 2000}},
		"a bound member counts once":          {pods: []*corev1.Pod{pinned.Obj(), bound.Obj()}, want: room{Pods: 1, CPUMilli: 2000}},
		"a finished member gives it back":     {pods: []*corev1.Pod{bound.Obj(), done.Obj()}},
		"a deleted member gives it back":      {pods: []*corev1.Pod{bound.Obj()}, deleted: true},
		"pods without GPUs count as well":     {pods: []*corev1.Pod{web.Obj()}, want: room{Pods: 1, Memory: 1 << 30}},
		"pods of every kind add up on a node": {pods: []*corev1.Pod{web.Obj(), pinned.Obj()}, want: room{Pods: 2, CPUMilli: 2000, Memory: 1 << 30}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := NewCache()
			c.UpsertNode(MakeNode("n-0").Obj())
			for _, p := range tc.pods {
				c.UpsertPod(p)
			}
			if tc.deleted {
				c.DeletePod(tc.pods[len(tc.pods)-1].UID)
			}
			n := c.State().Nodes["n-0"]
			got := room{Pods: n.Pods, CPUMilli: n.CPUMilli, Memory: n.Memory}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("room taken on n-0 (-want +got):\n%s", diff)
			}
		})
	}
}
