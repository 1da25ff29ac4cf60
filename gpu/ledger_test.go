package gpu_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestInventoryFromGPUNode(t *testing.T) {
	cases := map[string]struct {
		node *v1alpha1.GPUNode
		want *gpu.NodeInventory
	}{
		"devices sorted by index, unhealthy kept": {
			node: pt.MakeGPUNode("n1").Device(1, "H100", 81920).Device(0, "H100", 81920).UnhealthyDevice(1).Isolation(v1alpha1.IsolationMPS).Obj(),
			want: &gpu.NodeInventory{Name: "n1", Isolation: v1alpha1.IsolationMPS, Devices: []gpu.Device{
				{Index: 0, UUID: "GPU-n1-0", Product: "H100", MemoryMiB: 81920, Healthy: true},
				{Index: 1, UUID: "GPU-n1-1", Product: "H100", MemoryMiB: 81920},
			}},
		},
		"isolation defaults to time-slicing": {
			node: pt.MakeGPUNode("n1").Obj(),
			want: &gpu.NodeInventory{Name: "n1", Isolation: v1alpha1.IsolationTimeSlicing},
		},
		"MIG-enabled devices take no slice; repeated UUIDs are dropped": {
			node: func() *v1alpha1.GPUNode {
				n := pt.MakeGPUNode("n1").Device(0, "A100", 40960).Device(1, "A100", 40960).Device(2, "A100", 40960).Obj()
				n.Status.Devices[0].MIGMode = v1alpha1.MIGEnabled
				n.Status.Devices[2].UUID = n.Status.Devices[1].UUID
				return n
			}(),
			want: &gpu.NodeInventory{Name: "n1", Isolation: v1alpha1.IsolationTimeSlicing, Devices: []gpu.Device{
				{Index: 0, UUID: "GPU-n1-0", Product: "A100", MemoryMiB: 40960},
				{Index: 1, UUID: "GPU-n1-1", Product: "A100", MemoryMiB: 40960, Healthy: true},
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, gpu.InventoryFromGPUNode(tc.node)); diff != "" {
				t.Errorf("InventoryFromGPUNode (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestAllocationAnnotations(t *testing.T) {
	a := &gpu.PodAllocation{Namespace: "ns", Name: "p", UID: "u", Node: "n1", Containers: []gpu.ContainerAllocation{
		{Container: "train", DeviceUUIDs: []string{"GPU-a", "GPU-b"}, DeviceIndexes: []int32{0, 1}, Milli: 500, MemoryMiB: 40960, SMPercent: 50},
		{Container: "whole", DeviceUUIDs: []string{"GPU-c"}, DeviceIndexes: []int32{2}, Milli: 1000},
	}}
	want := map[string]string{
		"partita.dev/node":            "n1",
		"partita.dev/devices.train":   "GPU-a,GPU-b",
		"partita.dev/mem-limit.train": "40960M",
		"partita.dev/sm-limit.train":  "50",
		"partita.dev/devices.whole":   "GPU-c",
	}
	if diff := cmp.Diff(want, gpu.AllocationAnnotations(a)); diff != "" {
		t.Errorf("AllocationAnnotations (-want,+got):\n%s", diff)
	}
}

func TestAllocationFromPodErrors(t *testing.T) {
	inv := gpu.InventoryFromGPUNode(h100s("n1", 2))
	good := held("p", "n1", "0.5", 0)
	cases := map[string]struct {
		pod     *corev1.Pod
		node    *gpu.NodeInventory
		wantErr string
		wantIs  error
	}{
		"no allocation": {
			pod:    pt.MakePod("p", "ns").GPUFraction("0.5").Node("n1").Obj(),
			node:   inv,
			wantIs: gpu.ErrNotAllocated,
		},
		"not bound": {
			pod: func() *corev1.Pod {
				p := good.DeepCopy()
				p.Spec.NodeName = ""
				return p
			}(),
			node:    inv,
			wantErr: "read allocation of pod ns/p: pod is not bound",
		},
		"another node's inventory": {
			pod:     good,
			node:    gpu.InventoryFromGPUNode(h100s("n2", 2)),
			wantErr: `read allocation of pod ns/p: pod is bound to "n1", not "n2"`,
		},
		"unknown device": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").Node("n1").
				Annotation("partita.dev/devices.main", "GPU-n1-7").Obj(),
			node:    inv,
			wantErr: `read allocation of pod ns/p: container "main" names device "GPU-n1-7", which node "n1" does not have`,
		},
		"wrong device count": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").GPUCount(2).Node("n1").
				Annotation("partita.dev/devices.main", "GPU-n1-0").Obj(),
			node:    inv,
			wantErr: `read allocation of pod ns/p: container "main" has 1 devices but asks for 2`,
		},
		"devices for a container without a request": {
			pod: pt.MakePod("p", "ns").Container("main").Container("side").GPUFraction("0.5").Node("n1").
				Annotation("partita.dev/devices.main", "GPU-n1-0").Annotation("partita.dev/devices.side", "GPU-n1-1").Obj(),
			node:    inv,
			wantErr: `read allocation of pod ns/p: container "side" has devices but asks for no GPU`,
		},
		"bad memory limit": {
			pod: pt.MakePod("p", "ns").GPUFraction("0.5").Node("n1").
				Annotation("partita.dev/devices.main", "GPU-n1-0").Annotation("partita.dev/mem-limit.main", "40Gi").Obj(),
			node:    inv,
			wantErr: `read allocation of pod ns/p: partita.dev/mem-limit.main is "40Gi", not <MiB>M`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := gpu.AllocationFromPod(tc.pod, tc.node)
			if err == nil {
				t.Fatalf("AllocationFromPod = %+v, want an error", got)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("AllocationFromPod error %v, want %v", err, tc.wantIs)
			}
			if tc.wantErr != "" && err.Error() != tc.wantErr {
				t.Errorf("AllocationFromPod error:\n got %q\nwant %q", err.Error(), tc.wantErr)
			}
		})
	}
}

func TestAssume(t *testing.T) {
	quarter := func(uid types.UID, indexes ...int32) *gpu.PodAllocation {
		ca := gpu.ContainerAllocation{Container: "main", Milli: 250, MemoryMiB: 20480}
		for _, i := range indexes {
			ca.DeviceUUIDs = append(ca.DeviceUUIDs, pt.DeviceUUID("n1", i))
		}
		return &gpu.PodAllocation{Namespace: "ns", Name: string(uid), UID: uid, Node: "n1", Containers: []gpu.ContainerAllocation{ca}}
	}
	whole := func(uid types.UID, index int32) *gpu.PodAllocation {
		return &gpu.PodAllocation{Namespace: "ns", Name: string(uid), UID: uid, Node: "n1", Containers: []gpu.ContainerAllocation{
			{Container: "main", DeviceIndexes: []int32{index}, Milli: 1000},
		}}
	}
	node := pt.MakeGPUNode("n1").Devices(2, "H100", 81920).UnhealthyDevice(1).Obj()
	cases := map[string]struct {
		before  []*gpu.PodAllocation
		assume  *gpu.PodAllocation
		check   func(error) bool
		wantErr string
	}{
		"fits": {
			before: []*gpu.PodAllocation{quarter("a", 0)},
			assume: quarter("b", 0),
		},
		"the same allocation again is a no-op": {
			before: []*gpu.PodAllocation{quarter("a", 0)},
			assume: quarter("a", 0),
		},
		"other devices for the same pod": {
			before:  []*gpu.PodAllocation{quarter("a", 0)},
			assume:  whole("a", 1),
			check:   func(err error) bool { return errors.Is(err, gpu.ErrAlreadyAllocated) },
			wantErr: "assume pod ns/a: pod already holds a different allocation",
		},
		"over the device's share": {
			before:  []*gpu.PodAllocation{quarter("a", 0), quarter("b", 0), quarter("c", 0), quarter("d", 0)},
			assume:  quarter("e", 0),
			check:   gpu.IsInsufficient,
			wantErr: "assume pod ns/e: node n1: largest free slice 0 on GPU 0; pod needs 0.25 (container main)",
		},
		"whole next to a slice": {
			before: []*gpu.PodAllocation{quarter("a", 0)},
			assume: whole("b", 0),
			check:  gpu.IsInsufficient,
		},
		"slice next to a whole": {
			before: []*gpu.PodAllocation{whole("a", 0)},
			assume: quarter("b", 0),
			check:  gpu.IsInsufficient,
		},
		"unhealthy device": {
			assume:  quarter("a", 1),
			wantErr: "assume pod ns/a: allocation of pod ns/a, container main: device 1 (GPU-n1-1) is unhealthy",
		},
		"unknown device": {
			assume:  quarter("a", 5),
			wantErr: "assume pod ns/a: allocation of pod ns/a, container main: node n1 has no device GPU-n1-5",
		},
		"the same device twice": {
			assume:  quarter("a", 0, 0),
			wantErr: "assume pod ns/a: allocation of pod ns/a, container main: device GPU-n1-0 named twice",
		},
		"unknown node": {
			assume: func() *gpu.PodAllocation { a := quarter("a", 0); a.Node = "n9"; return a }(),
			check:  gpu.IsNodeNotFound,
		},
		"no UID": {
			assume:  quarter("", 0),
			wantErr: "assume pod ns/: allocation of pod ns/: no pod UID",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := ledgerWith([]*v1alpha1.GPUNode{node}, nil)
			for _, a := range tc.before {
				if err := l.Assume(a); err != nil {
					t.Fatalf("setup Assume(%s): %v", a.UID, err)
				}
			}
			before := l.State()
			err := l.Assume(tc.assume)
			wantFail := tc.check != nil || tc.wantErr != ""
			switch {
			case !wantFail && err != nil:
				t.Fatalf("Assume: %v", err)
			case wantFail && err == nil:
				t.Fatalf("Assume succeeded, want an error")
			case tc.check != nil && !tc.check(err):
				t.Errorf("Assume error %v (%T) is not the expected kind", err, errors.Unwrap(err))
			case tc.wantErr != "" && err.Error() != tc.wantErr:
				t.Errorf("Assume error:\n got %q\nwant %q", err.Error(), tc.wantErr)
			}
			if wantFail {
				if diff := cmp.Diff(before, l.State()); diff != "" {
					t.Errorf("a refused Assume changed the ledger (-before,+after):\n%s", diff)
				}
			}
			if errs := l.CheckInvariants(); len(errs) > 0 {
				t.Errorf("invariants: %v", errs)
			}
		})
	}
}

// TestAssumeConcurrent races binds for one device: exactly as many as fit
// must win, whatever the interleaving.
func TestAssumeConcurrent(t *testing.T) {
	l := ledgerWith([]*v1alpha1.GPUNode{h100s("n1", 1)}, nil)
	const binders = 16
	var wg sync.WaitGroup
	won := make(chan types.UID, binders)
	for i := range binders {
		wg.Go(func() {
			pod := pt.MakePod(fmt.Sprintf("p%d", i), "ns").GPUFraction("0.25").Obj()
			r, _ := gpu.ParsePod(pod)
			for {
				a, err := l.Choose("n1", r, "")
				if err != nil {
					return
				}
				if err := l.Assume(a); err == nil {
					won <- r.UID
					return
				}
			}
		})
	}
	wg.Wait()
	close(won)
	if n := len(won); n != 4 {
		t.Errorf("%d binds won a quarter of one device, want 4", n)
	}
	if errs := l.CheckInvariants(); len(errs) > 0 {
		t.Errorf("invariants: %v", errs)
	}
}

func TestLedgerPodLifecycle(t *testing.T) {
	node := h100s("n1", 2)
	pod := held("p", "n1", "0.5", 0)
	used := func(l *gpu.Ledger) []int64 {
		var out []int64
		for _, n := range l.State().Nodes {
			for _, d := range n.Devices {
				out = append(out, d.AllocatedMilli)
			}
		}
		return out
	}
	cases := map[string]struct {
		steps func(l *gpu.Ledger)
		want  []int64
	}{
		"a bound pod holds its slice": {
			steps: func(l *gpu.Ledger) { l.UpsertNode(node); l.UpsertPod(pod) },
			want:  []int64{500, 0},
		},
		"a pod seen before its node counts once the node appears": {
			steps: func(l *gpu.Ledger) { l.UpsertPod(pod); l.UpsertNode(node) },
			want:  []int64{500, 0},
		},
		"the same pod twice counts once": {
			steps: func(l *gpu.Ledger) { l.UpsertNode(node); l.UpsertPod(pod); l.UpsertPod(pod.DeepCopy()) },
			want:  []int64{500, 0},
		},
		"a pod that succeeded frees its slice": {
			steps: func(l *gpu.Ledger) {
				l.UpsertNode(node)
				l.UpsertPod(pod)
				done := pod.DeepCopy()
				done.Status.Phase = corev1.PodSucceeded
				l.UpsertPod(done)
			},
			want: []int64{0, 0},
		},
		"a pod that failed frees its slice": {
			steps: func(l *gpu.Ledger) {
				l.UpsertNode(node)
				l.UpsertPod(pod)
				done := pod.DeepCopy()
				done.Status.Phase = corev1.PodFailed
				l.UpsertPod(done)
			},
			want: []int64{0, 0},
		},
		"a deleted pod frees its slice": {
			steps: func(l *gpu.Ledger) { l.UpsertNode(node); l.UpsertPod(pod); l.DeletePod(pod.UID) },
			want:  []int64{0, 0},
		},
		"a terminating pod still holds its slice": {
			steps: func(l *gpu.Ledger) {
				l.UpsertNode(node)
				p := pod.DeepCopy()
				now := metav1.Now()
				p.DeletionTimestamp = &now
				l.UpsertPod(p)
			},
			want: []int64{500, 0},
		},
		"an assumed pod survives updates that do not show the bind yet": {
			steps: func(l *gpu.Ledger) {
				l.UpsertNode(node)
				pending := pt.MakePod("p", "ns").GPUFraction("0.5").Obj()
				a, _ := l.Choose("n1", parse(t, pending), "")
				if err := l.Assume(a); err != nil {
					t.Fatal(err)
				}
				l.UpsertPod(pending)
			},
			want: []int64{500, 0},
		},
		"Forget drops an assumption": {
			steps: func(l *gpu.Ledger) {
				l.UpsertNode(node)
				pending := pt.MakePod("p", "ns").GPUFraction("0.5").Obj()
				a, _ := l.Choose("n1", parse(t, pending), "")
				_ = l.Assume(a)
				l.Forget(pending.UID)
			},
			want: []int64{0, 0},
		},
		"Forget keeps what a pod shows": {
			steps: func(l *gpu.Ledger) { l.UpsertNode(node); l.UpsertPod(pod); l.Forget(pod.UID) },
			want:  []int64{500, 0},
		},
		"a node deleted and back counts its pods again": {
			steps: func(l *gpu.Ledger) { l.UpsertNode(node); l.UpsertPod(pod); l.DeleteNode("n1"); l.UpsertNode(node) },
			want:  []int64{500, 0},
		},
		"a device that turns unhealthy keeps its allocation": {
			steps: func(l *gpu.Ledger) {
				l.UpsertNode(node)
				l.UpsertPod(pod)
				l.UpsertNode(pt.MakeGPUNode("n1").Devices(2, "NVIDIA H100 80GB HBM3", 81920).UnhealthyDevice(0).Obj())
			},
			want: []int64{500, 0},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := gpu.NewLedger()
			tc.steps(l)
			if diff := cmp.Diff(tc.want, used(l)); diff != "" {
				t.Errorf("allocated milli per device (-want,+got):\n%s", diff)
			}
			if errs := l.CheckInvariants(); len(errs) > 0 {
				t.Errorf("invariants: %v", errs)
			}
		})
	}
}

