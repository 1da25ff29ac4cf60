package dra

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// The GPUs a pod asks for through ResourceClaims of any driver, for the
// admission loop's queue accounting (docs/queues.md, "Pods with
// ResourceClaims"): its own claims (resourceClaimName), the claims made from
// its templates (resourceClaimTemplateName), and an extended resource backed
// by a DeviceClass (KEP-5004: the class's spec.extendedResourceName, or
// deviceclass.resource.kubernetes.io/<class>).
//
// A request counts when its DeviceClass is one of the GPU classes
// (GPUClasses; default Partita's and NVIDIA's). What it counts:
//   - an allocated claim: what its allocation holds of the GPU requests'
//     devices (ClaimShares: Partita's consumed compute, another driver's
//     largest consumed share of a published capacity, else whole devices);
//   - otherwise what the request asks: count devices, each a whole GPU (1000 milli-GPUs) unless it asks Partita's class for
//     compute capacity, which is its share; allocationMode All counts the
//     most GPUs one node has (GPUCounter; 1 when the source cannot tell); a
//     firstAvailable request counts its smallest GPU alternative;
//     adminAccess counts nothing.
//
// A claim several pods name (resourceClaimName) is charged once: once
// allocated, to the first pod it is reserved for; before, to one member of
// each workload that names it (Shared).
//
// A claim or template the pod names that does not exist yet is Missing: the
// pod cannot be judged, and the loop keeps it waiting until it can.

// GPUClasses are the DeviceClasses whose devices are GPUs.
type GPUClasses []string

// DefaultGPUClasses are Partita's DeviceClass and NVIDIA's (k8s-dra-driver-gpu's
// gpu.nvidia.com, whole GPUs).
var DefaultGPUClasses = GPUClasses{DeviceClassName, "gpu.nvidia.com"}

// Has reports whether class is a GPU class.
func (g GPUClasses) Has(class string) bool { return slices.Contains(g, class) }

// ClaimSource reads what a pod's claims are made of, from caches.
type ClaimSource interface {
	// Claim is a ResourceClaim.
	Claim(namespace, name string) (*resourceapi.ResourceClaim, bool)
	// Template is a ResourceClaimTemplate.
	Template(namespace, name string) (*resourceapi.ResourceClaimTemplate, bool)
	// ExtendedResourceClass is the DeviceClass whose extendedResourceName
	// is name.
	ExtendedResourceClass(name corev1.ResourceName) (string, bool)
}

// Demand is what a pod asks for, or holds, of GPUs through ResourceClaims.
type Demand struct {
	// Milli is the GPUs in milli-GPUs: what allocated claims hold, plus
	// what the others ask.
	Milli int64
	// Devices counts the GPU devices asked for or held.
	Devices int
	// Allocated reports whether every GPU claim is allocated, so that Milli
	// is what they hold.
	Allocated bool
	// Claims say, per GPU claim, what it asks: "claim train-gpu: 2 ×
	// gpu.nvidia.com".
	Claims []string
	// Missing names the claims and templates the pod names that do not
	// exist (yet).
	Missing []string
	// Shared are the claims the pod names by resourceClaimName (which
	// other pods may name too) that Milli charges to it: the loop charges
	// such a claim once per workload. An allocated claim is charged to the
	// first pod it is reserved for alone.
	Shared []SharedClaim
}

// SharedClaim is what one claim a pod names by resourceClaimName charges.
type SharedClaim struct {
	// Claim is namespace/name.
	Claim string
	Milli int64
}

// GPU reports whether the demand makes the pod a GPU pod: it asks for a
// GPU, or names a claim that cannot be read yet.
func (d Demand) GPU() bool { return d.Devices > 0 || len(d.Missing) > 0 }

// Describe is the demand in words: "2 × gpu.nvidia.com (claim c)".
func (d Demand) Describe() string {
	parts := slices.Clone(d.Claims)
	for _, m := range d.Missing {
		parts = append(parts, m+" (not found yet)")
	}
	if len(parts) == 0 {
		return "no GPU claim"
	}
	return strings.Join(parts, "; ")
}

// HasClaims reports whether pod uses DRA at all: pod claims, or an
// extended resource a DeviceClass may back (a request whose name is none of
// the well-known ones). Only such pods need PodDemand.
func HasClaims(pod *corev1.Pod) bool {
	if len(pod.Spec.ResourceClaims) > 0 {
		return true
	}
	for _, c := range pod.Spec.Containers {
		for name := range c.Resources.Requests {
			if isExtended(name) {
				return true
			}
		}
	}
	return false
}

// isExtended reports whether name is an extended resource (one with a
// domain, outside kubernetes.io's own).
func isExtended(name corev1.ResourceName) bool {
	n := string(name)
	i := strings.IndexByte(n, '/')
	if i < 0 {
		return false
	}
	domain := n[:i]
	return domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io") || strings.HasPrefix(n, resourceapi.ResourceDeviceClassPrefix)
}

