package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// The tests of decisions that survive restarts and of fairness under
// contention (issue 14): reservations on the pods, all-or-nothing
// eviction, the head of line, reclaim up to the fair share, kube-scheduler's
// preemption, and CPU and memory quotas.

// devStarvationBound is the extender's --starvation-bound in the dev
// cluster (cmd/partita/dev_processes.go).
const devStarvationBound = 10 * time.Second

// holdGate is a scheduling gate of the tests' own: a pod the admission loop
// released stays unscheduled while it has it, as it would while
// kube-scheduler is slow to get to it.
const holdGate = "e2e.partita.dev/hold"

// restartExtender kills the dev cluster's extender (the leader, as there
// is one), runs between() while it is gone, and starts it again with
// `partita dev up` as a user would (with devUpArgs), waiting until it is
// ready.
func restartExtender(ctx context.Context, t *testing.T, between func(), devUpArgs ...string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cluster.Dir(), "partita", "extender.pid"))
	if err != nil {
		t.Fatalf("read the extender's pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("extender pid file: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the extender (pid %d): %v", pid, err)
	}
	poll(t, 30*time.Second, "the extender gone", func() (bool, string) {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		return os.IsNotExist(err), "still in the process table"
	})
	between()
	devUp(ctx, t, devUpArgs...)
}

// devUp runs `partita dev up` on the e2e cluster with args, as a user
// would; host processes whose command line args change are restarted.
func devUp(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	out, err := partita(ctx, append([]string{"dev", "up", "--name", clusterName,
		"--nodes", fmt.Sprint(e2eNodes), "--gpus-per-node", fmt.Sprint(e2eGPUsPerNode)}, args...)...)
	if err != nil {
		t.Fatalf("dev up %v: %v\n%s", args, err, out)
	}
	return out
}

// podNodes maps the namespace's pods to their nodes ("" unbound).
func podNodes(ctx context.Context, t *testing.T, ns string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range listNS(ctx, t, ns) {
		out[p.Name] = p.Spec.NodeName
	}
	return out
}

