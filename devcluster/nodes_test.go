package devcluster

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/nodeagent"
)

// TestSimulatedNodeResources: a kwok node added by hand gets from the
// agent the pods, CPU and memory that `up` gives the nodes it creates, so
// that the dev cluster's simulated capacity does not depend on who made
// the node.
func TestSimulatedNodeResources(t *testing.T) {
	quantities := cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })
	want := SimulatedNodeResources()
	node := SimulatedGPUNode(3, 8, GPUModels["H100-80GB"])
	if diff := cmp.Diff(want, node.Status.Capacity, quantities); diff != "" {
		t.Errorf("capacity of a node up creates (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, node.Status.Allocatable, quantities); diff != "" {
		t.Errorf("allocatable of a node up creates (-want +got):\n%s", diff)
	}
	flag := AgentNodeResourcesFlag()
	value, ok := strings.CutPrefix(flag, "--simulate-node-resources=")
	if !ok {
		t.Fatalf("agent flag %q, want --simulate-node-resources=...", flag)
	}
	got, err := nodeagent.ParseNodeResources(value)
	if err != nil {
		t.Fatalf("the agent refuses %q: %v", flag, err)
	}
	if diff := cmp.Diff(want, got, quantities); diff != "" {
		t.Errorf("what the agent fills in on a node added by hand (-want +got):\n%s", diff)
	}
	if value != "cpu=64,memory=512Gi,pods=110" {
		t.Errorf("flag value %q, want the resources in name order", value)
	}
}
