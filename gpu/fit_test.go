package gpu_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestFit(t *testing.T) {
	mixed := pt.MakeGPUNode("n1").Device(0, "A100 40GB", 40960).Device(1, "H100", 81920).Obj()
	cases := map[string]struct {
		node     *v1alpha1.GPUNode
		existing []*corev1.Pod
		pod      *corev1.Pod
		fitNode  string
		want     *gpu.InsufficientError
		wantMsg  string
	}{
		"fraction on an empty device": {
			node: h100s("n1", 1),
			pod:  pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
		},
		"fraction next to a quarter": {
			node:     h100s("n1", 1),
			existing: []*corev1.Pod{held("a", "n1", "0.25", 0), held("b", "n1", "0.25", 0)},
			pod:      pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
		},
		"largest free slice too small": {
			node:     h100s("n1", 2),
			existing: []*corev1.Pod{held("a", "n1", "0.75", 0), held("b", "n1", "0.75", 1)},
			pod:      pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			want: &gpu.InsufficientError{Node: "n1", Container: "main", WantMilli: 500, Count: 1,
				BestDevice: 0, BestFreeMilli: 250, BestFreeMemoryMiB: 20480},
			wantMsg: "node n1: largest free slice 0.25 on GPU 0; pod needs 0.5 (container main)",
		},
		"free memory too small": {
			node:     pt.MakeGPUNode("n1").Devices(2, "L4", 24576).Obj(),
			existing: []*corev1.Pod{held("a", "n1", "16Gi", 0), held("b", "n1", "12Gi", 1)},
			pod:      pt.MakePod("p", "ns").GPUMemory("16Gi").Obj(),
			want: &gpu.InsufficientError{Node: "n1", Container: "main", WantMemoryMiB: 16384, Count: 1,
				BestDevice: 1, BestFreeMilli: 500, BestFreeMemoryMiB: 12288},
			wantMsg: "node n1: largest free memory 12288MiB (slice 0.5) on GPU 1; pod needs 16384MiB (container main)",
		},
		"memory bigger than any device": {
			node: pt.MakeGPUNode("n1").Devices(2, "L4", 24576).Obj(),
			pod:  pt.MakePod("p", "ns").GPUMemory("40Gi").Obj(),
			want: &gpu.InsufficientError{Node: "n1", Container: "main", WantMemoryMiB: 40960, Count: 1,
				BestDevice: 0, BestFreeMilli: 1000, BestFreeMemoryMiB: 24576, Unresolvable: true},
			wantMsg: "node n1: largest free memory 24576MiB (slice 1) on GPU 0; pod needs 40960MiB (container main); it can never fit this node",
		},
		"whole GPU blocked by a slice": {
			node:     h100s("n1", 1),
			existing: []*corev1.Pod{held("a", "n1", "0.25", 0)},
			pod:      pt.MakePod("p", "ns").Resource("", gpu.ResourceNVIDIAGPU, "1").Obj(),
			want: &gpu.InsufficientError{Node: "n1", Container: "main", WantMilli: 1000, Count: 1,
				BestDevice: 0, BestFreeMilli: 750, BestFreeMemoryMiB: 61440},
		},
		"slice blocked by a whole GPU": {
			node:     h100s("n1", 1),
			existing: []*corev1.Pod{held("a", "n1", "1", 0)},
			pod:      pt.MakePod("p", "ns").GPUFraction("0.1").Obj(),
			want:     &gpu.InsufficientError{Node: "n1", Container: "main", WantMilli: 100, Count: 1, BestDevice: -1},
			wantMsg:  "node n1: no healthy GPU with room; pod needs 0.1 (container main)",
		},
		"too few free devices": {
			node:     h100s("n1", 4),
			existing: []*corev1.Pod{held("a", "n1", "1", 0, 1, 2)},
			pod:      pt.MakePod("p", "ns").GPUCount(2).Obj(),
			want: &gpu.InsufficientError{Node: "n1", Container: "main", WantMilli: 1000, Count: 2, DevicesWithRoom: 1,
				BestDevice: 3, BestFreeMilli: 1000, BestFreeMemoryMiB: 81920},
			wantMsg: "node n1: 1 GPU free; pod needs 2 whole GPUs (container main)",
		},
		"more devices than the node has": {
			node: h100s("n1", 2),
			pod:  pt.MakePod("p", "ns").GPUCount(4).Obj(),
			want: &gpu.InsufficientError{Node: "n1", Container: "main", WantMilli: 1000, Count: 4, DevicesWithRoom: 2,
				BestDevice: 0, BestFreeMilli: 1000, BestFreeMemoryMiB: 81920, Unresolvable: true},
		},
		"unhealthy devices get nothing": {
			node:     pt.MakeGPUNode("n1").Devices(2, "H100", 81920).UnhealthyDevice(0).Obj(),
			existing: []*corev1.Pod{held("a", "n1", "0.75", 1)},
			pod:      pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			want: &gpu.InsufficientError{Node: "n1", Container: "main", WantMilli: 500, Count: 1,
				BestDevice: 1, BestFreeMilli: 250, BestFreeMemoryMiB: 20480},
		},
		"two containers' whole GPUs never share a device": {
			node: h100s("n1", 1),
			pod: pt.MakePod("p", "ns").Container("a").Resource("a", gpu.ResourceNVIDIAGPU, "1").
				Container("b").Resource("b", gpu.ResourceNVIDIAGPU, "1").Obj(),
			want: &gpu.InsufficientError{Node: "n1", Container: "b", WantMilli: 1000, Count: 1, BestDevice: -1, Unresolvable: true},
		},
		"two containers' slices share a device": {
			node: h100s("n1", 1),
			pod: pt.MakePod("p", "ns").Container("a").Resource("a", v1alpha1.ResourceGPUMilli, "500").
				Container("b").Resource("b", v1alpha1.ResourceGPUMilli, "500").GPUFraction("0.5").Obj(),
		},
		"a multi-device slice needs devices of one size": {
			node: mixed,
			pod:  pt.MakePod("p", "ns").GPUFraction("0.5").GPUCount(2).Obj(),
			want: &gpu.InsufficientError{Node: "n1", Container: "main", WantMilli: 500, Count: 2, DevicesWithRoom: 2,
				BestDevice: 0, BestFreeMilli: 1000, BestFreeMemoryMiB: 40960, Unresolvable: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := ledgerWith([]*v1alpha1.GPUNode{tc.node}, tc.existing)
			if errs := l.CheckInvariants(); len(errs) > 0 {
				t.Fatalf("setup breaks invariants: %v", errs)
			}
			err := l.Fit("n1", parse(t, tc.pod))
			var got *gpu.InsufficientError
			if err != nil && !errors.As(err, &got) {
				t.Fatalf("Fit: %v, want an *InsufficientError", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Fit (-want,+got):\n%s", diff)
			}
			if tc.wantMsg != "" && err.Error() != tc.wantMsg {
				t.Errorf("Fit message:\n got %q\nwant %q", err.Error(), tc.wantMsg)
			}
			if (err == nil) != (l.Score("n1", parse(t, tc.pod), "") > 0) && err != nil {
				t.Errorf("Score > 0 on a node that does not fit")
			}
		})
	}
}

func TestMaxDeviceMemoryMiB(t *testing.T) {
	l := ledgerWith([]*v1alpha1.GPUNode{h100s("n1", 2), pt.MakeGPUNode("n2").Device(0, "B200", 183359).Obj()}, nil)
	if got := l.MaxDeviceMemoryMiB(); got != 183359 {
		t.Errorf("MaxDeviceMemoryMiB = %d, want 183359", got)
	}
	if got := gpu.NewLedger().MaxDeviceMemoryMiB(); got != 0 {
		t.Errorf("MaxDeviceMemoryMiB of an empty ledger = %d, want 0", got)
	}
}

func TestFitUnknownNode(t *testing.T) {
	l := ledgerWith([]*v1alpha1.GPUNode{h100s("n1", 1)}, nil)
	r := parse(t, pt.MakePod("p", "ns").GPUFraction("0.5").Obj())
	err := l.Fit("n2", r)
	if !gpu.IsNodeNotFound(err) {
		t.Errorf("Fit(unknown node) = %v, want a NodeNotFoundError", err)
	}
	if _, err := l.Choose("n2", r, ""); !gpu.IsNodeNotFound(err) {
		t.Errorf("Choose(unknown node) = %v, want a NodeNotFoundError", err)
	}
	if got := l.Score("n2", r, ""); got != 0 {
		t.Errorf("Score(unknown node) = %d, want 0", got)
	}
}

func TestChoose(t *testing.T) {
	stepped := []*corev1.Pod{held("a", "n1", "0.25", 1), held("b", "n1", "0.5", 2), held("c", "n1", "0.75", 3)}
	alloc := func(container string, milli, memMiB int64, sm int32, indexes ...int32) gpu.ContainerAllocation {
		ca := gpu.ContainerAllocation{Container: container, Milli: milli, MemoryMiB: memMiB, SMPercent: sm}
		for _, i := range indexes {
			ca.DeviceUUIDs = append(ca.DeviceUUIDs, pt.DeviceUUID("n1", i))
			ca.DeviceIndexes = append(ca.DeviceIndexes, i)
		}
		return ca
	}
	cases := map[string]struct {
		node      *v1alpha1.GPUNode
		existing  []*corev1.Pod
		pod       *corev1.Pod
		placement gpu.Placement
		want      []gpu.ContainerAllocation
	}{
		"binpack takes the fullest device that fits": {
			node:     h100s("n1", 4),
			existing: stepped,
			pod:      pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			want:     []gpu.ContainerAllocation{alloc("main", 500, 40960, 50, 2)},
		},
		"spread takes the emptiest device": {
			node:      h100s("n1", 4),
			existing:  stepped,
			pod:       pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			placement: gpu.PlacementSpread,
			want:      []gpu.ContainerAllocation{alloc("main", 500, 40960, 50, 0)},
		},
		"the pod's own placement when the caller names none": {
			node:     h100s("n1", 4),
			existing: stepped,
			pod:      pt.MakePod("p", "ns").GPUFraction("0.25").Placement("spread").Obj(),
			want:     []gpu.ContainerAllocation{alloc("main", 250, 20480, 25, 0)},
		},
		"ties go to the lower index": {
			node: h100s("n1", 4),
			pod:  pt.MakePod("p", "ns").GPUFraction("0.5").GPUCount(2).Obj(),
			want: []gpu.ContainerAllocation{alloc("main", 500, 40960, 50, 0, 1)},
		},
		"whole GPUs go to free devices only": {
			node:     h100s("n1", 4),
			existing: []*corev1.Pod{held("a", "n1", "0.25", 0)},
			pod:      pt.MakePod("p", "ns").Resource("", gpu.ResourceNVIDIAGPU, "2").Obj(),
			want:     []gpu.ContainerAllocation{alloc("main", 1000, 0, 0, 1, 2)},
		},
		"two containers' whole GPUs get different devices": {
			node: h100s("n1", 2),
			pod: pt.MakePod("p", "ns").Container("a").Resource("a", gpu.ResourceNVIDIAGPU, "1").
				Container("b").Resource("b", gpu.ResourceNVIDIAGPU, "1").Obj(),
			want: []gpu.ContainerAllocation{alloc("a", 1000, 0, 0, 0), alloc("b", 1000, 0, 0, 1)},
		},
		"two containers' slices pack onto one device": {
			node: h100s("n1", 2),
			pod: pt.MakePod("p", "ns").Container("a").Resource("a", gpu.ResourceNVIDIAGPU, "1").Resource("a", gpu.ResourceHAMiGPUMemPercentage, "40").
				Container("b").Resource("b", gpu.ResourceNVIDIAGPU, "1").Resource("b", gpu.ResourceHAMiGPUMemPercentage, "40").Obj(),
			want: []gpu.ContainerAllocation{alloc("a", 400, 32768, 40, 0), alloc("b", 400, 32768, 40, 0)},
		},
		"memory request: share rounded up, limit is the request": {
			node: pt.MakeGPUNode("n1").Device(0, "H100", 81559).Obj(),
			pod:  pt.MakePod("p", "ns").GPUMemory("20Gi").Obj(),
			want: []gpu.ContainerAllocation{alloc("main", 252, 20480, 26, 0)},
		},
		"fraction: the limit is the share of the memory, rounded down": {
			node: pt.MakeGPUNode("n1").Device(0, "H100", 81559).Obj(),
			pod:  pt.MakePod("p", "ns").GPUFraction("0.3").Obj(),
			want: []gpu.ContainerAllocation{alloc("main", 300, 24467, 30, 0)},
		},
		"cores set the SM limit": {
			node: h100s("n1", 1),
			pod:  pt.MakePod("p", "ns").GPUFraction("0.5").GPUCores(20).Obj(),
			want: []gpu.ContainerAllocation{alloc("main", 500, 40960, 20, 0)},
		},
		"a multi-device slice takes devices of one size": {
			node: pt.MakeGPUNode("n1").Device(0, "A100 40GB", 40960).Device(1, "H100", 81920).Device(2, "H100", 81920).Obj(),
			pod:  pt.MakePod("p", "ns").GPUFraction("0.5").GPUCount(2).Obj(),
			want: []gpu.ContainerAllocation{alloc("main", 500, 40960, 50, 1, 2)},
		},
		"unhealthy devices are skipped": {
			node: pt.MakeGPUNode("n1").Devices(2, "H100", 81920).UnhealthyDevice(0).Obj(),
			pod:  pt.MakePod("p", "ns").GPUCount(1).Obj(),
			want: []gpu.ContainerAllocation{alloc("main", 1000, 0, 0, 1)},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := ledgerWith([]*v1alpha1.GPUNode{tc.node}, tc.existing)
			r := parse(t, tc.pod)
			got, err := l.Choose("n1", r, tc.placement)
			if err != nil {
				t.Fatalf("Choose: %v", err)
			}
			want := &gpu.PodAllocation{Namespace: "ns", Name: "p", UID: "uid-ns-p", Node: "n1", Containers: tc.want}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Choose (-want,+got):\n%s", diff)
			}
			if err := l.Assume(got); err != nil {
				t.Fatalf("Assume(Choose()): %v", err)
			}
			if errs := l.CheckInvariants(); len(errs) > 0 {
				t.Errorf("invariants after Assume: %v", errs)
			}
			// Bind writes the allocation onto the pod; reading it back gives
			// the same allocation, and the ledger's state does not change.
			before := l.State()
			pod := bound(tc.pod, r, got)
			l.UpsertPod(pod)
			if diff := cmp.Diff(before.Nodes, l.State().Nodes); diff != "" {
				t.Errorf("devices after the bound pod came (-assumed,+seen):\n%s", diff)
			}
			inv, _ := l.Node("n1")
			back, err := gpu.AllocationFromPod(pod, inv)
			if err != nil {
				t.Fatalf("AllocationFromPod: %v", err)
			}
			if diff := cmp.Diff(got, back); diff != "" {
				t.Errorf("AllocationFromPod(bound pod) (-chosen,+read):\n%s", diff)
			}
			held, ok := l.Allocation(r.UID)
			if !ok {
				t.Fatalf("Allocation(%s): not found", r.UID)
			}
			if diff := cmp.Diff(got, held); diff != "" {
				t.Errorf("Ledger.Allocation (-chosen,+held):\n%s", diff)
			}
		})
	}
}

