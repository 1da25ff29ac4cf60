// Package nodeagent is Partita's node agent (DESIGN §2 step 4, §3, §8): it
// discovers a node's GPUs through a Backend (NVML on real nodes, a simulated
// backend for dev clusters and tests), publishes them as the node's GPUNode
// and as the partita.dev/gpu-milli capacity of the Node, applies each bound
// pod's slice for the node's isolation mode (one MPS control daemon per
// shared device in mps mode), watches the memory each slice really uses and
// acts on overuse (an event, or ending the process), and exports metrics.
//
// One Agent serves one node (a DaemonSet pod) or, in fleet mode, every node
// that a label selector matches, each with its own simulated backend, so a
// large simulated cluster needs one process.
//
// nodeagent reads allocations through the gpu package and never imports the
// webhook, policy or extender packages.
package nodeagent
