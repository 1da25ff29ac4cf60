package dra

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/partitatest"
)

func TestCDISpec(t *testing.T) {
	slice := PreparedRequest{Request: "gpu/mib81559", Devices: []PreparedDevice{{Device: "gpu-0", UUID: "GPU-a", Milli: 250, MemoryMiB: 20389}}, SMLimitPercent: 30}
	two := PreparedRequest{Request: "gpu/mib81559", Devices: []PreparedDevice{{Device: "gpu-0", UUID: "GPU-a", Milli: 500, MemoryMiB: 40000}, {Device: "gpu-1", UUID: "GPU-b", Milli: 500, MemoryMiB: 40000}}}
	whole := PreparedRequest{Request: "gpu", Whole: true, Devices: []PreparedDevice{{Device: "gpu-2", UUID: "GPU-c", Milli: 1000, MemoryMiB: 81559}}}
	cases := map[string]struct {
		req        PreparedRequest
		mode       v1alpha1.IsolationMode
		interposer string
		want       cdispec.ContainerEdits
	}{
		"time-slicing: the devices only": {
			req: slice, mode: v1alpha1.IsolationTimeSlicing,
			want: cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a"}},
		},
		"mps: the device's own pipe and its limits": {
			req: slice, mode: v1alpha1.IsolationMPS,
			want: cdispec.ContainerEdits{
				Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "CUDA_MPS_PIPE_DIRECTORY=/run/partita/mps-pipe",
					"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=20389M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30"},
				Mounts: []*cdispec.Mount{{HostPath: "/run/partita/mps/GPU-a/pipe", ContainerPath: "/run/partita/mps-pipe", Type: "bind", Options: []string{"rbind", "rw", "nosuid", "nodev"}}},
			},
		},
		"mps over two devices: limits, no pipe": {
			req: two, mode: v1alpha1.IsolationMPS,
			want: cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=40000M"}},
		},
		"mps over two devices with the interposer installed: capped by it": {
			req: two, mode: v1alpha1.IsolationMPS, interposer: "/var/lib/partita/interposer",
			want: cdispec.ContainerEdits{
				Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b", "CUDA_DEVICE_MEMORY_LIMIT=40000M"},
				Mounts: []*cdispec.Mount{
					{HostPath: "/var/lib/partita/interposer", ContainerPath: "/usr/local/partita/interposer", Type: "bind", Options: []string{"rbind", "ro", "nosuid", "nodev"}},
					{HostPath: "/var/lib/partita/interposer/ld.so.preload", ContainerPath: "/etc/ld.so.preload", Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"}},
				},
			},
		},
		"mps on one device ignores the interposer": {
			req: slice, mode: v1alpha1.IsolationMPS, interposer: "/var/lib/partita/interposer",
			want: cdispec.ContainerEdits{
				Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "CUDA_MPS_PIPE_DIRECTORY=/run/partita/mps-pipe",
					"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=20389M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30"},
				Mounts: []*cdispec.Mount{{HostPath: "/run/partita/mps/GPU-a/pipe", ContainerPath: "/run/partita/mps-pipe", Type: "bind", Options: []string{"rbind", "rw", "nosuid", "nodev"}}},
			},
		},
		"hami-core": {
			req: slice, mode: v1alpha1.IsolationHAMiCore,
			want: cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "CUDA_DEVICE_MEMORY_LIMIT=20389M", "CUDA_DEVICE_SM_LIMIT=30"}},
		},
		"hami-core with the interposer installed: it and its preload list, read-only": {
			req: slice, mode: v1alpha1.IsolationHAMiCore, interposer: "/var/lib/partita/interposer",
			want: cdispec.ContainerEdits{
				Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-a", "CUDA_DEVICE_MEMORY_LIMIT=20389M", "CUDA_DEVICE_SM_LIMIT=30"},
				Mounts: []*cdispec.Mount{
					{HostPath: "/var/lib/partita/interposer", ContainerPath: "/usr/local/partita/interposer", Type: "bind", Options: []string{"rbind", "ro", "nosuid", "nodev"}},
					{HostPath: "/var/lib/partita/interposer/ld.so.preload", ContainerPath: "/etc/ld.so.preload", Type: "bind", Options: []string{"bind", "ro", "nosuid", "nodev"}},
				},
			},
		},
		"whole devices have no limits": {
			req: whole, mode: v1alpha1.IsolationMPS,
			want: cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=GPU-c"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			spec := CDISpec("uid-1", "ns", []PreparedRequest{tc.req}, CDINode{Mode: tc.mode, MPSDir: "/run/partita/mps", InterposerDir: tc.interposer})
			if spec.Kind != "gpu.partita.dev/claim" || len(spec.Devices) != 1 || spec.Devices[0].Name != "uid-1-gpu_mib81559" && spec.Devices[0].Name != "uid-1-gpu" {
				t.Fatalf("spec %s with devices %+v", spec.Kind, spec.Devices)
			}
			if diff := cmp.Diff(tc.want, spec.Devices[0].ContainerEdits); diff != "" {
				t.Errorf("edits (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestPluginPrepare(t *testing.T) {
	dir := t.TempDir()
	node := partitatest.MakeGPUNode("real-node-0").Device(0, "H100", 81559).Device(1, "H100", 81559).Obj()
	p := &Plugin{opts: PluginOptions{NodeName: "real-node-0", CDIDir: dir, MPSDir: filepath.Join(dir, "mps")}}
	quarter := func(uid, dev string) *resourceapi.ResourceClaim {
		c := claimOf("c-"+uid, typesUID("pod-"+uid), result(DriverName, dev, "gpu/mib81559", map[resourceapi.QualifiedName]string{CapacityCompute: "250", CapacityMemory: "20389Mi"}))
		c.UID = typesUID(uid)
		c.Status.Allocation.Devices.Results[0].Pool = "real-node-0"
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"gpu"},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.partita.dev/v1","kind":"SliceConfig","smLimitPercent":25}`)},
			}},
		}}
		return c
	}
	for i, uid := range []string{"a", "b", "c", "d"} {
		res, err := p.prepare(quarter(uid, "gpu-0"), node.Status.Devices, v1alpha1.IsolationMPS)
		if err != nil {
			t.Fatalf("quarter %d: %v", i, err)
		}
		if len(res.Devices) != 1 || res.Devices[0].CDIDeviceIDs[0] != "gpu.partita.dev/claim="+uid+"-gpu_mib81559" {
			t.Fatalf("quarter %d: result %+v", i, res)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "mps", "GPU-real-node-0-0", "pipe")); err != nil {
		t.Errorf("the pipe directory was not made: %v", err)
	}
	// Prepared again (a kubelet restart): the same answer.
	if _, err := p.prepare(quarter("a", "gpu-0"), node.Status.Devices, v1alpha1.IsolationMPS); err != nil {
		t.Errorf("preparing again: %v", err)
	}
	// A fifth quarter on the same device would overbook it.
	if _, err := p.prepare(quarter("e", "gpu-0"), node.Status.Devices, v1alpha1.IsolationMPS); err == nil {
		t.Error("a fifth quarter of gpu-0 was prepared")
	}
	if _, err := p.prepare(quarter("e", "gpu-1"), node.Status.Devices, v1alpha1.IsolationMPS); err != nil {
		t.Errorf("a quarter of gpu-1: %v", err)
	}
	if _, err := p.prepare(quarter("f", "gpu-9"), node.Status.Devices, v1alpha1.IsolationMPS); err == nil {
		t.Error("a device the node lacks was prepared")
	}
	out, err := p.UnprepareResourceClaims(t.Context(), nil)
	if err != nil || len(out) != 0 {
		t.Fatal(out, err)
	}
	if err := RemoveCDISpec(dir, "a"); err != nil {
		t.Fatal(err)
	}
	if err := RemoveCDISpec(dir, "a"); err != nil {
		t.Errorf("removing twice: %v", err)
	}
	if _, err := p.prepare(quarter("e2", "gpu-0"), node.Status.Devices, v1alpha1.IsolationMPS); err != nil {
		t.Errorf("after one quarter left, another: %v", err)
	}
	used, err := PreparedConsumption(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Consumption{
		"gpu-0": {Milli: 1000, MemoryMiB: 4 * 20389, Namespaces: []string{"team-a"}},
		"gpu-1": {Milli: 250, MemoryMiB: 20389, Namespaces: []string{"team-a"}},
	}
	if diff := cmp.Diff(want, used); diff != "" {
		t.Errorf("consumption (-want,+got):\n%s", diff)
	}
}

