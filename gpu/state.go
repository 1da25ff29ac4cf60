package gpu

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// LedgerState is a comparable dump of a ledger, sorted so that two ledgers
// holding the same objects give equal states whatever order the objects came
// in. Tests and the debug endpoint use it.
type LedgerState struct {
	// Nodes are the nodes with an inventory, by name.
	Nodes []NodeUsage
	// Pods are the pods that hold devices, by namespace, name and UID,
	// including those whose node has no inventory yet.
	Pods []PodState
}

// NodeUsage is one node's devices and what they hold.
type NodeUsage struct {
	// Name is the node's name.
	Name string
	// Isolation is the node's isolation mode.
	Isolation v1alpha1.IsolationMode
	// Devices are the node's devices, by index.
	Devices []DeviceUsage
}

// DeviceUsage is one device and what it holds.
type DeviceUsage struct {
	// Index is the device's index.
	Index int32
	// UUID is the device's UUID.
	UUID string
	// Product is the device's product name.
	Product string
	// MemoryMiB is the device's memory.
	MemoryMiB int64
	// Healthy reports whether the device takes new work.
	Healthy bool
	// AllocatedMilli is the sum of the allocations' shares.
	AllocatedMilli int64
	// AllocatedMemoryMiB is the sum of the allocations' memory (a whole
	// device holds all of it).
	AllocatedMemoryMiB int64
	// Allocations counts the allocations (one per container) on the device.
	Allocations int32
	// Whole is set when a whole-device allocation holds it.
	Whole bool
}

// PodState is one pod's allocation in a LedgerState.
type PodState struct {
	// Allocation is what the pod holds.
	Allocation PodAllocation
	// Assumed is set for a decision recorded by Assume that the pod does not
	// show yet.
	Assumed bool
	// ReservedUntil is set for an unbound pod's reservation
	// (partita.dev/reservation): when it expires.
	ReservedUntil *time.Time `json:",omitempty"`
}

// StrandedReason says why an allocation is not (fully) served.
type StrandedReason string

// Stranded reasons.
const (
	// StrandedDeviceUnhealthy: the device turned unhealthy after the
	// allocation was made.
	StrandedDeviceUnhealthy StrandedReason = "DeviceUnhealthy"
	// StrandedDeviceMissing: the node's inventory no longer lists the device;
	// the allocation is not counted.
	StrandedDeviceMissing StrandedReason = "DeviceMissing"
	// StrandedNodeMissing: the node has no GPUNode; the pod is counted once it
	// appears.
	StrandedNodeMissing StrandedReason = "NodeMissing"
	// StrandedMalformed: the pod's annotations could not be read fully; what
	// could be read is counted.
	StrandedMalformed StrandedReason = "Malformed"
)

// Stranded is an allocation that is not, or not fully, served. These are not
// invariant violations: the world changed under an allocation that was sound
// when made.
type Stranded struct {
	// Namespace is the pod's namespace.
	Namespace string
	// Name is the pod's name.
	Name string
	// UID is the pod's UID.
	UID types.UID
	// Node is the pod's node.
	Node string
	// Container is the container concerned, if one is.
	Container string
	// DeviceUUID is the device concerned, if one is.
	DeviceUUID string
	// Reason says what happened.
	Reason StrandedReason
	// Detail gives the problems in words, for Malformed.
	Detail string
}

// State returns a sorted dump of the ledger.
func (l *Ledger) State() LedgerState {
	l.lock.RLock()
	defer l.lock.RUnlock()
	return l.v.state()
}

// State returns a sorted dump of the snapshot.
func (s *Snapshot) State() LedgerState {
	return s.v.state()
}

