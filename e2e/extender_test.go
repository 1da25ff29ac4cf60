package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/extender"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// The extender's end-to-end tests run the real kube-scheduler, which calls
// `partita extender` (started by `partita dev up` with the scheduler
// configuration of `partita extender --print-scheduler-config`). Pods are
// created already canonical (as the webhook writes them) so that the tests
// do not depend on the webhook's mutation.

// extGPUClass is a PriorityClass whose preemptionPolicy is Never: the API
// server refuses a pod that says Never under a class (or the default) that
// says otherwise, and managed pods must say Never (DESIGN §6).
const extGPUClass = "partita-e2e-gpu-never"

// extLabel marks the extender tests' pods.
const extLabel = "e2e.partita.dev/extender"

func ensureGPUPriorityClass(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: extGPUClass}, Value: 0,
		PreemptionPolicy: ptr.To(corev1.PreemptNever), Description: "Partita e2e: GPU pods never preempt"}
	if _, err := cs.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create priority class: %v", err)
	}
}

// extGPUPod is a canonical GPU pod: count devices of milli each (1000 for
// whole GPUs), the partita.dev/gpu-milli resource, preemptionPolicy Never.
func extGPUPod(ns, name string, milli int64, count int, nodeSelector map[string]string) *corev1.Pod {
	anns := map[string]string{v1alpha1.AnnotationGPUCount: strconv.Itoa(count)}
	if milli < gpu.MilliPerGPU {
		anns[v1alpha1.AnnotationGPUFraction] = gpu.FormatMilli(milli)
	}
	q := *resource.NewQuantity(milli*int64(count), resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: anns, Labels: map[string]string{extLabel: "true"}},
		Spec: corev1.PodSpec{
			PriorityClassName: extGPUClass,
			PreemptionPolicy:  ptr.To(corev1.PreemptNever),
			NodeSelector:      nodeSelector,
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{v1alpha1.ResourceGPUMilli: q},
					Limits:   corev1.ResourceList{v1alpha1.ResourceGPUMilli: q},
				}}},
		},
	}
}

// extNamespace creates a namespace for the test and waits for its default
// service account: the API server refuses pods in a namespace until
// kube-controller-manager has created it, which a busy machine delays.
func extNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns := createNamespace(ctx, t, cs)
	waitServiceAccount(ctx, t, cs, ns)
	return ns
}

