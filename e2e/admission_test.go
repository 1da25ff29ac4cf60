package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/gpu"
)

// The admission loop's end-to-end tests: pods go through the webhook, which
// gates them, and `partita extender`'s admission loop, which admits them by
// queue and gang; kube-scheduler and the extender then bind them. Each test
// adds simulated nodes of its own, labelled for it, so that its pods compete
// only with each other.

// devPreemptMinRuntime is the extender's --preempt-min-runtime in the dev
// cluster (cmd/partita/dev_processes.go).
const devPreemptMinRuntime = 5 * time.Second

// addGPUNode adds a simulated node with gpus H100s and extra labels, served
// by the agent like the others, and removes it when the test ends.
func addGPUNode(ctx context.Context, t *testing.T, name string, gpus int, labels map[string]string) {
	t.Helper()
	addGPUNodeOf(ctx, t, name, gpus, "H100-80GB", labels)
}

// addGPUNodeOf is addGPUNode with gpus devices of model (a key of
// devcluster.GPUModels), so that a test can mix GPU models.
func addGPUNodeOf(ctx context.Context, t *testing.T, name string, gpus int, model string, labels map[string]string) {
	t.Helper()
	m, ok := devcluster.GPUModels[model]
	if !ok {
		t.Fatalf("no simulated GPU model %q", model)
	}
	node := devcluster.SimulatedGPUNode(0, gpus, m)
	node.Name = name
	node.Labels["kubernetes.io/hostname"] = name
	for k, v := range labels {
		node.Labels[k] = v
	}
	if _, err := clientset.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 60*time.Second)
		defer cancel()
		_ = clientset.CoreV1().Nodes().Delete(cctx, name, metav1.DeleteOptions{})
		poll(t, 60*time.Second, "node "+name+"'s GPUNode gone", func() (bool, string) {
			err := crClient(t).Get(cctx, client.ObjectKey{Name: name}, &v1alpha1.GPUNode{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	})
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"capacity": node.Status.Capacity, "allocatable": node.Status.Allocatable, "nodeInfo": node.Status.NodeInfo}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clientset.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("set capacity of node %s: %v", name, err)
	}
	want := int64(gpus) * 1000
	poll(t, 60*time.Second, fmt.Sprintf("node %s Ready with partita.dev/gpu-milli %d", name, want), func() (bool, string) {
		n, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		q := n.Status.Allocatable[v1alpha1.ResourceGPUMilli]
		return devcluster.NodeReady(n) && q.Value() == want, fmt.Sprintf("ready %v, gpu-milli %s", devcluster.NodeReady(n), q.String())
	})
}

// gangPods are n whole-GPU members of pod group group, named group-0...,
// restricted to nodes with labels.
func gangPods(ns, group string, n int, labels map[string]string) []*corev1.Pod {
	pods := make([]*corev1.Pod, n)
	for i := range pods {
		pods[i] = extGPUPod(ns, fmt.Sprintf("%s-%d", group, i), 1000, 1, labels)
		pods[i].Labels[v1alpha1.LabelPodGroup] = group
	}
	return pods
}

// createQueue creates a queue for namespace ns, waits until the webhook's
// policy knows it (it batches queue changes), and deletes it when the test
// ends.
func createQueue(ctx context.Context, t *testing.T, q *v1alpha1.Queue) {
	t.Helper()
	c := crClient(t)
	if err := c.Create(ctx, q); err != nil {
		t.Fatalf("create queue %s: %v", q.Name, err)
	}
	t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), q) })
	ns := q.Spec.Namespaces[0]
	probe := queuedPod(ns, "queue-probe", q.Name, gpuNodes)
	poll(t, 30*time.Second, "the webhook to know queue "+q.Name, func() (bool, string) {
		_, err := clientset.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, fmt.Sprint(err)
	})
}

