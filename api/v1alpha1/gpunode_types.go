package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IsolationMode is how a node applies GPU slices (DESIGN §8).
//
// +kubebuilder:validation:Enum=time-slicing;mps;hami-core;mig
type IsolationMode string

// Isolation modes.
const (
	// IsolationTimeSlicing shares a device by time; only NVIDIA_VISIBLE_DEVICES
	// is set and the watchdog polices memory.
	IsolationTimeSlicing IsolationMode = "time-slicing"
	// IsolationMPS runs an MPS control daemon per device; the driver caps memory.
	IsolationMPS IsolationMode = "mps"
	// IsolationHAMiCore sets CUDA_DEVICE_MEMORY_LIMIT and CUDA_DEVICE_SM_LIMIT
	// for a preloaded interposer.
	IsolationHAMiCore IsolationMode = "hami-core"
	// IsolationMIG creates a MIG instance per slice (not yet supported).
	IsolationMIG IsolationMode = "mig"
)

// DeviceHealth says whether a device may take new work.
//
// +kubebuilder:validation:Enum=Healthy;Unhealthy
type DeviceHealth string

// Device health values.
const (
	DeviceHealthy   DeviceHealth = "Healthy"
	DeviceUnhealthy DeviceHealth = "Unhealthy"
)

// MIGMode is a device's MIG setting.
//
// +kubebuilder:validation:Enum=Disabled;Enabled;Unsupported
type MIGMode string

// MIG modes.
const (
	MIGDisabled    MIGMode = "Disabled"
	MIGEnabled     MIGMode = "Enabled"
	MIGUnsupported MIGMode = "Unsupported"
)

// GPUNodeSpec is what an operator sets for a GPU node.
type GPUNodeSpec struct {
	// Isolation is how slices are applied on this node: time-slicing (default),
	// mps, hami-core or mig.
	// +kubebuilder:default=time-slicing
	// +optional
	Isolation IsolationMode `json:"isolation,omitempty"`
}

// GPUDevice is one physical GPU as the agent discovered it.
type GPUDevice struct {
	// Index is the device's NVML index on the node.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	// +required
	Index int32 `json:"index"`
	// UUID is the device's NVML UUID (GPU-...).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +required
	UUID string `json:"uuid"`
	// Product is the device's product name.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Product string `json:"product,omitempty"`
	// MemoryMiB is the device's total memory in MiB.
	// +kubebuilder:validation:Minimum=0
	// +required
	MemoryMiB int64 `json:"memoryMiB"`
	// NUMANode is the NUMA node the device is attached to, when known.
	// +optional
	NUMANode *int32 `json:"numaNode,omitempty"`
	// MIGMode is Disabled, Enabled or Unsupported.
	// +optional
	MIGMode MIGMode `json:"migMode,omitempty"`
	// ComputeCapability is the CUDA compute capability ("9.0").
	// +kubebuilder:validation:MaxLength=16
	// +optional
	ComputeCapability string `json:"computeCapability,omitempty"`
	// Health is Healthy or Unhealthy; an unhealthy device gets nothing new.
	// +required
	Health DeviceHealth `json:"health"`
	// HealthReason says why a device is unhealthy (an XID, a lost device).
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	HealthReason string `json:"healthReason,omitempty"`
	// DRADriver names the DRA driver other than Partita's (gpu.nvidia.com,
	// say) that publishes this GPU in its ResourceSlices. Such a GPU is that
	// driver's to allocate: Partita offers no partita.dev/gpu-milli on it
	// (and, with gpuBackend dra, publishes no device for it), and the pods
	// holding it through ResourceClaims are charged to their queues. Empty
	// for a GPU no other driver publishes.
	// +kubebuilder:validation:MaxLength=63
	// +optional
	DRADriver string `json:"draDriver,omitempty"`
}