func waitServiceAccount(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	poll(t, 60*time.Second, "the default service account of "+ns, func() (bool, string) {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
}

var gpuNodes = map[string]string{v1alpha1.LabelGPUNode: "true"}

// inParallel runs do(0) … do(n-1), workers at a time, and fails the test
// with every error once all have run.
func inParallel(t *testing.T, workers, n int, do func(i int) error) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := do(i); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
}

// createPods creates pods with a few workers at once, as a burst.
func createPods(ctx context.Context, t *testing.T, cs kubernetes.Interface, pods []*corev1.Pod, workers int) {
	t.Helper()
	inParallel(t, workers, len(pods), func(i int) error {
		if _, err := cs.CoreV1().Pods(pods[i].Namespace).Create(ctx, pods[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create pod %s: %w", pods[i].Name, err)
		}
		return nil
	})
}

// burst returns n pods of milli each, named prefix-000...
func burst(ns, prefix string, n int, milli int64, nodeSelector map[string]string) []*corev1.Pod {
	out := make([]*corev1.Pod, n)
	for i := range out {
		out[i] = extGPUPod(ns, fmt.Sprintf("%s-%03d", prefix, i), milli, 1, nodeSelector)
	}
	return out
}

func listNS(ctx context.Context, t *testing.T, ns string) []corev1.Pod {
	t.Helper()
	pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	return pods.Items
}

// waitPods polls the namespace's pods every 500ms until cond holds, and
// fails the test with cond's last word and the pods' state when d passes.
func waitPods(ctx context.Context, t *testing.T, ns string, d time.Duration, what string, cond func([]corev1.Pod) (bool, string)) []corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		pods := listNS(ctx, t, ns)
		ok, msg := cond(pods)
		if ok {
			return pods
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("%s: not after %s: %s\n%s", what, d, msg, devcluster.DescribePods(context.WithoutCancel(ctx), clientset, ns, extLabel))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func countBound(pods []corev1.Pod) (bound, pending int) {
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			bound++
		} else {
			pending++
		}
	}
	return bound, pending
}

// waitSettled waits until exactly wantBound pods are bound, every other pod
// has been found unschedulable by kube-scheduler, and nothing has changed
// for 5 seconds.
func waitSettled(ctx context.Context, t *testing.T, ns string, d time.Duration, wantBound int) []corev1.Pod {
	t.Helper()
	var stableSince time.Time
	last := -1
	return waitPods(ctx, t, ns, d, fmt.Sprintf("%d pods bound and the rest unschedulable", wantBound), func(pods []corev1.Pod) (bool, string) {
		b, p := countBound(pods)
		if b != last {
			last, stableSince = b, time.Now()
		}
		if b > wantBound {
			t.Fatalf("%d pods bound, more than the %d that fit\n%s", b, wantBound, devcluster.DescribePods(ctx, clientset, ns, extLabel))
		}
		tried := 0
		for _, pod := range pods {
			// Found unschedulable by kube-scheduler, or held by the
			// admission loop for want of room; each pod counts once.
			if pod.Spec.NodeName == "" && slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Status == corev1.ConditionFalse && (c.Type == corev1.PodScheduled && c.Reason == corev1.PodReasonUnschedulable ||
					c.Type == v1alpha1.PodConditionAdmitted && c.Reason == v1alpha1.ReasonWaitingForCapacity)
			}) {
				tried++
			}
		}
		msg := fmt.Sprintf("%d bound, %d pending (%d found unschedulable), count stable for %s", b, p, tried, time.Since(stableSince).Round(time.Second))
		return b == wantBound && tried == p && time.Since(stableSince) > 5*time.Second, msg
	})
}

// devicesOf is the device UUIDs a pod holds (partita.dev/devices.main).
func devicesOf(p *corev1.Pod) []string {
	v := p.Annotations[v1alpha1.AnnotationDevicesPrefix+"main"]
	if v == "" {
		return nil
	}
	return strings.Split(v, ",")
}

// checkClusterLedger recomputes the ledger from the API objects alone (every
// GPUNode and every pod) and checks DESIGN §3's invariants on it: per device
// at most 1000 milli and its memory, whole devices alone, every bound pod
// that asks for GPUs holding exactly the devices it asked for. It returns
// the recomputed state.
func checkClusterLedger(ctx context.Context, t *testing.T) gpu.LedgerState {
	t.Helper()
	var gns v1alpha1.GPUNodeList
	if err := crClient(t).List(ctx, &gns); err != nil {
		t.Fatalf("list GPUNodes: %v", err)
	}
	pods, err := clientset.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	l := gpu.BuildLedger(gns.Items, pods.Items)
	for _, err := range l.CheckInvariants() {
		t.Errorf("invariant: %v", err)
	}
	inv := map[string]*gpu.NodeInventory{}
	for i := range gns.Items {
		inv[gns.Items[i].Name] = gpu.InventoryFromGPUNode(&gns.Items[i])
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		req, _ := gpu.ParsePod(p)
		if req == nil || p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if _, err := gpu.AllocationFromPod(p, inv[p.Spec.NodeName]); err != nil {
			t.Errorf("pod %s/%s is bound to %s without its devices: %v", p.Namespace, p.Name, p.Spec.NodeName, err)
		}
	}
	return l.State()
}

