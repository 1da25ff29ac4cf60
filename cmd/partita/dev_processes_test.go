package main

import (
	"slices"
	"testing"

	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/dra"
)

// TestDevAgentFillsNodeResources: in every mode and backend the dev
// cluster's fleet agent fills in the pods, CPU and memory of a kwok node
// added by hand, in the write of its GPU capacity.
func TestDevAgentFillsNodeResources(t *testing.T) {
	for _, mode := range []devcluster.Mode{devcluster.ModeHost, devcluster.ModeChart} {
		for _, backend := range []dra.Backend{dra.BackendExtender, dra.BackendDRA} {
			procs, err := devHostProcesses(mode, backend, true, extraFlags{}, 1)
			if err != nil {
				t.Fatal(err)
			}
			i := slices.IndexFunc(procs, func(p devcluster.HostProcess) bool { return p.Name == "agent" })
			if i < 0 {
				t.Fatalf("mode %s, backend %s: no fleet agent", mode, backend)
			}
			if !slices.Contains(procs[i].Args, devcluster.AgentNodeResourcesFlag()) {
				t.Errorf("mode %s, backend %s: the fleet agent's arguments %q lack %s", mode, backend, procs[i].Args, devcluster.AgentNodeResourcesFlag())
			}
		}
	}
}
