// Package containeredit decides, on the node, what a container of a GPU pod
// gets when the runtime creates it: its devices, the limit env of the
// node's isolation mode, the mounts and the cgroup limits, all from the
// pod's allocation (docs/agent.md, "Container creation through NRI"). It
// is pure: the NRI plugin (package nodeagent/nri) hands it the node's facts
// and the container, and hands the runtime the adjustment it returns.
//
// The adjustment replaces whatever the pod spec or the image set for these
// variables, so neither the tenant's spec nor its process decides what a
// container sees.
package containeredit

import (
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/nodeagent/dmem"
	"github.com/partita-dev/partita/nodeagent/interposer"
)

// Device env: the names the webhook writes in the pod-spec path
// (webhook/env.go) and the DRA plugin's CDI edits (dra/cdi.go) set.
const (
	EnvVisibleDevices    = "NVIDIA_VISIBLE_DEVICES"
	EnvMPSPinnedMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvMPSActiveThreads  = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvMPSPipeDirectory  = "CUDA_MPS_PIPE_DIRECTORY"
	EnvDeviceMemoryLimit = "CUDA_DEVICE_MEMORY_LIMIT"
	EnvDeviceSMLimit     = "CUDA_DEVICE_SM_LIMIT"
	// EnvPartitaDevice only feeds the webhook's MPS mount subPathExpr.
	EnvPartitaDevice = "PARTITA_DEVICE"
	// VisibleDevicesVoid makes the NVIDIA runtime mount no device.
	VisibleDevicesVoid = "void"
)

// Paths inside the container.
const (
	// MPSPipeMountPath is where an MPS client sees its own device's pipe
	// directory, as in the pod-spec and CDI paths.
	MPSPipeMountPath = "/run/partita/mps-pipe"
	// PreloadPath is the dynamic loader's preload list: bound over it, the
	// interposer is loaded into every process, whatever LD_PRELOAD says.
	PreloadPath = interposer.ContainerPreload
	// InterposerMountPath is where the container sees the host's
	// interposer directory; its ld.so.preload names
	// InterposerMountPath/libvgpu.so.
	InterposerMountPath = interposer.ContainerDir
	// InterposerPreloadFile is the preload list in the host's interposer
	// directory.
	InterposerPreloadFile = interposer.PreloadName
)

// DmemMaxKey is the cgroup v2 file the adjustment writes for kernel caps.
const DmemMaxKey = dmem.MaxFile

// Node is what the adjustment depends on besides the pod: the node's mode
// and what is installed on it.
type Node struct {
	// Mode is the isolation mode the agent applies on the node.
	Mode v1alpha1.IsolationMode
	// MPSDir is the agent's --mps-dir, where each device's daemon pipe is
	// <MPSDir>/<UUID>/pipe.
	MPSDir string
	// InterposerDir is the host directory of the interposer library and
	// its ld.so.preload, "" when it is not installed.
	InterposerDir string
	// DmemRegions are the devices' dmem regions by UUID, nil when the
	// kernel cannot cap device memory on this node.
	DmemRegions map[string]string
	// DeviceNodes are the host's /dev/nvidia<minor> by UUID, as they exist.
	DeviceNodes map[string]*api.LinuxDevice
	// ControlNodes are /dev/nvidiactl and /dev/nvidia-uvm, those that exist.
	ControlNodes []*api.LinuxDevice
}

// Container is the container being created.
type Container struct {
	// Env is the container's env as the runtime would start it ("K=V"),
	// image and pod spec together.
	Env []string
	// Alloc is the container's allocation, nil for a container that holds
	// no GPU (or whose allocation could not be read: it gets none).
	Alloc *gpu.ContainerAllocation
}

// isDeviceEnv reports whether only Partita may set the variable.
func isDeviceEnv(name string) bool {
	return name == EnvVisibleDevices || name == EnvPartitaDevice ||
		strings.HasPrefix(name, "CUDA_MPS_") || strings.HasPrefix(name, "CUDA_DEVICE_")
}