// deletePods deletes the namespace's pods at once and waits until they are
// gone, so that their devices are free for the next test. A busy API server
// may time out on the collection delete while it carries on: what is left is
// then deleted pod by pod.
func deletePods(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	ctx = context.WithoutCancel(ctx)
	now := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}
	err := clientset.CoreV1().Pods(ns).DeleteCollection(ctx, now, metav1.ListOptions{})
	if err != nil && !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) {
		t.Errorf("delete pods of %s: %v", ns, err)
	}
	start := time.Now()
	for {
		pods := listNS(ctx, t, ns)
		if len(pods) == 0 {
			return
		}
		if time.Since(start) > 2*time.Minute {
			t.Errorf("%d pods of %s still there after 2 minutes", len(pods), ns)
			return
		}
		if time.Since(start) > 20*time.Second {
			for _, p := range pods {
				_ = clientset.CoreV1().Pods(ns).Delete(ctx, p.Name, now)
			}
		}
		time.Sleep(time.Second)
	}
}

// waitGPUsIdle waits until the shared cluster's GPUs are free and its
// GPUNodes are the dev cluster's own, all healthy, so that a test can count
// on all of them.
func waitGPUsIdle(ctx context.Context, t *testing.T) {
	t.Helper()
	c := crClient(t)
	poll(t, 90*time.Second, "every GPU of the shared cluster free", func() (bool, string) {
		var gns v1alpha1.GPUNodeList
		if err := c.List(ctx, &gns); err != nil {
			return false, err.Error()
		}
		healthy := 0
		for _, g := range gns.Items {
			healthy += int(g.Status.HealthyDevices)
		}
		if len(gns.Items) != e2eNodes || healthy != e2eNodes*e2eGPUsPerNode {
			return false, fmt.Sprintf("%d GPUNodes with %d healthy devices, want %d with %d", len(gns.Items), healthy, e2eNodes, e2eNodes*e2eGPUsPerNode)
		}
		pods, err := clientset.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		st := gpu.BuildLedger(gns.Items, pods.Items).State()
		if len(st.Pods) > 0 {
			return false, fmt.Sprintf("%d pods still hold GPUs, e.g. %s/%s", len(st.Pods), st.Pods[0].Allocation.Namespace, st.Pods[0].Allocation.Name)
		}
		return true, ""
	})
}

// addTwoGPUNode adds a simulated node with two H100s to the shared cluster
// (the agent serves it like the others) and removes it when the test ends.
func addTwoGPUNode(ctx context.Context, t *testing.T, name string) {
	t.Helper()
	addGPUNode(ctx, t, name, 2, nil)
}

// TestExtenderOneNodeTwoGPUs runs the small placement cases on a node of its
// own with two GPUs.
func TestExtenderOneNodeTwoGPUs(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	node := "e2e-ext-two-gpus"
	addTwoGPUNode(ctx, t, node)
	onNode := map[string]string{"kubernetes.io/hostname": node}

	t.Run("FourHalvesLandOnTwoDevices", func(t *testing.T) {
		ns := extNamespace(ctx, t, clientset)
		t.Cleanup(func() { deletePods(ctx, t, ns) })
		createPods(ctx, t, clientset, burst(ns, "half", 4, 500, onNode), 4)
		pods := waitPods(ctx, t, ns, 90*time.Second, "four halves bound", func(pods []corev1.Pod) (bool, string) {
			b, p := countBound(pods)
			return b == 4, fmt.Sprintf("%d bound, %d pending", b, p)
		})
		perDevice := map[string]int{}
		for i := range pods {
			d := devicesOf(&pods[i])
			if len(d) != 1 {
				t.Errorf("pod %s holds devices %v, want one", pods[i].Name, d)
			}
			for _, u := range d {
				perDevice[u]++
			}
		}
		if len(perDevice) != 2 {
			t.Errorf("the halves are on %d devices, want 2: %v", len(perDevice), perDevice)
		}
		for u, n := range perDevice {
			if n != 2 {
				t.Errorf("device %s holds %d halves, want 2", u, n)
			}
		}
		checkClusterLedger(ctx, t)
	})

	t.Run("ThirdPodWaitsNamingTheLargestFreeSlice", func(t *testing.T) {
		ns := extNamespace(ctx, t, clientset)
		t.Cleanup(func() { deletePods(ctx, t, ns) })
		createPods(ctx, t, clientset, burst(ns, "six", 3, 600, onNode), 1)
		pods := waitSettled(ctx, t, ns, 90*time.Second, 2)
		var waiting *corev1.Pod
		seen := map[string]bool{}
		for i := range pods {
			if pods[i].Spec.NodeName == "" {
				waiting = &pods[i]
				continue
			}
			for _, u := range devicesOf(&pods[i]) {
				if seen[u] {
					t.Errorf("two 0.6 slices share device %s", u)
				}
				seen[u] = true
			}
		}
		waitWaitingEvent(ctx, t, waiting, 30*time.Second, "largest free slice 0.4 on GPU")
		checkClusterLedger(ctx, t)
	})
}