// gpuQueue is a leaf queue for namespace ns with GPU quota, limit and
// over-quota weight.
func gpuQueue(name, ns, quota, limit string, weight int32) *v1alpha1.Queue {
	return &v1alpha1.Queue{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.QueueSpec{Namespaces: []string{ns}, Resources: v1alpha1.QueueResources{GPU: &v1alpha1.ResourceQuota{
			Quota: ptr.To(resource.MustParse(quota)), Limit: ptr.To(resource.MustParse(limit)), OverQuotaWeight: ptr.To(weight),
		}}},
	}
}

// queuedPod is a whole-GPU pod of queue q restricted to nodes with labels.
func queuedPod(ns, name, q string, labels map[string]string) *corev1.Pod {
	p := extGPUPod(ns, name, 1000, 1, labels)
	p.Labels[v1alpha1.LabelQueue] = q
	return p
}

// ensurePriorityClass creates a PriorityClass of value whose pods never
// preempt through kube-scheduler (the admission loop preempts).
func ensurePriorityClass(ctx context.Context, t *testing.T, name string, value int32) {
	t.Helper()
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value, PreemptionPolicy: ptr.To(corev1.PreemptNever)}
	if _, err := clientset.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create priority class %s: %v", name, err)
	}
}

// admissionCondition is the pod's partita.dev/Admitted condition.
func admissionCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == v1alpha1.PodConditionAdmitted {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func gated(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == v1alpha1.SchedulingGateAdmission })
}

// waitEvent waits for an event on the pod with reason whose message
// contains want, and returns the message.
func waitEvent(ctx context.Context, t *testing.T, ns, pod, reason, want string) string {
	t.Helper()
	var got string
	poll(t, 60*time.Second, fmt.Sprintf("a %s event on pod %s saying %q", reason, pod, want), func() (bool, string) {
		evs, err := clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == reason && strings.Contains(e.Message, want) {
				got = e.Message
				return true, ""
			}
		}
		return false, fmt.Sprintf("events: %q", seen)
	})
	return got
}

// gangOnItsNodes makes a namespace with nodes of its own for a gang test:
// nodes GPU nodes of gpus devices labelled with the returned selector
// (named after kind), and the PodGroup "train" of minMember. The pods go
// before the nodes when the test ends.
func gangOnItsNodes(ctx context.Context, t *testing.T, kind string, nodes, gpus int, minMember int32) (string, map[string]string, *v1alpha1.PodGroup) {
	t.Helper()
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/" + kind: ns}
	for i := range nodes {
		addGPUNode(ctx, t, fmt.Sprintf("%s-%s-%d", ns, kind, i), gpus, sel)
	}
	// Cleanups run last first: the pods go before their nodes.
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: ns}, Spec: v1alpha1.PodGroupSpec{MinMember: minMember}}
	if err := crClient(t).Create(ctx, pg); err != nil {
		t.Fatalf("create pod group: %v", err)
	}
	return ns, sel, pg
}

