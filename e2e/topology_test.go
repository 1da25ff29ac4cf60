package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

const (
	e2eBlock = "network.example.com/block"
	e2eRack  = "network.example.com/rack"
)

// TestTopologyAwareGangs (issue 28) on kwok nodes labelled like a real
// cluster: 2 blocks × 2 racks × 2 nodes of 4 GPUs, rack names repeating
// across blocks, and a Topology of block, rack and host. A gang that
// requires a rack lands in one, the fullest that takes it; one written in
// KAI's keys lands in one rack too; a gang that fits the cluster but no
// rack waits, naming the level and the roomiest rack.
func TestTopologyAwareGangs(t *testing.T) {
	ctx := testContext(t, 6*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel, topo := rackedCluster(ctx, t, ns, 2, 2)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := "topo-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "0", "-1", 1))
	c := crClient(t)

	// Two GPUs of rack b1/r1 are taken: it has 6 free, the others 8.
	busy := busyPods(ns, q, "b1-r1-0", "b1-r1-0")
	createPods(ctx, t, clientset, busy, 2)
	waitBound(ctx, t, ns, "busy-", 2)

	gang := func(name string, n int, ann map[string]string) {
		t.Helper()
		if err := c.Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1alpha1.PodGroupSpec{MinMember: int32(n), Queue: q}}); err != nil {
			t.Fatalf("create PodGroup %s: %v", name, err)
		}
		pods := gangPods(ns, name, n, sel)
		for _, p := range pods {
			for k, v := range ann {
				p.Annotations[k] = v
			}
		}
		createPods(ctx, t, clientset, pods, 4)
	}
	// racks are the racks (block/rack) of the bound pods named prefix*.
	racks := func(prefix string) []string {
		var out []string
		for _, p := range listNS(ctx, t, ns) {
			if strings.HasPrefix(p.Name, prefix) && p.Spec.NodeName != "" {
				name := strings.TrimPrefix(p.Spec.NodeName, ns+"-")
				out = append(out, name[:strings.LastIndex(name, "-")])
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}

	gang("train", 6, map[string]string{v1alpha1.AnnotationTopology: topo, v1alpha1.AnnotationTopologyRequired: e2eRack})
	waitBound(ctx, t, ns, "train-", 6)
	if got := racks("train-"); !slices.Equal(got, []string{"b1-r1"}) {
		t.Errorf("gang train (required rack) ran in racks %v, want b1-r1 alone (the fullest rack that takes it)", got)
	}

	// KAI's dialect: the same request in its keys.
	gang("kai", 8, map[string]string{v1alpha1.AnnotationKAITopology: topo, v1alpha1.AnnotationKAITopologyRequired: e2eRack})
	waitBound(ctx, t, ns, "kai-", 8)
	if got := racks("kai-"); len(got) != 1 {
		t.Errorf("gang kai (KAI's required rack) ran in racks %v, want one", got)
	}

	// 10 GPUs fit the cluster (two racks have 8 free each) but no rack.
	gang("big", 10, map[string]string{v1alpha1.AnnotationTopology: topo, v1alpha1.AnnotationTopologyRequired: e2eRack})
	want := "needs 10 GPUs in one " + e2eRack + "; the roomiest, r"
	poll(t, 60*time.Second, "gang big waiting for a rack, saying so", func() (bool, string) {
		var seen []string
		for _, p := range listNS(ctx, t, ns) {
			if !strings.HasPrefix(p.Name, "big-") {
				continue
			}
			if p.Spec.NodeName != "" {
				return false, fmt.Sprintf("pod %s was bound to %s", p.Name, p.Spec.NodeName)
			}
			if cond := admissionCondition(&p); cond != nil {
				if cond.Reason == v1alpha1.ReasonWaitingForCapacity && strings.Contains(cond.Message, want) && strings.Contains(cond.Message, "has 8 free") {
					return true, ""
				}
				seen = append(seen, cond.Reason+": "+cond.Message)
			}
		}
		return false, fmt.Sprintf("conditions %q", seen)
	})
	// Kueue's dialect names no Topology: its level is read in the one that
	// has it. The gang goes past big, which waits for a rack.
	gang("kueue", 8, map[string]string{v1alpha1.AnnotationKueueTopologyRequired: e2eRack})
	waitBound(ctx, t, ns, "kueue-", 8)
	if got := racks("kueue-"); len(got) != 1 {
		t.Errorf("gang kueue (Kueue's required rack) ran in racks %v, want one", got)
	}
}

// waitBound waits until n pods of ns named prefix* are bound.
func waitBound(ctx context.Context, t *testing.T, ns, prefix string, n int) {
	t.Helper()
	poll(t, 90*time.Second, fmt.Sprintf("%d pods %s* bound", n, prefix), func() (bool, string) {
		bound, all := 0, 0
		var reasons []string
		for _, p := range listNS(ctx, t, ns) {
			if !strings.HasPrefix(p.Name, prefix) {
				continue
			}
			all++
			if p.Spec.NodeName != "" {
				bound++
			} else if cond := admissionCondition(&p); cond != nil {
				reasons = append(reasons, cond.Reason+": "+cond.Message)
			}
		}
		slices.Sort(reasons)
		return bound == n, fmt.Sprintf("%d of %d bound; waiting: %q", bound, all, slices.Compact(reasons))
	})
}

// rackedCluster adds blocks × racks × 2 kwok nodes of 4 GPUs named
// NS-bB-rR-I, labelled with their block and rack, and a Topology of block,
// rack and host; it returns the node selector of its nodes and the
// Topology's name.
func rackedCluster(ctx context.Context, t *testing.T, ns string, blocks, racks int) (map[string]string, string) {
	t.Helper()
	sel := map[string]string{"e2e.partita.dev/topo": ns}
	for b := range blocks {
		for r := range racks {
			for i := range 2 {
				addGPUNode(ctx, t, fmt.Sprintf("%s-b%d-r%d-%d", ns, b, r, i), 4, map[string]string{
					"e2e.partita.dev/topo": ns, "type": "e2e", e2eBlock: fmt.Sprintf("b%d", b), e2eRack: fmt.Sprintf("r%d", r),
				})
			}
		}
	}
	topo := "net-" + ns
	c := crClient(t)
	if err := c.Create(ctx, &v1alpha1.Topology{ObjectMeta: metav1.ObjectMeta{Name: topo}, Spec: v1alpha1.TopologySpec{Levels: []v1alpha1.TopologyLevel{
		{NodeLabel: e2eBlock}, {NodeLabel: e2eRack}, {NodeLabel: "kubernetes.io/hostname"},
	}}}); err != nil {
		t.Fatalf("create topology: %v", err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.WithoutCancel(ctx), &v1alpha1.Topology{ObjectMeta: metav1.ObjectMeta{Name: topo}})
	})
	return sel, topo
}