// waitWaitingEvent waits for an event on the waiting pod, from the admission
// loop holding it or from kube-scheduler finding no node, whose message
// contains want.
func waitWaitingEvent(ctx context.Context, t *testing.T, pod *corev1.Pod, timeout time.Duration, want string) {
	t.Helper()
	poll(t, timeout, fmt.Sprintf("an event on %s saying %q", pod.Name, want), func() (bool, string) {
		var msgs []string
		for _, e := range devcluster.PodEvents(ctx, clientset, pod, 5) {
			if (e.Reason == v1alpha1.ReasonWaitingForCapacity || e.Reason == "FailedScheduling") && strings.Contains(e.Message, want) {
				t.Logf("event on %s: %s", pod.Name, e.Message)
				return true, ""
			}
			msgs = append(msgs, e.Reason+": "+e.Message)
		}
		return false, fmt.Sprintf("events: %q", msgs)
	})
}

// TestExtenderWholeAndSlicesNeverShare fills one 8-GPU node with four whole
// GPUs and eight halves, created interleaved: all fit, no device holds a
// whole GPU and a slice, and one more of either waits.
func TestExtenderWholeAndSlicesNeverShare(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	waitGPUsIdle(ctx, t)
	ns := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	node := devcluster.NodeName(e2eNodes - 1)
	onNode := map[string]string{"kubernetes.io/hostname": node}
	var pods []*corev1.Pod
	for i := range 4 {
		pods = append(pods,
			extGPUPod(ns, fmt.Sprintf("half-%d", 2*i), 500, 1, onNode),
			extGPUPod(ns, fmt.Sprintf("whole-%d", i), 1000, 1, onNode),
			extGPUPod(ns, fmt.Sprintf("half-%d", 2*i+1), 500, 1, onNode))
	}
	createPods(ctx, t, clientset, pods, 1)
	waitPods(ctx, t, ns, 2*time.Minute, "four whole GPUs and eight halves bound", func(pods []corev1.Pod) (bool, string) {
		b, p := countBound(pods)
		return b == 12, fmt.Sprintf("%d bound, %d pending", b, p)
	})
	createPods(ctx, t, clientset, []*corev1.Pod{extGPUPod(ns, "whole-extra", 1000, 1, onNode), extGPUPod(ns, "half-extra", 500, 1, onNode)}, 1)
	bound := waitSettled(ctx, t, ns, 90*time.Second, 12)

	whole, sliced := map[string][]string{}, map[string][]string{}
	for i := range bound {
		p := &bound[i]
		if p.Spec.NodeName == "" {
			if !strings.HasSuffix(p.Name, "-extra") {
				t.Errorf("pod %s waits, want only the extra ones to", p.Name)
			}
			continue
		}
		for _, u := range devicesOf(p) {
			if strings.HasPrefix(p.Name, "whole") {
				whole[u] = append(whole[u], p.Name)
			} else {
				sliced[u] = append(sliced[u], p.Name)
			}
		}
	}
	for u, w := range whole {
		if len(w) != 1 || len(sliced[u]) > 0 {
			t.Errorf("device %s holds whole %v and slices %v; a whole GPU must be alone", u, w, sliced[u])
		}
	}
	if len(whole) != 4 || len(sliced) != 4 {
		t.Errorf("%d devices hold whole GPUs and %d hold slices, want 4 and 4 (halves packed in pairs)", len(whole), len(sliced))
	}
	checkClusterLedger(ctx, t)
}