func TestStrandedAndInvariants(t *testing.T) {
	node := pt.MakeGPUNode("n1").Devices(2, "H100", 81920).UnhealthyDevice(1).Obj()
	cases := map[string]struct {
		pods           []*corev1.Pod
		wantStranded   []gpu.Stranded
		wantViolations int
	}{
		"a pod on a device that turned unhealthy is stranded, not a violation": {
			pods: []*corev1.Pod{held("a", "n1", "0.5", 1)},
			wantStranded: []gpu.Stranded{{Namespace: "ns", Name: "a", UID: "uid-ns-a", Node: "n1", Container: "main",
				DeviceUUID: "GPU-n1-1", Reason: gpu.StrandedDeviceUnhealthy}},
		},
		"a pod on a missing device": {
			pods: []*corev1.Pod{held("a", "n1", "0.5", 7)},
			wantStranded: []gpu.Stranded{{Namespace: "ns", Name: "a", UID: "uid-ns-a", Node: "n1", Container: "main",
				DeviceUUID: "GPU-n1-7", Reason: gpu.StrandedDeviceMissing}},
		},
		"a pod on a node without inventory": {
			pods:         []*corev1.Pod{held("a", "n2", "0.5", 0)},
			wantStranded: []gpu.Stranded{{Namespace: "ns", Name: "a", UID: "uid-ns-a", Node: "n2", Reason: gpu.StrandedNodeMissing}},
		},
		"annotations written by someone else that overcommit a device": {
			pods:           []*corev1.Pod{held("a", "n1", "0.75", 0), held("b", "n1", "0.5", 0)},
			wantViolations: 2, // share and memory
		},
		"a whole device shared": {
			pods:           []*corev1.Pod{held("a", "n1", "1", 0), held("b", "n1", "0.1", 0)},
			wantViolations: 3, // share, memory and exclusivity
		},
		"fewer devices than asked": {
			pods: func() []*corev1.Pod {
				p := held("a", "n1", "0.5", 0)
				p.Annotations[v1alpha1.AnnotationGPUCount] = "2"
				p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMilli] = quantity("1000")
				p.Spec.Containers[0].Resources.Requests[v1alpha1.ResourceGPUMilli] = quantity("1000")
				return []*corev1.Pod{p}
			}(),
			wantViolations: 1,
		},
		"unreadable annotations are counted as read and reported": {
			pods: func() []*corev1.Pod {
				p := held("a", "n1", "0.5", 0)
				p.Annotations[v1alpha1.AnnotationMemLimitPrefix+"main"] = "lots"
				return []*corev1.Pod{p}
			}(),
			wantStranded: []gpu.Stranded{{Namespace: "ns", Name: "a", UID: "uid-ns-a", Node: "n1", Reason: gpu.StrandedMalformed,
				Detail: `partita.dev/mem-limit.main is "lots", not <MiB>M`}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := ledgerWith([]*v1alpha1.GPUNode{node}, tc.pods)
			if diff := cmp.Diff(tc.wantStranded, l.Stranded()); diff != "" {
				t.Errorf("Stranded (-want,+got):\n%s", diff)
			}
			errs := l.CheckInvariants()
			if len(errs) != tc.wantViolations {
				t.Errorf("CheckInvariants = %v, want %d violations", errs, tc.wantViolations)
			}
			for _, err := range errs {
				var ie *gpu.InvariantError
				if !errors.As(err, &ie) {
					t.Errorf("violation %v is not an *InvariantError", err)
				}
			}
		})
	}
}

