package report

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

const (
	block = "example.com/block"
	rack  = "example.com/rack"
)

func TestGroupByLevels(t *testing.T) {
	labels := map[string]map[string]string{
		"n1": {block: "b1", rack: "r1"},
		"n2": {block: "b1", rack: "r2"},
		"n3": {block: "b2", rack: "r1"},
		"n4": {block: "b1", rack: "r1"},
		"n5": {rack: "r1"},
		"n6": {block: "b2"},
		// An empty value is a value: the label is there.
		"n7": {block: "", rack: "r1"},
	}
	of := func(n string) map[string]string { return labels[n] }
	cases := map[string]struct {
		levels []string
		nodes  []string
		want   []Domain
	}{
		"no levels": {levels: nil, nodes: []string{"n1"}},
		"no nodes":  {levels: []string{block}},
		"one level, sorted by value": {
			levels: []string{block},
			nodes:  []string{"n3", "n1"},
			want: []Domain{
				{Level: block, Value: "b1", Nodes: []string{"n1"}},
				{Level: block, Value: "b2", Nodes: []string{"n3"}},
			},
		},
		"rack r1 of b1 is not rack r1 of b2": {
			levels: []string{block, rack},
			nodes:  []string{"n1", "n2", "n3", "n4"},
			want: []Domain{
				{Level: block, Value: "b1", Nodes: []string{"n1", "n2", "n4"}, Domains: []Domain{
					{Level: rack, Value: "r1", Nodes: []string{"n1", "n4"}},
					{Level: rack, Value: "r2", Nodes: []string{"n2"}},
				}},
				{Level: block, Value: "b2", Nodes: []string{"n3"}, Domains: []Domain{
					{Level: rack, Value: "r1", Nodes: []string{"n3"}},
				}},
			},
		},
		"nodes without a label, or without a Node, are grouped last": {
			levels: []string{block, rack},
			nodes:  []string{"n5", "n6", "n7", "gone"},
			want: []Domain{
				{Level: block, Value: "", Nodes: []string{"n7"}, Domains: []Domain{
					{Level: rack, Value: "r1", Nodes: []string{"n7"}},
				}},
				{Level: block, Value: "b2", Nodes: []string{"n6"}, Domains: []Domain{
					{Level: rack, Missing: true, Nodes: []string{"n6"}},
				}},
				{Level: block, Missing: true, Nodes: []string{"n5", "gone"}, Domains: []Domain{
					{Level: rack, Value: "r1", Nodes: []string{"n5"}},
					{Level: rack, Missing: true, Nodes: []string{"gone"}},
				}},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, GroupByLevels(tc.levels, tc.nodes, of)); diff != "" {
				t.Errorf("domains (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestFindTopology(t *testing.T) {
	gb200 := *pt.MakeTopology("gb200", block, rack).Obj()
	zones := *pt.MakeTopology("zones", "topology.kubernetes.io/zone").Obj()
	cases := map[string]struct {
		topologies []v1alpha1.Topology
		name       string
		wantErr    string
	}{
		"found": {topologies: []v1alpha1.Topology{zones, gb200}, name: "gb200"},
		"another name lists those there are": {
			topologies: []v1alpha1.Topology{zones, gb200}, name: "gb300",
			wantErr: `read Topology "gb300": topology not found; the cluster has gb200, zones (kubectl get topologies)`,
		},
		"none says how to make one": {
			name: "gb200",
			wantErr: `read Topology "gb200": topology not found; the cluster has no Topologies: create one that lists node labels as levels, broadest first ` +
				`(apiVersion: partita.dev/v1alpha1, kind: Topology, spec.levels: [{nodeLabel: topology.kubernetes.io/zone}, {nodeLabel: kubernetes.io/hostname}])`,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := FindTopology(tc.topologies, tc.name)
			if tc.wantErr == "" {
				if err != nil || got.Name != tc.name {
					t.Fatalf("FindTopology = %v, %v; want %s", got, err, tc.name)
				}
				return
			}
			if !errors.Is(err, ErrTopologyNotFound) {
				t.Fatalf("err = %v, want ErrTopologyNotFound", err)
			}
			if diff := cmp.Diff(tc.wantErr, err.Error()); diff != "" {
				t.Errorf("error (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestNodesByTopologyWithoutNodes(t *testing.T) {
	c := &Cluster{
		GPUNodes:       []v1alpha1.GPUNode{*pt.MakeGPUNode("n1").Devices(1, "H100", 81920).Obj()},
		NodesForbidden: true,
		Topologies:     []v1alpha1.Topology{*pt.MakeTopology("t", block).Obj()},
	}
	r, err := NodesByTopology(c, "t")
	if err != nil {
		t.Fatal(err)
	}
	want := &TopologyReport{Name: "t", Levels: []string{block},
		Note: "you may not list Nodes, so their labels are unknown and every node shows without them",
		Domains: []TopologyDomain{{Level: block, Missing: true, NodeCount: 1, Nodes: []string{"n1"},
			NodeTotals: NodeTotals{GPUs: 1, Healthy: 1, FreeMilli: 1000, LargestFreeMilli: 1000}}}}
	if diff := cmp.Diff(want, r.Topology); diff != "" {
		t.Errorf("topology (-want,+got):\n%s", diff)
	}
}