// PodDemand reads pod's GPU demand through its claims. lookup finds the
// published devices of other drivers, for consumed capacity; nil knows none.
func PodDemand(pod *corev1.Pod, src ClaimSource, classes GPUClasses, lookup DeviceLookup) Demand {
	d := Demand{Allocated: true}
	all := allDevices(src)
	for _, pc := range pod.Spec.ResourceClaims {
		var claim *resourceapi.ResourceClaim
		var spec *resourceapi.ResourceClaimSpec
		var label string
		switch {
		case pc.ResourceClaimName != nil:
			c, ok := src.Claim(pod.Namespace, *pc.ResourceClaimName)
			if !ok {
				d.Missing = append(d.Missing, "ResourceClaim "+*pc.ResourceClaimName)
				d.Allocated = false
				continue
			}
			claim, spec = c, &c.Spec
			label = "claim " + *pc.ResourceClaimName
			if m, charged := d.add(pod, label, claim, spec, classes, lookup, all); charged && m > 0 {
				d.Shared = append(d.Shared, SharedClaim{Claim: pod.Namespace + "/" + c.Name, Milli: m})
			}
			continue
		case pc.ResourceClaimTemplateName != nil:
			if name := generatedClaim(pod, pc.Name); name != "" {
				if c, ok := src.Claim(pod.Namespace, name); ok {
					claim, spec = c, &c.Spec
				}
			}
			if spec == nil {
				t, ok := src.Template(pod.Namespace, *pc.ResourceClaimTemplateName)
				if !ok {
					d.Missing = append(d.Missing, "ResourceClaimTemplate "+*pc.ResourceClaimTemplateName)
					d.Allocated = false
					continue
				}
				spec = &t.Spec.Spec
			}
			label = "claim " + pc.Name + " from template " + *pc.ResourceClaimTemplateName
		default:
			continue
		}
		d.add(pod, label, claim, spec, classes, lookup, all)
	}
	d.addExtended(pod, src, classes, lookup, all)
	if d.Devices == 0 {
		d.Allocated = false
	}
	return d
}

// add counts one claim: held when allocated, asked otherwise. An allocated
// claim reserved for other pods first is charged to the first of them,
// not to pod: it returns the milli-GPUs charged to pod, and whether they
// are.
func (d *Demand) add(pod *corev1.Pod, label string, claim *resourceapi.ResourceClaim, spec *resourceapi.ResourceClaimSpec, classes GPUClasses, lookup DeviceLookup, all func() int64) (int64, bool) {
	gpuReqs := map[string]bool{}
	var milli int64
	devices := 0
	var what []string
	for _, r := range spec.Devices.Requests {
		m, n, class := requestDemand(r, classes, all)
		if n == 0 {
			continue
		}
		gpuReqs[r.Name] = true
		milli += m
		devices += n
		what = append(what, fmt.Sprintf("%d × %s", n, class))
	}
	if devices == 0 {
		return 0, false
	}
	charged := true
	if claim != nil && claim.Status.Allocation != nil {
		var drivers GPUDrivers
		for _, r := range claim.Status.Allocation.Devices.Results {
			if !drivers.Has(r.Driver) {
				drivers = append(drivers, r.Driver)
			}
		}
		milli, devices = 0, 0
		for _, s := range ClaimShares(claim, drivers, lookup) {
			base, _, _ := strings.Cut(s.Request, "/")
			if gpuReqs[base] {
				milli += s.Milli
				devices++
			}
		}
		label += " (allocated)"
		if r := claim.Status.ReservedFor; len(r) > 0 && r[0].Resource == "pods" && r[0].APIGroup == "" && r[0].UID != pod.UID {
			label += ", charged to pod " + r[0].Name
			milli, charged = 0, false
		}
	} else {
		d.Allocated = false
	}
	d.Milli += milli
	d.Devices += devices
	d.Claims = append(d.Claims, label+": "+strings.Join(what, " + "))
	return milli, charged
}

// addExtended counts the container requests of extended resources a GPU
// DeviceClass backs; once kube-scheduler made the pod's claim for them
// (status.extendedResourceClaimStatus), that claim counts instead.
func (d *Demand) addExtended(pod *corev1.Pod, src ClaimSource, classes GPUClasses, lookup DeviceLookup, all func() int64) {
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil && s.ResourceClaimName != "" {
		if c, ok := src.Claim(pod.Namespace, s.ResourceClaimName); ok {
			d.add(pod, "claim "+c.Name+" for extended resources", c, &c.Spec, classes, lookup, all)
			return
		}
	}
	for _, r := range ExtendedGPURequests(pod, src, classes) {
		d.Milli += r.Count * 1000
		d.Devices += int(r.Count)
		d.Allocated = false
		d.Claims = append(d.Claims, fmt.Sprintf("%s of container %s: %d × %s", r.Resource, r.Container, r.Count, r.Class))
	}
}