func TestBuildLedgerMatchesIncremental(t *testing.T) {
	nodes := []v1alpha1.GPUNode{*h100s("n1", 2), *pt.MakeGPUNode("n2").Devices(4, "L4", 24576).UnhealthyDevice(3).Obj()}
	pods := []corev1.Pod{
		*held("a", "n1", "0.5", 0), *held("b", "n2", "8Gi", 1, 2), *held("c", "n1", "1", 1),
		*held("d", "n3", "0.5", 0),
		*pt.MakePod("e", "ns").GPUFraction("0.5").Obj(),
	}
	built := gpu.BuildLedger(nodes, pods)
	l := gpu.NewLedger()
	for i := len(pods) - 1; i >= 0; i-- {
		l.UpsertPod(&pods[i])
	}
	l.UpsertNode(&nodes[1])
	l.UpsertNode(&nodes[0])
	if diff := cmp.Diff(built.State(), l.State()); diff != "" {
		t.Errorf("BuildLedger vs incremental (-built,+incremental):\n%s", diff)
	}
	if got := len(built.State().Pods); got != 4 {
		t.Errorf("%d pods hold devices, want 4", got)
	}
}

// TestLedgerNodeChurn adds and deletes many nodes, so that the ledger
// compacts its slices, and checks it against BuildLedger and a snapshot
// taken before.
func TestLedgerNodeChurn(t *testing.T) {
	l := gpu.NewLedger()
	var nodes []v1alpha1.GPUNode
	var pods []corev1.Pod
	for i := range 3000 {
		name := fmt.Sprintf("n%04d", i)
		n := pt.MakeGPUNode(name).Devices(1+i%4, "L4", 24576).Obj()
		l.UpsertNode(n)
		p := held(fmt.Sprintf("p%04d", i), name, "0.5", 0)
		l.UpsertPod(p)
		if i%3 == 0 {
			// Keep a third of the nodes, and the pods of the deleted nodes
			// whose index is even.
			nodes = append(nodes, *n)
		}
		if i%3 == 0 || i%2 == 0 {
			pods = append(pods, *p)
		}
	}
	s := l.Snapshot()
	snapBefore := s.State()
	for i := range 3000 {
		if i%3 == 0 {
			continue
		}
		l.DeleteNode(fmt.Sprintf("n%04d", i))
		if i%2 != 0 {
			l.DeletePod(types.UID(fmt.Sprintf("uid-ns-p%04d", i)))
		}
	}
	// A node grows: its devices move.
	grown := pt.MakeGPUNode("n0000").Devices(8, "L4", 24576).Obj()
	l.UpsertNode(grown)
	nodes[0] = *grown
	if diff := cmp.Diff(gpu.BuildLedger(nodes, pods).State(), l.State()); diff != "" {
		t.Errorf("after churn (-built,+incremental):\n%s", diff)
	}
	if errs := l.CheckInvariants(); len(errs) > 0 {
		t.Errorf("invariants: %v", errs[:min(3, len(errs))])
	}
	if diff := cmp.Diff(snapBefore, s.State()); diff != "" {
		t.Errorf("the churn reached a snapshot (-before,+after):\n%s", diff)
	}
	if got, want := len(l.Nodes()), 1000; got != want {
		t.Errorf("%d nodes, want %d", got, want)
	}
}

