package gpu

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// InsufficientError says a pod does not fit a node now, with the numbers the
// extender turns into a filter reason and the admitter into a PodGroup
// status reason.
type InsufficientError struct {
	// Node is the node.
	Node string
	// Container is the GPU container that did not fit (containers are placed
	// in spec order, each after the ones before it).
	Container string
	// WantMilli is the container's share of each device, 0 when it asks for
	// memory.
	WantMilli int64
	// WantMemoryMiB is the container's memory per device, 0 when it asks for
	// a fraction or whole devices.
	WantMemoryMiB int64
	// Count is the number of devices the container needs.
	Count int
	// DevicesWithRoom is the number of devices that could take one more slice
	// of this size.
	DevicesWithRoom int
	// BestDevice is the index of the device with the most room (free milli,
	// or free memory for a memory request), -1 when the node has no healthy
	// device open to the request.
	BestDevice int32
	// BestFreeMilli is BestDevice's free share in milli-GPUs.
	BestFreeMilli int64
	// BestFreeMemoryMiB is BestDevice's free memory.
	BestFreeMemoryMiB int64
	// OtherTenantDevices counts the devices that have room but serve slices
	// of another namespace on an MPS node, where a device serves one
	// namespace (its MPS daemon obeys every client).
	OtherTenantDevices int
	// Unresolvable is set when the request can never fit this node, even
	// empty: it is bigger than any healthy device, or the node has too few
	// healthy devices. Preemption cannot help.
	Unresolvable bool
}

// Error reads like "node n1: largest free slice 0.25 on GPU 5; pod needs 0.5".
func (e *InsufficientError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s: ", e.Node)
	whole := e.WantMilli == MilliPerGPU && e.WantMemoryMiB == 0
	want := FormatMilli(e.WantMilli)
	switch {
	case e.WantMemoryMiB > 0:
		want = fmt.Sprintf("%dMiB", e.WantMemoryMiB)
	case whole:
		want = "a whole GPU"
	}
	switch {
	case e.Count > 1 && whole:
		fmt.Fprintf(&b, "%s free; pod needs %d whole GPUs", gpus(e.DevicesWithRoom), e.Count)
	case e.Count > 1 && e.DevicesWithRoom >= e.Count:
		fmt.Fprintf(&b, "%s have room for %s but differ in memory; pod needs %s on each of %d GPUs of one size", gpus(e.DevicesWithRoom), want, want, e.Count)
	case e.Count > 1:
		fmt.Fprintf(&b, "%s with room for %s; pod needs %s on each of %d GPUs", gpus(e.DevicesWithRoom), want, want, e.Count)
	case e.BestDevice < 0 && e.OtherTenantDevices > 0:
		fmt.Fprintf(&b, "no GPU with room for the pod's namespace; pod needs %s", want)
	case e.BestDevice < 0:
		fmt.Fprintf(&b, "no healthy GPU with room; pod needs %s", want)
	case e.WantMemoryMiB > 0:
		fmt.Fprintf(&b, "largest free memory %dMiB (slice %s) on GPU %d; pod needs %s", e.BestFreeMemoryMiB, FormatMilli(e.BestFreeMilli), e.BestDevice, want)
	default:
		fmt.Fprintf(&b, "largest free slice %s on GPU %d; pod needs %s", FormatMilli(e.BestFreeMilli), e.BestDevice, want)
	}
	if e.Container != "" {
		fmt.Fprintf(&b, " (container %s)", e.Container)
	}
	if e.OtherTenantDevices > 0 {
		verb := "serve"
		if e.OtherTenantDevices == 1 {
			verb = "serves"
		}
		fmt.Fprintf(&b, "; %s with room %s MPS clients of another namespace (one namespace per GPU in mps mode)", gpus(e.OtherTenantDevices), verb)
	}
	if e.Unresolvable {
		b.WriteString("; it can never fit this node")
	}
	return b.String()
}

func gpus(n int) string {
	if n == 1 {
		return "1 GPU"
	}
	return fmt.Sprintf("%d GPUs", n)
}

// IsInsufficient reports whether err is, or wraps, an *InsufficientError.
func IsInsufficient(err error) bool {
	var ie *InsufficientError
	return errors.As(err, &ie)
}

// NodeNotFoundError says the ledger has no inventory for a node: it has no
// GPUNode, or the GPUNode was deleted.
type NodeNotFoundError struct {
	// Node is the node's name.
	Node string
}

// Error implements error.
func (e *NodeNotFoundError) Error() string {
	return fmt.Sprintf("node %s has no GPU inventory", e.Node)
}

// IsNodeNotFound reports whether err is, or wraps, a *NodeNotFoundError.
func IsNodeNotFound(err error) bool {
	var ne *NodeNotFoundError
	return errors.As(err, &ne)
}

