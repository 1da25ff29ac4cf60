package gpu_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestSnapshotIsolation(t *testing.T) {
	l := ledgerWith([]*v1alpha1.GPUNode{h100s("n1", 2)}, []*corev1.Pod{held("a", "n1", "0.5", 0)})
	s := l.Snapshot()
	ledgerBefore, snapBefore := l.State(), s.State()
	if diff := cmp.Diff(ledgerBefore, snapBefore); diff != "" {
		t.Fatalf("snapshot differs from its ledger (-ledger,+snapshot):\n%s", diff)
	}

	// Changes on the snapshot stay there.
	r := parse(t, pt.MakePod("b", "ns").GPUCount(1).Obj())
	a, err := s.Choose("n1", r, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Assume(a); err != nil {
		t.Fatal(err)
	}
	s.Forget("uid-ns-a")
	if diff := cmp.Diff(ledgerBefore, l.State()); diff != "" {
		t.Errorf("snapshot changes reached the ledger (-before,+after):\n%s", diff)
	}

	// Changes on the ledger stay there, new nodes included.
	snapAfter := s.State()
	l.UpsertNode(h100s("n2", 1))
	l.UpsertPod(held("c", "n1", "0.25", 0))
	l.DeletePod("uid-ns-a")
	if diff := cmp.Diff(snapAfter, s.State()); diff != "" {
		t.Errorf("ledger changes reached the snapshot (-before,+after):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"n1"}, s.Nodes()); diff != "" {
		t.Errorf("snapshot nodes (-want,+got):\n%s", diff)
	}
	if errs := s.CheckInvariants(); len(errs) > 0 {
		t.Errorf("snapshot invariants: %v", errs)
	}
	if errs := l.CheckInvariants(); len(errs) > 0 {
		t.Errorf("ledger invariants: %v", errs)
	}
}

func TestRefresh(t *testing.T) {
	l := ledgerWith([]*v1alpha1.GPUNode{h100s("n1", 2)}, []*corev1.Pod{held("a", "n1", "0.5", 0)})
	s := l.Snapshot()
	r := parse(t, pt.MakePod("b", "ns").GPUCount(1).Obj())
	a, err := s.Choose("n1", r, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Assume(a); err != nil {
		t.Fatal(err)
	}
	l.UpsertNode(h100s("n2", 1))
	l.Refresh(s)
	if diff := cmp.Diff(l.State(), s.State()); diff != "" {
		t.Errorf("refreshed snapshot differs from its ledger (-ledger,+snapshot):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"n1", "n2"}, s.Nodes()); diff != "" {
		t.Errorf("refreshed snapshot nodes (-want,+got):\n%s", diff)
	}
	if _, ok := s.Allocation(r.UID); ok {
		t.Errorf("a pod assumed before the refresh is still on the snapshot")
	}
}

func TestSnapshotForgetVictim(t *testing.T) {
	l := ledgerWith([]*v1alpha1.GPUNode{h100s("n1", 1)}, []*corev1.Pod{held("victim", "n1", "1", 0)})
	r := parse(t, pt.MakePod("p", "ns").GPUCount(1).Obj())
	s := l.Snapshot()
	if err := s.Fit("n1", r); !gpu.IsInsufficient(err) {
		t.Fatalf("Fit before eviction = %v, want insufficient", err)
	}
	if _, ok := s.Allocation("uid-ns-victim"); !ok {
		t.Fatalf("snapshot does not show the victim's allocation")
	}
	s.Forget("uid-ns-victim")
	if err := s.Fit("n1", r); err != nil {
		t.Errorf("Fit after evicting the victim on the snapshot: %v", err)
	}
	if err := l.Fit("n1", r); !gpu.IsInsufficient(err) {
		t.Errorf("ledger Fit = %v, want insufficient: the snapshot's eviction must not reach it", err)
	}
}

func TestPlaceGang(t *testing.T) {
	members := func(n int, pod func(name string) *pt.PodWrapper) []*corev1.Pod {
		var out []*corev1.Pod
		for i := range n {
			out = append(out, pod(fmt.Sprintf("m%d", i)).Obj())
		}
		return out
	}
	half := func(name string) *pt.PodWrapper { return pt.MakePod(name, "ns").GPUFraction("0.5") }
	whole := func(name string) *pt.PodWrapper { return pt.MakePod(name, "ns").GPUCount(1) }
	type placed struct {
		Node    string
		Devices []int32
	}
	cases := map[string]struct {
		nodes      []*v1alpha1.GPUNode
		existing   []*corev1.Pod
		members    []*corev1.Pod
		candidates []string
		placement  gpu.Placement
		want       []placed
		wantMember int // when the gang does not fit: the member that failed
	}{
		"binpack packs the gang onto one node": {
			nodes:   []*v1alpha1.GPUNode{h100s("n1", 8), h100s("n2", 8)},
			members: members(4, half),
			want:    []placed{{"n1", []int32{0}}, {"n1", []int32{0}}, {"n1", []int32{1}}, {"n1", []int32{1}}},
		},
		"binpack prefers the node already in use": {
			nodes:    []*v1alpha1.GPUNode{h100s("n1", 8), h100s("n2", 8)},
			existing: []*corev1.Pod{held("x", "n2", "0.5", 3)},
			members:  members(2, half),
			want:     []placed{{"n2", []int32{3}}, {"n2", []int32{0}}},
		},
		"spread spreads": {
			nodes:     []*v1alpha1.GPUNode{h100s("n1", 2), h100s("n2", 2)},
			members:   members(4, half),
			placement: gpu.PlacementSpread,
			want:      []placed{{"n1", []int32{0}}, {"n2", []int32{0}}, {"n1", []int32{1}}, {"n2", []int32{1}}},
		},
		"candidates restrict the nodes": {
			nodes:      []*v1alpha1.GPUNode{h100s("n1", 8), h100s("n2", 8)},
			members:    members(2, whole),
			candidates: []string{"n2", "n9"},
			want:       []placed{{"n2", []int32{0}}, {"n2", []int32{1}}},
		},
		"members of different shapes": {
			nodes: []*v1alpha1.GPUNode{h100s("n1", 2)},
			members: []*corev1.Pod{
				pt.MakePod("leader", "ns").GPUFraction("0.25").Obj(),
				whole("w0").Obj(),
				pt.MakePod("w1", "ns").GPUFraction("0.75").Obj(),
			},
			want: []placed{{"n1", []int32{0}}, {"n1", []int32{1}}, {"n1", []int32{0}}},
		},
		"all or none": {
			nodes:      []*v1alpha1.GPUNode{h100s("n1", 1), h100s("n2", 1)},
			members:    members(3, whole),
			wantMember: 2,
		},
		"members need distinct UIDs": {
			nodes:      []*v1alpha1.GPUNode{h100s("n1", 4)},
			members:    []*corev1.Pod{whole("m").Obj(), whole("m").Obj()},
			wantMember: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := ledgerWith(tc.nodes, tc.existing)
			s := l.Snapshot()
			before := s.State()
			var reqs []*gpu.PodRequest
			for _, m := range tc.members {
				reqs = append(reqs, parse(t, m))
			}
			allocs, err := s.PlaceGang(reqs, tc.candidates, tc.placement)
			if tc.want == nil {
				var ge *gpu.GangError
				if !errors.As(err, &ge) {
					t.Fatalf("PlaceGang = %v, %v; want a *GangError", allocs, err)
				}
				if diff := cmp.Diff(tc.wantMember, ge.Member); diff != "" {
					t.Errorf("failed member (-want,+got):\n%s", diff)
				}
				if diff := cmp.Diff(before, s.State()); diff != "" {
					t.Errorf("a failed gang left members on the snapshot (-before,+after):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("PlaceGang: %v", err)
			}
			var got []placed
			for i, a := range allocs {
				if a.UID != reqs[i].UID {
					t.Errorf("allocation %d is for %s, want %s", i, a.UID, reqs[i].UID)
				}
				got = append(got, placed{a.Node, a.Containers[0].DeviceIndexes})
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("PlaceGang (-want,+got):\n%s", diff)
			}
			if errs := s.CheckInvariants(); len(errs) > 0 {
				t.Errorf("snapshot invariants: %v", errs)
			}
			if got := len(s.State().Pods) - len(before.Pods); got != len(tc.members) {
				t.Errorf("%d members assumed on the snapshot, want %d", got, len(tc.members))
			}
		})
	}
}

func TestPlaceGangReason(t *testing.T) {
	l := ledgerWith([]*v1alpha1.GPUNode{h100s("n1", 1), h100s("n2", 1)},
		[]*corev1.Pod{held("x", "n1", "0.75", 0), held("y", "n2", "0.5", 0)})
	s := l.Snapshot()
	r := parse(t, pt.MakePod("m", "ns").GPUFraction("0.75").Obj())
	_, err := s.PlaceGang([]*gpu.PodRequest{r}, nil, "")
	want := "place gang: member 1 of 1 does not fit: node n2: largest free slice 0.5 on GPU 0; pod needs 0.75 (container main)"
	if err == nil || err.Error() != want {
		t.Errorf("PlaceGang error:\n got %v\nwant %s", err, want)
	}
	if !gpu.IsInsufficient(err) {
		t.Errorf("PlaceGang error does not wrap an *InsufficientError")
	}
}

// TestSnapshotHeldMilli: what a pod holds is the share the ledger charges
// each of its devices, so a memory slice holds more of a small device than
// of a large one; an allocation's Milli agrees with it.
func TestSnapshotHeldMilli(t *testing.T) {
	l4 := pt.MakeGPUNode("l4").Devices(2, "NVIDIA L4", 23034).Obj()
	h200 := pt.MakeGPUNode("h200").Devices(1, "NVIDIA H200", 143771).Obj()
	l := ledgerWith([]*v1alpha1.GPUNode{l4, h200}, []*corev1.Pod{
		held("slice-l4", "l4", "20Gi", 0),
		held("slice-h200", "h200", "20Gi", 0),
		held("half", "l4", "0.5", 1),
		pt.Held("two", "l4", "1", 0, pt.DeviceUUID("l4", 0), pt.DeviceUUID("l4", 1)),
	})
	s := l.Snapshot()
	cases := map[string]struct {
		uid, node string
		want      int64
		ok        bool
	}{
		"20Gi of a 23034 MiB L4":     {uid: "uid-ns-slice-l4", node: "l4", want: 890, ok: true},
		"20Gi of a 143771 MiB H200":  {uid: "uid-ns-slice-h200", node: "h200", want: 143, ok: true},
		"half a GPU":                 {uid: "uid-ns-half", node: "l4", want: 500, ok: true},
		"two whole GPUs":             {uid: "uid-ns-two", node: "l4", want: 2000, ok: true},
		"looked for on another node": {uid: "uid-ns-slice-l4", node: "h200"},
		"unknown pod":                {uid: "uid-ns-none", node: "l4"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok := s.HeldMilli(types.UID(tc.uid), tc.node)
			if got != tc.want || ok != tc.ok {
				t.Errorf("HeldMilli(%s, %s) = %d, %v; want %d, %v", tc.uid, tc.node, got, ok, tc.want, tc.ok)
			}
		})
	}
	// A placement assumed on the snapshot is found wherever it went, and
	// holds what its allocation says.
	r := parse(t, pt.MakePod("new", "ns").GPUMemory("20Gi").Obj())
	a, err := s.Choose("h200", r, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Assume(a); err != nil {
		t.Fatal(err)
	}
	if got, ok := s.HeldMilli(r.UID, ""); got != 143 || !ok || a.Milli() != 143 {
		t.Errorf("assumed: HeldMilli = %d, %v, allocation Milli = %d; want 143", got, ok, a.Milli())
	}
}

// TestSnapshotWithhold: withheld devices take nothing new, keep what they
// hold and take back what was taken off; the ledger never sees it.
func TestSnapshotWithhold(t *testing.T) {
	occupant := held("occupant", "n1", "0.5", 0)
	l := ledgerWith([]*v1alpha1.GPUNode{h100s("n1", 2)}, []*corev1.Pod{occupant})
	s := l.Snapshot()
	dev0, dev1 := pt.DeviceUUID("n1", 0), pt.DeviceUUID("n1", 1)
	if !s.Withhold("n1", []string{dev0}) {
		t.Fatal("Withhold refused a healthy device")
	}
	if s.Withhold("n1", []string{dev1, dev0}) {
		t.Error("Withhold took a device withheld already")
	}
	if s.Withhold("n1", []string{"GPU-nope"}) || s.Withhold("n9", []string{dev1}) {
		t.Error("Withhold took a device that does not exist")
	}
	half := parse(t, pt.MakePod("half", "ns").GPUFraction("0.5").Obj())
	a, err := s.Choose("n1", half, gpu.PlacementBinpack)
	if err != nil || a.Containers[0].DeviceUUIDs[0] != dev1 {
		t.Errorf("Choose = %+v, %v; want GPU 1, the binpack choice GPU 0 being withheld", a, err)
	}
	onDev0 := &gpu.PodAllocation{Namespace: "ns", Name: "half", UID: "uid-half", Node: "n1",
		Containers: []gpu.ContainerAllocation{{Container: pt.DefaultContainer, DeviceUUIDs: []string{dev0}, Milli: 500}}}
	if err := s.Assume(onDev0); err == nil {
		t.Error("Assume put a new pod on a withheld device")
	}
	taken, ok := s.Allocation(occupant.UID)
	if !ok {
		t.Fatal("occupant missing")
	}
	s.Forget(occupant.UID)
	if err := s.Restore(taken); err != nil {
		t.Errorf("Restore onto a withheld device: %v", err)
	}
	if pods := s.PodsOn("n1"); len(pods) != 1 || pods[0] != occupant.UID {
		t.Errorf("PodsOn = %v, want the occupant", pods)
	}
	two := parse(t, pt.MakePod("two", "ns").GPUCount(2).Obj())
	s.Unwithhold("n1", []string{dev0})
	s.Forget(occupant.UID)
	if err := s.Fit("n1", two); err != nil {
		t.Errorf("Fit after Unwithhold: %v", err)
	}
	if err := l.Fit("n1", half); err != nil {
		t.Errorf("the ledger saw the snapshot's withholding: %v", err)
	}
}