// TestLedgerSilentAgent: a node whose agent is marked silent takes no new
// pods, from any door (Fit, Choose, Score, Assume, gang placement), says
// why, keeps counting what it holds, and takes pods again as soon as a
// newer heartbeat arrives.
func TestLedgerSilentAgent(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	n1 := pt.MakeGPUNode("n1").Devices(2, "NVIDIA H100 80GB HBM3", 81920).Heartbeat(t0)
	n2 := pt.MakeGPUNode("n2").Devices(1, "NVIDIA H100 80GB HBM3", 81920).Heartbeat(t0)
	running := held("running", "n1", "1", 0)
	l := ledgerWith([]*v1alpha1.GPUNode{n1.Clone().Obj(), n2.Clone().Obj()}, []*corev1.Pod{running})
	half := parse(t, pt.MakePod("half", "ns").UID("half").GPUFraction("0.5").Obj())
	whole := func(uid string) *gpu.PodRequest {
		return parse(t, pt.MakePod(uid, "ns").UID(types.UID(uid)).GPUFraction("1").Obj())
	}
	silence := &gpu.AgentSilentError{LastHeartbeat: t0, For: 3*time.Minute + 400*time.Millisecond}
	const want = "the agent on node n1 has not reported for 3m0s (last heartbeat 2026-12-01T10:00:00Z): the node takes no new GPU pods until it does"

	l.SetAgentSilent("n1", silence)
	if diff := cmp.Diff([]gpu.AgentSilentError{{Node: "n1", LastHeartbeat: t0, For: silence.For}}, l.SilentAgents()); diff != "" {
		t.Errorf("silent agents (-want,+got):\n%s", diff)
	}
	if err := l.Fit("n1", half); !gpu.IsAgentSilent(err) || err.Error() != want {
		t.Errorf("Fit on the silent node = %v, want %q", err, want)
	}
	if _, err := l.Choose("n1", half, ""); !gpu.IsAgentSilent(err) {
		t.Errorf("Choose on the silent node = %v, want an AgentSilentError", err)
	}
	if s := l.Score("n1", half, ""); s != 0 {
		t.Errorf("Score on the silent node = %d, want 0", s)
	}
	a := &gpu.PodAllocation{Namespace: "ns", Name: "x", UID: "x", Node: "n1",
		Containers: []gpu.ContainerAllocation{{Container: "main", DeviceUUIDs: []string{pt.DeviceUUID("n1", 1)}, Milli: 500}}}
	if err := l.Assume(a); !gpu.IsAgentSilent(err) {
		t.Errorf("Assume on the silent node = %v, want an AgentSilentError", err)
	}
	if err := l.Fit("n2", half); err != nil {
		t.Errorf("Fit on the other node: %v", err)
	}

	// Gangs go elsewhere, or say the silence is what holds them.
	snap := l.Snapshot()
	if got, err := snap.PlaceGang([]*gpu.PodRequest{half}, nil, ""); err != nil || got[0].Node != "n2" {
		t.Errorf("PlaceGang = %v (%v), want it on n2", got, err)
	}
	snap = l.Snapshot()
	_, err := snap.PlaceGang([]*gpu.PodRequest{whole("w1"), whole("w2")}, nil, "")
	if !gpu.IsAgentSilent(err) || !strings.Contains(err.Error(), "the agent on node n1 has not reported") {
		t.Errorf("PlaceGang of 2 whole GPUs (n2 has 1, n1 is silent) = %v, want the silence as the reason", err)
	}
	if got := snap.FreeMilli("n1"); got != 0 {
		t.Errorf("FreeMilli of the silent node = %d, want 0", got)
	}
	if got := snap.CapacityMilli(); got != 3000 {
		t.Errorf("CapacityMilli = %d, want 3000 (silent nodes still count)", got)
	}
	// What it holds stays counted.
	if st := l.State(); st.Nodes[0].Devices[0].AllocatedMilli != 1000 || len(st.Pods) != 1 {
		t.Errorf("state of the silent node: %+v", st)
	}

	// A mark made from an older heartbeat than the ledger has is ignored.
	l.UpsertNode(n2.Clone().Heartbeat(t0.Add(time.Minute)).Obj())
	l.SetAgentSilent("n2", &gpu.AgentSilentError{LastHeartbeat: t0, For: time.Hour})
	if err := l.Fit("n2", half); err != nil {
		t.Errorf("Fit on n2 after a stale mark: %v", err)
	}

	// The agent reports again: n1 takes pods at once.
	l.UpsertNode(n1.Clone().Heartbeat(t0.Add(4 * time.Minute)).Obj())
	if err := l.Fit("n1", half); err != nil {
		t.Errorf("Fit on n1 after a new heartbeat: %v", err)
	}
	if got := l.SilentAgents(); len(got) != 0 {
		t.Errorf("silent agents after the heartbeat: %v", got)
	}
	// Clearing by hand works too.
	l.SetAgentSilent("n1", &gpu.AgentSilentError{LastHeartbeat: t0.Add(4 * time.Minute)})
	l.SetAgentSilent("n1", nil)
	if err := l.Fit("n1", half); err != nil {
		t.Errorf("Fit on n1 after clearing: %v", err)
	}
	if diff := cmp.Diff(map[string]time.Time{"n1": t0.Add(4 * time.Minute), "n2": t0.Add(time.Minute)}, l.Heartbeats()); diff != "" {
		t.Errorf("heartbeats (-want,+got):\n%s", diff)
	}
}

