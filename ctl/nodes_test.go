package ctl

import (
	"bytes"
	"encoding/json"
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

// topologyCluster is four nodes in two blocks of racks, one without
// labels, a notebook on gpu-0, and the Topology gb200 over block and rack.
func topologyCluster() *report.Cluster {
	const block, rack = "example.com/block", "example.com/rack"
	h100 := func(name string, n int) v1alpha1.GPUNode {
		return *pt.MakeGPUNode(name).Devices(n, "NVIDIA-H100-80GB-HBM3", 81920).Obj()
	}
	return &report.Cluster{
		GPUNodes: []v1alpha1.GPUNode{h100("gpu-0", 4), h100("gpu-1", 4), h100("gpu-2", 4), h100("gpu-3", 2)},
		Nodes: []corev1.Node{
			*pt.MakeNode("gpu-0").Label(block, "b1").Label(rack, "r1").Obj(),
			*pt.MakeNode("gpu-1").Label(block, "b1").Label(rack, "r2").Obj(),
			// Rack r1 of block b2: not gpu-0's rack.
			*pt.MakeNode("gpu-2").Label(block, "b2").Label(rack, "r1").Obj(),
			*pt.MakeNode("gpu-3").Obj(),
		},
		Pods:       []corev1.Pod{*pt.MakePod("nb", "team-a").GPUFraction("0.25").BoundTo("gpu-0", 0).Obj()},
		Topologies: []v1alpha1.Topology{*pt.MakeTopology("gb200", block, rack).Obj(), *pt.MakeTopology("zones", "topology.kubernetes.io/zone").Obj()},
	}
}

func TestNodesTopologyTable(t *testing.T) {
	devices := `NODE   DEVICE  MODEL           HEALTH   USED  FREE           SLICES
gpu-0  0       H100-80GB-HBM3  Healthy  0.25  0.75 / 60Gi    team-a/nb 0.25
gpu-0  1-3     H100-80GB-HBM3  Healthy  0     1 / 80Gi each
gpu-1  0-3     H100-80GB-HBM3  Healthy  0     1 / 80Gi each
gpu-2  0-3     H100-80GB-HBM3  Healthy  0     1 / 80Gi each
gpu-3  0-1     H100-80GB-HBM3  Healthy  0     1 / 80Gi each

`
	cases := map[string]struct {
		cluster  func() *report.Cluster
		topology string
		want     string
	}{
		"blocks, racks, and a node without either": {
			cluster: topologyCluster, topology: "gb200",
			want: devices + `TOPOLOGY gb200           NODES  GPUS  HEALTHY  USED  FREE   LARGEST FREE  PODS  ISOLATION
example.com/block=b1     2      8     8        0.25  7.75   1             1
  example.com/rack=r1    1      4     4        0.25  3.75   1             1
    gpu-0                       4     4        0.25  3.75   1             1     time-slicing
  example.com/rack=r2    1      4     4        0     4      1             0
    gpu-1                       4     4        0     4      1             0     time-slicing
example.com/block=b2     1      4     4        0     4      1             0
  example.com/rack=r1    1      4     4        0     4      1             0
    gpu-2                       4     4        0     4      1             0     time-slicing
(no example.com/block)   1      2     2        0     2      1             0
  (no example.com/rack)  1      2     2        0     2      1             0
    gpu-3                       2     2        0     2      1             0     time-slicing
TOTAL (4 nodes)          4      14    14       0.25  13.75  1             1
`,
		},
		"a level no node has": {
			cluster: topologyCluster, topology: "zones",
			want: devices + `TOPOLOGY zones                    NODES  GPUS  HEALTHY  USED  FREE   LARGEST FREE  PODS  ISOLATION
(no topology.kubernetes.io/zone)  4      14    14       0.25  13.75  1             1
  gpu-0                                  4     4        0.25  3.75   1             1     time-slicing
  gpu-1                                  4     4        0     4      1             0     time-slicing
  gpu-2                                  4     4        0     4      1             0     time-slicing
  gpu-3                                  2     2        0     2      1             0     time-slicing
TOTAL (4 nodes)                   4      14    14       0.25  13.75  1             1
`,
		},
		"a reader who may not list Nodes is told why every node lacks the labels": {
			cluster: func() *report.Cluster {
				c := topologyCluster()
				c.GPUNodes, c.Nodes, c.Pods, c.NodesForbidden = c.GPUNodes[3:], nil, nil, true
				return c
			},
			topology: "gb200",
			want: `NODE   DEVICE  MODEL           HEALTH   USED  FREE           SLICES
gpu-3  0-1     H100-80GB-HBM3  Healthy  0     1 / 80Gi each

TOPOLOGY gb200           NODES  GPUS  HEALTHY  USED  FREE  LARGEST FREE  PODS  ISOLATION
(no example.com/block)   1      2     2        0     2     1             0
  (no example.com/rack)  1      2     2        0     2     1             0
    gpu-3                       2     2        0     2     1             0     time-slicing
TOTAL (1 node)           1      2     2        0     2     1             0
note: you may not list Nodes, so their labels are unknown and every node shows without them
`,
		},
		"no GPUNodes": {
			cluster: func() *report.Cluster {
				return &report.Cluster{Topologies: topologyCluster().Topologies}
			},
			topology: "gb200",
			want:     "No GPUNodes: no node runs Partita's agent yet.\n",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := report.NodesByTopology(tc.cluster(), tc.topology)
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := WriteNodes(&b, r, OutputTable); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, b.String()); diff != "" {
				t.Errorf("nodes --topology %s (-want,+got):\n%s", tc.topology, diff)
			}
		})
	}
}

