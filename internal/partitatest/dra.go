package partitatest

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// ResourceSliceWrapper builds a ResourceSlice of one node, as a DRA driver
// (NVIDIA's, in tests that play one) publishes it.
type ResourceSliceWrapper struct{ resourceapi.ResourceSlice }

// MakeResourceSlice starts a node-local slice of driver with a pool named
// after the node and no device.
func MakeResourceSlice(name, driver, node string) *ResourceSliceWrapper {
	return &ResourceSliceWrapper{resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
		},
	}}
}

// Obj returns the slice.
func (w *ResourceSliceWrapper) Obj() *resourceapi.ResourceSlice { return &w.ResourceSlice }

// GPU adds a device with NVIDIA's attributes (uuid, productName) and a
// memory capacity; an empty uuid leaves the attribute out.
func (w *ResourceSliceWrapper) GPU(name, uuid, product, memory string) *ResourceSliceWrapper {
	d := resourceapi.Device{
		Name:       name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"productName": {StringValue: ptr.To(product)}},
		Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(memory)}},
	}
	if uuid != "" {
		d.Attributes["uuid"] = resourceapi.DeviceAttribute{StringValue: ptr.To(uuid)}
	}
	w.Spec.Devices = append(w.Spec.Devices, d)
	return w
}

// Attribute sets a string attribute of the device named device.
func (w *ResourceSliceWrapper) Attribute(device string, name resourceapi.QualifiedName, value string) *ResourceSliceWrapper {
	for i := range w.Spec.Devices {
		if w.Spec.Devices[i].Name == device {
			if w.Spec.Devices[i].Attributes == nil {
				w.Spec.Devices[i].Attributes = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
			}
			w.Spec.Devices[i].Attributes[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(value)}
		}
	}
	return w
}

// ClaimWrapper builds a ResourceClaim.
type ClaimWrapper struct{ resourceapi.ResourceClaim }

// MakeResourceClaim starts a claim with no request.
func MakeResourceClaim(name, namespace string) *ClaimWrapper {
	return &ClaimWrapper{resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}}
}

// Obj returns the claim.
func (w *ClaimWrapper) Obj() *resourceapi.ResourceClaim { return &w.ResourceClaim }

// Devices adds a request for count devices of class.
func (w *ClaimWrapper) Devices(request, class string, count int64) *ClaimWrapper {
	w.Spec.Devices.Requests = append(w.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: request, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
	}})
	return w
}

// Allocated records an allocation of devices of driver in pool to request,
// reserved for the pod of uid (none when empty).
func (w *ClaimWrapper) Allocated(request, driver, pool, uid string, devices ...string) *ClaimWrapper {
	if w.Status.Allocation == nil {
		w.Status.Allocation = &resourceapi.AllocationResult{}
	}
	for _, d := range devices {
		w.Status.Allocation.Devices.Results = append(w.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: request, Driver: driver, Pool: pool, Device: d})
	}
	if uid != "" {
		w.Status.ReservedFor = append(w.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod", UID: types.UID(uid)})
	}
	return w
}

// ClaimSource is a dra.ClaimSource over fixed objects, for tests.
type ClaimSource struct {
	Claims    []*resourceapi.ResourceClaim
	Templates []*resourceapi.ResourceClaimTemplate
	Classes   []*resourceapi.DeviceClass
}

// Claim finds a claim.
func (s ClaimSource) Claim(namespace, name string) (*resourceapi.ResourceClaim, bool) {
	for _, c := range s.Claims {
		if c.Namespace == namespace && c.Name == name {
			return c, true
		}
	}
	return nil, false
}

// Template finds a template.
func (s ClaimSource) Template(namespace, name string) (*resourceapi.ResourceClaimTemplate, bool) {
	for _, t := range s.Templates {
		if t.Namespace == namespace && t.Name == name {
			return t, true
		}
	}
	return nil, false
}

// ExtendedResourceClass finds the class whose extendedResourceName is name.
func (s ClaimSource) ExtendedResourceClass(name corev1.ResourceName) (string, bool) {
	for _, c := range s.Classes {
		if c.Spec.ExtendedResourceName != nil && *c.Spec.ExtendedResourceName == string(name) {
			return c.Name, true
		}
	}
	return "", false
}

// NVIDIAClaimWorld is two nodes n-0 and n-1 whose one GPU each NVIDIA's
// DRA driver publishes, its DeviceClass gpu.nvidia.com, and claims
// c0..c(n-1) in namespace ns of one GPU each, with extra objects: the
// nodes, and every object for a client to hold.
func NVIDIAClaimWorld(claims int, extra ...client.Object) ([]*corev1.Node, []client.Object) {
	var objs []client.Object
	var nodes []*corev1.Node
	for i := range 2 {
		name := fmt.Sprintf("n-%d", i)
		nodes = append(nodes, MakeNode(name).Obj())
		objs = append(objs, MakeResourceSlice(name+"-nvidia", "gpu.nvidia.com", name).GPU("gpu-0", "GPU-"+name, "H100", "80Gi").Obj())
	}
	objs = append(objs, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.nvidia.com"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.nvidia.com"`}}}}})
	for i := range claims {
		objs = append(objs, MakeResourceClaim(fmt.Sprintf("c%d", i), "ns").Devices("gpu", "gpu.nvidia.com", 1).Obj())
	}
	return nodes, append(objs, extra...)
}

// ClaimGangMember is a gated member of gang "train" of queue "a" in
// namespace ns whose GPU is the ResourceClaim claim.
func ClaimGangMember(name, claim string) *corev1.Pod {
	return MakePod(name, "ns").UID(types.UID("uid-"+name)).Queue("a").PodGroup("train").Claim("gpu", claim).
		SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)).Obj()
}