// TestGangStartsWholeOnceItFits: a gang of 4 × 1 GPU on 3 nodes × 1 GPU
// never starts partly, and starts whole within seconds of a 4th node.
func TestGangStartsWholeOnceItFits(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns, sel, pg := gangOnItsNodes(ctx, t, "gang", 3, 1, 4)
	createPods(ctx, t, clientset, gangPods(ns, "train", 4, sel), 4)

	poll(t, 60*time.Second, "the PodGroup saying how much of the gang fits", func() (bool, string) {
		if err := crClient(t).Get(ctx, client.ObjectKeyFromObject(pg), pg); err != nil {
			return false, err.Error()
		}
		return pg.Status.Phase == v1alpha1.PodGroupPending && pg.Status.Reason == "gang needs 4 × 1 GPU; at most 3 fit now",
			fmt.Sprintf("phase %q, reason %q", pg.Status.Phase, pg.Status.Reason)
	})
	waitEvent(ctx, t, ns, "train-0", v1alpha1.ReasonWaitingForCapacity, "gang needs 4 × 1 GPU; at most 3 fit now")
	// It must not start partly, however long it waits.
	for range 6 {
		if b, _ := countBound(listNS(ctx, t, ns)); b != 0 {
			t.Fatalf("%d members of an incomplete gang were bound\n%s", b, devcluster.DescribePods(ctx, clientset, ns, extLabel))
		}
		time.Sleep(500 * time.Millisecond)
	}

	start := time.Now()
	addGPUNode(ctx, t, fmt.Sprintf("%s-gang-3", ns), 1, sel)
	ready := time.Now()
	got := waitPods(ctx, t, ns, 60*time.Second, "all 4 members bound", func(ps []corev1.Pod) (bool, string) {
		b, p := countBound(ps)
		return b == 4, fmt.Sprintf("%d bound, %d pending", b, p)
	})
	t.Logf("the gang started %.1fs after the 4th node was created (%.1fs after it was Ready)", time.Since(start).Seconds(), time.Since(ready).Seconds())
	nodes := map[string]bool{}
	for _, p := range got {
		nodes[p.Spec.NodeName] = true
		// The reservation said where it would go, and with which devices.
		r, err := gpu.ParseReservation(p.Annotations[v1alpha1.AnnotationReservation])
		if err != nil || r.Workload != ns+"/train" || r.Node != p.Spec.NodeName || !slices.Equal(r.Containers[0].Devices, devicesOf(&p)) {
			t.Errorf("pod %s on %s with %v: reservation %q (%v), want gang %s/train there", p.Name, p.Spec.NodeName, devicesOf(&p),
				p.Annotations[v1alpha1.AnnotationReservation], err, ns)
		}
	}
	if len(nodes) != 4 {
		t.Errorf("members on %d nodes, want 4 (one GPU each): %v", len(nodes), nodes)
	}
	poll(t, 30*time.Second, "the PodGroup Running", func() (bool, string) {
		if err := crClient(t).Get(ctx, client.ObjectKeyFromObject(pg), pg); err != nil {
			return false, err.Error()
		}
		return pg.Status.Phase == v1alpha1.PodGroupRunning && pg.Status.Running == 4, fmt.Sprintf("%+v", pg.Status)
	})
	checkClusterLedger(ctx, t)
}

// TestGangWithAWorkerANodeRuns: a gang whose members each want a node of
// their own (required pod anti-affinity on the hostname, as multi-node
// training jobs write it) runs whole. Packed onto one node and pinned
// there, the second member would be refused by kube-scheduler and wait out
// the schedule timeout, again and again.
func TestGangWithAWorkerANodeRuns(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns, sel, _ := gangOnItsNodes(ctx, t, "spread", 2, 8, 2)
	pods := make([]*corev1.Pod, 2)
	for i := range pods {
		p := extGPUPod(ns, fmt.Sprintf("train-%d", i), 1000, 4, sel)
		p.Labels[v1alpha1.LabelPodGroup] = "train"
		p.Labels["job"] = "train"
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"job": "train"}}}}}}
		pods[i] = p
	}
	createPods(ctx, t, clientset, pods, 2)
	got := waitPods(ctx, t, ns, 60*time.Second, "both members bound", func(ps []corev1.Pod) (bool, string) {
		b, p := countBound(ps)
		return b == 2, fmt.Sprintf("%d bound, %d pending", b, p)
	})
	if got[0].Spec.NodeName == got[1].Spec.NodeName {
		t.Errorf("both members on node %s, want one a node", got[0].Spec.NodeName)
	}
	for _, p := range got {
		if len(devicesOf(&p)) != 4 {
			t.Errorf("pod %s on %s holds devices %v, want 4", p.Name, p.Spec.NodeName, devicesOf(&p))
		}
	}
	checkClusterLedger(ctx, t)
}