// TestExtenderBurst200 creates 200 quarter-GPU pods at once on 4 nodes × 8
// GPUs: exactly 128 bind, 72 wait, and the invariants hold when recomputed
// from the API objects alone.
func TestExtenderBurst200(t *testing.T) {
	ctx := testContext(t, 8*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	waitGPUsIdle(ctx, t)
	ns := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	start := time.Now()
	createPods(ctx, t, clientset, burst(ns, "q", 200, 250, gpuNodes), 16)
	created := time.Since(start)
	pods := waitSettled(ctx, t, ns, 5*time.Minute, 128)
	t.Logf("200 pods created in %s; 128 bound and 72 waiting after %s", created.Round(time.Millisecond), time.Since(start).Round(time.Second))
	_, pending := countBound(pods)
	if pending != 72 {
		t.Errorf("%d pods wait, want 72", pending)
	}
	st := checkClusterLedger(ctx, t)
	for _, n := range st.Nodes {
		for _, d := range n.Devices {
			if d.AllocatedMilli != 1000 || d.Allocations != 4 {
				t.Errorf("%s GPU %d holds %d milli in %d slices, want 1000 in 4", n.Name, d.Index, d.AllocatedMilli, d.Allocations)
			}
		}
	}
}

// TestExtenderRestartMidBurst kills the extender (SIGKILL) while a burst is
// being scheduled and starts it again with `partita dev up`: it rebuilds its
// ledger from the API objects, no device is over-allocated, and no pod is
// bound without its devices.
func TestExtenderRestartMidBurst(t *testing.T) {
	ctx := testContext(t, 8*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	waitGPUsIdle(ctx, t)
	ns := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })

	pidFile := filepath.Join(cluster.Dir(), "partita", "extender.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("read the extender's pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("extender pid file: %v", err)
	}

	pods := burst(ns, "r", 150, 250, gpuNodes)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The kill lands mid-burst: some pods bound, some being bound, some
		// waiting, some not created yet.
		var wg sync.WaitGroup
		const workers = 6
		for w := range workers {
			wg.Go(func() {
				for i := w; i < len(pods); i += workers {
					if _, err := clientset.CoreV1().Pods(ns).Create(ctx, pods[i], metav1.CreateOptions{}); err != nil {
						t.Errorf("create pod %s: %v", pods[i].Name, err)
						return
					}
				}
			})
		}
		wg.Wait()
	}()
	waitPods(ctx, t, ns, 2*time.Minute, "a quarter of the burst bound", func(pods []corev1.Pod) (bool, string) {
		b, p := countBound(pods)
		return b >= 40, fmt.Sprintf("%d bound, %d pending", b, p)
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the extender (pid %d): %v", pid, err)
	}
	b1, p1 := countBound(listNS(ctx, t, ns))
	t.Logf("killed the extender with %d pods created, %d bound and %d pending", b1+p1, b1, p1)
	checkClusterLedger(ctx, t)
	time.Sleep(3 * time.Second)
	if out, err := partita(ctx, "dev", "up", "--name", clusterName,
		"--nodes", fmt.Sprint(e2eNodes), "--gpus-per-node", fmt.Sprint(e2eGPUsPerNode)); err != nil {
		t.Fatalf("dev up to restart the extender: %v\n%s", err, out)
	}
	<-done
	start := time.Now()
	final := waitSettled(ctx, t, ns, 5*time.Minute, 128)
	_, pending := countBound(final)
	t.Logf("after the restart: 128 bound and %d waiting within %s", pending, time.Since(start).Round(time.Second))
	if pending != len(pods)-128 {
		t.Errorf("%d pods wait, want %d", pending, len(pods)-128)
	}
	st := checkClusterLedger(ctx, t)
	for _, n := range st.Nodes {
		for _, d := range n.Devices {
			if d.AllocatedMilli > 1000 {
				t.Errorf("%s GPU %d is over-allocated: %d milli", n.Name, d.Index, d.AllocatedMilli)
			}
		}
	}
	if log, err := os.ReadFile(cluster.HostProcessLog("extender")); err == nil {
		if n := strings.Count(string(log), "Serving the scheduler extender"); n < 2 {
			t.Errorf("the extender's log shows %d starts, want 2 or more", n)
		}
	}
}