// TestReservationsSurviveExtenderRestart admits a gang whose members
// kube-scheduler cannot get to yet (a gate of the test's own holds them
// after the admission loop let them go), kills the extender, creates pods
// that would fit on the gang's devices while it is gone, and starts it
// again: its new ledger and loop read the reservations from the members,
// so no competing pod is admitted onto the gang's devices, and the gang
// binds whole, on them, once kube-scheduler may go.
func TestReservationsSurviveExtenderRestart(t *testing.T) {
	ctx := testContext(t, 8*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/reserve": ns}
	// `partita dev up` removes the simulated nodes it did not make (label
	// type=kwok) beyond its count: these nodes must outlive the restart.
	keep := map[string]string{"e2e.partita.dev/reserve": ns, "type": "e2e"}
	addGPUNode(ctx, t, ns+"-rs-0", 1, keep)
	addGPUNode(ctx, t, ns+"-rs-1", 1, keep)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	if err := crClient(t).Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: ns},
		Spec: v1alpha1.PodGroupSpec{MinMember: 2}}); err != nil {
		t.Fatalf("create pod group: %v", err)
	}
	members := gangPods(ns, "train", 2, sel)
	for _, p := range members {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: holdGate}}
	}
	createPods(ctx, t, clientset, members, 2)
	// Admitted: out of the admission gate, pinned to a node, and carrying
	// what was reserved for it.
	pinned := map[string]string{}
	reserved := map[string]*gpu.Reservation{}
	poll(t, 60*time.Second, "both members admitted", func() (bool, string) {
		var seen []string
		for _, p := range listNS(ctx, t, ns) {
			node := p.Annotations[v1alpha1.AnnotationNode]
			if gated(&p) || node == "" {
				seen = append(seen, fmt.Sprintf("%s gated %v node %q", p.Name, gated(&p), node))
				continue
			}
			pinned[p.Name] = node
			r, err := gpu.ParseReservation(p.Annotations[v1alpha1.AnnotationReservation])
			if err != nil {
				t.Logf("%s: its reservation does not say what was reserved (%v): %q", p.Name, err, p.Annotations[v1alpha1.AnnotationReservation])
			}
			reserved[p.Name] = r
		}
		return len(pinned) == 2, strings.Join(seen, "; ")
	})

	competitors := []*corev1.Pod{extGPUPod(ns, "late-0", 1000, 1, sel), extGPUPod(ns, "late-1", 1000, 1, sel)}
	restartExtender(ctx, t, func() {
		createPods(ctx, t, clientset, competitors, 2)
	})
	// The new leader's loop runs its cycles; the competitors must keep
	// waiting, and say for what.
	for _, c := range competitors {
		waitEvent(ctx, t, ns, c.Name, v1alpha1.ReasonWaitingForCapacity, "no node has room now")
	}
	time.Sleep(5 * time.Second)
	for _, c := range competitors {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, c.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !gated(p) || p.Spec.NodeName != "" {
			t.Errorf("competitor %s was admitted onto the gang's reserved devices (gated %v, node %q)", p.Name, gated(p), p.Spec.NodeName)
		}
	}

	// kube-scheduler may go: the gang binds whole, on its reserved devices.
	for _, m := range members {
		patch := []byte(`{"spec":{"schedulingGates":null}}`)
		if _, err := clientset.CoreV1().Pods(ns).Patch(ctx, m.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatalf("remove the hold gate of %s: %v", m.Name, err)
		}
	}
	ps := waitPods(ctx, t, ns, 90*time.Second, "the gang bound", func(ps []corev1.Pod) (bool, string) {
		nodes := map[string]string{}
		for _, p := range ps {
			nodes[p.Name] = p.Spec.NodeName
		}
		return nodes["train-0"] != "" && nodes["train-1"] != "", fmt.Sprint(nodes)
	})
	for _, p := range ps {
		node, ok := pinned[p.Name]
		if !ok {
			if p.Spec.NodeName != "" {
				t.Errorf("competitor %s bound to %s while the gang held its devices", p.Name, p.Spec.NodeName)
			}
			continue
		}
		if p.Spec.NodeName != node {
			t.Errorf("member %s bound to %s; it was pinned to %s", p.Name, p.Spec.NodeName, node)
		}
		if r := reserved[p.Name]; r == nil || !slices.Equal(devicesOf(&p), r.Containers[0].Devices) {
			t.Errorf("member %s holds %v; it was reserved %+v", p.Name, devicesOf(&p), r)
		}
	}
	checkClusterLedger(ctx, t)
}