// TestLedgerUnknownDevice: a device the agent could not identify is in the
// inventory, unhealthy, whatever its health field says.
func TestLedgerUnknownDevice(t *testing.T) {
	n := pt.MakeGPUNode("n1").Devices(1, "NVIDIA H100 80GB HBM3", 81920).UnknownDevice(1).Obj()
	n.Status.Devices[1].Health = v1alpha1.DeviceHealthy // even if it said so
	l := ledgerWith([]*v1alpha1.GPUNode{n}, nil)
	inv, ok := l.Node("n1")
	if !ok || len(inv.Devices) != 2 || inv.Devices[1].UUID != "unknown-1" || inv.Devices[1].Healthy {
		t.Fatalf("inventory %+v, want device 1 kept as unknown-1 and unhealthy", inv)
	}
	two := parse(t, pt.MakePod("two", "ns").GPUFraction("1").GPUCount(2).Obj())
	if err := l.Fit("n1", two); !gpu.IsInsufficient(err) {
		t.Errorf("Fit of 2 GPUs = %v, want insufficient (one device is unknown)", err)
	}
}

func TestLedgerDRAManagedDevices(t *testing.T) {
	const h100 = "NVIDIA H100 80GB HBM3"
	whole := pt.MakePod("whole", "ns").GPUFraction("1").Obj()
	cases := map[string]struct {
		node         *v1alpha1.GPUNode
		wantFit      string // "" fits, "dra", "insufficient"
		wantCapacity int64
		wantManaged  []string
	}{
		"every GPU another driver's": {
			node:         pt.MakeGPUNode("n1").Devices(2, h100, 81920).DRADriver("gpu.nvidia.com", 0, 1).Obj(),
			wantFit:      "dra",
			wantCapacity: 2000,
			wantManaged:  []string{"gpu.nvidia.com"},
		},
		"one of two another driver's": {
			node:         pt.MakeGPUNode("n1").Devices(2, h100, 81920).DRADriver("gpu.nvidia.com", 0).Obj(),
			wantCapacity: 2000,
		},
		"the other one unhealthy": {
			node:         pt.MakeGPUNode("n1").Devices(2, h100, 81920).DRADriver("gpu.nvidia.com", 0).UnhealthyDevice(1).Obj(),
			wantFit:      "dra",
			wantCapacity: 1000,
			wantManaged:  []string{"gpu.nvidia.com"},
		},
		"no other driver": {
			node:         pt.MakeGPUNode("n1").Devices(2, h100, 81920).Obj(),
			wantCapacity: 2000,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := ledgerWith([]*v1alpha1.GPUNode{tc.node}, nil)
			inv, _ := l.Node("n1")
			if diff := cmp.Diff(tc.wantManaged, inv.DRAManaged()); diff != "" {
				t.Errorf("DRAManaged (-want,+got):\n%s", diff)
			}
			err := l.Fit("n1", parse(t, whole))
			switch tc.wantFit {
			case "":
				if err != nil {
					t.Errorf("Fit = %v, want nil", err)
				}
			case "dra":
				if !gpu.IsDRAManaged(err) || !strings.Contains(err.Error(), "GPUs managed by DRA driver gpu.nvidia.com") {
					t.Errorf("Fit = %v, want a DRAManagedError naming gpu.nvidia.com", err)
				}
			}
			_, gangErr := l.Snapshot().PlaceGang([]*gpu.PodRequest{parse(t, whole)}, []string{"n1"}, gpu.PlacementBinpack)
			if tc.wantFit == "dra" && !gpu.IsDRAManaged(gangErr) {
				t.Errorf("PlaceGang = %v, want a DRAManagedError (what the admission loop says)", gangErr)
			}
			if got := l.Snapshot().CapacityMilli(); got != tc.wantCapacity {
				t.Errorf("CapacityMilli = %d, want %d (another driver's GPUs count)", got, tc.wantCapacity)
			}
		})
	}
}

