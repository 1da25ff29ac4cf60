package nodeagent

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// maxReasonLen is the longest health reason the CRD accepts.
const maxReasonLen = 1024

// schedulable reports whether a device may take new work; this matches what
// the ledger counts (gpu.Device.Healthy).
func schedulable(d v1alpha1.GPUDevice) bool {
	return d.Health == v1alpha1.DeviceHealthy && d.MIGMode != v1alpha1.MIGEnabled
}

// offered reports whether Partita offers a device: it may take work and no
// other DRA driver publishes it (dra.ForeignGPUs).
func offered(d v1alpha1.GPUDevice) bool { return schedulable(d) && d.DRADriver == "" }

// capacityMilli is the node's partita.dev/gpu-milli capacity: 1000 for each
// device that may take work and that no other DRA driver publishes.
func capacityMilli(devices []v1alpha1.GPUDevice) int64 {
	var n int64
	for _, d := range devices {
		if offered(d) {
			n += gpu.MilliPerGPU
		}
	}
	return n
}

// buildStatus is the GPUNode status the agent wants to publish.
func buildStatus(devices []v1alpha1.GPUDevice, sl []v1alpha1.GPUSlice, mode v1alpha1.IsolationMode, version string, now metav1.Time) v1alpha1.GPUNodeStatus {
	var drivers []string
	for _, d := range devices {
		if d.DRADriver != "" && !slices.Contains(drivers, d.DRADriver) {
			drivers = append(drivers, d.DRADriver)
		}
	}
	slices.Sort(drivers)
	st := v1alpha1.GPUNodeStatus{
		DRADrivers:   drivers,
		Devices:      slices.Clone(devices),
		Slices:       sl,
		Isolation:    mode,
		DeviceCount:  int32(len(devices)),
		AgentVersion: version,
		Heartbeat:    &now,
	}
	slices.SortFunc(st.Devices, func(a, b v1alpha1.GPUDevice) int { return int(a.Index) - int(b.Index) })
	for i := range st.Devices {
		if len(st.Devices[i].HealthReason) > maxReasonLen {
			st.Devices[i].HealthReason = st.Devices[i].HealthReason[:maxReasonLen]
		}
		if st.Devices[i].Health == v1alpha1.DeviceHealthy {
			st.HealthyDevices++
		}
	}
	for _, s := range sl {
		st.AllocatedMilli += s.Milli
	}
	return st
}

// unavailableDevices is what the agent publishes while its backend cannot
// read the GPUs: the devices it knew, all unhealthy, so nothing new lands on
// them until the backend is back.
func unavailableDevices(known []v1alpha1.GPUDevice, reason string) []v1alpha1.GPUDevice {
	out := slices.Clone(known)
	for i := range out {
		out[i].Health = v1alpha1.DeviceUnhealthy
		out[i].HealthReason = reason
	}
	return out
}

// sameInventory reports whether two statuses agree on everything but the
// heartbeat and the observed memory of slices; those two alone only need a
// write when the heartbeat is due. A slice going over or back under its
// limit is a change.
func sameInventory(a, b *v1alpha1.GPUNodeStatus) bool {
	return equality.Semantic.DeepEqual(inventoryPart(a), inventoryPart(b))
}

// sameDevices reports whether two statuses differ at most in their slices
// and the sum of them: only pods came or went.
func sameDevices(a, b *v1alpha1.GPUNodeStatus) bool {
	strip := func(s *v1alpha1.GPUNodeStatus) *v1alpha1.GPUNodeStatus {
		out := inventoryPart(s)
		out.Slices, out.AllocatedMilli = nil, 0
		return out
	}
	return equality.Semantic.DeepEqual(strip(a), strip(b))
}

func inventoryPart(s *v1alpha1.GPUNodeStatus) *v1alpha1.GPUNodeStatus {
	out := s.DeepCopy()
	out.Heartbeat = nil
	for i := range out.Slices {
		sl := &out.Slices[i]
		over := sl.MemoryLimitMiB > 0 && sl.ObservedMemoryMiB > sl.MemoryLimitMiB
		sl.ObservedMemoryMiB = 0
		if over {
			sl.ObservedMemoryMiB = -1
		}
	}
	if len(out.Devices) == 0 {
		out.Devices = nil
	}
	if len(out.Slices) == 0 {
		out.Slices = nil
	}
	return out
}

// nodeMilli reads the node's partita.dev/gpu-milli capacity and allocatable,
// -1 where absent.
func nodeMilli(n *corev1.Node) (capacity, allocatable int64) {
	capacity, allocatable = -1, -1
	if q, ok := n.Status.Capacity[v1alpha1.ResourceGPUMilli]; ok {
		capacity = q.Value()
	}
	if q, ok := n.Status.Allocatable[v1alpha1.ResourceGPUMilli]; ok {
		allocatable = q.Value()
	}
	return capacity, allocatable
}

// milliQuantity is a milli-GPU count as a resource quantity.
func milliQuantity(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }

// identifyDevices gives every device whose UUID the backend could not read
// (NVML cannot open it) a UUID to publish: the one the node's GPUNode
// published for that index before, if no other device has it now, so that
// a pod holding the device keeps counting against it; else
// v1alpha1.UnknownDeviceUUID(index). Such a device is always Unhealthy.
func identifyDevices(devices []DeviceState, published []v1alpha1.GPUDevice) {
	inUse := map[string]bool{}
	for _, d := range devices {
		if d.UUID != "" {
			inUse[d.UUID] = true
		}
	}
	for i := range devices {
		d := &devices[i]
		if d.UUID != "" && !v1alpha1.IsUnknownDeviceUUID(d.UUID) {
			continue
		}
		d.UUID = v1alpha1.UnknownDeviceUUID(d.Index)
		for _, p := range published {
			if p.Index == d.Index && p.UUID != "" && !v1alpha1.IsUnknownDeviceUUID(p.UUID) && !inUse[p.UUID] {
				d.UUID = p.UUID
			}
		}
		inUse[d.UUID] = true
		d.Health = v1alpha1.DeviceUnhealthy
		if d.HealthReason == "" {
			d.HealthReason = fmt.Sprintf("the agent cannot identify device %d", d.Index)
		}
	}
}
