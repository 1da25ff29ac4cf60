package extender

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func metaVictimsOf(uids ...string) *extenderv1.MetaVictims {
	mv := &extenderv1.MetaVictims{Pods: []*extenderv1.MetaPod{}}
	for _, u := range uids {
		mv.Pods = append(mv.Pods, &extenderv1.MetaPod{UID: u})
	}
	return mv
}

func TestPreempt(t *testing.T) {
	// n1: GPU 0 held whole by w, GPU 1 by halves h1 and h2. n2: GPU 0 held
	// whole by g, a gang member.
	w := pt.Bound(pt.WholePod("w", 1, "1000"), "n1", 0)
	h1 := pt.Bound(pt.FractionPod("h1", "0.5", "500"), "n1", 1)
	h2 := pt.Bound(pt.FractionPod("h2", "0.5", "500"), "n1", 1)
	g := pt.Bound(pt.WholePod("g", 1, "1000").PodGroup("train"), "n2", 0)
	cpuGang := pt.MakePod("launcher", "ns").Label(v1alpha1.LabelPodGroup, "train").Node("n2").Obj()
	// n3: GPU 0 held whole by m, a single pod the admission loop admitted.
	m := pt.Bound(pt.WholePod("m", 1, "1000").Annotation(v1alpha1.AnnotationAdmitted, "2026-12-01T00:00:00.000Z"), "n3", 0)
	nodes := []*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 1).Obj(), pt.H100Node("n3", 1).Obj()}
	whole := pt.WholePod("p", 1, "1000")
	cases := map[string]struct {
		pod  *corev1.Pod
		args func(*corev1.Pod) *extenderv1.ExtenderPreemptionArgs
		want map[string]*extenderv1.MetaVictims
	}{
		"evicting the whole GPU frees a device": {
			pod: whole.Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("uid-ns-w")}}
			},
			want: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("uid-ns-w")},
		},
		"evicting one half frees no whole device": {
			pod: whole.Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("uid-ns-h1")}}
			},
			want: map[string]*extenderv1.MetaVictims{},
		},
		"evicting both halves frees their device": {
			pod: whole.Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("uid-ns-h1", "uid-ns-h2")}}
			},
			want: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("uid-ns-h1", "uid-ns-h2")},
		},
		"a gang is never evicted in part": {
			pod: whole.Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
					"n1": metaVictimsOf("uid-ns-w"), "n2": metaVictimsOf("uid-ns-g")}}
			},
			want: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("uid-ns-w")},
		},
		"nor through a member without GPUs": {
			pod: whole.Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
					"n2": metaVictimsOf("uid-ns-launcher")}}
			},
			want: map[string]*extenderv1.MetaVictims{},
		},
		"whole victims in, victims by UID out": {
			pod: whole.Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToVictims: map[string]*extenderv1.Victims{
					"n1": {Pods: []*corev1.Pod{h1, h2}, NumPDBViolations: 1}}}
			},
			want: map[string]*extenderv1.MetaVictims{"n1": {Pods: []*extenderv1.MetaPod{{UID: "uid-ns-h1"}, {UID: "uid-ns-h2"}}, NumPDBViolations: 1}},
		},
		"a pinned pod preempts on its node only": {
			pod: whole.Clone().Annotation(v1alpha1.AnnotationNode, "n2").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("uid-ns-w")}}
			},
			want: map[string]*extenderv1.MetaVictims{},
		},
		"a pod the admission loop admitted gets no victims": {
			pod: whole.Clone().Annotation(v1alpha1.AnnotationAdmitted, "2026-12-01T00:00:00.000Z").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("uid-ns-w")}}
			},
			want: map[string]*extenderv1.MetaVictims{},
		},
		"a pod the admission loop admitted is never a victim": {
			pod: whole.Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{
					"n1": metaVictimsOf("uid-ns-w"), "n3": metaVictimsOf("uid-ns-m")}}
			},
			want: map[string]*extenderv1.MetaVictims{"n1": metaVictimsOf("uid-ns-w")},
		},
		"a pod without GPUs is not the extender's to judge": {
			pod: pt.MakePod("p", "ns").Obj(),
			args: func(p *corev1.Pod) *extenderv1.ExtenderPreemptionArgs {
				return &extenderv1.ExtenderPreemptionArgs{Pod: p, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"n2": metaVictimsOf("uid-ns-g")}}
			},
			want: map[string]*extenderv1.MetaVictims{"n2": metaVictimsOf("uid-ns-g")},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l := pt.Ledger(nodes, w, h1, h2, g, m)
			e := New(l, fakeClient(w, h1, h2, g, cpuGang, m), &fakeBinder{})
			got, err := e.Preempt(pt.Context(t), tc.args(tc.pod))
			if err != nil {
				t.Fatalf("Preempt: %v", err)
			}
			if diff := cmp.Diff(tc.want, got.NodeNameToMetaVictims); diff != "" {
				t.Errorf("Preempt (-want,+got):\n%s", diff)
			}
			// Preempt simulates on a snapshot: the ledger is untouched.
			if got := len(l.State().Pods); got != 5 {
				t.Errorf("ledger holds %d pods after Preempt, want 5", got)
			}
		})
	}
	t.Run("no pod is a bad request", func(t *testing.T) {
		e := New(pt.Ledger(nodes), fakeClient(), &fakeBinder{})
		if _, err := e.Preempt(pt.Context(t), &extenderv1.ExtenderPreemptionArgs{}); !IsRequestError(err) {
			t.Errorf("Preempt error = %v, want a RequestError", err)
		}
	})
}
