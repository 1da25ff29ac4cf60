package nodeagent

import (
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// TestCapacityPatchFillsNodeResources: the agent's write of a simulated
// node's GPU capacity also gives it the pods, CPU and memory its status
// lacks, whichever of the agent and kwok writes first, and never changes
// what is there; what it writes is the merge patch the API server
// applies to the node's status.
func TestCapacityPatchFillsNodeResources(t *testing.T) {
	want := corev1.ResourceList{
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
	}
	list := func(kv ...string) corev1.ResourceList {
		out := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return out
	}
	milli := int64(8000)
	cases := map[string]struct {
		status corev1.NodeStatus
		want   corev1.NodeStatus
	}{
		"a node added by hand, before kwok wrote its status": {
			want: corev1.NodeStatus{
				Capacity:    list("pods", "110", "cpu", "64", "memory", "512Gi", string(v1alpha1.ResourceGPUMilli), "8k"),
				Allocatable: list("pods", "110", "cpu", "64", "memory", "512Gi", string(v1alpha1.ResourceGPUMilli), "8k"),
			},
		},
		"kwok's status first: its values stay": {
			status: corev1.NodeStatus{Capacity: list("pods", "1M", "cpu", "1k", "memory", "1Ti"), Allocatable: list("pods", "1M", "cpu", "1k", "memory", "1Ti")},
			want: corev1.NodeStatus{
				Capacity:    list("pods", "1M", "cpu", "1k", "memory", "1Ti", string(v1alpha1.ResourceGPUMilli), "8k"),
				Allocatable: list("pods", "1M", "cpu", "1k", "memory", "1Ti", string(v1alpha1.ResourceGPUMilli), "8k"),
			},
		},
		"a node left without pods by the race is mended": {
			status: corev1.NodeStatus{Capacity: list(string(v1alpha1.ResourceGPUMilli), "8k"), Allocatable: list(string(v1alpha1.ResourceGPUMilli), "8k")},
			want: corev1.NodeStatus{
				Capacity:    list("pods", "110", "cpu", "64", "memory", "512Gi", string(v1alpha1.ResourceGPUMilli), "8k"),
				Allocatable: list("pods", "110", "cpu", "64", "memory", "512Gi", string(v1alpha1.ResourceGPUMilli), "8k"),
			},
		},
		"only what is missing, on each side": {
			status: corev1.NodeStatus{Capacity: list("pods", "250", "cpu", "32", "memory", "256Gi"), Allocatable: list("cpu", "30")},
			want: corev1.NodeStatus{
				Capacity:    list("pods", "250", "cpu", "32", "memory", "256Gi", string(v1alpha1.ResourceGPUMilli), "8k"),
				Allocatable: list("pods", "110", "cpu", "30", "memory", "512Gi", string(v1alpha1.ResourceGPUMilli), "8k"),
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			node := &corev1.Node{Status: tc.status}
			patch, err := capacityPatch(&milli, missingResources(node, want))
			if err != nil {
				t.Fatal(err)
			}
			doc, err := json.Marshal(node)
			if err != nil {
				t.Fatal(err)
			}
			merged, err := jsonpatch.MergePatch(doc, patch)
			if err != nil {
				t.Fatal(err)
			}
			var got corev1.Node
			if err := json.Unmarshal(merged, &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.Status, cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })); diff != "" {
				t.Errorf("node status after the patch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMissingResourcesWithoutNodeResources: an agent not asked to fill in
// node resources (every agent but the dev cluster's fleet) patches the
// GPU capacity alone.
func TestMissingResourcesWithoutNodeResources(t *testing.T) {
	if f := missingResources(&corev1.Node{}, nil); !f.empty() {
		t.Errorf("missingResources with none wanted = %v, want nothing", f)
	}
	patch, err := capacityPatch(nil, resourceFill{})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"status":{"allocatable":{"partita.dev/gpu-milli":null},"capacity":{"partita.dev/gpu-milli":null}}}`
	if string(patch) != want {
		t.Errorf("patch %s, want %s", patch, want)
	}
}

func TestParseNodeResources(t *testing.T) {
	cases := map[string]struct {
		in      string
		want    corev1.ResourceList
		wantErr string
	}{
		"empty": {in: "", want: corev1.ResourceList{}},
		"the dev cluster's": {in: "cpu=64,memory=512Gi,pods=110", want: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"), corev1.ResourcePods: resource.MustParse("110"),
		}},
		"spaces":       {in: " pods = 20 ", want: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("20")}},
		"no amount":    {in: "pods", wantErr: `read node resource "pods": want name=quantity, e.g. pods=110`},
		"a GPU":        {in: "nvidia.com/gpu=8", wantErr: `read node resource "nvidia.com/gpu=8": want pods, cpu or memory`},
		"zero":         {in: "pods=0", wantErr: `read node resource "pods=0": want a positive amount`},
		"twice":        {in: "pods=1,pods=2", wantErr: `read node resources "pods=1,pods=2": pods named twice`},
		"bad quantity": {in: "cpu=lots", wantErr: `read node resource "cpu=lots": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseNodeResources(tc.in)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if diff := cmp.Diff(tc.wantErr, gotErr); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })); diff != "" {
				t.Errorf("resources (-want +got):\n%s", diff)
			}
		})
	}
}
