package dra

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// The GPUs a pod holds through its ResourceClaims: the one definition the
// queue accounting, ctl and the console use in dra mode, and for GPUs of
// other DRA drivers in any mode.
//
// A pod holds what the allocations of the claims it uses hold: for each
// allocated device of a GPU driver, its share in milli-GPUs.
//   - Partita's devices: the compute the allocation consumed
//     (consumedCapacity[compute]); an allocation without it holds the device
//     whole.
//   - Another driver's device that the allocation consumed capacity of, when
//     the device is known (a DeviceLookup over its ResourceSlices): the
//     largest share of any capacity, ceil(1000 × consumed / capacity).
//   - Otherwise the whole device: 1000.
//
// Results with admin access hold nothing (they monitor devices, others keep
// using them). A claim used by several pods holds its devices once: Share
// names the claim, so that a caller charging pods can count each claim once.

// Share is one device a claim holds, and how much of it.
type Share struct {
	// Claim is the ResourceClaim.
	Claim types.NamespacedName
	// Driver, Pool and Device name the device.
	Driver, Pool, Device string
	// Request is the claim's request (with its subrequest, "gpu/mib81559").
	Request string
	// Milli is the share of the device in milli-GPUs, 1 to 1000.
	Milli int64
	// MemoryMiB is the memory the allocation consumed, 0 when it says none.
	MemoryMiB int64
}

// DeviceID is a device across drivers and pools.
type DeviceID struct {
	Driver, Pool, Device string
}

// ID is the share's device.
func (s Share) ID() DeviceID { return DeviceID{Driver: s.Driver, Pool: s.Pool, Device: s.Device} }

// DeviceLookup finds a published device, for the capacities of other
// drivers' devices; nil knows none.
type DeviceLookup func(id DeviceID) (*resourceapi.Device, bool)

// GPUDrivers are the DRA drivers whose devices are GPUs.
type GPUDrivers []string

// DefaultGPUDrivers are Partita's and NVIDIA's (k8s-dra-driver-gpu, whose
// GPUs and MIG devices are gpu.nvidia.com).
var DefaultGPUDrivers = GPUDrivers{DriverName, "gpu.nvidia.com"}

// Has reports whether driver publishes GPUs.
func (g GPUDrivers) Has(driver string) bool { return slices.Contains(g, driver) }

// ClaimShares are the GPU devices claim's allocation holds; nil when it is
// not allocated.
func ClaimShares(claim *resourceapi.ResourceClaim, drivers GPUDrivers, lookup DeviceLookup) []Share {
	if claim == nil || claim.Status.Allocation == nil {
		return nil
	}
	key := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}
	var out []Share
	for _, r := range claim.Status.Allocation.Devices.Results {
		if !drivers.Has(r.Driver) || (r.AdminAccess != nil && *r.AdminAccess) {
			continue
		}
		s := Share{Claim: key, Driver: r.Driver, Pool: r.Pool, Device: r.Device, Request: r.Request, Milli: gpu.MilliPerGPU}
		if q, ok := r.ConsumedCapacity[CapacityMemory]; ok {
			s.MemoryMiB = (q.Value() + (1 << 20) - 1) >> 20
		}
		switch {
		case r.Driver == DriverName:
			if q, ok := r.ConsumedCapacity[CapacityCompute]; ok {
				s.Milli = clampMilli(q.Value())
			}
		case len(r.ConsumedCapacity) > 0 && lookup != nil:
			if d, ok := lookup(s.ID()); ok {
				s.Milli = shareOf(d, r.ConsumedCapacity)
			}
		}
		out = append(out, s)
	}
	return out
}

// shareOf is the largest share of any capacity of d that consumed names.
func shareOf(d *resourceapi.Device, consumed map[resourceapi.QualifiedName]resource.Quantity) int64 {
	best := int64(0)
	for name, q := range consumed {
		c, ok := d.Capacity[name]
		if !ok || c.Value.Sign() <= 0 {
			continue
		}
		// Milli-values keep fractional capacities exact; ceil so that
		// a sliver never rounds to nothing.
		num, den := q.MilliValue()*gpu.MilliPerGPU, c.Value.MilliValue()
		best = max(best, (num+den-1)/den)
	}
	if best == 0 {
		return gpu.MilliPerGPU
	}
	return clampMilli(best)
}

func clampMilli(v int64) int64 { return min(gpu.MilliPerGPU, max(1, v)) }

// ClaimGetter reads a ResourceClaim from a cache.
type ClaimGetter func(namespace, name string) (*resourceapi.ResourceClaim, bool)