// TestNodesTopologyJSON: -o json with --topology is the JSON without it
// plus one field, topology.
func TestNodesTopologyJSON(t *testing.T) {
	c := topologyCluster()
	c.GPUNodes, c.Nodes = c.GPUNodes[1:3], c.Nodes[1:3]
	decode := func(r report.NodesReport) map[string]json.RawMessage {
		t.Helper()
		var b bytes.Buffer
		if err := WriteNodes(&b, r, OutputJSON); err != nil {
			t.Fatal(err)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b.Bytes(), &m); err != nil {
			t.Fatalf("decode %s: %v", b.String(), err)
		}
		return m
	}
	plain := decode(report.Nodes(c))
	grouped, err := report.NodesByTopology(c, "gb200")
	if err != nil {
		t.Fatal(err)
	}
	got := decode(grouped)
	topology, ok := got["topology"]
	if !ok {
		t.Fatalf("no topology field in %v", got)
	}
	delete(got, "topology")
	if _, ok := plain["topology"]; ok {
		t.Errorf("nodes -o json without --topology has a topology field")
	}
	if diff := cmp.Diff(plain, got, cmp.Transformer("string", func(r json.RawMessage) string { return string(r) })); diff != "" {
		t.Errorf("fields other than topology (-without,+with --topology):\n%s", diff)
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, topology, "", "  "); err != nil {
		t.Fatal(err)
	}
	want := `{
  "name": "gb200",
  "levels": [
    "example.com/block",
    "example.com/rack"
  ],
  "domains": [
    {
      "level": "example.com/block",
      "value": "b1",
      "nodeCount": 1,
      "gpus": 4,
      "healthy": 4,
      "usedMilli": 0,
      "freeMilli": 4000,
      "largestFreeMilli": 1000,
      "pods": 0,
      "domains": [
        {
          "level": "example.com/rack",
          "value": "r2",
          "nodeCount": 1,
          "gpus": 4,
          "healthy": 4,
          "usedMilli": 0,
          "freeMilli": 4000,
          "largestFreeMilli": 1000,
          "pods": 0,
          "nodes": [
            "gpu-1"
          ]
        }
      ]
    },
    {
      "level": "example.com/block",
      "value": "b2",
      "nodeCount": 1,
      "gpus": 4,
      "healthy": 4,
      "usedMilli": 0,
      "freeMilli": 4000,
      "largestFreeMilli": 1000,
      "pods": 0,
      "domains": [
        {
          "level": "example.com/rack",
          "value": "r1",
          "nodeCount": 1,
          "gpus": 4,
          "healthy": 4,
          "usedMilli": 0,
          "freeMilli": 4000,
          "largestFreeMilli": 1000,
          "pods": 0,
          "nodes": [
            "gpu-2"
          ]
        }
      ]
    }
  ]
}`
	if diff := cmp.Diff(want, indented.String()); diff != "" {
		t.Errorf("topology (-want,+got):\n%s", diff)
	}
}