// TestQueueAtItsLimitHoldsTheNextPod: the next pod of a queue at its limit
// waits, says why, and goes once room under the limit is freed.
func TestQueueAtItsLimitHoldsTheNextPod(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	q := "limit-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "0", "1", 1))
	createPods(ctx, t, clientset, []*corev1.Pod{queuedPod(ns, "first", q, gpuNodes)}, 1)
	waitPods(ctx, t, ns, 60*time.Second, "the first pod bound", func(ps []corev1.Pod) (bool, string) {
		b, p := countBound(ps)
		return b == 1, fmt.Sprintf("%d bound, %d pending", b, p)
	})
	createPods(ctx, t, clientset, []*corev1.Pod{queuedPod(ns, "second", q, gpuNodes)}, 1)
	want := fmt.Sprintf("queue %s is at its limit: 1 of 1 GPUs", q)
	waitEvent(ctx, t, ns, "second", v1alpha1.ReasonWaitingForQuota, want)
	poll(t, 30*time.Second, "the second pod's admission condition", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := admissionCondition(p)
		return c != nil && c.Status == corev1.ConditionFalse && c.Reason == v1alpha1.ReasonWaitingForQuota && strings.Contains(c.Message, want) && gated(p),
			fmt.Sprintf("gated %v, condition %+v", gated(p), c)
	})
	poll(t, 30*time.Second, "the queue's status", func() (bool, string) {
		var got v1alpha1.Queue
		if err := crClient(t).Get(ctx, client.ObjectKey{Name: q}, &got); err != nil {
			return false, err.Error()
		}
		alloc := got.Status.Allocated[v1alpha1.ResourceGPU]
		return alloc.MilliValue() == 1000 && got.Status.PendingWorkloads == 1, fmt.Sprintf("%+v", got.Status)
	})
	if err := clientset.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	poll(t, 60*time.Second, "the second pod bound once the first is gone", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName != "", fmt.Sprintf("gated %v, node %q", gated(p), p.Spec.NodeName)
	})
}