// TestEvictionRespectsPodDisruptionBudget: a PodDisruptionBudget (computed
// by kube-controller-manager's disruption controller) refuses one member of
// the only gang whose eviction would make room: nothing of the gang is
// evicted, the preemptor's PodGroup says why, and once the budget is gone
// the gang is evicted whole and the preemptor runs.
func TestEvictionRespectsPodDisruptionBudget(t *testing.T) {
	ctx := testContext(t, 6*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	ensurePriorityClass(ctx, t, "partita-e2e-low", 10)
	ensurePriorityClass(ctx, t, "partita-e2e-high", 1000)
	sel := map[string]string{"e2e.partita.dev/pdb": ns}
	addGPUNode(ctx, t, ns+"-pdb-0", 1, sel)
	addGPUNode(ctx, t, ns+"-pdb-1", 1, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := "pdb-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "2", "-1", 1))
	c := crClient(t)
	gang := func(name, class string) {
		t.Helper()
		if err := c.Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1alpha1.PodGroupSpec{MinMember: 2, Queue: q}}); err != nil {
			t.Fatalf("create pod group %s: %v", name, err)
		}
		pods := gangPods(ns, name, 2, sel)
		for _, p := range pods {
			p.Spec.PriorityClassName = class
			p.Labels[v1alpha1.LabelQueue] = q
			p.Labels["app"] = p.Name
		}
		createPods(ctx, t, clientset, pods, 2)
	}
	gang("low", "partita-e2e-low")
	waitPods(ctx, t, ns, 60*time.Second, "the low gang running", func(ps []corev1.Pod) (bool, string) {
		ready := 0
		for _, p := range ps {
			if podReady(&p) {
				ready++
			}
		}
		return ready == 2, fmt.Sprintf("%d ready", ready)
	})
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "keep-low-0", Namespace: ns},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "low-0"}}}}
	if _, err := clientset.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the budget: %v", err)
	}
	poll(t, 60*time.Second, "the disruption controller computing the budget", func() (bool, string) {
		got, err := clientset.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, pdb.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s := got.Status
		return s.ObservedGeneration == got.Generation && s.CurrentHealthy == 1 && s.DisruptionsAllowed == 0, fmt.Sprintf("%+v", s)
	})
	time.Sleep(devPreemptMinRuntime + time.Second)
	gang("high", "partita-e2e-high")

	poll(t, 60*time.Second, "the high PodGroup saying the budget refuses", func() (bool, string) {
		var pg v1alpha1.PodGroup
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "high"}, &pg); err != nil {
			return false, err.Error()
		}
		cond := meta.FindStatusCondition(pg.Status.Conditions, v1alpha1.PodGroupConditionAdmitted)
		ok := cond != nil && cond.Reason == v1alpha1.ReasonEvictionRefused && strings.Contains(pg.Status.Reason, "PodDisruptionBudget "+ns+"/keep-low-0")
		return ok, fmt.Sprintf("condition %+v, reason %q", cond, pg.Status.Reason)
	})
	// Several cycles later the gang is still whole.
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, name := range []string{"low-0", "low-1"} {
			p, err := clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil {
				t.Fatalf("%s was evicted (%v) while the budget refused low-0: the gang is half evicted", name, err)
			}
		}
		time.Sleep(time.Second)
	}

	if err := clientset.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, pdb.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the budget: %v", err)
	}
	// The gang was spared for 30s after the refusal; then it goes whole.
	poll(t, 90*time.Second, "the low gang evicted whole and the high gang bound", func() (bool, string) {
		nodes := podNodes(ctx, t, ns)
		_, l0 := nodes["low-0"]
		_, l1 := nodes["low-1"]
		return !l0 && !l1 && nodes["high-0"] != "" && nodes["high-1"] != "", fmt.Sprint(nodes)
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestHeadOfLineGangRunsUnderAStreamOfSmallPods: a gang of 2 × 2 GPUs
// waits at the head of its queue while a stream of 1-GPU pods, younger
// than it, keeps the two nodes busy: each time a pod ends another is
// created. Backfill alone would give every freed GPU to the stream; past
// the starvation bound the loop holds room for the gang, and it runs.
func TestHeadOfLineGangRunsUnderAStreamOfSmallPods(t *testing.T) {
	ctx := testContext(t, 6*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/hol": ns}
	addGPUNode(ctx, t, ns+"-hol-0", 2, sel)
	addGPUNode(ctx, t, ns+"-hol-1", 2, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := "hol-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "4", "-1", 1))
	next := 0
	stream := func() *corev1.Pod {
		p := queuedPod(ns, fmt.Sprintf("s-%03d", next), q, sel)
		next++
		return p
	}
	var first []*corev1.Pod
	for range 4 {
		first = append(first, stream())
	}
	createPods(ctx, t, clientset, first, 4)
	waitPods(ctx, t, ns, 60*time.Second, "the stream on every GPU", func(ps []corev1.Pod) (bool, string) {
		b, p := countBound(ps)
		return b == 4, fmt.Sprintf("%d bound, %d pending", b, p)
	})
	if err := crClient(t).Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: ns},
		Spec: v1alpha1.PodGroupSpec{MinMember: 2, Queue: q}}); err != nil {
		t.Fatalf("create pod group: %v", err)
	}
	big := []*corev1.Pod{extGPUPod(ns, "big-0", 1000, 2, sel), extGPUPod(ns, "big-1", 1000, 2, sel)}
	for _, p := range big {
		p.Labels[v1alpha1.LabelPodGroup] = "big"
		p.Labels[v1alpha1.LabelQueue] = q
	}
	time.Sleep(time.Second)
	createPods(ctx, t, clientset, big, 2)
	createPods(ctx, t, clientset, []*corev1.Pod{stream()}, 1)

	// The stream: every 3s the oldest running small pod ends and a new one
	// comes, until the gang runs.
	start := time.Now()
	for {
		nodes := podNodes(ctx, t, ns)
		if nodes["big-0"] != "" && nodes["big-1"] != "" {
			break
		}
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("the gang did not run in 3 minutes under the stream: %v", nodes)
		}
		var running []string
		for name, node := range nodes {
			if strings.HasPrefix(name, "s-") && node != "" {
				running = append(running, name)
			}
		}
		slices.Sort(running)
		if len(running) > 0 {
			if err := clientset.CoreV1().Pods(ns).Delete(ctx, running[0], metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
			createPods(ctx, t, clientset, []*corev1.Pod{stream()}, 1)
		}
		time.Sleep(3 * time.Second)
	}
	t.Logf("the gang ran %s after it came, with %d small pods created", time.Since(start).Round(time.Second), next)
	msg := waitEvent(ctx, t, ns, "big-0", v1alpha1.ReasonWaitingForCapacity, "past the starvation bound of "+devStarvationBound.String())
	t.Logf("the gang was told: %s", msg)
}

// TestReclaimStopsAtTheFairShare: queue a deserves 2 GPUs and holds 3 (a
// 1-GPU pod and, younger, a 2-GPU pod); queue b deserves 2 and asks for 2
// on one node. Reclaim takes the 1-GPU pod, which leaves a at its fair
// share, not the younger 2-GPU one, which would drop it below; and nothing
// more goes over the next cycles.
func TestReclaimStopsAtTheFairShare(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/share": ns}
	addGPUNode(ctx, t, ns+"-fs-0", 2, sel)
	addGPUNode(ctx, t, ns+"-fs-1", 2, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	a, b := "share-a-"+ns, "share-b-"+ns
	createQueue(ctx, t, gpuQueue(a, ns, "2", "-1", 0))
	createQueue(ctx, t, gpuQueue(b, ns, "2", "-1", 0))
	createPods(ctx, t, clientset, []*corev1.Pod{queuedPod(ns, "a-small", a, sel)}, 1)
	waitPods(ctx, t, ns, 60*time.Second, "a-small bound", func(ps []corev1.Pod) (bool, string) {
		bd, _ := countBound(ps)
		return bd == 1, fmt.Sprintf("%d bound", bd)
	})
	aBig := extGPUPod(ns, "a-big", 1000, 2, sel)
	aBig.Labels[v1alpha1.LabelQueue] = a
	createPods(ctx, t, clientset, []*corev1.Pod{aBig}, 1)
	waitPods(ctx, t, ns, 60*time.Second, "a-big bound", func(ps []corev1.Pod) (bool, string) {
		bd, _ := countBound(ps)
		return bd == 2, fmt.Sprintf("%d bound", bd)
	})
	time.Sleep(devPreemptMinRuntime + time.Second)
	b1 := extGPUPod(ns, "b-1", 1000, 2, sel)
	b1.Labels[v1alpha1.LabelQueue] = b
	createPods(ctx, t, clientset, []*corev1.Pod{b1}, 1)
	waitEvent(ctx, t, ns, "a-small", v1alpha1.ReasonPreempted, "reclaimed for "+ns+"/b-1")
	poll(t, 60*time.Second, "b-1 bound, a-small gone, a-big running", func() (bool, string) {
		nodes := podNodes(ctx, t, ns)
		_, small := nodes["a-small"]
		return nodes["b-1"] != "" && !small && nodes["a-big"] != "", fmt.Sprint(nodes)
	})
	// Over the next cycles nothing ping-pongs: a-big stays, and a holds
	// its fair share.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, "a-big", metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Fatalf("a-big was evicted (%v): reclaim took queue %s below its fair share", err, a)
		}
		time.Sleep(2 * time.Second)
	}
	if got := allocatedMilli(ctx, t, a); got != 2000 {
		t.Errorf("queue %s holds %d milli-GPUs, want its fair share, 2000", a, got)
	}
}