// GPUSlice is one container's share of one device, as the agent applied and
// observes it.
type GPUSlice struct {
	// Namespace of the pod.
	// +kubebuilder:validation:MaxLength=63
	// +required
	Namespace string `json:"namespace"`
	// Pod name.
	// +kubebuilder:validation:MaxLength=253
	// +required
	Pod string `json:"pod"`
	// Container name.
	// +kubebuilder:validation:MaxLength=63
	// +required
	Container string `json:"container"`
	// DeviceIndex is the device's index on the node.
	// +required
	DeviceIndex int32 `json:"deviceIndex"`
	// Milli is the slice's share of the device in milli-GPUs.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +required
	Milli int64 `json:"milli"`
	// MemoryLimitMiB is the slice's memory limit; 0 means none.
	// +optional
	MemoryLimitMiB int64 `json:"memoryLimitMiB,omitempty"`
	// ObservedMemoryMiB is the memory the slice's processes use now.
	// +optional
	ObservedMemoryMiB int64 `json:"observedMemoryMiB,omitempty"`
}

// ContainerPath is how the device env, mounts and limits reach a GPU
// container on a node.
//
// +kubebuilder:validation:Enum=nri;pod-spec;cdi
type ContainerPath string

// Container paths.
const (
	// ContainerPathNRI: the agent, as an NRI plugin of the container
	// runtime, sets them at container creation from the allocation,
	// overriding the pod spec.
	ContainerPathNRI ContainerPath = "nri"
	// ContainerPathPodSpec: the webhook writes them into the pod spec as
	// downward-API references to the allocation annotations (runtimes
	// without NRI).
	ContainerPathPodSpec ContainerPath = "pod-spec"
	// ContainerPathCDI: the DRA kubelet plugin writes them as the CDI edits
	// of each prepared claim (gpuBackend dra).
	ContainerPathCDI ContainerPath = "cdi"
)

// MemoryCap says what stops a slice's processes from using more device
// memory than the slice holds.
//
// +kubebuilder:validation:Enum=kernel;driver;interposer;watchdog
type MemoryCap string

// Memory caps, strongest first.
const (
	// MemoryCapKernel: the container's dmem cgroup (dmem.max) caps it.
	MemoryCapKernel MemoryCap = "kernel"
	// MemoryCapDriver: the MPS server caps each client (mps mode).
	MemoryCapDriver MemoryCap = "driver"
	// MemoryCapInterposer: the preloaded interposer library caps it
	// (hami-core with the library installed on the node).
	MemoryCapInterposer MemoryCap = "interposer"
	// MemoryCapWatchdog: nothing caps it; the agent's watchdog reports or
	// ends a process over its slice.
	MemoryCapWatchdog MemoryCap = "watchdog"
)

// DmemSupport is whether the node's kernel can cap device memory per
// cgroup (the dmem controller, with regions the GPU driver registered).
type DmemSupport struct {
	// Available is set when every device has a dmem region.
	// +optional
	Available bool `json:"available,omitempty"`
	// Reason says why not, or what was found.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Reason string `json:"reason,omitempty"`
	// DriverVersion is the NVIDIA driver's version.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	DriverVersion string `json:"driverVersion,omitempty"`
}

// Enforcement is how the node applies what a slice may use.
type Enforcement struct {
	// ContainerPath is how the device env, mounts and limits reach a
	// container: nri, pod-spec or cdi.
	// +optional
	ContainerPath ContainerPath `json:"containerPath,omitempty"`
	// MemoryCap is what caps a slice's device memory in the node's mode:
	// kernel, driver, interposer or watchdog.
	// +optional
	MemoryCap MemoryCap `json:"memoryCap,omitempty"`
	// Dmem is whether the kernel can cap device memory per container.
	// +optional
	Dmem DmemSupport `json:"dmem,omitempty"`
	// Interposer is the interposer library's path on the host, "" when it
	// is not installed.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Interposer string `json:"interposer,omitempty"`
}

// The UUID rule reads each device's uuid once and compares the strings:
// the API server runs it on every status write (each heartbeat and each
// batch of slices), and reading a field of a custom resource in CEL costs
// far more than comparing two strings (n reads, not n²).
// +kubebuilder:validation:XValidation:rule="!has(self.devices) || [self.devices.map(d, d.uuid)].all(u, u.all(x, u.exists_one(y, y == x)))",message="status.devices: device UUIDs must be unique"

