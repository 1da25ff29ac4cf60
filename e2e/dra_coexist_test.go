package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// Coexistence with another DRA driver (docs/agent.md, "GPUs of other DRA
// drivers"; docs/queues.md, "Pods with ResourceClaims"): the test plays
// NVIDIA's DRA driver, publishing a kwok node's GPUs in ResourceSlices of
// driver gpu.nvidia.com with their UUIDs, and the DeviceClass gpu.nvidia.com.
// kube-scheduler's DRA plugin (real, v1.37) allocates the claims of pods
// that ask for them.

// nvidiaDriver is the driver and DeviceClass the test plays.
const nvidiaDriver = "gpu.nvidia.com"

// ensureNVIDIADeviceClass creates the DeviceClass NVIDIA's driver installs:
// every device of its driver.
func ensureNVIDIADeviceClass(ctx context.Context, t *testing.T) {
	t.Helper()
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: nvidiaDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", nvidiaDriver)}}}}}
	if _, err := clientset.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create DeviceClass: %v", err)
	}
}

// publishNVIDIASlice publishes node's GPUs, as its GPUNode lists them, in a
// ResourceSlice of NVIDIA's driver, and removes it when the test ends.
func publishNVIDIASlice(ctx context.Context, t *testing.T, node string) {
	t.Helper()
	var gn v1alpha1.GPUNode
	if err := crClient(t).Get(ctx, client.ObjectKey{Name: node}, &gn); err != nil {
		t.Fatalf("read GPUNode %s: %v", node, err)
	}
	w := pt.MakeResourceSlice(node+"-"+nvidiaDriver, nvidiaDriver, node)
	for _, d := range gn.Status.Devices {
		w.GPU(fmt.Sprintf("gpu-%d", d.Index), d.UUID, d.Product, fmt.Sprintf("%dMi", d.MemoryMiB))
	}
	if _, err := clientset.ResourceV1().ResourceSlices().Create(ctx, w.Obj(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceSlice: %v", err)
	}
	t.Cleanup(func() {
		_ = clientset.ResourceV1().ResourceSlices().Delete(context.WithoutCancel(ctx), w.Name, metav1.DeleteOptions{})
	})
}

// claimPod is a pod of queue q on the nodes with labels that holds one
// NVIDIA GPU through its own ResourceClaim claim.
func claimPod(ns, name, q, claim string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{v1alpha1.LabelQueue: q, extLabel: "true"}},
		Spec: corev1.PodSpec{
			NodeSelector:   labels,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}},
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}
}