// componentCPU returns the CPU seconds each process of a dev cluster has
// used so far (kwokctl's components and Partita's host processes), by name.
func componentCPU(dir string) map[string]float64 {
	out := map[string]float64{}
	for name, pid := range componentPIDs(dir) {
		if cpu, ok := processCPU(pid); ok {
			out[name] = cpu
		}
	}
	return out
}

// processCPU is the CPU seconds process pid has used so far (kept across
// its execs); false when it is gone.
func processCPU(pid string) (float64, bool) {
	stat, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, false
	}
	// Fields after the command name: utime and stime are the 12th and
	// 13th, in clock ticks (100 a second on Linux).
	rest := string(stat[strings.LastIndexByte(string(stat), ')')+2:])
	fields := strings.Fields(rest)
	if len(fields) < 13 {
		return 0, false
	}
	u, _ := strconv.ParseFloat(fields[11], 64)
	st, _ := strconv.ParseFloat(fields[12], 64)
	return (u + st) / 100, true
}

// componentPIDs are the pids of a dev cluster's processes (the control
// plane's and Partita's host processes), by name, from their pid files.
func componentPIDs(dir string) map[string]string {
	out := map[string]string{}
	for _, glob := range []string{filepath.Join(dir, "pids", "*.pid"), filepath.Join(dir, "partita", "*.pid")} {
		files, _ := filepath.Glob(glob)
		for _, f := range files {
			if b, err := os.ReadFile(f); err == nil {
				out[strings.TrimSuffix(filepath.Base(f), ".pid")] = strings.TrimSpace(string(b))
			}
		}
	}
	return out
}

// cpuSince says how many CPU seconds each component used since before.
func cpuSince(dir string, before map[string]float64) string {
	now := componentCPU(dir)
	for n := range now {
		now[n] -= before[n]
	}
	return formatCPU(now)
}

// formatCPU lists CPU seconds by component, in order of name.
func formatCPU(cpu map[string]float64) string {
	var parts []string
	for _, n := range slices.Sorted(maps.Keys(cpu)) {
		parts = append(parts, fmt.Sprintf("%s %.1fs", n, cpu[n]))
	}
	return strings.Join(parts, ", ")
}

// extenderCounts reads the verb and bind counters from a dev cluster's
// extender.
func extenderCounts(ctx context.Context, c *devcluster.Cluster) string {
	var out []string
	for _, line := range extenderMetrics(ctx, c, "partita_extender_request_duration_seconds_count", "partita_extender_request_duration_seconds_sum",
		"partita_extender_binds_total", "partita_extender_bind_conflicts_total", "partita_extender_filter_nodes_total") {
		out = append(out, strings.TrimPrefix(line, "partita_extender_"))
	}
	return strings.Join(out, "; ")
}

// extenderMetrics are the lines of a dev cluster's extender's /metrics
// that start with one of prefixes; on an error, one line saying it.
func extenderMetrics(ctx context.Context, c *devcluster.Cluster, prefixes ...string) []string {
	port, err := c.Port("extender")
	if err != nil {
		return []string{err.Error()}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return []string{err.Error()}
	}
	// /metrics needs no client certificate; the CA is the cluster's.
	ca, err := os.ReadFile(filepath.Join(c.StateDir(), "extender-certs", extender.DevCAFile))
	if err != nil {
		return []string{err.Error()}
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	resp, err := hc.Do(req)
	if err != nil {
		return []string{err.Error()}
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				out = append(out, line)
				break
			}
		}
	}
	return out
}

