package nodeagent

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

func TestParseSimSpec(t *testing.T) {
	cases := map[string]struct {
		in      string
		want    SimSpec
		wantErr string
	}{
		"known model":     {in: "8xH100-80GB", want: SimSpec{Count: 8, Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, ComputeCapability: "9.0"}},
		"another model":   {in: "2xL4", want: SimSpec{Count: 2, Product: "NVIDIA L4", MemoryMiB: 23034, ComputeCapability: "8.9"}},
		"explicit memory": {in: "2xMyGPU:24576", want: SimSpec{Count: 2, Product: "MyGPU", MemoryMiB: 24576}},
		"explicit MiB":    {in: "1xMyGPU:1024MiB", want: SimSpec{Count: 1, Product: "MyGPU", MemoryMiB: 1024}},
		"GB suffix":       {in: "4xRTX-24GB", want: SimSpec{Count: 4, Product: "RTX-24GB", MemoryMiB: 24576}},
		"no count":        {in: "H100-80GB", wantErr: "want <count>x<model>"},
		"zero":            {in: "0xH100-80GB", wantErr: "count from 1 to 64"},
		"too many":        {in: "65xH100-80GB", wantErr: "count from 1 to 64"},
		"unknown model":   {in: "8xB300", wantErr: `unknown model "B300"; use one of A100-40GB`},
		"bad memory":      {in: "8xFoo:lots", wantErr: "want <count>x<product>:<MiB>"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseSimSpec(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseSimSpec(%q) error = %v, want one containing %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseSimSpec(%q) (-want,+got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestSimSpecForNode(t *testing.T) {
	fallback := h100(8)
	gfd := func(kv ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{}}}
		for i := 0; i < len(kv); i += 2 {
			n.Labels[kv[i]] = kv[i+1]
		}
		return n
	}
	cases := map[string]struct {
		node     *corev1.Node
		fallback *SimSpec
		want     SimSpec
		wantOK   bool
		wantErr  string
	}{
		"GFD labels": {
			node:   gfd(v1alpha1.LabelNVIDIAGPUCount, "4", v1alpha1.LabelNVIDIAGPUProduct, "NVIDIA-L4", v1alpha1.LabelNVIDIAGPUMemory, "23034"),
			want:   SimSpec{Count: 4, Product: "NVIDIA-L4", MemoryMiB: 23034},
			wantOK: true,
		},
		"count only, rest from the flag": {
			node: gfd(v1alpha1.LabelNVIDIAGPUCount, "2"), fallback: &fallback,
			want:   SimSpec{Count: 2, Product: fallback.Product, MemoryMiB: fallback.MemoryMiB, ComputeCapability: "9.0"},
			wantOK: true,
		},
		"no labels, flag":      {node: gfd(), fallback: &fallback, want: fallback, wantOK: true},
		"no labels, no flag":   {node: gfd()},
		"count but no memory":  {node: gfd(v1alpha1.LabelNVIDIAGPUCount, "2"), wantErr: "no device memory"},
		"bad count":            {node: gfd(v1alpha1.LabelNVIDIAGPUCount, "many"), wantErr: `"many", not a count`},
		"bad memory":           {node: gfd(v1alpha1.LabelNVIDIAGPUCount, "2", v1alpha1.LabelNVIDIAGPUMemory, "80G"), wantErr: `"80G", not MiB`},
		"zero GPUs from label": {node: gfd(v1alpha1.LabelNVIDIAGPUCount, "0", v1alpha1.LabelNVIDIAGPUMemory, "1"), want: SimSpec{MemoryMiB: 1}, wantOK: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok, err := SimSpecForNode(tc.node, tc.fallback)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if ok {
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("spec (-want,+got):\n%s", diff)
				}
			}
		})
	}
}

func TestSimulatedUUIDsAreStableAndDistinct(t *testing.T) {
	seen := map[string]bool{}
	for _, node := range []string{"gpu-node-0", "gpu-node-1"} {
		for i := range 8 {
			u := SimulatedUUID(node, i)
			if u != SimulatedUUID(node, i) {
				t.Fatalf("UUID of %s/%d changes between calls", node, i)
			}
			if seen[u] || !strings.HasPrefix(u, "GPU-") {
				t.Fatalf("UUID %q of %s/%d repeats or lacks the GPU- prefix", u, node, i)
			}
			seen[u] = true
		}
	}
	// The same node in another process: the same devices.
	a, _ := NewSimulated("n1", h100(8)).Snapshot(t.Context())
	b, _ := NewSimulated("n1", h100(8)).Snapshot(t.Context())
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("two backends for the same node differ (-first,+second):\n%s", diff)
	}
}

