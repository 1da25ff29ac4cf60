package nodeagent

import (
	"cmp"
	"errors"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// sliceKey names one container's slice of one device.
type sliceKey struct {
	UID       types.UID
	Container string
	Device    int32
}

// boundPod is a pod on the node and the devices it holds.
type boundPod struct {
	pod   *corev1.Pod
	alloc *gpu.PodAllocation
}

// holdsGPUs reports whether a pod still holds the devices it was given: it
// has not Succeeded or Failed (the ledger frees those too).
func holdsGPUs(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// hasAllocation reports whether a pod carries allocation annotations, so
// that changes to other pods need not wake the agent.
func hasAllocation(p *corev1.Pod) bool {
	for k := range p.Annotations {
		if strings.HasPrefix(k, v1alpha1.AnnotationDevicesPrefix) || strings.HasPrefix(k, AnnotationSimulateMemoryUsedPrefix) {
			return true
		}
	}
	return false
}

// allocationsOn reads the allocations of the pods that hold devices of inv,
// sorted by namespace and name. Pods without an allocation are skipped; a
// pod whose allocation does not read is returned in bad with the reason.
func allocationsOn(inv *gpu.NodeInventory, pods []*corev1.Pod) (held []boundPod, bad map[types.UID]error) {
	for _, p := range pods {
		if p.Spec.NodeName != inv.Name || !holdsGPUs(p) {
			continue
		}
		a, err := gpu.AllocationFromPod(p, inv)
		switch {
		case errors.Is(err, gpu.ErrNotAllocated):
			continue
		case err != nil:
			if bad == nil {
				bad = map[types.UID]error{}
			}
			bad[p.UID] = err
			continue
		}
		held = append(held, boundPod{pod: p, alloc: a})
	}
	slices.SortFunc(held, func(a, b boundPod) int {
		return cmp.Or(strings.Compare(a.pod.Namespace, b.pod.Namespace), strings.Compare(a.pod.Name, b.pod.Name))
	})
	return held, bad
}

// slicesOf lists the slices of the held pods, with the memory observed for
// each (observed is keyed by slice, in bytes), sorted.
func slicesOf(held []boundPod, observed map[sliceKey]int64) []v1alpha1.GPUSlice {
	var out []v1alpha1.GPUSlice
	for _, h := range held {
		for _, c := range h.alloc.Containers {
			for _, dev := range c.DeviceIndexes {
				out = append(out, v1alpha1.GPUSlice{
					Namespace:         h.pod.Namespace,
					Pod:               h.pod.Name,
					Container:         c.Container,
					DeviceIndex:       dev,
					Milli:             c.Milli,
					MemoryLimitMiB:    c.MemoryMiB,
					ObservedMemoryMiB: observed[sliceKey{UID: h.pod.UID, Container: c.Container, Device: dev}] / mib,
				})
			}
		}
	}
	slices.SortFunc(out, compareSlices)
	return out
}

func compareSlices(a, b v1alpha1.GPUSlice) int {
	return cmp.Or(
		strings.Compare(a.Namespace, b.Namespace),
		strings.Compare(a.Pod, b.Pod),
		strings.Compare(a.Container, b.Container),
		cmp.Compare(a.DeviceIndex, b.DeviceIndex),
	)
}

// allocatedMilli sums the slices' milli-GPUs per device index.
func allocatedMilli(held []boundPod) map[int32]int64 {
	out := map[int32]int64{}
	for _, h := range held {
		for _, c := range h.alloc.Containers {
			for _, dev := range c.DeviceIndexes {
				out[dev] += c.Milli
			}
		}
	}
	return out
}
