package gpu_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// refMiB is the reference device memory the tests canonicalise with.
const refMiB = 81920

// held returns a pod bound to node that holds the given devices (see
// partitatest.Held).
func held(name, node, amount string, devices ...int32) *corev1.Pod {
	uuids := make([]string, 0, len(devices))
	for _, d := range devices {
		uuids = append(uuids, pt.DeviceUUID(node, d))
	}
	return pt.Held(name, node, amount, refMiB, uuids...)
}

// parse parses a pod that must be valid.
func parse(t testing.TB, pod *corev1.Pod) *gpu.PodRequest {
	t.Helper()
	r, errs := gpu.ParsePod(pod)
	if len(errs) > 0 || r == nil {
		t.Fatalf("ParsePod(%s): %v (request %v)", pod.Name, errs, r)
	}
	return r
}

// bound returns pod as bind leaves it: canonical, on the allocation's node,
// with the allocation's annotations.
func bound(pod *corev1.Pod, r *gpu.PodRequest, a *gpu.PodAllocation) *corev1.Pod {
	out := gpu.ApplyCanonical(pod, r, refMiB)
	for k, v := range gpu.AllocationAnnotations(a) {
		out.Annotations[k] = v
	}
	out.Spec.NodeName = a.Node
	out.Status.Phase = corev1.PodRunning
	return out
}

// ledgerWith builds a ledger of nodes and pods.
func ledgerWith(nodes []*v1alpha1.GPUNode, pods []*corev1.Pod) *gpu.Ledger {
	l := gpu.NewLedger()
	for _, n := range nodes {
		l.UpsertNode(n)
	}
	for _, p := range pods {
		l.UpsertPod(p)
	}
	return l
}

func h100s(name string, n int) *v1alpha1.GPUNode {
	return pt.MakeGPUNode(name).Devices(n, "NVIDIA H100 80GB HBM3", 81920).Obj()
}

// quantity is resource.MustParse for table values.
func quantity(s string) resource.Quantity { return resource.MustParse(s) }