func TestScore(t *testing.T) {
	half := []*corev1.Pod{held("a", "n1", "0.5", 0)}
	cases := map[string]struct {
		node      *v1alpha1.GPUNode
		existing  []*corev1.Pod
		pod       *corev1.Pod
		placement gpu.Placement
		want      int64
	}{
		"binpack: an empty node": {
			node: h100s("n1", 8),
			pod:  pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			want: 4,
		},
		"binpack: filling a half-used device scores higher": {
			node:     h100s("n1", 8),
			existing: half,
			pod:      pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			want:     7,
		},
		"spread: an empty node": {
			node:      h100s("n1", 2),
			pod:       pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			placement: gpu.PlacementSpread,
			want:      6,
		},
		"spread: a used node scores lower": {
			node:      h100s("n1", 2),
			existing:  half,
			pod:       pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			placement: gpu.PlacementSpread,
			want:      5,
		},
		"binpack: whole GPU on a node that is already busy": {
			node:     h100s("n1", 2),
			existing: []*corev1.Pod{held("a", "n1", "1", 0)},
			pod:      pt.MakePod("p", "ns").GPUCount(1).Obj(),
			want:     10,
		},
		"does not fit": {
			node:     h100s("n1", 1),
			existing: []*corev1.Pod{held("a", "n1", "0.75", 0)},
			pod:      pt.MakePod("p", "ns").GPUFraction("0.5").Obj(),
			want:     0,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := ledgerWith([]*v1alpha1.GPUNode{tc.node}, tc.existing)
			got := l.Score("n1", parse(t, tc.pod), tc.placement)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Score (-want,+got):\n%s", diff)
			}
		})
	}
}