func TestSimulateFromAnnotations(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	hog := heldPod("hog", "n1", "20Gi", 0)
	hog.Annotations[AnnotationSimulateMemoryUsedPrefix+"main"] = "30Gi"
	cases := map[string]struct {
		annotations   map[string]string
		pods          []*corev1.Pod
		wantUnhealthy []int32
		wantProcs     map[string]int64 // pod/device → MiB
	}{
		"idle": {},
		"unhealthy devices": {
			annotations:   map[string]string{AnnotationSimulateUnhealthy: "3, 5,x"},
			wantUnhealthy: []int32{3, 5},
		},
		"pods use half their slice by default": {
			pods:      []*corev1.Pod{withUID(heldPod("half", "n1", "0.5", 1), "u1"), withUID(heldPod("whole", "n1", "1", 2, 3), "u2")},
			wantProcs: map[string]int64{"half/1": 81559 * 500 / 1000 / 2, "whole/2": 81559 / 2, "whole/3": 81559 / 2},
		},
		"annotation sets the use": {
			pods:      []*corev1.Pod{withUID(hog, "u3")},
			wantProcs: map[string]int64{"hog/0": 30720},
		},
		"pending and finished pods use nothing": {
			pods: []*corev1.Pod{
				withUID(func() *corev1.Pod {
					p := heldPod("pending", "n1", "0.5", 1)
					p.Status.Phase = corev1.PodPending
					return p
				}(), "u4"),
				withUID(func() *corev1.Pod {
					p := heldPod("done", "n1", "0.5", 1)
					p.Status.Phase = corev1.PodSucceeded
					return p
				}(), "u5"),
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			n := node.DeepCopy()
			n.Annotations = tc.annotations
			s := NewSimulated("n1", h100(8))
			s.Simulate(n, tc.pods, 0.5)
			snap, err := s.Snapshot(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var unhealthy []int32
			for _, d := range snap.Devices {
				if d.Health == v1alpha1.DeviceUnhealthy {
					unhealthy = append(unhealthy, d.Index)
				}
			}
			if diff := cmp.Diff(tc.wantUnhealthy, unhealthy); diff != "" {
				t.Errorf("unhealthy devices (-want,+got):\n%s", diff)
			}
			names := map[string]string{}
			for _, p := range tc.pods {
				names[string(p.UID)] = p.Name
			}
			var procs map[string]int64
			for _, p := range snap.Processes {
				if procs == nil {
					procs = map[string]int64{}
				}
				procs[names[string(p.PodUID)]+"/"+deviceLabel(p.DeviceIndex)] = p.MemoryBytes / mib
				if got := snap.Devices[p.DeviceIndex].MemoryUsedBytes; got != p.MemoryBytes {
					t.Errorf("device %d uses %d bytes, want its process's %d", p.DeviceIndex, got, p.MemoryBytes)
				}
			}
			if diff := cmp.Diff(tc.wantProcs, procs); diff != "" {
				t.Errorf("processes (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestSimulatedKill(t *testing.T) {
	s := NewSimulated("n1", h100(2))
	p := Process{PID: 1234, DeviceIndex: 1, MemoryBytes: 10 * mib}
	s.SetProcesses([]Process{p})
	if err := s.Kill(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(t.Context(), p); err == nil {
		t.Error("killing a killed process succeeded")
	}
	s.SetProcesses([]Process{p}) // the same process, still reported by the pod
	if snap, _ := s.Snapshot(t.Context()); len(snap.Processes) != 0 || snap.Devices[1].MemoryUsedBytes != 0 {
		t.Errorf("killed process is back: %+v", snap.Processes)
	}
}
