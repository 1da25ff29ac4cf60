package partitatest

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// GPUNodeWrapper builds a GPUNode.
type GPUNodeWrapper struct{ v1alpha1.GPUNode }

// MakeGPUNode starts a GPUNode with no device.
func MakeGPUNode(name string) *GPUNodeWrapper {
	return &GPUNodeWrapper{v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: name}}}
}

// Obj returns the GPUNode, with the status counts filled in.
func (w *GPUNodeWrapper) Obj() *v1alpha1.GPUNode {
	w.Status.DeviceCount = int32(len(w.Status.Devices))
	w.Status.HealthyDevices = 0
	for _, d := range w.Status.Devices {
		if d.Health == v1alpha1.DeviceHealthy {
			w.Status.HealthyDevices++
		}
	}
	return &w.GPUNode
}

// Clone returns a deep copy of the wrapper.
func (w *GPUNodeWrapper) Clone() *GPUNodeWrapper {
	return &GPUNodeWrapper{*w.GPUNode.DeepCopy()}
}

// DeviceUUID is the UUID MakeGPUNode gives a node's device.
func DeviceUUID(node string, index int32) string {
	return fmt.Sprintf("GPU-%s-%d", node, index)
}

// Device adds (or replaces) a healthy device with UUID DeviceUUID(node,
// index).
func (w *GPUNodeWrapper) Device(index int32, product string, memoryMiB int64) *GPUNodeWrapper {
	d := v1alpha1.GPUDevice{
		Index:     index,
		UUID:      DeviceUUID(w.Name, index),
		Product:   product,
		MemoryMiB: memoryMiB,
		MIGMode:   v1alpha1.MIGDisabled,
		Health:    v1alpha1.DeviceHealthy,
	}
	for i := range w.Status.Devices {
		if w.Status.Devices[i].Index == index {
			w.Status.Devices[i] = d
			return w
		}
	}
	w.Status.Devices = append(w.Status.Devices, d)
	return w
}

// Devices adds n identical healthy devices with indexes 0..n-1.
func (w *GPUNodeWrapper) Devices(n int, product string, memoryMiB int64) *GPUNodeWrapper {
	for i := range n {
		w.Device(int32(i), product, memoryMiB)
	}
	return w
}

// DRADriver marks devices as published by another DRA driver
// (status.devices[].draDriver), as the agent does for GPUs that driver's
// ResourceSlices list, and keeps status.draDrivers in step.
func (w *GPUNodeWrapper) DRADriver(driver string, indexes ...int32) *GPUNodeWrapper {
	for i := range w.Status.Devices {
		if slices.Contains(indexes, w.Status.Devices[i].Index) {
			w.Status.Devices[i].DRADriver = driver
		}
	}
	if !slices.Contains(w.Status.DRADrivers, driver) {
		w.Status.DRADrivers = append(w.Status.DRADrivers, driver)
		slices.Sort(w.Status.DRADrivers)
	}
	return w
}

// UnhealthyDevice marks a device Unhealthy.
func (w *GPUNodeWrapper) UnhealthyDevice(index int32) *GPUNodeWrapper {
	for i := range w.Status.Devices {
		if w.Status.Devices[i].Index == index {
			w.Status.Devices[i].Health = v1alpha1.DeviceUnhealthy
			w.Status.Devices[i].HealthReason = "XID 79 (test)"
		}
	}
	return w
}

// Heartbeat sets the agent's heartbeat.
func (w *GPUNodeWrapper) Heartbeat(t time.Time) *GPUNodeWrapper {
	w.Status.Heartbeat = &metav1.Time{Time: t}
	return w
}

// UnknownDevice adds a device the agent could not identify, as it
// publishes one: UUID unknown-<index>, Unhealthy.
func (w *GPUNodeWrapper) UnknownDevice(index int32) *GPUNodeWrapper {
	w.Status.Devices = append(w.Status.Devices, v1alpha1.GPUDevice{
		Index: index, UUID: v1alpha1.UnknownDeviceUUID(index), Health: v1alpha1.DeviceUnhealthy,
		HealthReason: fmt.Sprintf("NVML cannot open device %d: ERROR_UNKNOWN", index), MIGMode: v1alpha1.MIGUnsupported,
	})
	return w
}

// Isolation sets the isolation mode in spec and status.
func (w *GPUNodeWrapper) Isolation(mode v1alpha1.IsolationMode) *GPUNodeWrapper {
	w.Spec.Isolation = mode
	w.Status.Isolation = mode
	return w
}

func itoa(n int) string { return strconv.Itoa(n) }