// GPUNodeStatus is the node's inventory and slices, written by the agent.
type GPUNodeStatus struct {
	// Devices lists every GPU on the node.
	// +listType=map
	// +listMapKey=index
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Devices []GPUDevice `json:"devices,omitempty"`
	// Slices lists the slices the agent applied.
	// +kubebuilder:validation:MaxItems=4096
	// +listType=atomic
	// +optional
	Slices []GPUSlice `json:"slices,omitempty"`
	// Isolation is the mode the agent applies.
	// +optional
	Isolation IsolationMode `json:"isolation,omitempty"`
	// DeviceCount is the number of devices, for kubectl's columns.
	// +optional
	DeviceCount int32 `json:"deviceCount,omitempty"`
	// HealthyDevices is the number of healthy devices.
	// +optional
	HealthyDevices int32 `json:"healthyDevices,omitempty"`
	// AllocatedMilli is the sum of the slices' milli-GPUs.
	// +optional
	AllocatedMilli int64 `json:"allocatedMilli,omitempty"`
	// DRADrivers are the DRA drivers other than Partita's that publish some
	// of the node's GPUs (devices[].draDriver), sorted: Partita does not
	// offer those GPUs itself.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	DRADrivers []string `json:"draDrivers,omitempty"`
	// Enforcement is how the node applies slices: the container path, what
	// caps a slice's memory, and the kernel and library support found.
	// +optional
	Enforcement *Enforcement `json:"enforcement,omitempty"`
	// AgentVersion is the version of the agent that wrote this status.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	AgentVersion string `json:"agentVersion,omitempty"`
	// Heartbeat is when the agent last confirmed this status.
	// +optional
	Heartbeat *metav1.Time `json:"heartbeat,omitempty"`
	// Conditions say whether what isolation names is in force on the node.
	// In mps mode, MPSReady is False while a shared device has no running
	// MPS control daemon, is not in EXCLUSIVE_PROCESS compute mode, or is
	// left without MPS for a slice that spans several devices.
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types and reasons of GPUNode status.
const (
	// ConditionMPSReady: in mps mode, every shared device has a running MPS
	// control daemon, in EXCLUSIVE_PROCESS compute mode.
	ConditionMPSReady = "MPSReady"
	// ReasonMPSRunning: every shared device has its daemon.
	ReasonMPSRunning = "DaemonsRunning"
	// ReasonMPSNotRunning: some shared device has no running daemon; its
	// slices run without MPS, their limits the watchdog's alone.
	ReasonMPSNotRunning = "DaemonsNotRunning"
	// ReasonComputeModeNotExclusive: some device with a daemon could not be
	// put in EXCLUSIVE_PROCESS: a process that skips MPS can use it.
	ReasonComputeModeNotExclusive = "ComputeModeNotExclusive"
	// ReasonSlicesSpanDevices: a slice spans several devices, which one MPS
	// daemon per device cannot serve: its devices run without MPS.
	ReasonSlicesSpanDevices = "SlicesSpanDevices"
)

// GPUNode is the GPU inventory of one node (name = node name).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=gn
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Devices",type=integer,JSONPath=`.status.deviceCount`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.healthyDevices`
// +kubebuilder:printcolumn:name="Allocated (milli)",type=integer,JSONPath=`.status.allocatedMilli`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.status.isolation`
// +kubebuilder:printcolumn:name="Path",type=string,JSONPath=`.status.enforcement.containerPath`
// +kubebuilder:printcolumn:name="Memory Cap",type=string,JSONPath=`.status.enforcement.memoryCap`,priority=1
// +kubebuilder:printcolumn:name="DRA Driver",type=string,JSONPath=`.status.draDrivers[0]`,priority=1
// +kubebuilder:printcolumn:name="Heartbeat",type=date,JSONPath=`.status.heartbeat`
type GPUNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec GPUNodeSpec `json:"spec,omitempty"`
	// +optional
	Status GPUNodeStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// GPUNodeList is a list of GPUNodes.
type GPUNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GPUNode `json:"items"`
}