// TestReclaimFromABorrowingQueue: queue A, with no deserved share, fills
// two nodes while B is idle; B submits within its quota; A's youngest
// workload is evicted and B runs.
func TestReclaimFromABorrowingQueue(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/reclaim": ns}
	addGPUNode(ctx, t, ns+"-rc-0", 1, sel)
	addGPUNode(ctx, t, ns+"-rc-1", 1, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	a, b := "borrow-"+ns, "owner-"+ns
	createQueue(ctx, t, gpuQueue(a, ns, "0", "-1", 0))
	createQueue(ctx, t, gpuQueue(b, ns, "1", "-1", 1))
	createPods(ctx, t, clientset, []*corev1.Pod{queuedPod(ns, "a-old", a, sel)}, 1)
	waitPods(ctx, t, ns, 60*time.Second, "a-old bound", func(ps []corev1.Pod) (bool, string) {
		bd, _ := countBound(ps)
		return bd == 1, fmt.Sprintf("%d bound", bd)
	})
	createPods(ctx, t, clientset, []*corev1.Pod{queuedPod(ns, "a-young", a, sel)}, 1)
	waitPods(ctx, t, ns, 60*time.Second, "a-young bound", func(ps []corev1.Pod) (bool, string) {
		bd, _ := countBound(ps)
		return bd == 2, fmt.Sprintf("%d bound", bd)
	})
	time.Sleep(devPreemptMinRuntime + time.Second)
	createPods(ctx, t, clientset, []*corev1.Pod{queuedPod(ns, "b-1", b, sel)}, 1)
	waitEvent(ctx, t, ns, "a-young", v1alpha1.ReasonPreempted, "reclaimed for "+ns+"/b-1")
	poll(t, 60*time.Second, "b-1 bound, a-young gone, a-old running", func() (bool, string) {
		ps := listNS(ctx, t, ns)
		state := map[string]string{}
		for _, p := range ps {
			state[p.Name] = p.Spec.NodeName
		}
		_, young := state["a-young"]
		return state["b-1"] != "" && !young && state["a-old"] != "", fmt.Sprintf("%v", state)
	})
}

// TestPriorityPreemptsWithinAQueue: a higher-priority pod evicts a
// lower-priority one of its own queue.
func TestPriorityPreemptsWithinAQueue(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/preempt": ns}
	addGPUNode(ctx, t, ns+"-pr-0", 1, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := "prio-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "1", "-1", 1))
	ensurePriorityClass(ctx, t, "partita-e2e-low", 10)
	ensurePriorityClass(ctx, t, "partita-e2e-high", 1000)
	low := queuedPod(ns, "low", q, sel)
	low.Spec.PriorityClassName = "partita-e2e-low"
	createPods(ctx, t, clientset, []*corev1.Pod{low}, 1)
	waitPods(ctx, t, ns, 60*time.Second, "low bound", func(ps []corev1.Pod) (bool, string) {
		bd, _ := countBound(ps)
		return bd == 1, fmt.Sprintf("%d bound", bd)
	})
	time.Sleep(devPreemptMinRuntime + time.Second)
	high := queuedPod(ns, "high", q, sel)
	high.Spec.PriorityClassName = "partita-e2e-high"
	createPods(ctx, t, clientset, []*corev1.Pod{high}, 1)
	waitEvent(ctx, t, ns, "low", v1alpha1.ReasonPreempted, "of higher priority (1000 > 10)")
	poll(t, 60*time.Second, "high bound and low gone", func() (bool, string) {
		state := map[string]string{}
		for _, p := range listNS(ctx, t, ns) {
			state[p.Name] = p.Spec.NodeName
		}
		_, lowThere := state["low"]
		return state["high"] != "" && !lowThere, fmt.Sprintf("%v", state)
	})
}

// TestAdmissionChurn submits and deletes pods and gangs at random for a
// while in two queues that share three nodes, then checks that the ledger's
// invariants hold and that no workload was evicted twice within the
// minimum runtime.
func TestAdmissionChurn(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	d := 2 * time.Minute
	if testing.Short() {
		d = 30 * time.Second
	}
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/churn": ns}
	for i := range 3 {
		addGPUNode(ctx, t, fmt.Sprintf("%s-ch-%d", ns, i), 2, sel)
	}
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	qa, qb := "churn-a-"+ns, "churn-b-"+ns
	createQueue(ctx, t, gpuQueue(qa, ns, "3", "-1", 1))
	createQueue(ctx, t, gpuQueue(qb, ns, "1", "4", 1))
	ensurePriorityClass(ctx, t, "partita-e2e-low", 10)
	ensurePriorityClass(ctx, t, "partita-e2e-high", 1000)
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	c := crClient(t)
	end := time.Now().Add(d)
	made := 0
	for time.Now().Before(end) {
		made++
		q := qa
		if rng.IntN(2) == 0 {
			q = qb
		}
		prio := "partita-e2e-low"
		if rng.IntN(4) == 0 {
			prio = "partita-e2e-high"
		}
		switch rng.IntN(4) {
		case 0: // a gang of 2 or 3
			n := 2 + rng.IntN(2)
			name := fmt.Sprintf("g%d", made)
			if err := c.Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: v1alpha1.PodGroupSpec{MinMember: int32(n), Queue: q}}); err != nil {
				t.Fatalf("create pod group: %v", err)
			}
			var pods []*corev1.Pod
			for i := range n {
				p := queuedPod(ns, fmt.Sprintf("%s-%d", name, i), q, sel)
				p.Labels[v1alpha1.LabelPodGroup] = name
				p.Spec.PriorityClassName = prio
				pods = append(pods, p)
			}
			createPods(ctx, t, clientset, pods, n)
		case 1: // delete something
			ps := listNS(ctx, t, ns)
			if len(ps) > 0 {
				_ = clientset.CoreV1().Pods(ns).Delete(ctx, ps[rng.IntN(len(ps))].Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			}
		default: // a single pod
			p := queuedPod(ns, fmt.Sprintf("p%d", made), q, sel)
			p.Spec.PriorityClassName = prio
			if rng.IntN(2) == 0 {
				p = extGPUPod(ns, fmt.Sprintf("p%d", made), 500, 1, sel)
				p.Labels[v1alpha1.LabelQueue] = q
			}
			createPods(ctx, t, clientset, []*corev1.Pod{p}, 1)
		}
		time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond)
	}
	time.Sleep(5 * time.Second)
	checkClusterLedger(ctx, t)

	// Evictions by workload, in time order.
	evs, err := clientset.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]string{}
	for _, p := range listNS(ctx, t, ns) {
		pods[p.Name] = p.Labels[v1alpha1.LabelPodGroup]
	}
	byWorkload := map[string][]time.Time{}
	evictions := 0
	for _, e := range evs.Items {
		if e.Reason != v1alpha1.ReasonPreempted {
			continue
		}
		evictions++
		w := e.InvolvedObject.Name
		if g := pods[w]; g != "" {
			w = g
		} else if i := strings.LastIndex(w, "-"); strings.HasPrefix(w, "g") && i > 0 {
			w = w[:i]
		}
		at := e.EventTime.Time
		if at.IsZero() {
			at = e.FirstTimestamp.Time
		}
		byWorkload[w] = append(byWorkload[w], at)
	}
	for w, ts := range byWorkload {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		for i := 1; i < len(ts); i++ {
			// One eviction sends an event per member at the same moment.
			if gap := ts[i].Sub(ts[i-1]); gap > time.Second && gap < devPreemptMinRuntime {
				t.Errorf("workload %s evicted twice within %s: at %s and %s", w, devPreemptMinRuntime, ts[i-1].Format(time.RFC3339Nano), ts[i].Format(time.RFC3339Nano))
			}
		}
	}
	b, p := countBound(listNS(ctx, t, ns))
	t.Logf("churn: %d actions in %s, %d eviction events, %d pods bound and %d waiting at the end", made, d, evictions, b, p)
}

