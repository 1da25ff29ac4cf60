package dra

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/partita-dev/partita/internal/partitatest"
)

func TestForeignGPUs(t *testing.T) {
	gn := partitatest.MakeGPUNode("n1").Devices(4, "NVIDIA H100 80GB HBM3", 81559).Obj()
	uuid := func(i int32) string { return partitatest.DeviceUUID("n1", i) }
	nvidia := func(name, node string) *partitatest.ResourceSliceWrapper {
		return partitatest.MakeResourceSlice(name, "gpu.nvidia.com", node)
	}
	cases := map[string]struct {
		slices []*resourceapi.ResourceSlice
		want   map[int32]string
	}{
		"no slices": {want: map[int32]string{}},
		"NVIDIA's driver publishes two GPUs by UUID": {
			slices: []*resourceapi.ResourceSlice{nvidia("n1-gpu", "n1").GPU("gpu-0", uuid(0), "H100", "80Gi").GPU("gpu-2", uuid(2), "H100", "80Gi").Obj()},
			want:   map[int32]string{0: "gpu.nvidia.com", 2: "gpu.nvidia.com"},
		},
		"a MIG device names its parent": {
			slices: []*resourceapi.ResourceSlice{nvidia("n1-mig", "n1").GPU("gpu-1-mig-0", "MIG-x", "H100", "10Gi").Attribute("gpu-1-mig-0", "parentUUID", uuid(1)).Obj()},
			want:   map[int32]string{1: "gpu.nvidia.com"},
		},
		"a qualified uuid attribute of any driver": {
			slices: []*resourceapi.ResourceSlice{partitatest.MakeResourceSlice("s", "example.com", "n1").GPU("d", "", "x", "1").Attribute("d", "example.com/uuid", uuid(3)).Obj()},
			want:   map[int32]string{3: "example.com"},
		},
		"a GPU driver without UUIDs owns every GPU": {
			slices: []*resourceapi.ResourceSlice{nvidia("n1-gpu", "n1").GPU("gpu-0", "", "H100", "80Gi").Obj()},
			want:   map[int32]string{0: "gpu.nvidia.com", 1: "gpu.nvidia.com", 2: "gpu.nvidia.com", 3: "gpu.nvidia.com"},
		},
		"another driver without UUIDs (a NIC) owns none": {
			slices: []*resourceapi.ResourceSlice{partitatest.MakeResourceSlice("nic", "dra.net", "n1").GPU("eth0", "", "nic", "1").Obj()},
			want:   map[int32]string{},
		},
		"UUIDs of other GPUs match none": {
			slices: []*resourceapi.ResourceSlice{nvidia("n1-gpu", "n1").GPU("gpu-0", "GPU-elsewhere", "H100", "80Gi").Obj()},
			want:   map[int32]string{},
		},
		"Partita's own slices and other nodes' are skipped": {
			slices: []*resourceapi.ResourceSlice{
				partitatest.MakeResourceSlice("own", DriverName, "n1").GPU("gpu-0", uuid(0), "H100", "80Gi").Obj(),
				nvidia("n2-gpu", "n2").GPU("gpu-0", "", "H100", "80Gi").Obj(),
			},
			want: map[int32]string{},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := ForeignGPUs("n1", gn.Status.Devices, tc.slices, DefaultGPUDrivers)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ForeignGPUs (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestMarkForeign(t *testing.T) {
	devices := partitatest.MakeGPUNode("n1").Devices(3, "L4", 23034).Obj().Status.Devices
	out, drivers := MarkForeign(devices, map[int32]string{2: "gpu.nvidia.com", 0: "example.com"})
	if diff := cmp.Diff([]string{"example.com", "gpu.nvidia.com"}, drivers); diff != "" {
		t.Errorf("drivers (-want,+got):\n%s", diff)
	}
	got := []string{out[0].DRADriver, out[1].DRADriver, out[2].DRADriver}
	if diff := cmp.Diff([]string{"example.com", "", "gpu.nvidia.com"}, got); diff != "" {
		t.Errorf("devices' drivers (-want,+got):\n%s", diff)
	}
	if devices[0].DRADriver != "" {
		t.Error("MarkForeign changed its input")
	}
}
