package report

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// TestWhyWaitsForAModel: a pod bound to a node waits for its node's copy
// of its model; why says how far it is, or why it failed.
func TestWhyWaitsForAModel(t *testing.T) {
	model := func(nodes ...v1alpha1.ModelNodeStatus) v1alpha1.Model {
		return v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "llama"}, Status: v1alpha1.ModelStatus{Nodes: nodes}}
	}
	gpuPod := pt.MakePod("serve", "team-a").GPUFraction("0.25").BoundTo("n1", 0).Annotation(v1alpha1.AnnotationModel, "llama").Obj()
	cpuPod := pt.MakePod("convert", "team-a").Annotation(v1alpha1.AnnotationModel, "llama").Obj()
	cpuPod.Spec.NodeName = "n1"
	cases := map[string]struct {
		pod         *corev1.Pod
		model       v1alpha1.Model
		wantSummary string
		wantModels  []Finding
		wantWaiting bool
	}{
		"fetching on its node": {
			pod: gpuPod,
			model: model(v1alpha1.ModelNodeStatus{Name: "n1", Phase: v1alpha1.ModelFetching, Bytes: 34, Total: 100,
				Message: "waiting for model llama on n1: 34% (5.5 GB of 16.1 GB) at 1.2 GB/s"}),
			wantSummary: "pod team-a/serve waits: waiting for model llama on n1: 34% (5.5 GB of 16.1 GB) at 1.2 GB/s",
			wantModels: []Finding{{Check: CheckModels, Status: StatusBlocking, Message: "waiting for model llama on n1: 34% (5.5 GB of 16.1 GB) at 1.2 GB/s",
				Numbers: map[string]float64{"bytes": 34, "total": 100}}},
			wantWaiting: true,
		},
		"failed there": {
			pod:         gpuPod,
			model:       model(v1alpha1.ModelNodeStatus{Name: "n1", Phase: v1alpha1.ModelFailed, Message: "access denied"}),
			wantSummary: "pod team-a/serve waits: model llama failed on n1: access denied",
			wantModels:  []Finding{{Check: CheckModels, Status: StatusBlocking, Message: "model llama failed on n1: access denied"}},
			wantWaiting: true,
		},
		"on its node, a pod without GPUs": {
			pod:         cpuPod,
			model:       model(v1alpha1.ModelNodeStatus{Name: "n1", Phase: v1alpha1.ModelReady}, v1alpha1.ModelNodeStatus{Name: "n2", Phase: v1alpha1.ModelFailed}),
			wantSummary: "pod team-a/convert is not waiting: it is bound to n1 (phase Pending)",
			wantModels:  []Finding{{Check: CheckModels, Status: StatusOK, Message: "model llama is on n1"}},
		},
		"not yet asked for there": {
			pod:         cpuPod,
			model:       model(),
			wantSummary: "pod team-a/convert waits: waiting for model llama on n1: its cache has not started fetching it (it does when the kubelet mounts the pod's volume)",
			wantModels: []Finding{{Check: CheckModels, Status: StatusBlocking,
				Message: "waiting for model llama on n1: its cache has not started fetching it (it does when the kubelet mounts the pod's volume)"}},
			wantWaiting: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := twoNodes()
			c.Pods = append(c.Pods, *tc.pod)
			c.Models = []v1alpha1.Model{tc.model}
			r, err := Why(c, "team-a", tc.pod.Name, now)
			if err != nil {
				t.Fatal(err)
			}
			if r.Summary != tc.wantSummary || r.Waiting != tc.wantWaiting {
				t.Errorf("summary %q (waiting %v), want %q (%v)", r.Summary, r.Waiting, tc.wantSummary, tc.wantWaiting)
			}
			var got []Finding
			for _, f := range r.Findings {
				if f.Check == CheckModels {
					got = append(got, f)
				}
			}
			if diff := cmp.Diff(tc.wantModels, got); diff != "" {
				t.Errorf("model findings (-want,+got):\n%s", diff)
			}
		})
	}
}
