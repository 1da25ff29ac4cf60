package report

import (
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// NodesReport is the device map of `ctl nodes`. Amounts of GPU are in
// milli-GPUs (1000 = one device), as in partita.dev/gpu-milli and
// GPUNode.status; memory is in MiB.
type NodesReport struct {
	// Nodes are the nodes with a GPUNode, by name.
	Nodes []NodeReport `json:"nodes"`
	// Total sums the nodes.
	Total NodeTotals `json:"total"`
	// Stranded are allocations the ledger cannot serve (gpu.Stranded).
	Stranded []StrandedReport `json:"stranded,omitempty"`
	// Topology groups the nodes by the levels of a Topology, when one was
	// asked for (NodesByTopology).
	Topology *TopologyReport `json:"topology,omitempty"`
}

// NodeReport is one node's devices.
type NodeReport struct {
	// Name is the node's name.
	Name string `json:"name"`
	// Isolation is how the node applies slices.
	Isolation v1alpha1.IsolationMode `json:"isolation"`
	// Devices are the node's GPUs, by index.
	Devices []DeviceReport `json:"devices"`
	// DRADrivers are the DRA drivers other than Partita's that publish
	// some of the node's GPUs (GPUNode.status.draDrivers): Partita offers
	// no partita.dev/gpu-milli on those.
	DRADrivers []string `json:"draDrivers,omitempty"`
	// Enforcement is how the node applies slices
	// (GPUNode.status.enforcement), nil before its agent says.
	Enforcement *v1alpha1.Enforcement `json:"enforcement,omitempty"`
	NodeTotals
}

// NodeTotals sums devices.
type NodeTotals struct {
	// GPUs counts devices.
	GPUs int `json:"gpus"`
	// Healthy counts devices that take new work.
	Healthy int `json:"healthy"`
	// UsedMilli is the sum of the devices' allocations.
	UsedMilli int64 `json:"usedMilli"`
	// FreeMilli is the sum of the healthy devices' free shares.
	FreeMilli int64 `json:"freeMilli"`
	// LargestFreeMilli is the largest free share on one healthy device:
	// the largest slice a one-device pod could get now.
	LargestFreeMilli int64 `json:"largestFreeMilli"`
	// Pods counts pods holding devices.
	Pods int `json:"pods"`
}

// add sums n into t: counts and amounts add up, the largest free share is
// the larger of the two.
func (t *NodeTotals) add(n NodeTotals) {
	t.GPUs += n.GPUs
	t.Healthy += n.Healthy
	t.UsedMilli += n.UsedMilli
	t.FreeMilli += n.FreeMilli
	t.LargestFreeMilli = max(t.LargestFreeMilli, n.LargestFreeMilli)
	t.Pods += n.Pods
}

// DeviceReport is one GPU and the slices it holds.
type DeviceReport struct {
	// Index is the device's index on its node.
	Index int32 `json:"index"`
	// UUID is the device's UUID.
	UUID string `json:"uuid"`
	// Model is the device's product name.
	Model string `json:"model"`
	// MemoryMiB is the device's memory.
	MemoryMiB int64 `json:"memoryMiB"`
	// Health is Healthy, Unhealthy (with the agent's reason), MIG for a
	// device in MIG mode, which takes no slices yet, or "DRA <driver>" for
	// a device another DRA driver publishes and allocates.
	Health string `json:"health"`
	// DRADriver is the DRA driver other than Partita's that publishes the
	// device, empty for none.
	DRADriver string `json:"draDriver,omitempty"`
	// UsedMilli is the sum of the slices' shares.
	UsedMilli int64 `json:"usedMilli"`
	// UsedMemoryMiB is the sum of the slices' memory.
	UsedMemoryMiB int64 `json:"usedMemoryMiB"`
	// FreeMilli is the share still free, 0 on a device that takes no work.
	FreeMilli int64 `json:"freeMilli"`
	// FreeMemoryMiB is the memory still free, 0 on a device that takes no work.
	FreeMemoryMiB int64 `json:"freeMemoryMiB"`
	// Slices are the allocations on the device, by pod.
	Slices []SliceReport `json:"slices"`
}

// SliceReport is one container's allocation on one device.
type SliceReport struct {
	// Namespace is the pod's namespace.
	Namespace string `json:"namespace"`
	// Pod is the pod's name.
	Pod string `json:"pod"`
	// Container is the GPU container.
	Container string `json:"container"`
	// Milli is the share of the device.
	Milli int64 `json:"milli"`
	// MemoryMiB is the memory limit on the device, 0 for a whole device.
	MemoryMiB int64 `json:"memoryMiB"`
	// ByMemory is set when the pod asked for an amount of memory rather
	// than a fraction.
	ByMemory bool `json:"byMemory,omitempty"`
	// Whole is set for a whole device.
	Whole bool `json:"whole,omitempty"`
	// MultiContainer is set when the pod has several GPU containers, so a
	// table names the container. It is not part of the JSON (the
	// container is).
	MultiContainer bool `json:"-"`
}

// StrandedReport is an allocation that is not, or not fully, served.
type StrandedReport struct {
	// Pod is namespace/name.
	Pod string `json:"pod"`
	// Node is the pod's node.
	Node string `json:"node"`
	// Reason is gpu.StrandedReason.
	Reason string `json:"reason"`
	// Detail says more, when there is more.
	Detail string `json:"detail,omitempty"`
}

// Nodes builds the device map from c's GPUNodes and pods through
// gpu.BuildLedger, so the numbers are the scheduler's.
func Nodes(c *Cluster) NodesReport {
	ledger := c.ledger()
	state := ledger.State()

	raw := map[string]map[int32]v1alpha1.GPUDevice{}
	drivers := map[string][]string{}
	enforcement := map[string]*v1alpha1.Enforcement{}
	for _, gn := range c.GPUNodes {
		drivers[gn.Name] = gn.Status.DRADrivers
		enforcement[gn.Name] = gn.Status.Enforcement
		m := map[int32]v1alpha1.GPUDevice{}
		for _, d := range gn.Status.Devices {
			m[d.Index] = d
		}
		raw[gn.Name] = m
	}
	byUID := map[types.UID]*corev1.Pod{}
	for i := range c.Pods {
		byUID[c.Pods[i].UID] = &c.Pods[i]
	}

	// slices[node][device] and the pods per node, from the ledger's pods.
	slices := map[string]map[int32][]SliceReport{}
	podsOn := map[string]map[types.UID]bool{}
	for _, ps := range state.Pods {
		a := ps.Allocation
		byMemory := false
		if p := byUID[a.UID]; p != nil {
			if req, _ := gpu.ParsePod(p); req != nil && len(req.Containers) > 0 {
				byMemory = req.Containers[0].MemoryMiB > 0
			}
		}
		if slices[a.Node] == nil {
			slices[a.Node] = map[int32][]SliceReport{}
			podsOn[a.Node] = map[types.UID]bool{}
		}
		podsOn[a.Node][a.UID] = true
		for _, ca := range a.Containers {
			for _, idx := range ca.DeviceIndexes {
				slices[a.Node][idx] = append(slices[a.Node][idx], SliceReport{
					Namespace: a.Namespace, Pod: a.Name, Container: ca.Container,
					Milli: ca.Milli, MemoryMiB: ca.MemoryMiB, ByMemory: byMemory && !ca.Whole(), Whole: ca.Whole(),
					MultiContainer: len(a.Containers) > 1,
				})
			}
		}
	}

	var out NodesReport
	for _, nu := range state.Nodes {
		nr := NodeReport{Name: nu.Name, Isolation: nu.Isolation, Devices: []DeviceReport{}, DRADrivers: drivers[nu.Name], Enforcement: enforcement[nu.Name]}
		for _, du := range nu.Devices {
			d := DeviceReport{
				Index: du.Index, UUID: du.UUID, Model: du.Product, MemoryMiB: du.MemoryMiB,
				Health:    health(raw[nu.Name][du.Index], du.Healthy),
				DRADriver: raw[nu.Name][du.Index].DRADriver,
				UsedMilli: du.AllocatedMilli, UsedMemoryMiB: du.AllocatedMemoryMiB,
				Slices: slices[nu.Name][du.Index],
			}
			if d.Slices == nil {
				d.Slices = []SliceReport{}
			}
			sort.Slice(d.Slices, func(i, j int) bool {
				a, b := d.Slices[i], d.Slices[j]
				return a.Namespace+"/"+a.Pod+"/"+a.Container < b.Namespace+"/"+b.Pod+"/"+b.Container
			})
			nr.GPUs++
			nr.UsedMilli += d.UsedMilli
			if du.Healthy && !du.Whole {
				d.FreeMilli = max(0, gpu.MilliPerGPU-du.AllocatedMilli)
				d.FreeMemoryMiB = max(0, du.MemoryMiB-du.AllocatedMemoryMiB)
			}
			if du.Healthy {
				nr.Healthy++
				nr.FreeMilli += d.FreeMilli
				nr.LargestFreeMilli = max(nr.LargestFreeMilli, d.FreeMilli)
			}
			nr.Devices = append(nr.Devices, d)
		}
		nr.Pods = len(podsOn[nu.Name])
		out.Nodes = append(out.Nodes, nr)
		out.Total.add(nr.NodeTotals)
	}
	if out.Nodes == nil {
		out.Nodes = []NodeReport{}
	}
	for _, s := range ledger.Stranded() {
		out.Stranded = append(out.Stranded, StrandedReport{
			Pod: s.Namespace + "/" + s.Name, Node: s.Node, Reason: string(s.Reason), Detail: s.Detail,
		})
	}
	return out
}

// health is the device's health in a word: the agent's, except that a
// healthy device in MIG mode takes no slices, which the ledger knows.
func health(d v1alpha1.GPUDevice, takesWork bool) string {
	switch {
	case d.Health == v1alpha1.DeviceUnhealthy && d.HealthReason != "":
		return "Unhealthy (" + d.HealthReason + ")"
	case d.Health == v1alpha1.DeviceUnhealthy:
		return "Unhealthy"
	case d.MIGMode == v1alpha1.MIGEnabled:
		return "MIG"
	case d.DRADriver != "":
		return "DRA " + d.DRADriver
	case !takesWork:
		return "Unavailable"
	}
	return "Healthy"
}