func TestLedgerNeverPlacesOnDRAManagedDevice(t *testing.T) {
	node := pt.MakeGPUNode("n1").Devices(2, "NVIDIA H100 80GB HBM3", 81920).DRADriver("gpu.nvidia.com", 0).Obj()
	l := ledgerWith([]*v1alpha1.GPUNode{node}, nil)
	two := parse(t, pt.MakePod("two", "ns").GPUFraction("1").GPUCount(2).Obj())
	if err := l.Fit("n1", two); !gpu.IsInsufficient(err) {
		t.Errorf("Fit of 2 GPUs = %v, want insufficient (GPU 0 is gpu.nvidia.com's)", err)
	}
	for range 4 {
		req := parse(t, pt.MakePod("q", "ns").UID(types.UID(fmt.Sprint(time.Now().UnixNano()))).GPUFraction("0.25").Obj())
		a, err := l.Choose("n1", req, gpu.PlacementBinpack)
		if err != nil {
			t.Fatalf("Choose: %v", err)
		}
		if diff := cmp.Diff([]int32{1}, a.Containers[0].DeviceIndexes); diff != "" {
			t.Errorf("devices (-want,+got):\n%s", diff)
		}
		if err := l.Assume(a); err != nil {
			t.Fatalf("Assume: %v", err)
		}
	}
	bad := &gpu.PodAllocation{Namespace: "ns", Name: "x", UID: "x", Node: "n1", Containers: []gpu.ContainerAllocation{{Container: "c", DeviceUUIDs: []string{pt.DeviceUUID("n1", 0)}, Milli: 1000}}}
	if err := l.Assume(bad); err == nil || !strings.Contains(err.Error(), "allocated by DRA driver gpu.nvidia.com") {
		t.Errorf("Assume on GPU 0 = %v, want refused naming the driver", err)
	}
}
