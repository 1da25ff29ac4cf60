package dra

import (
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// DriverName is Partita's DRA driver: the driver of its ResourceSlices,
// its DeviceClass and its kubelet plugin, and the vendor of its CDI devices.
const DriverName = "gpu.partita.dev"

// DeviceClassName is the DeviceClass of Partita's GPUs: every device of
// DriverName. Partita's claim templates ask for it; so may a user's own
// claim, which then takes whole devices unless it asks for capacity.
const DeviceClassName = "gpu.partita.dev"

// Capacities of each device (consumable: AllowMultipleAllocations is set,
// so claims share a device until a capacity is spent).
const (
	// CapacityCompute is the device's compute in milli-GPUs: 1000, of which
	// a 0.25 slice consumes 250. A claim that does not ask takes it all.
	CapacityCompute resourceapi.QualifiedName = "compute"
	// CapacityMemory is the device's memory, published in Mi; a claim asks
	// for it in any unit (20Gi) and is rounded up to whole MiB. A claim that
	// does not ask takes it all.
	CapacityMemory resourceapi.QualifiedName = "memory"
)

// Attributes of each device.
const (
	// AttributeModel is the product name ("NVIDIA H100 80GB HBM3").
	AttributeModel resourceapi.QualifiedName = "model"
	// AttributeUUID is the NVML UUID (GPU-...), what NVIDIA_VISIBLE_DEVICES takes.
	AttributeUUID resourceapi.QualifiedName = "uuid"
	// AttributeIndex is the NVML index on the node.
	AttributeIndex resourceapi.QualifiedName = "index"
	// AttributeMemoryMiB is the memory in MiB, as an integer for selectors;
	// Partita's claim templates select device sizes by it.
	AttributeMemoryMiB resourceapi.QualifiedName = "memoryMiB"
	// AttributeIsolation is the node's isolation mode (time-slicing, mps,
	// hami-core), which decides the limits the CDI spec sets.
	AttributeIsolation resourceapi.QualifiedName = "isolation"
	// AttributeComputeCapability is the CUDA compute capability ("9.0").
	AttributeComputeCapability resourceapi.QualifiedName = "computeCapability"
)

// TaintUnhealthy is the device taint of an unhealthy device (an XID, a lost
// GPU): kube-scheduler allocates it to no new claim; claims that hold it
// keep it.
const TaintUnhealthy = DriverName + "/unhealthy"

// TaintExtenderSlices is the device taint of a device that pods placed by
// the scheduler extender still hold (a cluster moving from the extender
// backend to dra, docs/design.md): no claim may share it, since the claims'
// capacity cannot count those pods, until they end.
const TaintExtenderSlices = DriverName + "/extender-slices"

// NodeDevices are what a node publishes.
type NodeDevices struct {
	// Devices are the node's GPUs, as its GPUNode lists them.
	Devices []v1alpha1.GPUDevice
	// Mode is the node's isolation mode.
	Mode v1alpha1.IsolationMode
	// ExtenderHeld are the indexes of the devices that pods placed by the
	// extender hold (TaintExtenderSlices).
	ExtenderHeld []int32
}

// maxAttributeString is the longest string attribute value the API takes.
const maxAttributeString = resourceapi.DeviceAttributeMaxValueLength

// DeviceName is the DRA device name of the GPU at an NVML index: "gpu-0".
func DeviceName(index int32) string { return "gpu-" + strconv.Itoa(int(index)) }

// Devices are the node's GPUs as DRA devices, in index order (the order in
// which kube-scheduler tries them). Each device can be allocated to many
// claims at once (consumable capacity): compute in milli-GPUs and memory in
// MiB, with request policies that accept any slice from 1 milli or 1Mi up to
// the whole device and make a claim that names neither take all of both.
func Devices(nd NodeDevices) []resourceapi.Device {
	devices, mode := nd.Devices, nd.Mode
	if mode == "" {
		mode = v1alpha1.IsolationTimeSlicing
	}
	out := make([]resourceapi.Device, 0, len(devices))
	for _, d := range devices {
		memory := mebibytes(d.MemoryMiB)
		dev := resourceapi.Device{
			Name: DeviceName(d.Index),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				AttributeModel:     {StringValue: ptr.To(truncate(d.Product, maxAttributeString))},
				AttributeUUID:      {StringValue: ptr.To(truncate(d.UUID, maxAttributeString))},
				AttributeIndex:     {IntValue: ptr.To(int64(d.Index))},
				AttributeMemoryMiB: {IntValue: ptr.To(d.MemoryMiB)},
				AttributeIsolation: {StringValue: ptr.To(string(mode))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				CapacityCompute: {
					Value: *resource.NewQuantity(gpu.MilliPerGPU, resource.DecimalSI),
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default: resource.NewQuantity(gpu.MilliPerGPU, resource.DecimalSI),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{
							Min:  resource.NewQuantity(1, resource.DecimalSI),
							Max:  resource.NewQuantity(gpu.MilliPerGPU, resource.DecimalSI),
							Step: resource.NewQuantity(1, resource.DecimalSI),
						},
					},
				},
				CapacityMemory: {
					Value: memory,
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default: ptr.To(memory.DeepCopy()),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{
							Min:  ptr.To(mebibytes(1)),
							Max:  ptr.To(memory.DeepCopy()),
							Step: ptr.To(mebibytes(1)),
						},
					},
				},
			},
			AllowMultipleAllocations: ptr.To(true),
		}
		if d.ComputeCapability != "" {
			dev.Attributes[AttributeComputeCapability] = resourceapi.DeviceAttribute{StringValue: ptr.To(truncate(d.ComputeCapability, maxAttributeString))}
		}
		if d.Health != v1alpha1.DeviceHealthy {
			dev.Taints = append(dev.Taints, resourceapi.DeviceTaint{Key: TaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
		if slices.Contains(nd.ExtenderHeld, d.Index) {
			dev.Taints = append(dev.Taints, resourceapi.DeviceTaint{Key: TaintExtenderSlices, Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
		out = append(out, dev)
	}
	return out
}

// Pool is the node's ResourceSlice pool: one pool named after the node, in
// one slice (a node has at most 64 GPUs, a slice takes 128 devices).
func Pool(nd NodeDevices) resourceslice.Pool {
	return resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: Devices(nd)}}}
}

// Resources are the node's driver resources: its pool, keyed by node name.
func Resources(node string, nd NodeDevices) *resourceslice.DriverResources {
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: Pool(nd)}}
}

// DeviceClasses are the DeviceClasses Partita needs: DeviceClassName, every
// device of DriverName.
func DeviceClasses() []resourceapi.DeviceClass {
	return []resourceapi.DeviceClass{{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   DeviceClassName,
			Labels: map[string]string{LabelManagedBy: ManagedByPartita},
		},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.driver == "` + DriverName + `"`,
			}}},
		},
	}}
}

// Labels on the objects Partita creates for DRA.
const (
	// LabelManagedBy marks Partita's DeviceClass and claim templates.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByPartita is its value.
	ManagedByPartita = "partita"
)

func mebibytes(mib int64) resource.Quantity {
	return *resource.NewQuantity(mib<<20, resource.BinarySI)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
