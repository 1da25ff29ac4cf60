package gpu

import (
	"slices"
	"time"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// NodeInventory is one node's GPUs as its GPUNode reports them.
type NodeInventory struct {
	// Name is the node's name.
	Name string
	// Isolation is how the node applies slices.
	Isolation v1alpha1.IsolationMode
	// Devices are the node's GPUs, sorted by Index.
	Devices []Device
}

// Device is one GPU of a node.
type Device struct {
	// Index is the device's NVML index on the node.
	Index int32
	// UUID is the device's NVML UUID.
	UUID string
	// Product is the device's product name.
	Product string
	// MemoryMiB is the device's total memory.
	MemoryMiB int64
	// Healthy reports whether the device may take new work: its health is
	// Healthy and MIG is not enabled on it (Partita does not place slices on
	// MIG instances yet).
	Healthy bool
	// DRADriver is the DRA driver other than Partita's that publishes the
	// device (GPUDevice.draDriver): it is that driver's to allocate, so the
	// ledger places nothing on it, but it counts in the cluster's capacity
	// (the pods holding it through claims are charged to queues).
	DRADriver string
}

// InventoryFromGPUNode reads a GPUNode's devices. The isolation mode is the
// one the agent reports in status, else the spec's, else time-slicing.
// Devices whose index or UUID repeats an earlier one are dropped (the CRD
// refuses them; this keeps the ledger sound if one slips through). A device
// the agent could not identify (v1alpha1.IsUnknownDeviceUUID) is kept, and
// never healthy.
func InventoryFromGPUNode(n *v1alpha1.GPUNode) *NodeInventory {
	inv := &NodeInventory{Name: n.Name, Isolation: n.Status.Isolation}
	if inv.Isolation == "" {
		inv.Isolation = n.Spec.Isolation
	}
	if inv.Isolation == "" {
		inv.Isolation = v1alpha1.IsolationTimeSlicing
	}
	seenIndex := make(map[int32]bool, len(n.Status.Devices))
	seenUUID := make(map[string]bool, len(n.Status.Devices))
	for _, d := range n.Status.Devices {
		if seenIndex[d.Index] || seenUUID[d.UUID] || d.UUID == "" {
			continue
		}
		seenIndex[d.Index], seenUUID[d.UUID] = true, true
		inv.Devices = append(inv.Devices, Device{
			Index:     d.Index,
			UUID:      d.UUID,
			Product:   d.Product,
			MemoryMiB: d.MemoryMiB,
			Healthy:   d.Health == v1alpha1.DeviceHealthy && d.MIGMode != v1alpha1.MIGEnabled && !v1alpha1.IsUnknownDeviceUUID(d.UUID),
			DRADriver: d.DRADriver,
		})
	}
	slices.SortFunc(inv.Devices, func(a, b Device) int { return int(a.Index) - int(b.Index) })
	return inv
}

// DRAManaged returns the DRA drivers other than Partita's that publish
// every healthy device of the node, sorted; nil when some healthy device is
// Partita's to place, or the node has none. A node whose every GPU another
// driver allocates takes no partita.dev/gpu-milli pod.
func (n *NodeInventory) DRAManaged() []string {
	var drivers []string
	for _, d := range n.Devices {
		switch {
		case !d.Healthy:
		case d.DRADriver == "":
			return nil
		case !slices.Contains(drivers, d.DRADriver):
			drivers = append(drivers, d.DRADriver)
		}
	}
	slices.Sort(drivers)
	return drivers
}

// DeviceByUUID returns the device with the given UUID.
func (n *NodeInventory) DeviceByUUID(uuid string) (Device, bool) {
	if i := n.position(uuid); i >= 0 {
		return n.Devices[i], true
	}
	return Device{}, false
}

// DeviceByIndex returns the device with the given index.
func (n *NodeInventory) DeviceByIndex(index int32) (Device, bool) {
	for _, d := range n.Devices {
		if d.Index == index {
			return d, true
		}
	}
	return Device{}, false
}

// position is the position in Devices of the device with the given UUID, or
// -1.
func (n *NodeInventory) position(uuid string) int {
	for i := range n.Devices {
		if n.Devices[i].UUID == uuid {
			return i
		}
	}
	return -1
}

func (n *NodeInventory) clone() *NodeInventory {
	out := *n
	out.Devices = slices.Clone(n.Devices)
	return &out
}

// heartbeatOf is when the node's agent last confirmed its GPUNode, as the
// agent's clock wrote it; zero when it never did.
func heartbeatOf(n *v1alpha1.GPUNode) time.Time {
	if n.Status.Heartbeat == nil {
		return time.Time{}
	}
	return n.Status.Heartbeat.Time
}
