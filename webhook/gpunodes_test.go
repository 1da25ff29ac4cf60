package webhook

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/partitatest"
)

func TestGPUNodeView(t *testing.T) {
	cases := map[string]struct {
		nodes   []*v1alpha1.GPUNode
		deleted []string
		pinned  []v1alpha1.IsolationMode
		want    StaticView
	}{
		"no node: the fallback": {
			want: StaticView{MemoryMiB: 40960, Modes: []v1alpha1.IsolationMode{v1alpha1.IsolationTimeSlicing}},
		},
		"largest healthy device and every mode": {
			nodes: []*v1alpha1.GPUNode{
				partitatest.MakeGPUNode("a").Devices(2, "A100", 40960).Obj(),
				partitatest.MakeGPUNode("b").Device(0, "H100", 81559).Isolation(v1alpha1.IsolationMPS).Obj(),
				partitatest.MakeGPUNode("c").Device(0, "H200", 143771).UnhealthyDevice(0).Isolation(v1alpha1.IsolationHAMiCore).Obj(),
			},
			want: StaticView{MemoryMiB: 81559, Modes: []v1alpha1.IsolationMode{v1alpha1.IsolationHAMiCore, v1alpha1.IsolationMPS, v1alpha1.IsolationTimeSlicing}},
		},
		"a deleted node no longer counts": {
			nodes: []*v1alpha1.GPUNode{
				partitatest.MakeGPUNode("a").Devices(2, "A100", 40960).Obj(),
				partitatest.MakeGPUNode("b").Device(0, "H100", 81559).Isolation(v1alpha1.IsolationMPS).Obj(),
			},
			deleted: []string{"b", "never-seen"},
			want:    StaticView{MemoryMiB: 40960, Modes: []v1alpha1.IsolationMode{v1alpha1.IsolationTimeSlicing}},
		},
		"pinned modes win": {
			nodes:  []*v1alpha1.GPUNode{partitatest.MakeGPUNode("b").Device(0, "H100", 81559).Isolation(v1alpha1.IsolationMPS).Obj()},
			pinned: []v1alpha1.IsolationMode{v1alpha1.IsolationHAMiCore},
			want:   StaticView{MemoryMiB: 81559, Modes: []v1alpha1.IsolationMode{v1alpha1.IsolationHAMiCore}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := NewGPUNodeView(40960, tc.pinned)
			for _, n := range tc.nodes {
				v.Set(n)
				v.Set(n) // idempotent
			}
			for _, n := range tc.deleted {
				v.Delete(n)
			}
			got := StaticView{MemoryMiB: v.ReferenceDeviceMemoryMiB(), Modes: v.IsolationModes()}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("view (-want,+got):\n%s", diff)
			}
		})
	}
}
