package extender

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func names(n ...string) *[]string {
	if n == nil {
		n = []string{}
	}
	return &n
}

func TestFilter(t *testing.T) {
	sixTenths := pt.FractionPod("six", "0.6", "600")
	n1Full := []*corev1.Pod{
		pt.Bound(pt.FractionPod("a", "0.6", "600"), "n1", 0),
		pt.Bound(pt.FractionPod("b", "0.6", "600"), "n1", 1),
	}
	cases := map[string]struct {
		nodes   []*v1alpha1.GPUNode
		held    []*corev1.Pod
		reserve *gpu.PodAllocation
		pod     *corev1.Pod
		args    func(*corev1.Pod) *extenderv1.ExtenderArgs
		want    *extenderv1.ExtenderFilterResult
	}{
		"a half fits an empty node": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()},
			pod:   pt.FractionPod("p", "0.5", "500").Obj(),
			want: &extenderv1.ExtenderFilterResult{NodeNames: names("n1"),
				FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}},
		},
		"a third 0.6 names the largest free slice": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()},
			held:  n1Full,
			pod:   sixTenths.Obj(),
			want: &extenderv1.ExtenderFilterResult{NodeNames: names(),
				FailedNodes:                extenderv1.FailedNodesMap{"n1": "largest free slice 0.4 on GPU 0; pod needs 0.6 (container main)"},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}},
		},
		"more GPUs than the node has can never fit": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()},
			pod:   pt.WholePod("p", 3, "3000").Obj(),
			want: &extenderv1.ExtenderFilterResult{NodeNames: names(),
				FailedNodes:                extenderv1.FailedNodesMap{},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{"n1": "2 GPUs free; pod needs 3 whole GPUs (container main); it can never fit this node"}},
		},
		"unhealthy devices never count": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).UnhealthyDevice(0).Obj()},
			held:  n1Full[1:],
			pod:   pt.FractionPod("p", "0.5", "500").Obj(),
			want: &extenderv1.ExtenderFilterResult{NodeNames: names(),
				FailedNodes:                extenderv1.FailedNodesMap{"n1": "largest free slice 0.4 on GPU 1; pod needs 0.5 (container main)"},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}},
		},
		"a node whose GPUs another DRA driver publishes is never offered": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 2).DRADriver("gpu.nvidia.com", 0, 1).Obj()},
			pod:   pt.FractionPod("p", "0.5", "500").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderArgs {
				return &extenderv1.ExtenderArgs{Pod: p, NodeNames: names("n1", "n2")}
			},
			want: &extenderv1.ExtenderFilterResult{NodeNames: names("n1"),
				FailedNodes: extenderv1.FailedNodesMap{},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{
					"n2": "GPUs managed by DRA driver gpu.nvidia.com; Partita offers no partita.dev/gpu-milli there (ask for them with a ResourceClaim of that driver's DeviceClass)"}},
		},
		"a node without GPUNode has no inventory": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()},
			pod:   pt.FractionPod("p", "0.5", "500").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderArgs {
				return &extenderv1.ExtenderArgs{Pod: p, NodeNames: names("n1", "cpu-only")}
			},
			want: &extenderv1.ExtenderFilterResult{NodeNames: names("n1"),
				FailedNodes: extenderv1.FailedNodesMap{},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{
					"cpu-only": "no GPU inventory: the node has no GPUNode (is Partita's agent running there?)"}},
		},
		"an invalid request fits nowhere": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()},
			pod:   pt.MakePod("p", "ns").GPUFraction("1.5").Obj(),
			want: &extenderv1.ExtenderFilterResult{NodeNames: names(),
				FailedNodes: extenderv1.FailedNodesMap{},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{
					"n1": `invalid GPU request: metadata.annotations[partita.dev/gpu-fraction]: Invalid value: "1.5": must be a decimal in (0, 1]; ask for whole GPUs with partita.dev/gpu-count`}},
		},
		"a pod without GPUs passes everywhere": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()},
			held:  n1Full,
			pod:   pt.MakePod("p", "ns").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderArgs {
				return &extenderv1.ExtenderArgs{Pod: p, NodeNames: names("n1", "cpu-only")}
			},
			want: &extenderv1.ExtenderFilterResult{NodeNames: names("n1", "cpu-only"),
				FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}},
		},
		// kube-scheduler schedules it there: the other nodes' reasons would
		// be dropped unread.
		"a pod pinned by partita.dev/node stays there": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 2).Obj()},
			pod:   pt.FractionPod("p", "0.5", "500").Annotation(v1alpha1.AnnotationNode, "n2").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderArgs {
				return &extenderv1.ExtenderArgs{Pod: p, NodeNames: names("n1", "n2")}
			},
			want: &extenderv1.ExtenderFilterResult{NodeNames: names("n2"),
				FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}},
		},
		"a pinned pod whose node is no candidate is told why on each": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 2).Obj(), pt.H100Node("n3", 2).Obj()},
			pod:   pt.FractionPod("p", "0.5", "500").Annotation(v1alpha1.AnnotationNode, "n2").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderArgs {
				return &extenderv1.ExtenderArgs{Pod: p, NodeNames: names("n1", "n3")}
			},
			want: &extenderv1.ExtenderFilterResult{NodeNames: names(), FailedNodes: extenderv1.FailedNodesMap{},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{
					"n1": "the pod's GPUs are reserved on node n2", "n3": "the pod's GPUs are reserved on node n2"}},
		},
		"a pinned pod whose node is full is told why on each": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 1).Obj()},
			held:  []*corev1.Pod{pt.Bound(pt.WholePod("other", 1, "1000"), "n2", 0)},
			pod:   pt.FractionPod("p", "0.5", "500").Annotation(v1alpha1.AnnotationNode, "n2").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderArgs {
				return &extenderv1.ExtenderArgs{Pod: p, NodeNames: names("n1", "n2")}
			},
			want: &extenderv1.ExtenderFilterResult{NodeNames: names(),
				FailedNodes:                extenderv1.FailedNodesMap{"n2": "no healthy GPU with room; pod needs 0.5 (container main)"},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{"n1": "the pod's GPUs are reserved on node n2"}},
		},
		"a reservation holds on a full node": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 1).Obj()},
			reserve: &gpu.PodAllocation{Namespace: "ns", Name: "p", UID: "uid-ns-p", Node: "n2", Containers: []gpu.ContainerAllocation{
				{Container: "main", DeviceUUIDs: []string{pt.DeviceUUID("n2", 0)}, DeviceIndexes: []int32{0}, Milli: 1000}}},
			pod: pt.WholePod("p", 1, "1000").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderArgs {
				return &extenderv1.ExtenderArgs{Pod: p, NodeNames: names("n1", "n2")}
			},
			want: &extenderv1.ExtenderFilterResult{NodeNames: names("n2"),
				FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}},
		},
		"whole nodes in, whole nodes out": {
			nodes: []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 2).Obj()},
			held:  n1Full,
			pod:   sixTenths.Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderArgs {
				return &extenderv1.ExtenderArgs{Pod: p, Nodes: &corev1.NodeList{Items: []corev1.Node{
					{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, {ObjectMeta: metav1.ObjectMeta{Name: "n2"}}}}}
			},
			want: &extenderv1.ExtenderFilterResult{
				Nodes:                      &corev1.NodeList{Items: []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n2"}}}},
				FailedNodes:                extenderv1.FailedNodesMap{"n1": "largest free slice 0.4 on GPU 0; pod needs 0.6 (container main)"},
				FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := pt.Ledger(tc.nodes, tc.held...)
			if tc.reserve != nil {
				if err := l.Assume(tc.reserve); err != nil {
					t.Fatal(err)
				}
			}
			args := &extenderv1.ExtenderArgs{Pod: tc.pod, NodeNames: names("n1")}
			if tc.args != nil {
				args = tc.args(tc.pod)
			}
			for _, parallel := range []int{1 << 20, 1} {
				e := New(l, fakeClient(), &fakeBinder{}, WithParallelNodes(parallel))
				got, err := e.Filter(pt.Context(t), args)
				if err != nil {
					t.Fatalf("Filter: %v", err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("Filter (parallel from %d nodes) (-want,+got):\n%s", parallel, diff)
				}
			}
		})
	}
}

func TestFilterRefuses(t *testing.T) {
	l := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()})
	pod := pt.FractionPod("p", "0.5", "500").Obj()
	cases := map[string]struct {
		synced  bool
		args    *extenderv1.ExtenderArgs
		wantErr func(error) bool
	}{
		"no arguments":     {synced: true, wantErr: IsRequestError},
		"no pod":           {synced: true, args: &extenderv1.ExtenderArgs{NodeNames: names("n1")}, wantErr: IsRequestError},
		"no nodes":         {synced: true, args: &extenderv1.ExtenderArgs{Pod: pod}, wantErr: IsRequestError},
		"ledger not ready": {args: &extenderv1.ExtenderArgs{Pod: pod, NodeNames: names("n1")}, wantErr: func(err error) bool { return errors.Is(err, ErrNotSynced) }},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := New(l, fakeClient(), &fakeBinder{}, WithSynced(func() bool { return tc.synced }))
			_, err := e.Filter(pt.Context(t), tc.args)
			if !tc.wantErr(err) {
				t.Errorf("Filter error = %v", err)
			}
			_, err = e.Prioritize(pt.Context(t), tc.args)
			if !tc.wantErr(err) {
				t.Errorf("Prioritize error = %v", err)
			}
		})
	}
}