func (v *view) state() LedgerState {
	var out LedgerState
	for i := range v.nodes {
		n := &v.nodes[i]
		for _, e := range n.pods {
			ps := PodState{Allocation: *e.allocation(n.inv), Assumed: e.assumed}
			if !e.expires.IsZero() {
				t := e.expires
				ps.ReservedUntil = &t
			}
			out.Pods = append(out.Pods, ps)
		}
		if !n.present() {
			continue
		}
		nu := NodeUsage{Name: n.name, Isolation: n.inv.Isolation}
		for j, d := range v.devs(n) {
			nu.Devices = append(nu.Devices, DeviceUsage{
				Index:              d.index,
				UUID:               n.inv.Devices[j].UUID,
				Product:            n.inv.Devices[j].Product,
				MemoryMiB:          d.memoryMiB,
				Healthy:            d.healthy,
				AllocatedMilli:     d.milli,
				AllocatedMemoryMiB: d.memMiB,
				Allocations:        d.users,
				Whole:              d.whole > 0,
			})
		}
		out.Nodes = append(out.Nodes, nu)
	}
	slices.SortFunc(out.Nodes, func(a, b NodeUsage) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(out.Pods, func(a, b PodState) int {
		return cmp.Or(
			strings.Compare(a.Allocation.Namespace, b.Allocation.Namespace),
			strings.Compare(a.Allocation.Name, b.Allocation.Name),
			strings.Compare(string(a.Allocation.UID), string(b.Allocation.UID)),
		)
	})
	return out
}

// CheckInvariants checks DESIGN §3's invariants and returns every violation
// as an *InvariantError: per device, the shares sum to at most 1000 and the
// memory to at most the device's; a whole-device allocation is alone on its
// device; every pod holds exactly the devices it asked for, each once; and
// the incremental accounting equals a recount from the pods. "An unhealthy
// device gets nothing new" is enforced where allocations are made (Choose
// and Assume); allocations on devices that turned unhealthy later are
// reported by Stranded, not here.
func (l *Ledger) CheckInvariants() []error {
	l.lock.RLock()
	defer l.lock.RUnlock()
	errs := l.v.checkInvariants()
	count := 0
	for i := range l.v.nodes {
		for _, e := range l.v.nodes[i].pods {
			count++
			if l.pods[e.uid] != e {
				errs = append(errs, &InvariantError{Node: l.v.nodes[i].name, Device: -1, Pod: e.key(), Detail: "pod listed on the node but not in the ledger's index"})
			}
			if e.node != l.v.nodes[i].name {
				errs = append(errs, &InvariantError{Node: l.v.nodes[i].name, Device: -1, Pod: e.key(), Detail: "pod listed on a node it is not bound to"})
			}
		}
	}
	if count != len(l.pods) {
		errs = append(errs, &InvariantError{Device: -1, Detail: fmt.Sprintf("%d pods in the index but %d on nodes", len(l.pods), count)})
	}
	return errs
}

func (v *view) checkInvariants() []error {
	var errs []error
	recount := slices.Clone(v.devices)
	for i := range recount {
		recount[i].milli, recount[i].memMiB, recount[i].users, recount[i].whole, recount[i].tenants = 0, 0, 0, 0, 0
	}
	rv := view{nodes: v.nodes, devices: recount, nodeIdx: v.nodeIdx, tenantSeed: v.tenantSeed}
	for i := range v.nodes {
		n := &v.nodes[i]
		for _, e := range n.pods {
			rv.charge(n, e, 1)
			for _, c := range e.containers {
				if c.wantCount >= 0 && len(c.uuids) != c.wantCount {
					errs = append(errs, &InvariantError{Node: n.name, Device: -1, Pod: e.key(),
						Detail: fmt.Sprintf("container %s holds %d devices but asked for %d", c.name, len(c.uuids), c.wantCount)})
				}
				for k, u := range c.uuids {
					if slices.Contains(c.uuids[:k], u) {
						errs = append(errs, &InvariantError{Node: n.name, Device: -1, Pod: e.key(),
							Detail: fmt.Sprintf("container %s holds device %s twice", c.name, u)})
					}
				}
			}
		}
		if !n.present() {
			continue
		}
		got, want := v.devs(n), rv.devs(n)
		for j := range got {
			d := &got[j]
			if d.tenants != want[j].tenants {
				errs = append(errs, &InvariantError{Node: n.name, Device: d.index, Detail: "accounting drift: the namespaces of its slices differ from its pods'"})
			}
			if d.milli != want[j].milli || d.memMiB != want[j].memMiB || d.users != want[j].users || d.whole != want[j].whole {
				errs = append(errs, &InvariantError{Node: n.name, Device: d.index,
					Detail: fmt.Sprintf("accounting drift: holds %d milli, %dMiB, %d allocations (%d whole); its pods hold %d milli, %dMiB, %d (%d whole)",
						d.milli, d.memMiB, d.users, d.whole, want[j].milli, want[j].memMiB, want[j].users, want[j].whole)})
			}
			if d.milli > MilliPerGPU {
				errs = append(errs, &InvariantError{Node: n.name, Device: d.index, Detail: fmt.Sprintf("shares sum to %d milli-GPUs, more than 1000", d.milli)})
			}
			if d.memMiB > d.memoryMiB {
				errs = append(errs, &InvariantError{Node: n.name, Device: d.index, Detail: fmt.Sprintf("allocations hold %dMiB of %dMiB", d.memMiB, d.memoryMiB)})
			}
			if d.whole > 0 && d.users > 1 {
				errs = append(errs, &InvariantError{Node: n.name, Device: d.index, Detail: fmt.Sprintf("a whole-device allocation shares the device with %d others", d.users-1)})
			}
		}
	}
	return errs
}

// Stranded lists allocations that are not, or not fully, served: on devices
// that turned unhealthy or left the inventory, on nodes without a GPUNode,
// or read from malformed annotations. Sorted by pod, then container.
func (l *Ledger) Stranded() []Stranded {
	l.lock.RLock()
	defer l.lock.RUnlock()
	var out []Stranded
	for i := range l.v.nodes {
		n := &l.v.nodes[i]
		for _, e := range n.pods {
			base := Stranded{Namespace: e.namespace, Name: e.name, UID: e.uid, Node: e.node}
			if e.problem != "" {
				s := base
				s.Reason, s.Detail = StrandedMalformed, e.problem
				out = append(out, s)
			}
			if !n.present() {
				s := base
				s.Reason = StrandedNodeMissing
				out = append(out, s)
				continue
			}
			for _, c := range e.containers {
				for _, u := range c.uuids {
					s := base
					s.Container, s.DeviceUUID = c.name, u
					switch j := n.inv.position(u); {
					case j < 0:
						s.Reason = StrandedDeviceMissing
					case !n.inv.Devices[j].Healthy:
						s.Reason = StrandedDeviceUnhealthy
					default:
						continue
					}
					out = append(out, s)
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b Stranded) int {
		return cmp.Or(
			strings.Compare(a.Namespace, b.Namespace),
			strings.Compare(a.Name, b.Name),
			strings.Compare(string(a.UID), string(b.UID)),
			strings.Compare(a.Container, b.Container),
			strings.Compare(a.DeviceUUID, b.DeviceUUID),
			strings.Compare(string(a.Reason), string(b.Reason)),
		)
	})
	return out
}