// ctlOut runs `partita ctl args...` against the dev cluster.
func ctlOut(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, partitaBin, append([]string{"ctl"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.KubeconfigPath())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("partita ctl %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// TestOtherDRADriversGPUsAreCountedNeverDoubleBooked: a node whose GPUs
// NVIDIA's driver publishes is never offered partita.dev/gpu-milli (the
// GPUNode, `partita ctl nodes` and a gpu-milli pod's wait say why); a queue
// limited to 1 GPU admits one pod that holds an NVIDIA GPU through its claim
// and holds the second, with a `why` that names the limit; a gang of two
// claim pods stays gated whole while the scheduler's allocator finds only
// one GPU free, and starts whole once two are; a claim pod of higher
// priority then evicts that gang for one of its GPUs.
func TestOtherDRADriversGPUsAreCountedNeverDoubleBooked(t *testing.T) {
	ctx := testContext(t, 6*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	ns := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	node := "nvdra-" + ns
	labels := map[string]string{"partita.dev/e2e-test": ns}
	addGPUNode(ctx, t, node, 2, labels)
	ensureNVIDIADeviceClass(ctx, t)
	publishNVIDIASlice(ctx, t, node)

	// (a) The agent leaves the GPUs to NVIDIA's driver.
	poll(t, 60*time.Second, "the node's gpu-milli withdrawn and its GPUNode naming the driver", func() (bool, string) {
		n, err := clientset.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var gn v1alpha1.GPUNode
		if err := crClient(t).Get(ctx, client.ObjectKey{Name: node}, &gn); err != nil {
			return false, err.Error()
		}
		q := n.Status.Allocatable[v1alpha1.ResourceGPUMilli]
		marked := len(gn.Status.Devices) == 2
		for _, d := range gn.Status.Devices {
			marked = marked && d.DRADriver == nvidiaDriver
		}
		return q.Value() == 0 && marked && slices.Equal(gn.Status.DRADrivers, []string{nvidiaDriver}),
			fmt.Sprintf("gpu-milli %s, draDrivers %v, devices %+v", q.String(), gn.Status.DRADrivers, gn.Status.Devices)
	})
	nodes := ctlOut(ctx, t, "nodes")
	for _, want := range []string{"DRA " + nvidiaDriver, node + ": GPUs 0, 1 managed by DRA driver " + nvidiaDriver} {
		if !strings.Contains(nodes, want) {
			t.Errorf("partita ctl nodes does not say %q:\n%s", want, nodes)
		}
	}
	// A gpu-milli pod that may only go there waits and says why.
	milli := extGPUPod(ns, "milli", 1000, 1, labels)
	createPods(ctx, t, clientset, []*corev1.Pod{milli}, 1)
	poll(t, 60*time.Second, "the gpu-milli pod held, naming the driver", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, "milli", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c := admissionCondition(p)
		return c != nil && strings.Contains(c.Message, "GPUs managed by DRA driver "+nvidiaDriver) && p.Spec.NodeName == "",
			fmt.Sprintf("node %q, condition %+v", p.Spec.NodeName, c)
	})
	if err := clientset.CoreV1().Pods(ns).Delete(ctx, "milli", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}

	// (b) A queue limited to 1 GPU: the first claim pod is admitted and
	// kube-scheduler allocates its claim there; the second waits.
	q := "nvdra-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "1", "1", 1))
	for _, name := range []string{"gpu-1", "gpu-2"} {
		claim := pt.MakeResourceClaim(name, ns).Devices("gpu", nvidiaDriver, 1).Obj()
		if _, err := clientset.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create claim %s: %v", name, err)
		}
	}
	first, err := clientset.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "first", q, "gpu-1", labels), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create first: %v", err)
	}
	if !gated(first) || first.Labels[v1alpha1.LabelQueue] != q {
		t.Errorf("the webhook left the claim pod ungated or moved its queue: gates %v, labels %v", first.Spec.SchedulingGates, first.Labels)
	}
	poll(t, 90*time.Second, "the first claim pod bound with its claim allocated on the node", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, "first", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c, err := clientset.ResourceV1().ResourceClaims(ns).Get(ctx, "gpu-1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		alloc := c.Status.Allocation != nil && len(c.Status.Allocation.Devices.Results) == 1 && c.Status.Allocation.Devices.Results[0].Pool == node
		return p.Spec.NodeName == node && alloc, fmt.Sprintf("node %q, gated %v, allocation %+v, conditions %+v", p.Spec.NodeName, gated(p), c.Status.Allocation, p.Status.Conditions)
	})
	if _, err := clientset.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "second", q, "gpu-2", labels), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create second: %v", err)
	}
	want := fmt.Sprintf("queue %s is at its limit: 1 of 1 GPUs", q)
	waitEvent(ctx, t, ns, "second", v1alpha1.ReasonWaitingForQuota, want)
	poll(t, 30*time.Second, "the queue's status counting the claim", func() (bool, string) {
		var got v1alpha1.Queue
		if err := crClient(t).Get(ctx, client.ObjectKey{Name: q}, &got); err != nil {
			return false, err.Error()
		}
		alloc := got.Status.Allocated[v1alpha1.ResourceGPU]
		return alloc.MilliValue() == 1000 && got.Status.PendingWorkloads == 1, fmt.Sprintf("%+v", got.Status)
	})
	why := ctlOut(ctx, t, "why", "second", "-n", ns)
	for _, w := range []string{"queue " + q + " is at its limit: 1 of 1 GPUs allocated", "through ResourceClaims (claim gpu-2: 1 × " + nvidiaDriver + ")"} {
		if !strings.Contains(why, w) {
			t.Errorf("partita ctl why second does not say %q:\n%s", w, why)
		}
	}
	// The first goes: the second is admitted and gets the GPU.
	if err := clientset.CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	poll(t, 90*time.Second, "the second claim pod bound once the first is gone", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName == node, fmt.Sprintf("gated %v, node %q, condition %+v", gated(p), p.Spec.NodeName, admissionCondition(p))
	})
	// (c) A gang of two claim pods, in a queue without a limit, while the
	// second pod holds one of the node's two GPUs: the scheduler's
	// allocator finds room for one member only, so neither starts; once the
	// second pod goes, the gang starts whole.
	gq := "nvdra-gang-" + ns
	createQueue(ctx, t, gpuQueue(gq, ns, "0", "-1", 1))
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "pair", Namespace: ns}, Spec: v1alpha1.PodGroupSpec{MinMember: 2, Queue: gq}}
	if err := crClient(t).Create(ctx, pg); err != nil {
		t.Fatalf("create PodGroup: %v", err)
	}
	for i := range 2 {
		name := fmt.Sprintf("pair-%d", i)
		claim := pt.MakeResourceClaim(name, ns).Devices("gpu", nvidiaDriver, 1).Obj()
		if _, err := clientset.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create claim %s: %v", name, err)
		}
		p := claimPod(ns, name, gq, name, labels)
		p.Labels[v1alpha1.LabelPodGroup] = "pair"
		if _, err := clientset.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	pairs := func() (gatedN, bound int, seen string) {
		for i := range 2 {
			p, err := clientset.CoreV1().Pods(ns).Get(ctx, fmt.Sprintf("pair-%d", i), metav1.GetOptions{})
			if err != nil {
				return 0, 0, err.Error()
			}
			if gated(p) {
				gatedN++
			}
			if p.Spec.NodeName != "" {
				bound++
			}
			seen += fmt.Sprintf("%s gated %v node %q; ", p.Name, gated(p), p.Spec.NodeName)
		}
		return gatedN, bound, seen
	}
	waitEvent(ctx, t, ns, "pair-0", v1alpha1.ReasonWaitingForCapacity, "cannot be allocated")
	if g, b, seen := pairs(); g != 2 || b != 0 {
		t.Fatalf("the gang started in part: %s", seen)
	}
	if err := clientset.CoreV1().Pods(ns).Delete(ctx, "second", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	poll(t, 90*time.Second, "the gang bound whole", func() (bool, string) {
		_, b, seen := pairs()
		return b == 2, seen
	})

	// (d) A claim pod of higher priority in the gang's queue, while the
	// gang holds both GPUs: the loop's simulation frees the gang's claims,
	// so it evicts the gang (whole) and the pod gets a GPU.
	ensurePriorityClass(ctx, t, "partita-e2e-low", 10)
	ensurePriorityClass(ctx, t, "partita-e2e-high", 1000)
	time.Sleep(devPreemptMinRuntime + time.Second)
	urgentClaim := pt.MakeResourceClaim("urgent", ns).Devices("gpu", nvidiaDriver, 1).Obj()
	if _, err := clientset.ResourceV1().ResourceClaims(ns).Create(ctx, urgentClaim, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create claim urgent: %v", err)
	}
	urgent := claimPod(ns, "urgent", gq, "urgent", labels)
	urgent.Spec.PriorityClassName = "partita-e2e-high"
	if _, err := clientset.CoreV1().Pods(ns).Create(ctx, urgent, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create urgent: %v", err)
	}
	waitEvent(ctx, t, ns, "pair-0", v1alpha1.ReasonPreempted, "of higher priority (1000 > 0)")
	poll(t, 90*time.Second, "urgent bound with its claim allocated, the gang gone", func() (bool, string) {
		state := map[string]string{}
		for _, p := range listNS(ctx, t, ns) {
			state[p.Name] = p.Spec.NodeName
		}
		c, err := clientset.ResourceV1().ResourceClaims(ns).Get(ctx, "urgent", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		_, p0 := state["pair-0"]
		_, p1 := state["pair-1"]
		return state["urgent"] == node && c.Status.Allocation != nil && !p0 && !p1,
			fmt.Sprintf("pods %v, urgent's allocation %+v", state, c.Status.Allocation)
	})
}