// TestKubeSchedulerNeverEvictsManagedPods: a GPU pod of the highest
// priority that does not fit, created where the webhook does not gate it
// (kube-system), reaches kube-scheduler's own preemption. The only pods it
// could evict are a gang and a single pod that the admission loop admitted:
// kube-scheduler evicts neither, and the pod waits.
func TestKubeSchedulerNeverEvictsManagedPods(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/kspreempt": ns}
	addGPUNode(ctx, t, ns+"-kp-0", 2, sel)
	addGPUNode(ctx, t, ns+"-kp-1", 1, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	if err := crClient(t).Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: ns},
		Spec: v1alpha1.PodGroupSpec{MinMember: 2}}); err != nil {
		t.Fatalf("create pod group: %v", err)
	}
	createPods(ctx, t, clientset, append(gangPods(ns, "train", 2, sel), extGPUPod(ns, "solo", 1000, 1, sel)), 3)
	waitPods(ctx, t, ns, 60*time.Second, "the gang and solo bound", func(ps []corev1.Pod) (bool, string) {
		bd, p := countBound(ps)
		return bd == 3, fmt.Sprintf("%d bound, %d pending", bd, p)
	})
	const class = "partita-e2e-preemptor"
	if _, err := clientset.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: class}, Value: 1000000,
		PreemptionPolicy: ptr.To(corev1.PreemptLowerPriority)}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create priority class: %v", err)
	}
	// In the canonical form (the webhook does not touch kube-system), with
	// a class that preempts.
	preemptor := extGPUPod(metav1.NamespaceSystem, "preemptor-"+ns, 1000, 1, sel)
	preemptor.Spec.PriorityClassName, preemptor.Spec.PreemptionPolicy = class, nil
	if _, err := clientset.CoreV1().Pods(metav1.NamespaceSystem).Create(ctx, preemptor, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the preemptor: %v", err)
	}
	t.Cleanup(func() {
		_ = clientset.CoreV1().Pods(metav1.NamespaceSystem).Delete(context.WithoutCancel(ctx), preemptor.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	poll(t, 60*time.Second, "kube-scheduler trying the preemptor", func() (bool, string) {
		evs, err := eventsAbout(ctx, preemptor.Name)
		if err != nil {
			return false, err.Error()
		}
		return slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, "FailedScheduling") }), fmt.Sprint(evs)
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, name := range []string{"train-0", "train-1", "solo"} {
			p, err := clientset.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil {
				t.Fatalf("kube-scheduler evicted %s (%v) for a GPU preemptor", name, err)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
					t.Fatalf("kube-scheduler marked %s for eviction: %s", name, c.Message)
				}
			}
		}
		time.Sleep(2 * time.Second)
	}
	p, err := clientset.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, preemptor.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" || p.Status.NominatedNodeName != "" {
		t.Errorf("the preemptor got node %q, nominated %q; want it waiting", p.Spec.NodeName, p.Status.NominatedNodeName)
	}
}