// DRAManagedError says every healthy GPU of a node is published by another
// DRA driver (GPUNode.status.devices[].draDriver): that driver's claims
// allocate them, so Partita places no partita.dev/gpu-milli pod there.
// Waiting cannot help.
type DRAManagedError struct {
	// Node is the node's name.
	Node string
	// Drivers are the drivers, sorted.
	Drivers []string
}

// Error reads like "node n1: GPUs managed by DRA driver gpu.nvidia.com; ...".
func (e *DRAManagedError) Error() string {
	what := "driver " + strings.Join(e.Drivers, ", ")
	if len(e.Drivers) > 1 {
		what = "drivers " + strings.Join(e.Drivers, ", ")
	}
	return fmt.Sprintf("node %s: GPUs managed by DRA %s; Partita offers no partita.dev/gpu-milli there (ask for them with a ResourceClaim of that driver's DeviceClass)", e.Node, what)
}

// IsDRAManaged reports whether err is, or wraps, a *DRAManagedError.
func IsDRAManaged(err error) bool {
	var de *DRAManagedError
	return errors.As(err, &de)
}

// DefaultAgentHeartbeatTimeout is how long a node's agent may go without a
// new heartbeat on its GPUNode before the node takes no new GPU pods: three
// of the agent's default heartbeat intervals (1m), so that one late or
// failed write, or an agent restart, never trips it.
const DefaultAgentHeartbeatTimeout = 3 * time.Minute

// ReasonAgentSilent names an AgentSilentError where people read it: the
// extender's filter verdict and the event on the node's GPUNode.
const ReasonAgentSilent = "AgentSilent"

// AgentSilentError says a node's agent stopped reporting: its GPUNode's
// heartbeat has not moved for longer than the bound the extender was given
// (--agent-heartbeat-timeout). Nothing new goes there, as nobody watches
// its devices' health, applies slices or polices memory; pods already
// there are left alone.
type AgentSilentError struct {
	// Node is the node.
	Node string
	// LastHeartbeat is the last heartbeat its GPUNode shows, as the agent's
	// clock wrote it; zero when the agent never reported.
	LastHeartbeat time.Time
	// For is how long no newer heartbeat has been seen.
	For time.Duration
}

// Error reads like "the agent on node n1 has not reported for 3m10s (last
// heartbeat 2026-12-01T10:00:00Z)".
func (e *AgentSilentError) Error() string {
	last := "never"
	if !e.LastHeartbeat.IsZero() {
		last = e.LastHeartbeat.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("the agent on node %s has not reported for %s (last heartbeat %s): the node takes no new GPU pods until it does", e.Node, e.For.Round(time.Second), last)
}

// IsAgentSilent reports whether err is, or wraps, an *AgentSilentError.
func IsAgentSilent(err error) bool {
	var se *AgentSilentError
	return errors.As(err, &se)
}

// ErrAlreadyAllocated says a pod already holds a different allocation.
var ErrAlreadyAllocated = errors.New("pod already holds a different allocation")

// InvalidAllocationError says an allocation handed to Assume is malformed or
// names devices it may not have: an unknown or unhealthy device, a device
// twice, no device at all, a share out of range.
type InvalidAllocationError struct {
	// Pod is namespace/name.
	Pod string
	// Container is the container concerned, if any.
	Container string
	// Reason says what is wrong, in words.
	Reason string
}

// Error implements error.
func (e *InvalidAllocationError) Error() string {
	if e.Container != "" {
		return fmt.Sprintf("allocation of pod %s, container %s: %s", e.Pod, e.Container, e.Reason)
	}
	return fmt.Sprintf("allocation of pod %s: %s", e.Pod, e.Reason)
}

// GangError says a gang could not be placed; no member was.
type GangError struct {
	// Total is the number of members.
	Total int
	// Member is the position of the first member that did not fit.
	Member int
	// UID is that member's UID.
	UID types.UID
	// Cause is why: an *InsufficientError from the candidate node that came
	// closest, or another error.
	Cause error
}

// Error implements error.
func (e *GangError) Error() string {
	return fmt.Sprintf("place gang: member %d of %d does not fit: %v", e.Member+1, e.Total, e.Cause)
}

// Unwrap returns the cause.
func (e *GangError) Unwrap() error { return e.Cause }

// InvariantError is a broken ledger invariant (DESIGN §3).
type InvariantError struct {
	// Node is the node concerned.
	Node string
	// Device is the device index concerned, -1 for none.
	Device int32
	// Pod is namespace/name of the pod concerned, if any.
	Pod string
	// Detail says what is broken.
	Detail string
}

// Error implements error.
func (e *InvariantError) Error() string {
	var b strings.Builder
	b.WriteString("ledger invariant broken: node ")
	b.WriteString(e.Node)
	if e.Device >= 0 {
		fmt.Fprintf(&b, " GPU %d", e.Device)
	}
	if e.Pod != "" {
		fmt.Fprintf(&b, " pod %s", e.Pod)
	}
	b.WriteString(": ")
	b.WriteString(e.Detail)
	return b.String()
}