// rackOfNode is "b0-r1" for node NS-b0-r1-0.
func rackOfNode(ns, node string) string {
	name := strings.TrimPrefix(node, ns+"-")
	return name[:max(0, strings.LastIndex(name, "-"))]
}

// TestTopologySubGroupsOfAJobSet: a JobSet whose replicas must each run
// inside one rack, and the whole job inside one block (the owner's
// annotations, read by the workload map's built-in rules), lands each
// replica in a rack of its own choosing within one block: the block with
// the least room that takes it, so a whole block stays free.
func TestTopologySubGroupsOfAJobSet(t *testing.T) {
	needAddon(t, "jobset")
	ctx := testContext(t, 6*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel, topo := rackedCluster(ctx, t, ns, 2, 2)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := "topo-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "0", "-1", 1))
	// Block b0 has 6 + 4 free, block b1 8 + 8.
	busy := busyPods(ns, q, "b0-r0-0", "b0-r0-0", "b0-r1-0", "b0-r1-0", "b0-r1-0", "b0-r1-0")
	createPods(ctx, t, clientset, busy, 2)
	waitBound(ctx, t, ns, "busy-", len(busy))

	apply(ctx, t, fmt.Sprintf(`apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: ft
  namespace: %s
  annotations:
    %s: %s
    %s: %s
    %s: %s
spec:
  replicatedJobs:
  - name: workers
    replicas: 2
    template:
      spec:
        parallelism: 4
        completions: 4
        backoffLimit: 0
        template:
          metadata:
            labels: {%s: %s}
          spec:
            restartPolicy: Never
            nodeSelector: {e2e.partita.dev/topo: %s}
            containers:
            - name: train
              image: registry.k8s.io/pause:3.10
              resources: {limits: {nvidia.com/gpu: "1"}}
`, ns, v1alpha1.AnnotationTopology, topo, v1alpha1.AnnotationTopologyRequired, e2eBlock,
		v1alpha1.AnnotationSubGroupTopologyRequired, e2eRack, v1alpha1.LabelQueue, q, sel["e2e.partita.dev/topo"]))
	sel2 := "jobset.sigs.k8s.io/jobset-name=ft"
	var racksByReplica map[string][]string
	poll(t, 2*time.Minute, "the JobSet's 8 pods bound", func() (bool, string) {
		admitted, _, seen := podState(ctx, t, ns, sel2)
		racksByReplica = map[string][]string{}
		bound := 0
		for _, p := range admitted {
			if p.Spec.NodeName == "" {
				continue
			}
			bound++
			r := p.Labels["jobset.sigs.k8s.io/job-index"]
			if rk := rackOfNode(ns, p.Spec.NodeName); !slices.Contains(racksByReplica[r], rk) {
				racksByReplica[r] = append(racksByReplica[r], rk)
			}
		}
		return bound == 8, seen
	})
	var blocks []string
	for r, rks := range racksByReplica {
		if len(rks) != 1 {
			t.Errorf("replica %s ran in racks %v, want one", r, rks)
		}
		for _, rk := range rks {
			if b, _, _ := strings.Cut(rk, "-"); !slices.Contains(blocks, b) {
				blocks = append(blocks, b)
			}
		}
	}
	if !slices.Equal(blocks, []string{"b0"}) {
		t.Errorf("the JobSet ran in blocks %v (racks by replica %v), want b0 alone: the block with the least room that takes it", blocks, racksByReplica)
	}
}

// TestTopologyReclaimInsideOneRack: queue a's single pods fill two racks
// of 8 GPUs; queue b, its sibling under a parent limited to those 16,
// asks for a gang of 8 in one rack. Reclaim takes b's fair share (8) back
// from one rack, not a little from each: the evicted pods all ran in
// the rack b's gang lands in.
func TestTopologyReclaimInsideOneRack(t *testing.T) {
	ctx := testContext(t, 6*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel, topo := rackedCluster(ctx, t, ns, 1, 2)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	dept, a, b := "topo-dept-"+ns, "topo-a-"+ns, "topo-b-"+ns
	createQueue(ctx, t, gpuQueue(dept, ns, "0", "16", 1))
	for _, name := range []string{a, b} {
		queue := gpuQueue(name, ns, "0", "-1", 1)
		queue.Spec.Parent = dept
		createQueue(ctx, t, queue)
	}
	var small []*corev1.Pod
	for i := range 16 {
		small = append(small, queuedPod(ns, fmt.Sprintf("small-%02d", i), a, sel))
	}
	createPods(ctx, t, clientset, small, 4)
	waitBound(ctx, t, ns, "small-", 16)
	rackOf := map[string]string{}
	for _, p := range listNS(ctx, t, ns) {
		rackOf[p.Name] = rackOfNode(ns, p.Spec.NodeName)
	}
	time.Sleep(devPreemptMinRuntime)

	createAnnotatedGang(ctx, t, ns, "train", b, 8, map[string]string{v1alpha1.AnnotationTopology: topo, v1alpha1.AnnotationTopologyRequired: e2eRack}, sel)
	waitBound(ctx, t, ns, "train-", 8)
	var gangRacks []string
	left := map[string]bool{}
	for _, p := range listNS(ctx, t, ns) {
		if strings.HasPrefix(p.Name, "train-") {
			if rk := rackOfNode(ns, p.Spec.NodeName); !slices.Contains(gangRacks, rk) {
				gangRacks = append(gangRacks, rk)
			}
		}
		if strings.HasPrefix(p.Name, "small-") && p.DeletionTimestamp == nil {
			left[p.Name] = true
		}
	}
	if len(gangRacks) != 1 {
		t.Fatalf("gang train ran in racks %v, want one", gangRacks)
	}
	var evictedFrom []string
	for name, rk := range rackOf {
		if strings.HasPrefix(name, "small-") && !left[name] {
			evictedFrom = append(evictedFrom, rk)
		}
	}
	slices.Sort(evictedFrom)
	want := slices.Repeat([]string{gangRacks[0]}, 8)
	if !slices.Equal(evictedFrom, want) {
		t.Errorf("evicted pods ran in racks %v, want 8 from %s, where the gang runs", evictedFrom, gangRacks[0])
	}
}

// TestTopologyPreferredSpansFewestRacks: a gang that prefers a rack but
// fits none spans as few racks as it can, the roomiest first: with 4, 6
// and 8 GPUs free in three racks, 12 members take two racks, not three.
func TestTopologyPreferredSpansFewestRacks(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel, topo := rackedCluster(ctx, t, ns, 1, 3)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := "topo-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "0", "-1", 1))
	busy := busyPods(ns, q, "b0-r0-0", "b0-r0-0", "b0-r0-0", "b0-r0-0", "b0-r1-0", "b0-r1-0")
	createPods(ctx, t, clientset, busy, 2)
	waitBound(ctx, t, ns, "busy-", len(busy))
	createAnnotatedGang(ctx, t, ns, "wide", q, 12, map[string]string{v1alpha1.AnnotationTopology: topo, v1alpha1.AnnotationTopologyPreferred: e2eRack}, sel)
	waitBound(ctx, t, ns, "wide-", 12)
	var racks []string
	for _, p := range listNS(ctx, t, ns) {
		if strings.HasPrefix(p.Name, "wide-") {
			if rk := rackOfNode(ns, p.Spec.NodeName); !slices.Contains(racks, rk) {
				racks = append(racks, rk)
			}
		}
	}
	slices.Sort(racks)
	if !slices.Equal(racks, []string{"b0-r1", "b0-r2"}) {
		t.Errorf("gang wide (preferred rack) ran in racks %v, want b0-r1 and b0-r2 (the two roomiest)", racks)
	}
}

// createAnnotatedGang creates PodGroup name of queue q with annotations ann
// and its n whole-GPU members restricted to nodes with labels sel.
func createAnnotatedGang(ctx context.Context, t *testing.T, ns, name, q string, n int, ann, sel map[string]string) {
	t.Helper()
	if err := crClient(t).Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
		Spec: v1alpha1.PodGroupSpec{MinMember: int32(n), Queue: q}}); err != nil {
		t.Fatalf("create PodGroup %s: %v", name, err)
	}
	createPods(ctx, t, clientset, gangPods(ns, name, n, sel), 4)
}

// busyPods are one whole-GPU pod of queue q on each of nodes (NS-less
// names, repeated for more), named busy-0, busy-1, ....
func busyPods(ns, q string, nodes ...string) []*corev1.Pod {
	var out []*corev1.Pod
	for i, node := range nodes {
		out = append(out, queuedPod(ns, fmt.Sprintf("busy-%d", i), q, map[string]string{"kubernetes.io/hostname": ns + "-" + node}))
	}
	return out
}