// TestQueueCPULimitHoldsPods: a queue's CPU limit holds back the pod that
// would take it over, says so, and lets it go once there is room; its
// status shows the CPU its pods request.
func TestQueueCPULimitHoldsPods(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/cpu": ns}
	addGPUNode(ctx, t, ns+"-cpu-0", 2, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := gpuQueue("cpu-"+ns, ns, "2", "-1", 1)
	q.Spec.Resources.CPU = &v1alpha1.ResourceQuota{Quota: ptr.To(resource.MustParse("1")), Limit: ptr.To(resource.MustParse("2"))}
	createQueue(ctx, t, q)
	withCPU := func(name, cpu string) *corev1.Pod {
		p := queuedPod(ns, name, q.Name, sel)
		p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse(cpu)
		return p
	}
	createPods(ctx, t, clientset, []*corev1.Pod{withCPU("first", "1500m")}, 1)
	waitPods(ctx, t, ns, 60*time.Second, "first bound", func(ps []corev1.Pod) (bool, string) {
		bd, _ := countBound(ps)
		return bd == 1, fmt.Sprintf("%d bound", bd)
	})
	createPods(ctx, t, clientset, []*corev1.Pod{withCPU("second", "1")}, 1)
	waitEvent(ctx, t, ns, "second", v1alpha1.ReasonWaitingForQuota, "queue "+q.Name+" is at its CPU limit: 1.5 of 2 CPUs, and the workload needs 1")
	poll(t, 30*time.Second, "the queue's status showing 1.5 CPUs allocated", func() (bool, string) {
		var got v1alpha1.Queue
		if err := crClient(t).Get(ctx, client.ObjectKey{Name: q.Name}, &got); err != nil {
			return false, err.Error()
		}
		cpu := got.Status.Allocated[v1alpha1.ResourceCPU]
		b, _ := json.Marshal(got.Status.Allocated)
		return cpu.Cmp(resource.MustParse("1500m")) == 0, string(b)
	})
	p, err := clientset.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{})
	if err != nil || !gated(p) {
		t.Fatalf("second was admitted over the CPU limit (%v)", err)
	}
	if err := clientset.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	waitPods(ctx, t, ns, 60*time.Second, "second bound once first is gone", func(ps []corev1.Pod) (bool, string) {
		for _, p := range ps {
			if p.Name == "second" {
				return p.Spec.NodeName != "", fmt.Sprintf("gated %v", gated(&p))
			}
		}
		return false, "second missing"
	})
}

