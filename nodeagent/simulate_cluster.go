package nodeagent

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Annotations that drive the simulated backend on a dev cluster. They only
// matter to nodes the agent simulates; on real nodes they are ignored.
const (
	// AnnotationSimulateUnhealthy on a Node lists the indexes of simulated
	// devices to report Unhealthy, comma-separated ("0,3"), as if each had
	// raised XID 79.
	AnnotationSimulateUnhealthy = "simulate.partita.dev/unhealthy-devices"
	// AnnotationSimulateMemoryUsedPrefix + container name on a Pod sets the
	// GPU memory the container's simulated process uses on each of its
	// devices, as a quantity ("30Gi"). It lets a test make a process go over
	// its slice.
	AnnotationSimulateMemoryUsedPrefix = "simulate.partita.dev/gpu-memory-used."
)

// Simulate sets the simulated devices' health from the node's
// AnnotationSimulateUnhealthy, and gives each GPU container of every running
// pod that holds devices here one process per device. The process uses the
// container's AnnotationSimulateMemoryUsedPrefix amount when set, else the
// share usage (0 to 1) of its slice's memory limit (of the device's memory
// for whole devices).
func (s *Simulated) Simulate(node *corev1.Node, pods []*corev1.Pod, usage float64) {
	unhealthy := map[int32]string{}
	for f := range strings.SplitSeq(node.Annotations[AnnotationSimulateUnhealthy], ",") {
		if i, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32); err == nil {
			unhealthy[int32(i)] = "XID 79 (simulated: GPU has fallen off the bus)"
		}
	}
	s.SetHealth(unhealthy)

	inv := s.inventory()
	held, _ := allocationsOn(inv, pods)
	var procs []Process
	for _, h := range held {
		if h.pod.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, c := range h.alloc.Containers {
			for _, dev := range c.DeviceIndexes {
				limitMiB := c.MemoryMiB
				if limitMiB == 0 {
					limitMiB = s.spec.MemoryMiB
				}
				bytes := int64(usage * float64(limitMiB*mib))
				if v, ok := h.pod.Annotations[AnnotationSimulateMemoryUsedPrefix+c.Container]; ok {
					if q, err := resource.ParseQuantity(v); err == nil {
						bytes = q.Value()
					}
				}
				if bytes <= 0 {
					continue
				}
				procs = append(procs, Process{
					PID:         simulatedPID(h.pod.UID, c.Container, dev),
					DeviceIndex: dev,
					MemoryBytes: bytes,
					PodUID:      h.pod.UID,
					Container:   c.Container,
				})
			}
		}
	}
	s.SetProcesses(procs)
}

// inventory is the simulated node's inventory, to read allocations with.
func (s *Simulated) inventory() *gpu.NodeInventory {
	inv := &gpu.NodeInventory{Name: s.node, Devices: make([]gpu.Device, s.spec.Count)}
	for i := range s.spec.Count {
		inv.Devices[i] = gpu.Device{Index: int32(i), UUID: SimulatedUUID(s.node, i), Product: s.spec.Product, MemoryMiB: s.spec.MemoryMiB, Healthy: true}
	}
	return inv
}

// inventoryOf turns a snapshot's devices into the inventory that
// gpu.AllocationFromPod resolves a pod's devices against.
func inventoryOf(node string, mode v1alpha1.IsolationMode, devices []DeviceState) *gpu.NodeInventory {
	gn := &v1alpha1.GPUNode{Status: v1alpha1.GPUNodeStatus{Isolation: mode, Devices: make([]v1alpha1.GPUDevice, len(devices))}}
	gn.Name = node
	for i, d := range devices {
		gn.Status.Devices[i] = d.GPUDevice
	}
	return gpu.InventoryFromGPUNode(gn)
}
