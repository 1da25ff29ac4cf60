package nodeagent

import (
	"context"
	"fmt"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Inventory is what `partita agent --once --print` prints: the node's
// devices as the agent would publish them, with their usage now.
type Inventory struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Backend is "nvml" or "simulated".
	Backend string `json:"backend"`
	// Devices are the devices, as in GPUNode.status.devices.
	Devices []v1alpha1.GPUDevice `json:"devices"`
	// CapacityMilli is the partita.dev/gpu-milli the node would advertise.
	CapacityMilli int64 `json:"capacityMilli"`
	// Usage is each device's use now.
	Usage []DeviceUsage `json:"usage"`
	// Processes are the processes holding GPU memory.
	Processes []Process `json:"processes,omitempty"`
}

// DeviceUsage is one device's use at one moment.
type DeviceUsage struct {
	// Index is the device's index.
	Index int32 `json:"index"`
	// MemoryUsedBytes is the device memory in use.
	MemoryUsedBytes int64 `json:"memoryUsedBytes"`
	// UtilizationPercent is the share of time a kernel ran, or -1 when unknown.
	UtilizationPercent int32 `json:"utilizationPercent"`
}

// Discover reads a node's GPUs once, without a cluster.
func Discover(ctx context.Context, node, backendName string, b Backend) (*Inventory, error) {
	snap, err := b.Snapshot(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	inv := &Inventory{Node: node, Backend: backendName, Devices: []v1alpha1.GPUDevice{}, Usage: []DeviceUsage{}, Processes: snap.Processes}
	for _, d := range snap.Devices {
		inv.Devices = append(inv.Devices, d.GPUDevice)
		inv.Usage = append(inv.Usage, DeviceUsage{Index: d.Index, MemoryUsedBytes: d.MemoryUsedBytes, UtilizationPercent: d.UtilizationPercent})
	}
	inv.CapacityMilli = capacityMilli(inv.Devices)
	return inv, nil
}
