package partitatest

import (
	"context"
	"fmt"
	"maps"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// The device the extender's and the admission loop's tests use.
const (
	H100    = "NVIDIA H100 80GB HBM3"
	H100MiB = 81920
)

// Context is the test's context with a logger that writes to the test at
// V(5).
func Context(t *testing.T) context.Context {
	t.Helper()
	return logr.NewContext(t.Context(), testr.NewWithOptions(t, testr.Options{Verbosity: 5}))
}

// FractionPod is a canonical pod in namespace ns asking for frac of one
// GPU, as the webhook writes it.
func FractionPod(name, frac, milli string) *PodWrapper {
	return MakePod(name, "ns").GPUFraction(frac).GPUCount(1).Resource("", v1alpha1.ResourceGPUMilli, milli)
}

// WholePod is a canonical pod in namespace ns asking for n whole GPUs.
func WholePod(name string, n int, milli string) *PodWrapper {
	return MakePod(name, "ns").GPUCount(n).Resource("", v1alpha1.ResourceGPUMilli, milli)
}

// H100Node is a GPUNode with n healthy H100s.
func H100Node(name string, n int) *GPUNodeWrapper {
	return MakeGPUNode(name).Devices(n, H100, H100MiB)
}

// Bound returns the pod of w bound to node holding the H100s of the given
// indexes in its first container, as the API server shows it after the
// extender's Binding. It panics on a request the parser refuses: a test's
// mistake.
func Bound(w *PodWrapper, node string, indexes ...int32) *corev1.Pod {
	pod := w.Clone().Node(node).Obj()
	req, errs := gpu.ParsePod(pod)
	if len(errs) > 0 || req == nil {
		panic(fmt.Sprintf("parse %s: %v", pod.Name, errs))
	}
	c := req.Containers[0]
	ca := gpu.ContainerAllocation{Container: c.Name, Milli: c.Milli}
	for _, i := range indexes {
		ca.DeviceUUIDs = append(ca.DeviceUUIDs, DeviceUUID(node, i))
		ca.DeviceIndexes = append(ca.DeviceIndexes, i)
	}
	if !c.Whole() {
		ca.MemoryMiB = c.Milli * H100MiB / gpu.MilliPerGPU
		ca.SMPercent = int32((c.Milli + 9) / 10)
	}
	a := &gpu.PodAllocation{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Node: node, Containers: []gpu.ContainerAllocation{ca}}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	maps.Copy(pod.Annotations, gpu.AllocationAnnotations(a))
	return pod
}

// Ledger returns a ledger of nodes and pods.
func Ledger(nodes []*v1alpha1.GPUNode, pods ...*corev1.Pod) *gpu.Ledger {
	l := gpu.NewLedger()
	for _, n := range nodes {
		l.UpsertNode(n)
	}
	for _, p := range pods {
		l.UpsertPod(p)
	}
	return l
}
