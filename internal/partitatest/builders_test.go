package partitatest_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestMakePod(t *testing.T) {
	cases := map[string]struct {
		pod             *corev1.Pod
		wantContainers  []string
		wantAnnotations map[string]string
		wantLabels      map[string]string
		wantLimits      map[string]corev1.ResourceList
	}{
		"a default container": {
			pod:             pt.MakePod("p", "ns").GPUMemory("20Gi").GPUCount(2).Queue("team-a").Obj(),
			wantContainers:  []string{"main"},
			wantAnnotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCount: "2"},
			wantLabels:      map[string]string{v1alpha1.LabelQueue: "team-a"},
			wantLimits:      map[string]corev1.ResourceList{"main": nil},
		},
		"resources on named and last containers": {
			pod: pt.MakePod("p", "ns").Container("a").Container("b").
				Resource("a", "nvidia.com/gpu", "1").Resource("", "nvidia.com/gpumem", "3000").PodGroup("g").Obj(),
			wantContainers: []string{"a", "b"},
			wantLabels:     map[string]string{v1alpha1.LabelPodGroup: "g"},
			wantLimits: map[string]corev1.ResourceList{
				"a": {"nvidia.com/gpu": resource.MustParse("1")},
				"b": {"nvidia.com/gpumem": resource.MustParse("3000")},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var names []string
			limits := map[string]corev1.ResourceList{}
			for _, c := range tc.pod.Spec.Containers {
				names = append(names, c.Name)
				limits[c.Name] = c.Resources.Limits
			}
			if diff := cmp.Diff(tc.wantContainers, names); diff != "" {
				t.Errorf("containers (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAnnotations, tc.pod.Annotations); diff != "" {
				t.Errorf("annotations (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLabels, tc.pod.Labels); diff != "" {
				t.Errorf("labels (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLimits, limits); diff != "" {
				t.Errorf("limits (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestMakeGPUNode(t *testing.T) {
	got := pt.MakeGPUNode("n1").Devices(2, "H100", 81920).UnhealthyDevice(1).Isolation(v1alpha1.IsolationMPS).Obj()
	want := v1alpha1.GPUNodeStatus{
		Devices: []v1alpha1.GPUDevice{
			{Index: 0, UUID: "GPU-n1-0", Product: "H100", MemoryMiB: 81920, MIGMode: v1alpha1.MIGDisabled, Health: v1alpha1.DeviceHealthy},
			{Index: 1, UUID: "GPU-n1-1", Product: "H100", MemoryMiB: 81920, MIGMode: v1alpha1.MIGDisabled, Health: v1alpha1.DeviceUnhealthy, HealthReason: "XID 79 (test)"},
		},
		Isolation:      v1alpha1.IsolationMPS,
		DeviceCount:    2,
		HealthyDevices: 1,
	}
	if diff := cmp.Diff(want, got.Status); diff != "" {
		t.Errorf("GPUNode status (-want,+got):\n%s", diff)
	}
}

func TestMakeQueueAndPodGroup(t *testing.T) {
	q := pt.MakeQueue("team-a").Parent("research").Priority(50).GPU("4", "-1", 2).Namespaces("a", "b").Obj()
	if q.Spec.Parent != "research" || *q.Spec.Priority != 50 || q.Spec.Resources.GPU.Limit.String() != "-1" ||
		*q.Spec.Resources.GPU.OverQuotaWeight != 2 || len(q.Spec.Namespaces) != 2 {
		t.Errorf("MakeQueue built %+v", q.Spec)
	}
	g := pt.MakePodGroup("g", "ns").MinMember(8).Queue("team-a").Obj()
	if diff := cmp.Diff(v1alpha1.PodGroupSpec{MinMember: 8, Queue: "team-a"}, g.Spec); diff != "" {
		t.Errorf("MakePodGroup spec (-want,+got):\n%s", diff)
	}
}

func TestMakeTopology(t *testing.T) {
	got := pt.MakeTopology("gb200", "example.com/block").Level("example.com/rack", "kubernetes.io/hostname").Obj()
	want := v1alpha1.TopologySpec{Levels: []v1alpha1.TopologyLevel{{NodeLabel: "example.com/block"}, {NodeLabel: "example.com/rack"}, {NodeLabel: "kubernetes.io/hostname"}}}
	if diff := cmp.Diff(want, got.Spec); diff != "" || got.Name != "gb200" {
		t.Errorf("MakeTopology %q spec (-want,+got):\n%s", got.Name, diff)
	}
}

func TestQueueUsageStatus(t *testing.T) {
	gpu := func(v string) corev1.ResourceList {
		return corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse(v)}
	}
	cases := map[string]struct {
		queue *v1alpha1.Queue
		want  *v1alpha1.QueueUsage
	}{
		"the extender's default window": {
			queue: pt.MakeQueue("team-a").UsageStatus("410", "0.3", "").Obj(),
			want: &v1alpha1.QueueUsage{Hours: gpu("410"), Share: gpu("0.3"),
				HalfLife: metav1.Duration{Duration: 24 * time.Hour}, Window: metav1.Duration{Duration: 168 * time.Hour}, WindowType: v1alpha1.UsageWindowSliding},
		},
		"another window, before or after": {
			queue: pt.MakeQueue("team-a").UsageWindow(v1alpha1.UsageWindowTumbling, 24*time.Hour, time.Hour).UsageStatus("", "", "5").Obj(),
			want: &v1alpha1.QueueUsage{FairShareWithoutUsage: gpu("5"),
				HalfLife: metav1.Duration{Duration: time.Hour}, Window: metav1.Duration{Duration: 24 * time.Hour}, WindowType: v1alpha1.UsageWindowTumbling},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.queue.Status.Usage); diff != "" {
				t.Errorf("status.usage (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestMakeTopologyAndSubGroups(t *testing.T) {
	topo := pt.MakeTopology("dc-1", "network.example.com/block", "kubernetes.io/hostname")
	if diff := cmp.Diff(v1alpha1.TopologySpec{Levels: []v1alpha1.TopologyLevel{{NodeLabel: "network.example.com/block"}, {NodeLabel: "kubernetes.io/hostname"}}}, topo.Spec); diff != "" {
		t.Errorf("MakeTopology spec (-want,+got):\n%s", diff)
	}
	g := pt.MakePodGroup("g", "ns").MinMember(4).Annotation(v1alpha1.AnnotationTopology, "dc-1").SubGroup("r0", 2, "kubernetes.io/hostname", "").Obj()
	want := v1alpha1.PodGroupSpec{MinMember: 4, SubGroups: []v1alpha1.SubGroup{{Name: "r0", MinMember: 2, TopologyRequired: "kubernetes.io/hostname"}}}
	if diff := cmp.Diff(want, g.Spec); diff != "" || g.Annotations[v1alpha1.AnnotationTopology] != "dc-1" {
		t.Errorf("MakePodGroup spec (-want,+got):\n%s\nannotations %v", diff, g.Annotations)
	}
}
