package extender

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestPrioritize(t *testing.T) {
	// n1 has a half used, n2 is empty, n3 is full.
	nodes := []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 2).Obj(), pt.H100Node("n3", 1).Obj()}
	held := []*corev1.Pod{
		pt.Bound(pt.FractionPod("a", "0.5", "500"), "n1", 0),
		pt.Bound(pt.WholePod("b", 1, "1000"), "n3", 0),
	}
	half := pt.FractionPod("p", "0.5", "500")
	all := names("n1", "n2", "n3", "cpu-only")
	cases := map[string]struct {
		placement gpu.Placement
		pod       *corev1.Pod
		models    ModelLocator
		want      extenderv1.HostPriorityList
	}{
		// n2 holds the model: it outscores the better packed n1; n3 does
		// not fit, whatever it holds.
		"a model's replica goes where its weights are": {
			pod:    half.Clone().Annotation(v1alpha1.AnnotationModel, "llama").Obj(),
			models: heldModels{"llama": {"n2": 1, "n3": 1}},
			want:   extenderv1.HostPriorityList{{Host: "n1", Score: 5}, {Host: "n2", Score: 7}, {Host: "n3"}, {Host: "cpu-only"}},
		},
		"a model held nowhere leaves packing to decide": {
			pod:    half.Clone().Annotation(v1alpha1.AnnotationModel, "llama").Obj(),
			models: heldModels{},
			want:   extenderv1.HostPriorityList{{Host: "n1", Score: 5}, {Host: "n2", Score: 2}, {Host: "n3"}, {Host: "cpu-only"}},
		},
		"binpack prefers the partly used device": {
			pod:  half.Obj(),
			want: extenderv1.HostPriorityList{{Host: "n1", Score: 9}, {Host: "n2", Score: 4}, {Host: "n3"}, {Host: "cpu-only"}},
		},
		"spread prefers the empty node": {
			placement: gpu.PlacementSpread,
			pod:       half.Obj(),
			want:      extenderv1.HostPriorityList{{Host: "n1", Score: 5}, {Host: "n2", Score: 6}, {Host: "n3"}, {Host: "cpu-only"}},
		},
		"the pod's own placement wins": {
			pod:  half.Clone().Placement(string(gpu.PlacementSpread)).Obj(),
			want: extenderv1.HostPriorityList{{Host: "n1", Score: 5}, {Host: "n2", Score: 6}, {Host: "n3"}, {Host: "cpu-only"}},
		},
		"a whole GPU goes where no device is partly used": {
			pod:  pt.WholePod("p", 1, "1000").Obj(),
			want: extenderv1.HostPriorityList{{Host: "n1", Score: 8}, {Host: "n2", Score: 9}, {Host: "n3"}, {Host: "cpu-only"}},
		},
		"a pinned pod scores only its node": {
			pod:  half.Clone().Annotation(v1alpha1.AnnotationNode, "n2").Obj(),
			want: extenderv1.HostPriorityList{{Host: "n1"}, {Host: "n2", Score: 10}, {Host: "n3"}, {Host: "cpu-only"}},
		},
		"a pod without GPUs scores nothing": {
			pod:  pt.MakePod("p", "ns").Obj(),
			want: extenderv1.HostPriorityList{{Host: "n1"}, {Host: "n2"}, {Host: "n3"}, {Host: "cpu-only"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := pt.Ledger(nodes, held...)
			opts := []Option{}
			if tc.placement != "" {
				opts = append(opts, WithPlacement(tc.placement))
			}
			if tc.models != nil {
				opts = append(opts, WithModels(tc.models))
			}
			for _, parallel := range []int{1 << 20, 1} {
				e := New(l, fakeClient(), &fakeBinder{}, append(opts, WithParallelNodes(parallel))...)
				got, err := e.Prioritize(pt.Context(t), &extenderv1.ExtenderArgs{Pod: tc.pod, NodeNames: all})
				if err != nil {
					t.Fatalf("Prioritize: %v", err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("Prioritize (parallel from %d nodes) (-want,+got):\n%s", parallel, diff)
				}
			}
		})
	}
}

// heldModels is a ModelLocator: model -> node -> share held.
type heldModels map[string]map[string]float64

func (h heldModels) Held(_ context.Context, _ string, models []string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range models {
		for n, v := range h[m] {
			out[n] += v / float64(len(models))
		}
	}
	return out
}
