package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
)

// TestQueueAppliedWithItsPodGroup: a Queue, a PodGroup naming it and a pod
// of that PodGroup, created back to back as `kubectl apply` of one file
// sends them, are all accepted, every time (#31: the webhook refused the
// PodGroup in 4 of 10 runs, its policy state not having the Queue yet).
func TestQueueAppliedWithItsPodGroup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	c := crClient(t)
	for i := range 10 {
		q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", ns, i)},
			Spec: v1alpha1.QueueSpec{Namespaces: []string{ns}}}
		if err := c.Create(ctx, q); err != nil {
			t.Fatalf("round %d: create queue: %v", i, err)
		}
		t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), q) })
		pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("train-%d", i), Namespace: ns},
			Spec: v1alpha1.PodGroupSpec{MinMember: 1, Queue: q.Name}}
		if err := c.Create(ctx, pg); err != nil {
			t.Errorf("round %d: a PodGroup created right after its queue was refused: %v", i, err)
			continue
		}
		pod := extGPUPod(ns, fmt.Sprintf("train-%d-0", i), 500, 1, map[string]string{"e2e.partita.dev/nowhere": "true"})
		pod.Labels[v1alpha1.LabelPodGroup] = pg.Name
		if _, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("round %d: a member created right after its queue was refused: %v", i, err)
		}
		bare := extGPUPod(ns, fmt.Sprintf("bare-%d", i), 500, 1, map[string]string{"e2e.partita.dev/nowhere": "true"})
		bare.Labels[v1alpha1.LabelQueue] = q.Name
		if _, err := clientset.CoreV1().Pods(ns).Create(ctx, bare, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("round %d: a pod naming a queue created right before was refused: %v", i, err)
		}
	}
	// A queue that exists nowhere is still refused, with the same message.
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "nowhere", Namespace: ns},
		Spec: v1alpha1.PodGroupSpec{MinMember: 1, Queue: ns + "-missing"}}
	err := c.Create(ctx, pg)
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("a PodGroup naming a queue that does not exist: got %v, want a refusal saying it does not exist", err)
	}
}

// TestGangSkipsANodeWithoutPodRoom: a node whose GPUs are free but whose
// kubelet takes only two more pods gets no more than two members of a gang
// (#31: the loop pinned members kube-scheduler then refused, "Too many
// pods", and half the gang ran beside members that could not start); the
// gang binds whole, its other members on a node with room.
func TestGangSkipsANodeWithoutPodRoom(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	labels := map[string]string{"e2e.partita.dev/pod-room": ns}
	// tight has 4 free GPUs but room for 2 pods: binpacking by GPUs
	// alone would put the whole gang there, the fuller node.
	addGPUNode(ctx, t, ns+"-tight", 4, labels)
	addGPUNode(ctx, t, ns+"-roomy", 8, labels)
	setAllocatablePods(ctx, t, ns+"-tight", 2)
	// Cleanups run last first: the pods go before their nodes.
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: ns}, Spec: v1alpha1.PodGroupSpec{MinMember: 4}}
	if err := crClient(t).Create(ctx, pg); err != nil {
		t.Fatalf("create pod group: %v", err)
	}
	createPods(ctx, t, clientset, gangPods(ns, "train", 4, labels), 4)
	var where map[string]string
	poll(t, 90*time.Second, "the gang of 4 bound, at most 2 on the tight node", func() (bool, string) {
		where = podNodes(ctx, t, ns)
		bound := 0
		for _, n := range where {
			if n != "" {
				bound++
			}
		}
		return bound == 4, fmt.Sprint(where)
	})
	tight := 0
	for _, n := range where {
		if n == ns+"-tight" {
			tight++
		}
	}
	if tight > 2 {
		t.Errorf("%d members on a node with room for 2 pods: %v", tight, where)
	}
}

// TestNodeAddedByHandGetsPodRoom: a bare kwok Node applied by hand (no
// status), labelled as the README says, gets pods, CPU and memory beside
// its GPUs, whichever of kwok and the agent writes its status first, and
// runs a GPU pod.
func TestNodeAddedByHandGetsPodRoom(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ns := extNamespace(ctx, t, clientset)
	name := ns + "-by-hand"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
		Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
		Labels: map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"type": "kwok", v1alpha1.LabelGPUNode: "true", "nvidia.com/gpu.count": "2",
			"nvidia.com/gpu.product": "NVIDIA-L40S", "nvidia.com/gpu.memory": "46068", "e2e.partita.dev/by-hand": ns}}}
	if _, err := clientset.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() {
		_ = clientset.CoreV1().Nodes().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
	})
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	ensureGPUPriorityClass(ctx, t, clientset)
	poll(t, 90*time.Second, "node "+name+" Ready with GPUs, pods, CPU and memory", func() (bool, string) {
		n, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		a := n.Status.Allocatable
		g := a[v1alpha1.ResourceGPUMilli]
		return devcluster.NodeReady(n) && g.Value() == 2000 && a.Pods().Value() > 0 && a.Cpu().MilliValue() > 0 && a.Memory().Value() > 0,
			fmt.Sprintf("ready %v, allocatable %v", devcluster.NodeReady(n), a)
	})
	pod := extGPUPod(ns, "on-hand-node", 1000, 1, map[string]string{"e2e.partita.dev/by-hand": ns})
	pod.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("1")
	createPods(ctx, t, clientset, []*corev1.Pod{pod}, 1)
	poll(t, 60*time.Second, "the pod bound to the node added by hand", func() (bool, string) {
		where := podNodes(ctx, t, ns)
		return where["on-hand-node"] == name, fmt.Sprint(where)
	})
}

// setAllocatablePods sets a node's allocatable pods, as a kubelet with
// --max-pods would report it.
func setAllocatablePods(ctx context.Context, t *testing.T, name string, pods int64) {
	t.Helper()
	n, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alloc := n.Status.Allocatable.DeepCopy()
	alloc[corev1.ResourcePods] = *resource.NewQuantity(pods, resource.DecimalSI)
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"allocatable": alloc}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := clientset.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("set allocatable pods of %s: %v", name, err)
	}
	poll(t, 30*time.Second, fmt.Sprintf("node %s allocatable pods %d", name, pods), func() (bool, string) {
		n, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return n.Status.Allocatable.Pods().Value() == pods, fmt.Sprint(n.Status.Allocatable)
	})
}
