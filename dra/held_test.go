package dra

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func result(driver, device, request string, consumed map[resourceapi.QualifiedName]string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Driver: driver, Pool: "n1", Device: device, Request: request}
	if consumed != nil {
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
		for k, v := range consumed {
			r.ConsumedCapacity[k] = resource.MustParse(v)
		}
	}
	return r
}

func claimOf(name string, podUID types.UID, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a"}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: podUID}}
	return c
}

func TestClaimShares(t *testing.T) {
	foreign := &resourceapi.Device{Name: "gpu-0", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		"memory": {Value: resource.MustParse("80Gi")},
		"cores":  {Value: resource.MustParse("100")},
	}}
	lookup := func(id DeviceID) (*resourceapi.Device, bool) {
		return foreign, id == DeviceID{Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0"}
	}
	admin := result(DriverName, "gpu-3", "watch", nil)
	admin.AdminAccess = ptrTo(true)
	claim := claimOf("c", "u1",
		result(DriverName, "gpu-0", "gpu/mib81559", map[resourceapi.QualifiedName]string{CapacityCompute: "250", CapacityMemory: "20389Mi"}),
		result(DriverName, "gpu-1", "gpu", nil),
		result("gpu.nvidia.com", "gpu-0", "n", map[resourceapi.QualifiedName]string{"memory": "20Gi", "cores": "10"}),
		result("gpu.nvidia.com", "gpu-7", "n", nil),
		result("nic.example.com", "eth0", "n", nil),
		admin,
	)
	key := types.NamespacedName{Namespace: "team-a", Name: "c"}
	want := []Share{
		{Claim: key, Driver: DriverName, Pool: "n1", Device: "gpu-0", Request: "gpu/mib81559", Milli: 250, MemoryMiB: 20389},
		{Claim: key, Driver: DriverName, Pool: "n1", Device: "gpu-1", Request: "gpu", Milli: 1000},
		{Claim: key, Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0", Request: "n", Milli: 250, MemoryMiB: 20480},
		{Claim: key, Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-7", Request: "n", Milli: 1000},
	}
	got := ClaimShares(claim, DefaultGPUDrivers, lookup)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("shares (-want,+got):\n%s", diff)
	}
	if HeldMilli(got) != 2500 {
		t.Errorf("held %d, want 2500", HeldMilli(got))
	}
	if ClaimShares(&resourceapi.ResourceClaim{}, DefaultGPUDrivers, nil) != nil {
		t.Error("an unallocated claim holds something")
	}
}

func TestPodShares(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team-a", UID: "u1"}}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{
		{Name: "partita-gpu-0", ResourceClaimTemplateName: ptrTo("partita-gpu-1x250m-x")},
		{Name: "shared", ResourceClaimName: ptrTo("shared")},
		{Name: "later", ResourceClaimTemplateName: ptrTo("t")},
	}
	pod.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "partita-gpu-0", ResourceClaimName: ptrTo("p-partita-gpu-0-abcde")}}
	claims := map[string]*resourceapi.ResourceClaim{
		"p-partita-gpu-0-abcde": claimOf("p-partita-gpu-0-abcde", "u1", result(DriverName, "gpu-0", "gpu/mib81559", map[resourceapi.QualifiedName]string{CapacityCompute: "250"})),
		// Allocated, but for another pod.
		"shared": claimOf("shared", "other", result(DriverName, "gpu-1", "gpu", nil)),
	}
	get := func(ns, name string) (*resourceapi.ResourceClaim, bool) { c, ok := claims[name]; return c, ok }
	names, pending := PodClaimNames(pod)
	if diff := cmp.Diff([]string{"p-partita-gpu-0-abcde", "shared"}, names); diff != "" || pending != 1 {
		t.Errorf("claim names (-want,+got):\n%s pending %d", diff, pending)
	}
	shares := PodShares(pod, get, DefaultGPUDrivers, nil)
	if len(shares) != 1 || shares[0].Milli != 250 {
		t.Errorf("shares = %+v, want the template claim's 250", shares)
	}
	per := PerDevice(append(shares, shares...))
	if per[DeviceID{DriverName, "n1", "gpu-0"}] != 250 {
		t.Errorf("a claim seen twice counts twice: %v", per)
	}
}