// TestGangTimeoutLeavesBarePodsAndSaysWhy: a gang that is admitted but not
// fully bound within scheduleTimeoutSeconds is released; its bare pods are
// never deleted, and the PodGroup says why it failed.
func TestGangTimeoutLeavesBarePodsAndSaysWhy(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "slow", Namespace: ns},
		Spec: v1alpha1.PodGroupSpec{MinMember: 2, ScheduleTimeoutSeconds: ptr.To[int32](3)}}
	if err := crClient(t).Create(ctx, pg); err != nil {
		t.Fatalf("create pod group: %v", err)
	}
	pods := gangPods(ns, "slow", 2, gpuNodes)
	// A gate of someone else's keeps one member from binding after the
	// admission loop lets the gang go.
	pods[1].Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "e2e.partita.dev/hold"}}
	createPods(ctx, t, clientset, pods, 2)
	poll(t, 60*time.Second, "the PodGroup Failed for its timeout", func() (bool, string) {
		if err := crClient(t).Get(ctx, client.ObjectKeyFromObject(pg), pg); err != nil {
			return false, err.Error()
		}
		return pg.Status.Phase == v1alpha1.PodGroupFailed &&
				strings.Contains(pg.Status.Reason, "only 1 of 2 members bound within 3s; its pods have no controller"),
			fmt.Sprintf("phase %q, reason %q", pg.Status.Phase, pg.Status.Reason)
	})
	waitEvent(ctx, t, ns, "slow-1", v1alpha1.ReasonScheduleTimeout, "only 1 of 2 members bound within 3s")
	if got := len(listNS(ctx, t, ns)); got != 2 {
		t.Errorf("%d pods left, want both: bare pods are never deleted", got)
	}
}
