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
	sel := map[string]string{"e2e.partita.dev/topo": ns}
	for b := range 2 {
		for r := range 2 {
			for i := range 2 {
				addGPUNode(ctx, t, fmt.Sprintf("%s-b%d-r%d-%d", ns, b, r, i), 4, map[string]string{
					"e2e.partita.dev/topo": ns, "type": "e2e", e2eBlock: fmt.Sprintf("b%d", b), e2eRack: fmt.Sprintf("r%d", r),
				})
			}
		}
	}
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := "topo-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "0", "-1", 1))
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

	// Two GPUs of rack b1/r1 are taken: it has 6 free, the others 8.
	var busy []*corev1.Pod
	for i := range 2 {
		p := queuedPod(ns, fmt.Sprintf("busy-%d", i), q, map[string]string{"kubernetes.io/hostname": ns + "-b1-r1-0"})
		busy = append(busy, p)
	}
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

	// 10 GPUs fit the cluster (16 free) but no rack (8 at most).
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
