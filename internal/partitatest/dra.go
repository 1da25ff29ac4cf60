package partitatest

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
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
