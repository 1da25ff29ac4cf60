package ctl

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/report"

	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"

	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestNodesTable(t *testing.T) {
	h100 := func(name string, n int) *pt.GPUNodeWrapper {
		return pt.MakeGPUNode(name).Devices(n, "NVIDIA-H100-80GB-HBM3", 81920)
	}
	cases := map[string]struct {
		nodes []v1alpha1.GPUNode
		pods  []corev1.Pod
		want  string
	}{
		"no GPUNodes": {
			want: "No GPUNodes: no node runs Partita's agent yet.\n",
		},
		"slices, a whole GPU and an unhealthy device": {
			nodes: []v1alpha1.GPUNode{*h100("gpu-0", 4).Obj(), *h100("gpu-1", 2).UnhealthyDevice(1).Obj()},
			pods: []corev1.Pod{
				*pt.MakePod("nb-1", "team-a").GPUFraction("0.25").BoundTo("gpu-0", 0).Obj(),
				*pt.MakePod("nb-2", "team-a").GPUFraction("0.5").BoundTo("gpu-0", 0).Obj(),
				*pt.MakePod("mem", "team-b").GPUMemory("20Gi").BoundTo("gpu-0", 0).Obj(),
				*pt.MakePod("train", "team-b").Resource("", "nvidia.com/gpu", "1").BoundTo("gpu-0", 2).Obj(),
				// Waiting and finished pods hold nothing.
				*pt.MakePod("waiting", "team-a").GPUFraction("0.5").Obj(),
				*pt.MakePod("done", "team-a").GPUFraction("0.5").BoundTo("gpu-1", 0).Phase(corev1.PodSucceeded).Obj(),
			},
			// Device 0: 0.25 + 0.5 + 20Gi of 80Gi (0.25) = 1 used; memory
			// 20Gi + 40Gi + 20Gi = 80Gi, nothing left.
			want: `NODE   DEVICE  MODEL           HEALTH                     USED  FREE      SLICES
gpu-0  0       H100-80GB-HBM3  Healthy                    1     0 / 0     team-a/nb-1 0.25, team-a/nb-2 0.5, team-b/mem 20Gi
gpu-0  1       H100-80GB-HBM3  Healthy                    0     1 / 80Gi
gpu-0  2       H100-80GB-HBM3  Healthy                    1     0 / 0     team-b/train whole
gpu-0  3       H100-80GB-HBM3  Healthy                    0     1 / 80Gi
gpu-1  0       H100-80GB-HBM3  Healthy                    0     1 / 80Gi
gpu-1  1       H100-80GB-HBM3  Unhealthy (XID 79 (test))  0     -

NODE             GPUS  HEALTHY  USED  FREE  LARGEST FREE  PODS  ISOLATION
gpu-0            4     4        2     2     1             4     time-slicing
gpu-1            2     1        0     1     1             0     time-slicing
TOTAL (2 nodes)  6     5        2     3     1             4
`,
		},
		"GPUs another DRA driver manages": {
			nodes: []v1alpha1.GPUNode{*h100("n", 2).Obj(), *h100("nv", 2).DRADriver("gpu.nvidia.com", 0, 1).Obj()},
			want: `NODE  DEVICE  MODEL           HEALTH              USED  FREE           SLICES
n     0-1     H100-80GB-HBM3  Healthy             0     1 / 80Gi each
nv    0       H100-80GB-HBM3  DRA gpu.nvidia.com  0     -
nv    1       H100-80GB-HBM3  DRA gpu.nvidia.com  0     -

NODE             GPUS  HEALTHY  USED  FREE  LARGEST FREE  PODS  ISOLATION
n                2     2        0     2     1             0     time-slicing
nv               2     0        0     0     0             0     time-slicing
TOTAL (2 nodes)  4     2        0     2     1             0
nv: GPUs 0, 1 managed by DRA driver gpu.nvidia.com; Partita offers no gpu-milli on them (claims of the driver's DeviceClass hold them)
`,
		},
		"idle devices in a run": {
			nodes: []v1alpha1.GPUNode{*h100("n", 8).Obj()},
			pods:  []corev1.Pod{*pt.MakePod("p", "ns").GPUFraction("0.5").BoundTo("n", 3).Obj()},
			want: `NODE  DEVICE  MODEL           HEALTH   USED  FREE           SLICES
n     0-2     H100-80GB-HBM3  Healthy  0     1 / 80Gi each
n     3       H100-80GB-HBM3  Healthy  0.5   0.5 / 40Gi     ns/p 0.5
n     4-7     H100-80GB-HBM3  Healthy  0     1 / 80Gi each

NODE            GPUS  HEALTHY  USED  FREE  LARGEST FREE  PODS  ISOLATION
n               8     8        0.5   7.5   1             1     time-slicing
TOTAL (1 node)  8     8        0.5   7.5   1             1
`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteNodes(&b, report.Nodes(&report.Cluster{GPUNodes: tc.nodes, Pods: tc.pods}), OutputTable); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, b.String()); diff != "" {
				t.Errorf("nodes table (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestNodesReport(t *testing.T) {
	c := &report.Cluster{
		GPUNodes: []v1alpha1.GPUNode{*pt.MakeGPUNode("n").Devices(2, "L4", 23034).Obj()},
		Pods: []corev1.Pod{
			*pt.MakePod("a", "ns").GPUFraction("0.5").BoundTo("n", 1).Obj(),
			*pt.MakePod("b", "ns").Container("x").Container("y").Resource("x", v1alpha1.ResourceGPUMilli, "250").
				Resource("y", v1alpha1.ResourceGPUMilli, "250").GPUFraction("0.25").Obj(),
		},
	}
	// Bind b's two containers to devices 0 and 1.
	c.Pods[1].Spec.NodeName = "n"
	c.Pods[1].Annotations[v1alpha1.AnnotationNode] = "n"
	c.Pods[1].Annotations[v1alpha1.AnnotationDevicesPrefix+"x"] = pt.DeviceUUID("n", 0)
	c.Pods[1].Annotations[v1alpha1.AnnotationDevicesPrefix+"y"] = pt.DeviceUUID("n", 1)
	want := report.NodesReport{
		Nodes: []report.NodeReport{{
			Name: "n", Isolation: v1alpha1.IsolationTimeSlicing,
			Devices: []report.DeviceReport{
				{Index: 0, UUID: "GPU-n-0", Model: "L4", MemoryMiB: 23034, Health: "Healthy", UsedMilli: 250, UsedMemoryMiB: 5758,
					FreeMilli: 750, FreeMemoryMiB: 17276,
					Slices: []report.SliceReport{{Namespace: "ns", Pod: "b", Container: "x", Milli: 250, MemoryMiB: 5758, MultiContainer: true}}},
				{Index: 1, UUID: "GPU-n-1", Model: "L4", MemoryMiB: 23034, Health: "Healthy", UsedMilli: 750, UsedMemoryMiB: 5758 + 11517,
					FreeMilli: 250, FreeMemoryMiB: 23034 - 5758 - 11517,
					Slices: []report.SliceReport{
						{Namespace: "ns", Pod: "a", Container: "main", Milli: 500, MemoryMiB: 11517},
						{Namespace: "ns", Pod: "b", Container: "y", Milli: 250, MemoryMiB: 5758, MultiContainer: true},
					}},
			},
			NodeTotals: report.NodeTotals{GPUs: 2, Healthy: 2, UsedMilli: 1000, FreeMilli: 1000, LargestFreeMilli: 750, Pods: 2},
		}},
		Total: report.NodeTotals{GPUs: 2, Healthy: 2, UsedMilli: 1000, FreeMilli: 1000, LargestFreeMilli: 750, Pods: 2},
	}
	if diff := cmp.Diff(want, report.Nodes(c), cmp.AllowUnexported(report.SliceReport{})); diff != "" {
		t.Errorf("nodes report (-want,+got):\n%s", diff)
	}
	var b bytes.Buffer
	if err := WriteNodes(&b, report.Nodes(c), OutputTable); err != nil {
		t.Fatal(err)
	}
	if want := "ns/a 0.5, ns/b:y 0.25"; !bytes.Contains(b.Bytes(), []byte(want)) {
		t.Errorf("table does not name the containers of a pod with two GPU containers (%q):\n%s", want, b.String())
	}
}