// Every client of an MPS daemon can command it, so on an mps node a device's
// slices belong to one namespace; the kube-scheduler allocator does not know
// that, and the kubelet plugin refuses the claim that would break it.
func TestPluginPrepareKeepsAnMPSDeviceToOneNamespace(t *testing.T) {
	dir := t.TempDir()
	node := partitatest.MakeGPUNode("real-node-0").Device(0, "H100", 81559).Device(1, "H100", 81559).Obj()
	p := &Plugin{opts: PluginOptions{NodeName: "real-node-0", CDIDir: dir, MPSDir: filepath.Join(dir, "mps")}}
	quarter := func(ns, uid, dev string) *resourceapi.ResourceClaim {
		c := claimOf("c-"+uid, typesUID("pod-"+uid), result(DriverName, dev, "gpu/mib81559", map[resourceapi.QualifiedName]string{CapacityCompute: "250", CapacityMemory: "20389Mi"}))
		c.Namespace, c.UID = ns, typesUID(uid)
		c.Status.Allocation.Devices.Results[0].Pool = "real-node-0"
		return c
	}
	prepare := func(c *resourceapi.ResourceClaim, mode v1alpha1.IsolationMode) error {
		_, err := p.prepare(c, node.Status.Devices, mode)
		return err
	}
	if err := prepare(quarter("team-a", "a", "gpu-0"), v1alpha1.IsolationMPS); err != nil {
		t.Fatalf("team-a's first quarter: %v", err)
	}
	if err := prepare(quarter("team-a", "a2", "gpu-0"), v1alpha1.IsolationMPS); err != nil {
		t.Errorf("team-a's second quarter beside its first: %v", err)
	}
	err := prepare(quarter("team-b", "b", "gpu-0"), v1alpha1.IsolationMPS)
	wantMsg := "refused to prepare a slice of namespace team-b: gpu-0 already serves MPS clients of another namespace; in mps mode a GPU serves one namespace"
	if err == nil || !strings.Contains(err.Error(), wantMsg) {
		t.Errorf("team-b's quarter beside team-a's: %v, want %q", err, wantMsg)
	}
	// The message reaches team-b's pod events: it must not name team-a.
	if err != nil && strings.Contains(err.Error(), "team-a") {
		t.Errorf("the refusal names the other namespace: %v", err)
	}
	if _, statErr := os.Stat(CDISpecPath(dir, "b")); !os.IsNotExist(statErr) {
		t.Errorf("the refused claim left a CDI spec: %v", statErr)
	}
	if err := prepare(quarter("team-b", "b", "gpu-1"), v1alpha1.IsolationMPS); err != nil {
		t.Errorf("team-b's quarter on the other device: %v", err)
	}
	if err := prepare(quarter("team-b", "b3", "gpu-0"), v1alpha1.IsolationTimeSlicing); err != nil {
		t.Errorf("off mps, namespaces share a device: %v", err)
	}
	for _, uid := range []string{"a", "a2", "b3"} {
		if err := RemoveCDISpec(dir, typesUID(uid)); err != nil {
			t.Fatal(err)
		}
	}
	if err := prepare(quarter("team-b", "b4", "gpu-0"), v1alpha1.IsolationMPS); err != nil {
		t.Errorf("team-b's quarter once team-a left: %v", err)
	}
}

func typesUID(s string) types.UID { return types.UID(s) }
