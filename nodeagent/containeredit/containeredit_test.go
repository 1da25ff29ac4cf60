package containeredit

import (
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

func charDev(path string, major, minor int64) *api.LinuxDevice {
	return &api.LinuxDevice{Path: path, Type: "c", Major: major, Minor: minor, FileMode: api.FileMode(0o666)}
}

func TestAdjust(t *testing.T) {
	dev0, dev1 := charDev("/dev/nvidia0", 195, 0), charDev("/dev/nvidia1", 195, 1)
	ctl, uvm := charDev("/dev/nvidiactl", 195, 255), charDev("/dev/nvidia-uvm", 510, 0)
	nodes := map[string]*api.LinuxDevice{"GPU-a": dev0, "GPU-b": dev1}
	control := []*api.LinuxDevice{ctl, uvm}
	slice := &gpu.ContainerAllocation{Container: "main", DeviceUUIDs: []string{"GPU-a"}, DeviceIndexes: []int32{0}, Milli: 250, MemoryMiB: 20480, SMPercent: 30}
	twoSlices := &gpu.ContainerAllocation{Container: "main", DeviceUUIDs: []string{"GPU-a", "GPU-b"}, DeviceIndexes: []int32{0, 1}, Milli: 500, MemoryMiB: 40960}
	whole := &gpu.ContainerAllocation{Container: "main", DeviceUUIDs: []string{"GPU-a", "GPU-b"}, DeviceIndexes: []int32{0, 1}, Milli: 1000}
	regions := map[string]string{"GPU-a": "drm/0000:3b:00.0/vram0", "GPU-b": "drm/0000:86:00.0/vram0"}

	want := func(build func(a *api.ContainerAdjustment)) *api.ContainerAdjustment {
		a := &api.ContainerAdjustment{}
		build(a)
		return a
	}
	cases := map[string]struct {
		node Node
		c    Container
		want *api.ContainerAdjustment
	}{
		"container without a GPU gets void": {
			node: Node{Mode: v1alpha1.IsolationTimeSlicing},
			c:    Container{Env: []string{"PATH=/bin"}},
			want: want(func(a *api.ContainerAdjustment) { a.AddEnv(EnvVisibleDevices, VisibleDevicesVoid) }),
		},
		"hostile env in a container without a GPU is removed": {
			node: Node{Mode: v1alpha1.IsolationMPS},
			c:    Container{Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G", "CUDA_DEVICE_MEMORY_LIMIT=80g", "HOME=/root"}},
			want: want(func(a *api.ContainerAdjustment) {
				a.RemoveEnv(EnvMPSPinnedMemLimit)
				a.RemoveEnv(EnvDeviceMemoryLimit)
				a.AddEnv(EnvVisibleDevices, VisibleDevicesVoid)
			}),
		},
		"time-slicing slice: devices only": {
			node: Node{Mode: v1alpha1.IsolationTimeSlicing, DeviceNodes: nodes, ControlNodes: control},
			c:    Container{Alloc: slice},
			want: want(func(a *api.ContainerAdjustment) {
				a.AddEnv(EnvVisibleDevices, "GPU-a")
				a.AddDevice(dev0)
				a.AddDevice(ctl)
				a.AddDevice(uvm)
			}),
		},
		"mps slice: limits, pipe, and hostile limits replaced": {
			node: Node{Mode: v1alpha1.IsolationMPS, MPSDir: "/run/partita/mps"},
			c: Container{Alloc: slice, Env: []string{
				"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100", "CUDA_DEVICE_MEMORY_LIMIT=1g", "PARTITA_DEVICE=GPU-b",
			}},
			want: want(func(a *api.ContainerAdjustment) {
				a.RemoveEnv(EnvDeviceMemoryLimit)
				a.RemoveEnv(EnvPartitaDevice)
				a.AddEnv(EnvVisibleDevices, "GPU-a")
				a.AddEnv(EnvMPSPipeDirectory, MPSPipeMountPath)
				a.AddEnv(EnvMPSPinnedMemLimit, "20480M")
				a.AddEnv(EnvMPSActiveThreads, "30")
				a.AddMount(&api.Mount{Source: "/run/partita/mps/GPU-a/pipe", Destination: MPSPipeMountPath, Type: "bind", Options: []string{"rbind", "rw", "nosuid", "nodev"}})
			}),
		},
		"mps slice over two devices has no daemon pipe": {
			node: Node{Mode: v1alpha1.IsolationMPS, MPSDir: "/run/partita/mps"},
			c:    Container{Alloc: twoSlices},
			want: want(func(a *api.ContainerAdjustment) {
				a.AddEnv(EnvVisibleDevices, "GPU-a,GPU-b")
				a.AddEnv(EnvMPSPinnedMemLimit, "40960M")
			}),
		},
		"mps slice over two devices gets the interposer where it is installed": {
			node: Node{Mode: v1alpha1.IsolationMPS, MPSDir: "/run/partita/mps", InterposerDir: "/var/lib/partita/interposer"},
			c:    Container{Alloc: twoSlices, Env: []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G"}},
			want: want(func(a *api.ContainerAdjustment) {
				a.RemoveEnv(EnvMPSPinnedMemLimit)
				a.AddEnv(EnvVisibleDevices, "GPU-a,GPU-b")
				a.AddEnv(EnvDeviceMemoryLimit, "40960M")
				a.AddMount(&api.Mount{Source: "/var/lib/partita/interposer", Destination: InterposerMountPath, Type: "bind", Options: []string{"rbind", "ro", "nosuid", "nodev"}})
				a.AddMount(&api.Mount{Source: "/var/lib/partita/interposer/ld.so.preload", Destination: PreloadPath, Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"}})
			}),
		},
		"hami-core slice without the interposer": {
			node: Node{Mode: v1alpha1.IsolationHAMiCore},
			c:    Container{Alloc: slice},
			want: want(func(a *api.ContainerAdjustment) {
				a.AddEnv(EnvVisibleDevices, "GPU-a")
				a.AddEnv(EnvDeviceMemoryLimit, "20480M")
				a.AddEnv(EnvDeviceSMLimit, "30")
			}),
		},
		"hami-core slice with the interposer": {
			node: Node{Mode: v1alpha1.IsolationHAMiCore, InterposerDir: "/var/lib/partita/interposer"},
			c:    Container{Alloc: slice, Env: []string{"CUDA_DEVICE_MEMORY_LIMIT=80g"}},
			want: want(func(a *api.ContainerAdjustment) {
				a.AddEnv(EnvVisibleDevices, "GPU-a")
				a.AddEnv(EnvDeviceMemoryLimit, "20480M")
				a.AddEnv(EnvDeviceSMLimit, "30")
				a.AddMount(&api.Mount{Source: "/var/lib/partita/interposer", Destination: InterposerMountPath, Type: "bind", Options: []string{"rbind", "ro", "nosuid", "nodev"}})
				a.AddMount(&api.Mount{Source: "/var/lib/partita/interposer/ld.so.preload", Destination: PreloadPath, Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"}})
			}),
		},
		"dmem caps a slice in the kernel": {
			node: Node{Mode: v1alpha1.IsolationTimeSlicing, DmemRegions: regions},
			c:    Container{Alloc: slice},
			want: want(func(a *api.ContainerAdjustment) {
				a.AddEnv(EnvVisibleDevices, "GPU-a")
				a.AddLinuxUnified(DmemMaxKey, "drm/0000:3b:00.0/vram0 21474836480")
			}),
		},
		"dmem caps a multi-device slice on each region": {
			node: Node{Mode: v1alpha1.IsolationHAMiCore, DmemRegions: regions},
			c:    Container{Alloc: twoSlices},
			want: want(func(a *api.ContainerAdjustment) {
				a.AddEnv(EnvVisibleDevices, "GPU-a,GPU-b")
				a.AddEnv(EnvDeviceMemoryLimit, "40960M")
				a.AddLinuxUnified(DmemMaxKey, "drm/0000:3b:00.0/vram0 42949672960\ndrm/0000:86:00.0/vram0 42949672960")
			}),
		},
		"dmem off when a device has no region": {
			node: Node{Mode: v1alpha1.IsolationTimeSlicing, DmemRegions: map[string]string{"GPU-a": "drm/0000:3b:00.0/vram0"}},
			c:    Container{Alloc: twoSlices},
			want: want(func(a *api.ContainerAdjustment) { a.AddEnv(EnvVisibleDevices, "GPU-a,GPU-b") }),
		},
		"whole GPUs: devices, no limits, no dmem, hostile limits removed": {
			node: Node{Mode: v1alpha1.IsolationMPS, DmemRegions: regions, DeviceNodes: nodes, ControlNodes: control},
			c:    Container{Alloc: whole, Env: []string{"NVIDIA_VISIBLE_DEVICES=all", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=1G"}},
			want: want(func(a *api.ContainerAdjustment) {
				a.RemoveEnv(EnvMPSPinnedMemLimit)
				a.AddEnv(EnvVisibleDevices, "GPU-a,GPU-b")
				a.AddDevice(dev0)
				a.AddDevice(dev1)
				a.AddDevice(ctl)
				a.AddDevice(uvm)
			}),
		},
		"an allocation with no devices is void": {
			node: Node{Mode: v1alpha1.IsolationTimeSlicing},
			c:    Container{Alloc: &gpu.ContainerAllocation{Container: "main"}},
			want: want(func(a *api.ContainerAdjustment) { a.AddEnv(EnvVisibleDevices, VisibleDevicesVoid) }),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := Adjust(tc.node, tc.c)
			if diff := cmp.Diff(tc.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Adjust() (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMemoryCap(t *testing.T) {
	cases := map[string]struct {
		mode      v1alpha1.IsolationMode
		path      v1alpha1.ContainerPath
		dmem, lib bool
		want      v1alpha1.MemoryCap
	}{
		"dmem through NRI":                 {mode: v1alpha1.IsolationTimeSlicing, path: v1alpha1.ContainerPathNRI, dmem: true, want: v1alpha1.MemoryCapKernel},
		"dmem but the pod-spec path":       {mode: v1alpha1.IsolationTimeSlicing, path: v1alpha1.ContainerPathPodSpec, dmem: true, want: v1alpha1.MemoryCapWatchdog},
		"mps":                              {mode: v1alpha1.IsolationMPS, path: v1alpha1.ContainerPathNRI, want: v1alpha1.MemoryCapDriver},
		"hami-core with the interposer":    {mode: v1alpha1.IsolationHAMiCore, path: v1alpha1.ContainerPathNRI, lib: true, want: v1alpha1.MemoryCapInterposer},
		"hami-core without the interposer": {mode: v1alpha1.IsolationHAMiCore, path: v1alpha1.ContainerPathNRI, want: v1alpha1.MemoryCapWatchdog},
		// Nothing mounts the library into containers without NRI.
		"hami-core on the pod-spec path": {mode: v1alpha1.IsolationHAMiCore, path: v1alpha1.ContainerPathPodSpec, lib: true, want: v1alpha1.MemoryCapWatchdog},
		"hami-core through CDI":          {mode: v1alpha1.IsolationHAMiCore, path: v1alpha1.ContainerPathCDI, lib: true, want: v1alpha1.MemoryCapInterposer},
		"time-slicing":                   {mode: v1alpha1.IsolationTimeSlicing, path: v1alpha1.ContainerPathNRI, want: v1alpha1.MemoryCapWatchdog},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := MemoryCap(tc.mode, tc.path, tc.dmem, tc.lib); got != tc.want {
				t.Errorf("MemoryCap() = %q, want %q", got, tc.want)
			}
		})
	}
}
