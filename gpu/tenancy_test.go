package gpu_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// heldIn is held for a pod of namespace ns.
func heldIn(ns, name, node, amount string, devices ...int32) *corev1.Pod {
	p := held(name, node, amount, devices...)
	p.Namespace = ns
	p.UID = types.UID(ns + "-" + name)
	return p
}

func mpsH100s(name string, n int) *v1alpha1.GPUNode {
	return pt.MakeGPUNode(name).Devices(n, "NVIDIA H100 80GB HBM3", 81920).Isolation(v1alpha1.IsolationMPS).Obj()
}

// An MPS daemon obeys every client of its device (quit, set limits), so on
// an mps node a device's slices belong to one namespace.
func TestOneNamespacePerMPSDevice(t *testing.T) {
	cases := map[string]struct {
		node     *v1alpha1.GPUNode
		existing []*corev1.Pod
		pod      *corev1.Pod
		// wantDevices are the devices Choose picks, nil when it must fail.
		wantDevices []int32
		wantMsg     string
	}{
		"another namespace's device is closed to a slice": {
			node:     mpsH100s("n1", 1),
			existing: []*corev1.Pod{heldIn("team-a", "a", "n1", "0.25", 0)},
			pod:      pt.MakePod("p", "team-b").GPUFraction("0.25").Obj(),
			wantMsg:  "node n1: no GPU with room for the pod's namespace; pod needs 0.25 (container main); 1 GPU with room serves MPS clients of another namespace (one namespace per GPU in mps mode)",
		},
		"the same namespace shares its device": {
			node:        mpsH100s("n1", 1),
			existing:    []*corev1.Pod{heldIn("team-a", "a", "n1", "0.25", 0)},
			pod:         pt.MakePod("p", "team-a").GPUFraction("0.5").Obj(),
			wantDevices: []int32{0},
		},
		"binpack passes over a fuller device of another namespace": {
			node:        mpsH100s("n1", 2),
			existing:    []*corev1.Pod{heldIn("team-a", "a", "n1", "0.5", 0)},
			pod:         pt.MakePod("p", "team-b").GPUFraction("0.25").Obj(),
			wantDevices: []int32{1},
		},
		"a slice over two devices needs both free of other namespaces": {
			node:        mpsH100s("n1", 3),
			existing:    []*corev1.Pod{heldIn("team-a", "a", "n1", "0.25", 1)},
			pod:         pt.MakePod("p", "team-b").GPUFraction("0.5").GPUCount(2).Obj(),
			wantDevices: []int32{0, 2},
		},
		"off mps nodes namespaces share devices": {
			node:        h100s("n1", 1),
			existing:    []*corev1.Pod{heldIn("team-a", "a", "n1", "0.25", 0)},
			pod:         pt.MakePod("p", "team-b").GPUFraction("0.25").Obj(),
			wantDevices: []int32{0},
		},
		"two namespaces bound before the switch to mps close the device to both": {
			node:     mpsH100s("n1", 1),
			existing: []*corev1.Pod{heldIn("team-a", "a", "n1", "0.25", 0), heldIn("team-b", "b", "n1", "0.25", 0)},
			pod:      pt.MakePod("p", "team-a").GPUFraction("0.25").Obj(),
			wantMsg:  "node n1: no GPU with room for the pod's namespace; pod needs 0.25 (container main); 1 GPU with room serves MPS clients of another namespace (one namespace per GPU in mps mode)",
		},
		"whole GPUs are unaffected": {
			node:        mpsH100s("n1", 2),
			existing:    []*corev1.Pod{heldIn("team-a", "a", "n1", "0.25", 0)},
			pod:         pt.MakePod("p", "team-b").GPUCount(1).Obj(),
			wantDevices: []int32{1},
		},
		"a full device of another namespace is just full": {
			node:     mpsH100s("n1", 1),
			existing: []*corev1.Pod{heldIn("team-a", "a", "n1", "0.75", 0)},
			pod:      pt.MakePod("p", "team-b").GPUFraction("0.5").Obj(),
			wantMsg:  "node n1: no healthy GPU with room; pod needs 0.5 (container main)",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := ledgerWith([]*v1alpha1.GPUNode{tc.node}, tc.existing)
			req := parse(t, tc.pod)
			fitErr := l.Fit("n1", req)
			a, err := l.Choose("n1", req, "")
			if (fitErr == nil) != (err == nil) {
				t.Fatalf("Fit says %v but Choose %v", fitErr, err)
			}
			if tc.wantDevices == nil {
				if err == nil {
					t.Fatalf("Choose = %+v, want an error", a)
				}
				if !gpu.IsInsufficient(err) {
					t.Errorf("Choose error %v is not an InsufficientError", err)
				}
				if diff := cmp.Diff(tc.wantMsg, err.Error()); diff != "" {
					t.Errorf("Choose error (-want +got):\n%s", diff)
				}
				if s := l.Score("n1", req, ""); s != 0 {
					t.Errorf("Score = %d on a node the pod does not fit", s)
				}
				return
			}
			if err != nil {
				t.Fatalf("Choose: %v", err)
			}
			if diff := cmp.Diff(tc.wantDevices, a.Containers[0].DeviceIndexes); diff != "" {
				t.Errorf("devices (-want +got):\n%s", diff)
			}
			a.UID = "new"
			if err := l.Assume(a); err != nil {
				t.Fatalf("Assume: %v", err)
			}
			if errs := l.CheckInvariants(); len(errs) > 0 {
				t.Errorf("invariants: %v", errs)
			}
		})
	}
}