// TestExtenderThroughput is the end-to-end benchmark of docs/benchmarks.md:
// on a cluster of its own with 500 simulated nodes × 8 GPUs, 2,000 plain pods
// (kube-scheduler alone) and then 2,000 half-GPU pods (kube-scheduler calling
// the extender), the same scheduler and client QPS for both. Pods are created
// held by a scheduling gate and released at once, so that the rate measured
// is scheduling and binding, not creation. It reports pods/s for each and
// their ratio (target ≥ 0.7). It runs only with PARTITA_E2E_BENCH=1:
//
//	make build && PARTITA_E2E_BENCH=1 PARTITA_BIN=$PWD/bin/partita go test -count=1 -v -timeout 40m -run TestExtenderThroughput ./e2e/
func TestExtenderThroughput(t *testing.T) {
	if os.Getenv("PARTITA_E2E_BENCH") == "" {
		t.Skip("set PARTITA_E2E_BENCH=1 to run the end-to-end extender benchmark")
	}
	const nodes, gpus, n = 500, 8, 2000
	ctx := benchContext(t, 35*time.Minute)
	start := time.Now()
	bc, cs, _ := benchCluster(ctx, t, clusterName+"-bench", nodes, gpus)
	t.Logf("cluster of %d nodes × %d GPUs ready in %s", nodes, gpus, time.Since(start).Round(time.Second))
	ensureGPUPriorityClass(ctx, t, cs)

	// Each phase creates its pods held by a scheduling gate, then removes
	// the gates as fast as it can and times from the first removal until
	// every pod is bound: creation (through the webhook, on a busy box) is
	// slower than scheduling and would otherwise set the pace of both.
	const hold = "e2e.partita.dev/hold"
	ungate := []byte(`[{"op":"remove","path":"/spec/schedulingGates"}]`)
	//
	// The pods go to Partita's own namespace, which the webhook never sees:
	// on this box every admission call costs API server time that both
	// phases would otherwise wait for (PARTITA_E2E_BENCH_NS picks another).
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "partita-system"}}
	if n := os.Getenv("PARTITA_E2E_BENCH_NS"); n != "" {
		ns.Name = n
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cs, ns.Name)
	if os.Getenv("PARTITA_E2E_BENCH_STOP_AGENT") != "" {
		// A diagnostic: the agent reports every slice in GPUNode status,
		// API writes that plain pods do not cause. The GPUNodes it has
		// published stay.
		b, err := os.ReadFile(filepath.Join(bc.Dir(), "partita", "agent.pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
			t.Fatalf("stop the agent: %v", err)
		}
		t.Logf("stopped the agent (pid %d)", pid)
	}
	run := func(what string, mk func(ns string, i int) *corev1.Pod) (podsPerSecond float64) {
		pods := make([]*corev1.Pod, n)
		for i := range pods {
			pods[i] = mk(ns.Name, i)
			pods[i].Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: hold}}
		}
		selector := "e2e.partita.dev/phase=" + pods[0].Labels["e2e.partita.dev/phase"]
		begin := time.Now()
		createPods(ctx, t, cs, pods, 32)
		created := time.Since(begin)
		cpuBefore := componentCPU(bc.Dir())
		begin = time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		var ungated time.Duration
		ungatingDone := make(chan struct{})
		go func() {
			defer close(ungatingDone)
			for range 32 {
				wg.Go(func() {
					for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
						if _, err := cs.CoreV1().Pods(ns.Name).Patch(ctx, pods[i].Name, types.JSONPatchType, ungate, metav1.PatchOptions{}); err != nil {
							t.Errorf("ungate %s: %v", pods[i].Name, err)
						}
					}
				})
			}
			wg.Wait()
			ungated = time.Since(begin)
		}()
		var took time.Duration
		for {
			list, err := cs.CoreV1().Pods(ns.Name).List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: selector})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := countBound(list.Items)
			if b == n {
				took = time.Since(begin)
				break
			}
			if time.Since(begin) > 10*time.Minute {
				t.Fatalf("%s: %d of %d bound after 10 minutes", what, b, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
		<-ungatingDone
		rate := float64(n) / took.Seconds()
		t.Logf("%s: %d pods created in %s; gates removed in %s; all bound %s after the first removal: %.1f pods/s",
			what, n, created.Round(time.Millisecond), ungated.Round(time.Millisecond), took.Round(time.Millisecond), rate)
		t.Logf("%s: CPU used from the first removal on: %s", what, cpuSince(bc.Dir(), cpuBefore))
		t.Logf("%s: extender so far: %s", what, extenderCounts(ctx, bc))
		return rate
	}
	plain := run("plain pods, kube-scheduler alone", func(ns string, i int) *corev1.Pod {
		p := extGPUPod(ns, fmt.Sprintf("plain-%04d", i), 0, 0, gpuNodes)
		p.Labels["e2e.partita.dev/phase"] = "plain"
		p.Annotations = nil
		p.Spec.PriorityClassName, p.Spec.PreemptionPolicy = "", nil
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		return p
	})
	fractional := run("half-GPU pods, kube-scheduler + extender", func(ns string, i int) *corev1.Pod {
		p := extGPUPod(ns, fmt.Sprintf("half-%04d", i), 500, 1, gpuNodes)
		p.Labels["e2e.partita.dev/phase"] = "half"
		return p
	})
	ratio := fractional / plain
	t.Logf("RESULT plain %.1f pods/s, fractional %.1f pods/s, ratio %.2f (target ≥ 0.7)", plain, fractional, ratio)
	if ratio < 0.7 {
		t.Errorf("fractional pods schedule at %.2f of the plain rate, below the 0.7 target", ratio)
	}
}