// PodClaimNames are the ResourceClaims pod uses, by name in its namespace:
// those it names itself (resourceClaimName) and those made for it from
// templates, as pod.status.resourceClaimStatuses records them. pending
// counts the template claims not made yet.
func PodClaimNames(pod *corev1.Pod) (names []string, pending int) {
	for _, c := range pod.Spec.ResourceClaims {
		switch {
		case c.ResourceClaimName != nil:
			names = append(names, *c.ResourceClaimName)
		case c.ResourceClaimTemplateName != nil:
			i := slices.IndexFunc(pod.Status.ResourceClaimStatuses, func(s corev1.PodResourceClaimStatus) bool { return s.Name == c.Name })
			if i < 0 || pod.Status.ResourceClaimStatuses[i].ResourceClaimName == nil {
				pending++
				continue
			}
			names = append(names, *pod.Status.ResourceClaimStatuses[i].ResourceClaimName)
		}
	}
	// A claim made by the extended-resource path (KEP-5004) is recorded in
	// status.extendedResourceClaimStatus, not in spec.resourceClaims.
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil && s.ResourceClaimName != "" {
		names = append(names, s.ResourceClaimName)
	}
	return names, pending
}

// PodShares are the GPU devices pod holds through its ResourceClaims. A
// claim that is missing from get, or allocated but not reserved for pod,
// holds nothing for it.
func PodShares(pod *corev1.Pod, get ClaimGetter, drivers GPUDrivers, lookup DeviceLookup) []Share {
	names, _ := PodClaimNames(pod)
	var out []Share
	for _, n := range names {
		claim, ok := get(pod.Namespace, n)
		if !ok || !reservedFor(claim, pod.UID) {
			continue
		}
		out = append(out, ClaimShares(claim, drivers, lookup)...)
	}
	return out
}

func reservedFor(claim *resourceapi.ResourceClaim, uid types.UID) bool {
	return slices.ContainsFunc(claim.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool {
		return r.Resource == "pods" && r.UID == uid
	})
}

// HeldMilli sums shares in milli-GPUs.
func HeldMilli(shares []Share) int64 {
	var sum int64
	for _, s := range shares {
		sum += s.Milli
	}
	return sum
}

// PerDevice sums shares per device, counting each claim's share of a device
// once however many pods use the claim.
func PerDevice(shares []Share) map[DeviceID]int64 {
	type key struct {
		claim types.NamespacedName
		dev   DeviceID
		req   string
	}
	seen := map[key]bool{}
	out := map[DeviceID]int64{}
	for _, s := range shares {
		k := key{s.Claim, s.ID(), s.Request}
		if seen[k] {
			continue
		}
		seen[k] = true
		out[s.ID()] += s.Milli
	}
	return out
}

// AllocationFromClaims is what pod holds on its node through Partita's pod
// claims (those the webhook writes in dra mode), in the form the
// extender's allocation annotations have: per GPU container, its devices on
// inv and its slice of each. ok is false when the pod has no allocated
// Partita claim on the node; a container whose claim is not allocated yet
// is left out.
func AllocationFromClaims(pod *corev1.Pod, inv *gpu.NodeInventory, get ClaimGetter) (alloc *gpu.PodAllocation, ok bool) {
	alloc = &gpu.PodAllocation{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Node: pod.Spec.NodeName}
	for _, ctr := range pod.Spec.Containers {
		i := slices.IndexFunc(ctr.Resources.Claims, func(c corev1.ResourceClaim) bool { return strings.HasPrefix(c.Name, v1alpha1.PodClaimPrefix) })
		if i < 0 {
			continue
		}
		claimName := ""
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == ctr.Resources.Claims[i].Name && s.ResourceClaimName != nil {
				claimName = *s.ResourceClaimName
			}
		}
		claim, found := get(pod.Namespace, claimName)
		if claimName == "" || !found || !reservedFor(claim, pod.UID) {
			continue
		}
		ca := gpu.ContainerAllocation{Container: ctr.Name}
		for _, s := range ClaimShares(claim, GPUDrivers{DriverName}, nil) {
			if s.Pool != inv.Name {
				continue
			}
			d, found := deviceNamed(inv, s.Device)
			if !found {
				continue
			}
			ca.DeviceUUIDs = append(ca.DeviceUUIDs, d.UUID)
			ca.DeviceIndexes = append(ca.DeviceIndexes, d.Index)
			ca.Milli = s.Milli
			if s.Milli < gpu.MilliPerGPU || (s.MemoryMiB > 0 && s.MemoryMiB < d.MemoryMiB) {
				ca.MemoryMiB = s.MemoryMiB
			}
		}
		if len(ca.DeviceUUIDs) > 0 {
			alloc.Containers = append(alloc.Containers, ca)
		}
	}
	return alloc, len(alloc.Containers) > 0
}

func deviceNamed(inv *gpu.NodeInventory, name string) (gpu.Device, bool) {
	for _, d := range inv.Devices {
		if DeviceName(d.Index) == name {
			return d, true
		}
	}
	return gpu.Device{}, false
}