// TestHeadOfLineHoldsQueueHeadroom (issue 29): a queue limited to 2 GPUs
// runs two 1-GPU pods; a 2-GPU pod comes, then a stream of 1-GPU pods.
// Devices are plenty: only the limit holds the head back. Past the
// starvation bound the GPU a running pod frees is held for the head, not
// given to the next small pod, which waits saying so; once the second pod
// ends, the head runs.
func TestHeadOfLineHoldsQueueHeadroom(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/headroom": ns}
	addGPUNode(ctx, t, ns+"-hr-0", 8, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	q := "headroom-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "0", "2", 1))
	createPods(ctx, t, clientset, []*corev1.Pod{queuedPod(ns, "run-0", q, sel), queuedPod(ns, "run-1", q, sel)}, 2)
	waitPods(ctx, t, ns, 60*time.Second, "run-0 and run-1 bound", func(ps []corev1.Pod) (bool, string) {
		bd, _ := countBound(ps)
		return bd == 2, fmt.Sprintf("%d bound", bd)
	})
	head := extGPUPod(ns, "head", 1000, 2, sel)
	head.Labels[v1alpha1.LabelQueue] = q
	createPods(ctx, t, clientset, []*corev1.Pod{head}, 1)
	time.Sleep(time.Second)
	var later []*corev1.Pod
	for i := range 3 {
		later = append(later, queuedPod(ns, fmt.Sprintf("later-%d", i), q, sel))
	}
	createPods(ctx, t, clientset, later, 3)
	time.Sleep(devStarvationBound + 2*time.Second)

	del := func(name string) {
		t.Helper()
		if err := clientset.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
	del("run-0")
	// The GPU of headroom run-0 freed is the head's: no later pod takes it.
	want := "headroom is held for " + ns + "/head"
	poll(t, 60*time.Second, "later-0 held back for the head", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, "later-0", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := admissionCondition(p)
		if c == nil {
			return false, "no admission condition yet"
		}
		return strings.Contains(c.Message, want), c.Reason + ": " + c.Message
	})
	time.Sleep(5 * time.Second)
	for name, node := range podNodes(ctx, t, ns) {
		if strings.HasPrefix(name, "later-") && node != "" {
			t.Errorf("%s bound to %s into the headroom held for the head", name, node)
		}
	}
	del("run-1")
	poll(t, 60*time.Second, "the head bound", func() (bool, string) {
		nodes := podNodes(ctx, t, ns)
		return nodes["head"] != "", fmt.Sprint(nodes)
	})
	for name, node := range podNodes(ctx, t, ns) {
		if strings.HasPrefix(name, "later-") && node != "" {
			t.Errorf("%s bound to %s beside the head: the queue's limit is 2", name, node)
		}
	}
}