// Adjust is the adjustment that gives c what its allocation says on node,
// and nothing else: a container without an allocation gets
// NVIDIA_VISIBLE_DEVICES=void. Every device variable the container would
// otherwise start with and that Partita does not set is removed.
func Adjust(node Node, c Container) *api.ContainerAdjustment {
	adj := &api.ContainerAdjustment{}
	set := deviceEnv(node, c.Alloc)
	for _, kv := range c.Env {
		name, _, _ := strings.Cut(kv, "=")
		if isDeviceEnv(name) && !slices.ContainsFunc(set, func(e envVar) bool { return e.name == name }) {
			adj.RemoveEnv(name)
		}
	}
	for _, e := range set {
		adj.AddEnv(e.name, e.value)
	}
	if c.Alloc == nil || len(c.Alloc.DeviceUUIDs) == 0 {
		return adj
	}
	a := c.Alloc
	for _, u := range a.DeviceUUIDs {
		if d, ok := node.DeviceNodes[u]; ok {
			adj.AddDevice(d)
		}
	}
	if len(node.DeviceNodes) > 0 {
		for _, d := range node.ControlNodes {
			adj.AddDevice(d)
		}
	}
	if a.Whole() {
		return adj
	}
	switch sliceMode(node, a) {
	case v1alpha1.IsolationMPS:
		if len(a.DeviceUUIDs) == 1 {
			adj.AddMount(&api.Mount{
				Source: node.MPSDir + "/" + a.DeviceUUIDs[0] + "/pipe", Destination: MPSPipeMountPath,
				Type: "bind", Options: []string{"rbind", "rw", "nosuid", "nodev"},
			})
		}
	case v1alpha1.IsolationHAMiCore:
		if node.InterposerDir != "" {
			adj.AddMount(&api.Mount{
				Source: node.InterposerDir, Destination: InterposerMountPath,
				Type: "bind", Options: []string{"rbind", "ro", "nosuid", "nodev"},
			})
			adj.AddMount(&api.Mount{
				Source: node.InterposerDir + "/" + InterposerPreloadFile, Destination: PreloadPath,
				Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"},
			})
		}
	}
	if v, ok := dmemMax(node.DmemRegions, a); ok {
		adj.AddLinuxUnified(DmemMaxKey, v)
	}
	return adj
}

// sliceMode is how a slice is capped on node (interposer.SliceMode).
func sliceMode(node Node, a *gpu.ContainerAllocation) v1alpha1.IsolationMode {
	return interposer.SliceMode(node.Mode, len(a.DeviceUUIDs), node.InterposerDir != "")
}

type envVar struct{ name, value string }

// deviceEnv is the device env of a container holding alloc on node: the
// devices, and per mode the limits of a slice (whole devices have none).
func deviceEnv(node Node, a *gpu.ContainerAllocation) []envVar {
	if a == nil || len(a.DeviceUUIDs) == 0 {
		return []envVar{{EnvVisibleDevices, VisibleDevicesVoid}}
	}
	out := []envVar{{EnvVisibleDevices, strings.Join(a.DeviceUUIDs, ",")}}
	if a.Whole() {
		return out
	}
	memLimit := strconv.FormatInt(a.MemoryMiB, 10) + "M"
	switch sliceMode(node, a) {
	case v1alpha1.IsolationMPS:
		if len(a.DeviceUUIDs) == 1 {
			out = append(out, envVar{EnvMPSPipeDirectory, MPSPipeMountPath})
		}
		if a.MemoryMiB > 0 {
			out = append(out, envVar{EnvMPSPinnedMemLimit, memLimit})
		}
		if a.SMPercent > 0 {
			out = append(out, envVar{EnvMPSActiveThreads, strconv.Itoa(int(a.SMPercent))})
		}
	case v1alpha1.IsolationHAMiCore:
		if a.MemoryMiB > 0 {
			out = append(out, envVar{EnvDeviceMemoryLimit, memLimit})
		}
		if a.SMPercent > 0 {
			out = append(out, envVar{EnvDeviceSMLimit, strconv.Itoa(int(a.SMPercent))})
		}
	}
	return out
}

// dmemMax is the dmem.max of a slice: its memory limit on each of its
// devices' regions. A slice on a device without a region gets none at all
// (a cap on some devices only would read as a cap it is not).
func dmemMax(regions map[string]string, a *gpu.ContainerAllocation) (string, bool) {
	if len(regions) == 0 || a.MemoryMiB <= 0 {
		return "", false
	}
	limits := make([]dmem.Limit, 0, len(a.DeviceUUIDs))
	for _, u := range a.DeviceUUIDs {
		r, ok := regions[u]
		if !ok {
			return "", false
		}
		limits = append(limits, dmem.Limit{Region: r, Bytes: a.MemoryMiB << 20})
	}
	return dmem.MaxValue(limits), true
}

// MemoryCap says who caps a slice's memory on a node in mode: the kernel
// (dmem, which only the NRI path writes into a container's cgroup), the
// driver (MPS), the interposer (hami-core with the library installed and a
// path that mounts it: NRI or a claim's CDI spec; the pod-spec path cannot),
// or only the agent's watchdog.
func MemoryCap(mode v1alpha1.IsolationMode, path v1alpha1.ContainerPath, dmemAvailable, interposerInstalled bool) v1alpha1.MemoryCap {
	switch {
	case dmemAvailable && path == v1alpha1.ContainerPathNRI:
		return v1alpha1.MemoryCapKernel
	case mode == v1alpha1.IsolationMPS:
		return v1alpha1.MemoryCapDriver
	case mode == v1alpha1.IsolationHAMiCore && interposerInstalled && path != v1alpha1.ContainerPathPodSpec:
		return v1alpha1.MemoryCapInterposer
	}
	return v1alpha1.MemoryCapWatchdog
}