func TestMPSDeviceOpensWhenItsNamespaceLeaves(t *testing.T) {
	a1, a2 := heldIn("team-a", "a1", "n1", "0.25", 0), heldIn("team-a", "a2", "n1", "0.25", 0)
	l := ledgerWith([]*v1alpha1.GPUNode{mpsH100s("n1", 1)}, []*corev1.Pod{a1, a2})
	req := parse(t, pt.MakePod("p", "team-b").GPUFraction("0.25").Obj())
	if err := l.Fit("n1", req); err == nil {
		t.Fatal("Fit of team-b next to team-a's slices: nil error")
	}
	l.DeletePod(a1.UID)
	if err := l.Fit("n1", req); err == nil {
		t.Fatal("Fit of team-b with one of team-a's slices left: nil error")
	}
	l.DeletePod(a2.UID)
	if err := l.Fit("n1", req); err != nil {
		t.Fatalf("Fit on the emptied device: %v", err)
	}
	if errs := l.CheckInvariants(); len(errs) > 0 {
		t.Errorf("invariants: %v", errs)
	}
}

func TestMPSSwitchClosesSharedDevices(t *testing.T) {
	node := h100s("n1", 1)
	l := ledgerWith([]*v1alpha1.GPUNode{node}, []*corev1.Pod{heldIn("team-a", "a", "n1", "0.25", 0)})
	req := parse(t, pt.MakePod("p", "team-b").GPUFraction("0.25").Obj())
	if err := l.Fit("n1", req); err != nil {
		t.Fatalf("Fit on time-slicing: %v", err)
	}
	mps := node.DeepCopy()
	mps.Spec.Isolation = v1alpha1.IsolationMPS
	l.UpsertNode(mps)
	if err := l.Fit("n1", req); err == nil {
		t.Fatal("Fit after the switch to mps: nil error")
	}
}

func TestAssumeRefusesAnotherNamespacesMPSDevice(t *testing.T) {
	l := ledgerWith([]*v1alpha1.GPUNode{mpsH100s("n1", 1)}, []*corev1.Pod{heldIn("team-a", "a", "n1", "0.25", 0)})
	a := &gpu.PodAllocation{Namespace: "team-b", Name: "p", UID: "p", Node: "n1", Containers: []gpu.ContainerAllocation{{
		Container: "main", DeviceUUIDs: []string{pt.DeviceUUID("n1", 0)}, Milli: 250,
	}}}
	err := l.Assume(a)
	var ie *gpu.InsufficientError
	if !errors.As(err, &ie) || ie.OtherTenantDevices != 1 {
		t.Fatalf("Assume = %v, want an InsufficientError naming another namespace", err)
	}
	s := l.Snapshot()
	if err := s.Assume(a); err == nil {
		t.Fatal("Snapshot.Assume: nil error")
	}
}

func TestGangAvoidsOtherNamespacesMPSDevices(t *testing.T) {
	l := ledgerWith([]*v1alpha1.GPUNode{mpsH100s("n1", 2), mpsH100s("n2", 2)}, []*corev1.Pod{
		heldIn("team-a", "a", "n1", "0.25", 0), heldIn("team-a", "b", "n1", "0.25", 1), heldIn("team-a", "c", "n2", "0.25", 0),
	})
	var reqs []*gpu.PodRequest
	for _, name := range []string{"m0", "m1"} {
		reqs = append(reqs, parse(t, pt.MakePod(name, "team-b").UID(types.UID(name)).GPUFraction("0.5").Obj()))
	}
	allocs, err := l.Snapshot().PlaceGang(reqs, []string{"n1", "n2"}, "")
	if err != nil {
		t.Fatalf("PlaceGang: %v", err)
	}
	for _, a := range allocs {
		if got := a.Node + "/" + a.Containers[0].DeviceUUIDs[0]; got != "n2/"+pt.DeviceUUID("n2", 1) {
			t.Errorf("%s placed on %s, want n2's device 1, the only one without team-a", a.Name, got)
		}
	}
	reqs = append(reqs, parse(t, pt.MakePod("m2", "team-b").UID("m2").GPUFraction("0.5").Obj()))
	if _, err := l.Snapshot().PlaceGang(reqs, []string{"n1", "n2"}, ""); err == nil {
		t.Fatal("PlaceGang of three halves with one device open: nil error")
	}
}