// benchCluster brings up a cluster of its own for a benchmark, with client
// limits raised, and waits until every GPUNode is published; it is torn
// down when the test ends unless PARTITA_E2E_KEEP is set.
// benchCluster brings up the dev cluster name of nodes × gpus for a
// benchmark; devUpArgs go to each dev up.
func benchCluster(ctx context.Context, t *testing.T, name string, nodes, gpus int, devUpArgs ...string) (*devcluster.Cluster, kubernetes.Interface, client.Client) {
	t.Helper()
	if os.Getenv("PARTITA_E2E_KEEP") == "" {
		t.Cleanup(func() { _, _ = partita(context.WithoutCancel(ctx), "dev", "down", "--name", name) })
	}
	// The agent publishes hundreds of nodes at its client QPS, longer than
	// dev up waits for it to be ready; dev up again starts what is missing.
	for attempt := 1; ; attempt++ {
		out, err := partita(ctx, append([]string{"dev", "up", "--name", name, "--nodes", fmt.Sprint(nodes), "--gpus-per-node", fmt.Sprint(gpus)}, devUpArgs...)...)
		if err == nil {
			break
		}
		if attempt == 5 || !strings.Contains(out, "did not become ready") {
			t.Fatalf("dev up: %v\n%s", err, out)
		}
		t.Logf("dev up, attempt %d: %v", attempt, err)
	}
	opts := devcluster.DefaultOptions()
	opts.Name = name
	bc, err := devcluster.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := bc.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Minute, "every GPUNode published", func() (bool, string) {
		var gns v1alpha1.GPUNodeList
		if err := c.List(ctx, &gns); err != nil {
			return false, err.Error()
		}
		healthy := 0
		for _, g := range gns.Items {
			healthy += int(g.Status.HealthyDevices)
		}
		return healthy == nodes*gpus, fmt.Sprintf("%d GPUNodes, %d healthy devices", len(gns.Items), healthy)
	})
	return bc, cs, c
}
