package dra

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// FuzzPodDemand reads a tenant's claims of any count and capacity, and an
// extended resource of any quantity: the demand never panics and never
// goes negative (which would give the queue room it does not have).
func FuzzPodDemand(f *testing.F) {
	f.Add(int64(1), "250", "1", true)
	f.Add(int64(9223372036854775807), "9223372036854775807", "9223372036854775807", false)
	f.Add(int64(-5), "-1", "1e18", true)
	f.Fuzz(func(t *testing.T, count int64, compute, extended string, all bool) {
		mode := resourceapi.DeviceAllocationModeExactCount
		if all {
			mode = resourceapi.DeviceAllocationModeAll
		}
		req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: DeviceClassName, AllocationMode: mode, Count: count}}
		if q, err := resource.ParseQuantity(compute); err == nil {
			req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{CapacityCompute: q}}
		}
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"}, Spec: specOf(req, exact("more", "gpu.nvidia.com", count))}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-p"},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("c")}},
				Containers:     []corev1.Container{{Name: "main"}},
			}}
		if q, err := resource.ParseQuantity(extended); err == nil {
			pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceName(resourceapi.ResourceDeviceClassPrefix + "gpu.nvidia.com"): q}
		}
		src := source{claims: map[string]*resourceapi.ResourceClaim{"ns/c": claim}}
		d := PodDemand(pod, src, DefaultGPUClasses, nil)
		if d.Milli < 0 || d.Devices < 0 {
			t.Fatalf("negative demand %+v for count %d, compute %q, extended %q", d, count, compute, extended)
		}
	})
}