// ExtendedRequest is a container's request of an extended resource that a
// GPU DeviceClass backs: kube-scheduler allocates Count whole devices of
// Class for it, in a claim it makes when it schedules the pod.
type ExtendedRequest struct {
	Container string
	Resource  corev1.ResourceName
	Class     string
	Count     int64
}

// ExtendedGPURequests are pod's container requests of extended resources a
// GPU DeviceClass backs (the class's spec.extendedResourceName, or
// deviceclass.resource.kubernetes.io/<class>), in container and resource
// name order.
func ExtendedGPURequests(pod *corev1.Pod, src ClaimSource, classes GPUClasses) []ExtendedRequest {
	var out []ExtendedRequest
	for _, ctr := range pod.Spec.Containers {
		names := make([]corev1.ResourceName, 0, len(ctr.Resources.Requests))
		for name := range ctr.Resources.Requests {
			if isExtended(name) {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		for _, name := range names {
			q := ctr.Resources.Requests[name]
			class, ok := strings.CutPrefix(string(name), resourceapi.ResourceDeviceClassPrefix)
			if !ok {
				if class, ok = src.ExtendedResourceClass(name); !ok {
					continue
				}
			}
			if !classes.Has(class) || q.Value() <= 0 {
				continue
			}
			out = append(out, ExtendedRequest{Container: ctr.Name, Resource: name, Class: class, Count: min(q.Value(), maxDevicesAsked)})
		}
	}
	return out
}

// requestDemand is what one request asks of GPU classes: milli-GPUs,
// devices, and the class; 0 devices when it asks for no GPU.
func requestDemand(r resourceapi.DeviceRequest, classes GPUClasses, all func() int64) (milli int64, devices int, class string) {
	if e := r.Exactly; e != nil {
		if !classes.Has(e.DeviceClassName) || (e.AdminAccess != nil && *e.AdminAccess) {
			return 0, 0, ""
		}
		m, n := amount(e.DeviceClassName, e.AllocationMode, e.Count, e.Capacity, all)
		return m, n, e.DeviceClassName
	}
	best := int64(-1)
	for _, s := range r.FirstAvailable {
		if !classes.Has(s.DeviceClassName) {
			// An alternative of no GPU: the request may take no GPU at all.
			return 0, 0, ""
		}
		m, n := amount(s.DeviceClassName, s.AllocationMode, s.Count, s.Capacity, all)
		if best < 0 || m < best {
			best, devices, class = m, n, s.DeviceClassName
		}
	}
	return max(best, 0), devices, class
}

// maxDevicesAsked bounds the devices one request or extended resource is
// read as asking for: the API server takes any positive count, and a
// tenant's absurd one must not overflow the queue's sums (no cluster has
// this many GPUs, so the pod waits all the same).
const maxDevicesAsked = 1 << 20

// amount is what count devices of class ask, in milli-GPUs.
func amount(class string, mode resourceapi.DeviceAllocationMode, count int64, capacity *resourceapi.CapacityRequirements, all func() int64) (milli int64, devices int) {
	var n int64
	switch mode {
	case resourceapi.DeviceAllocationModeAll:
		n = 1
		if all != nil {
			n = min(max(all(), 1), maxDevicesAsked)
		}
	default:
		n = min(max(count, 1), maxDevicesAsked)
	}
	per := int64(1000)
	if capacity != nil && class == DeviceClassName {
		if q, ok := capacity.Requests[CapacityCompute]; ok {
			per = clampMilli(q.Value())
		}
	}
	return n * per, int(n)
}

// GPUCounter is a ClaimSource that knows the most GPUs one node has
// (published devices of GPU drivers), what an allocationMode All request
// may take: until it is allocated, it is charged that many, an upper
// bound, so that All is no way around a queue's limit.
type GPUCounter interface {
	MostGPUsOnANode() int
}

// allDevices is what an All request counts, read once per PodDemand: the
// most GPUs on a node when src knows it, else 1.
func allDevices(src ClaimSource) func() int64 {
	counter, ok := src.(GPUCounter)
	if !ok {
		return func() int64 { return 1 }
	}
	var n int64 = -1
	return func() int64 {
		if n < 0 {
			n = int64(max(counter.MostGPUsOnANode(), 1))
		}
		return n
	}
}

// generatedClaim is the claim kube-controller-manager made for the pod claim
// named claim from its template, as pod.status records it; "" before.
func generatedClaim(pod *corev1.Pod, claim string) string {
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == claim && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}
