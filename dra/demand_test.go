package dra

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// source is a ClaimSource over maps.
type source struct {
	claims    map[string]*resourceapi.ResourceClaim
	templates map[string]*resourceapi.ResourceClaimTemplate
	extended  map[corev1.ResourceName]string
}

func (s source) Claim(ns, name string) (*resourceapi.ResourceClaim, bool) {
	c, ok := s.claims[ns+"/"+name]
	return c, ok
}

func (s source) Template(ns, name string) (*resourceapi.ResourceClaimTemplate, bool) {
	t, ok := s.templates[ns+"/"+name]
	return t, ok
}

func (s source) ExtendedResourceClass(name corev1.ResourceName) (string, bool) {
	c, ok := s.extended[name]
	return c, ok
}

func exact(name, class string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, Count: count, AllocationMode: resourceapi.DeviceAllocationModeExactCount}}
}

func specOf(reqs ...resourceapi.DeviceRequest) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}
}

// counting is a source that knows the most GPUs one node has.
type counting struct {
	source
	most int
}

func (c counting) MostGPUsOnANode() int { return c.most }

// TestAllocationModeAll: an All request not allocated yet is charged the
// most GPUs one node has, so that it is no way around a queue's limit; 1
// when the source cannot tell.
func TestAllocationModeAll(t *testing.T) {
	all := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "all", Namespace: "ns"}, Spec: specOf(resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu.nvidia.com", AllocationMode: resourceapi.DeviceAllocationModeAll}})}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "uid-p"},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("all")}}}}
	src := source{claims: map[string]*resourceapi.ResourceClaim{"ns/all": all}}
	for name, tc := range map[string]struct {
		src  ClaimSource
		want int64
	}{
		"the most GPUs of a node":   {src: counting{source: src, most: 8}, want: 8000},
		"no node known: one":        {src: counting{source: src}, want: 1000},
		"a source that cannot tell": {src: src, want: 1000},
	} {
		t.Run(name, func(t *testing.T) {
			if got := PodDemand(pod, tc.src, DefaultGPUClasses, nil).Milli; got != tc.want {
				t.Errorf("Milli = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPodDemand(t *testing.T) {
	ns := "team-a"
	pod := func(mut func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, UID: "uid-p"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}
		mut(p)
		return p
	}
	named := func(claim string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "gpu", ResourceClaimName: ptr.To(claim)})
		}
	}
	fromTemplate := func(tmpl, made string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To(tmpl)})
			if made != "" {
				p.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To(made)}}
			}
		}
	}
	twoGPUs := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "two", Namespace: ns}, Spec: specOf(exact("gpus", "gpu.nvidia.com", 2))}
	allocated := twoGPUs.DeepCopy()
	allocated.Name = "two-allocated"
	allocated.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpus", Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-0"},
		{Request: "gpus", Driver: "gpu.nvidia.com", Pool: "n1", Device: "gpu-1"},
	}}}
	reservedElsewhere := allocated.DeepCopy()
	reservedElsewhere.Name = "shared"
	reservedElsewhere.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "first", UID: "uid-first"}, {Resource: "pods", Name: "p", UID: "uid-p"}}
	reservedHere := reservedElsewhere.DeepCopy()
	reservedHere.Name = "shared-here"
	reservedHere.Status.ReservedFor = reservedHere.Status.ReservedFor[1:]
	nic := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "nic", Namespace: ns}, Spec: specOf(exact("eth", "nic.example.com", 1))}
	slice := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "slice", Namespace: ns}, Spec: specOf(resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: DeviceClassName, Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{CapacityCompute: resource.MustParse("250")}}}})}
	admin := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "admin", Namespace: ns}, Spec: specOf(resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: "gpu.nvidia.com", AllocationMode: resourceapi.DeviceAllocationModeAll, AdminAccess: ptr.To(true)}})}
	choice := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "choice", Namespace: ns}, Spec: specOf(resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "big", DeviceClassName: "gpu.nvidia.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 4},
		{Name: "small", DeviceClassName: "gpu.nvidia.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}})}
	src := source{
		claims: map[string]*resourceapi.ResourceClaim{
			ns + "/two": twoGPUs, ns + "/two-allocated": allocated, ns + "/nic": nic, ns + "/slice": slice, ns + "/admin": admin, ns + "/choice": choice,
			ns + "/shared": reservedElsewhere, ns + "/shared-here": reservedHere,
		},
		templates: map[string]*resourceapi.ResourceClaimTemplate{ns + "/one-gpu": {Spec: resourceapi.ResourceClaimTemplateSpec{Spec: specOf(exact("gpu", "gpu.nvidia.com", 1))}}},
		extended:  map[corev1.ResourceName]string{"example.com/gpu": "gpu.nvidia.com"},
	}
	cases := map[string]struct {
		pod  *corev1.Pod
		want Demand
	}{
		"no claims": {pod: pod(func(*corev1.Pod) {}), want: Demand{}},
		"its own claim of two GPUs": {
			pod: pod(named("two")),
			want: Demand{Milli: 2000, Devices: 2, Claims: []string{"claim two: 2 × gpu.nvidia.com"},
				Shared: []SharedClaim{{Claim: ns + "/two", Milli: 2000}}},
		},
		"a shared claim reserved for another pod first is charged to that pod": {
			pod: pod(named("shared")),
			want: Demand{Milli: 0, Devices: 2, Allocated: true,
				Claims: []string{"claim shared (allocated), charged to pod first: 2 × gpu.nvidia.com"}},
		},
		"a shared claim reserved for the pod first is charged to it": {
			pod: pod(named("shared-here")),
			want: Demand{Milli: 2000, Devices: 2, Allocated: true, Claims: []string{"claim shared-here (allocated): 2 × gpu.nvidia.com"},
				Shared: []SharedClaim{{Claim: ns + "/shared-here", Milli: 2000}}},
		},
		"an allocated claim counts what it holds": {
			pod: pod(named("two-allocated")),
			want: Demand{Milli: 2000, Devices: 2, Allocated: true, Claims: []string{"claim two-allocated (allocated): 2 × gpu.nvidia.com"},
				Shared: []SharedClaim{{Claim: ns + "/two-allocated", Milli: 2000}}},
		},
		"a NIC claim is no GPU": {pod: pod(named("nic")), want: Demand{}},
		"a missing claim cannot be judged": {
			pod:  pod(named("later")),
			want: Demand{Missing: []string{"ResourceClaim later"}},
		},
		"a template before its claim is made": {
			pod:  pod(fromTemplate("one-gpu", "")),
			want: Demand{Milli: 1000, Devices: 1, Claims: []string{"claim gpu from template one-gpu: 1 × gpu.nvidia.com"}},
		},
		"the claim made from a template, allocated": {
			pod:  pod(fromTemplate("one-gpu", "two-allocated")),
			want: Demand{Milli: 2000, Devices: 2, Allocated: true, Claims: []string{"claim gpu from template one-gpu (allocated): 2 × gpu.nvidia.com"}},
		},
		"Partita's class with compute capacity is a share": {
			pod:  pod(named("slice")),
			want: Demand{Milli: 250, Devices: 1, Claims: []string{"claim slice: 1 × gpu.partita.dev"}, Shared: []SharedClaim{{Claim: ns + "/slice", Milli: 250}}},
		},
		"admin access holds nothing": {pod: pod(named("admin")), want: Demand{}},
		"firstAvailable counts its smallest alternative": {
			pod:  pod(named("choice")),
			want: Demand{Milli: 1000, Devices: 1, Claims: []string{"claim choice: 1 × gpu.nvidia.com"}, Shared: []SharedClaim{{Claim: ns + "/choice", Milli: 1000}}},
		},
		"an extended resource a GPU class backs": {
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"example.com/gpu": resource.MustParse("3"), "example.com/nic": resource.MustParse("1")}
			}),
			want: Demand{Milli: 3000, Devices: 3, Claims: []string{"example.com/gpu of container main: 3 × gpu.nvidia.com"}},
		},
		"the implicit extended resource of a class": {
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"deviceclass.resource.kubernetes.io/gpu.nvidia.com": resource.MustParse("1")}
			}),
			want: Demand{Milli: 1000, Devices: 1, Claims: []string{"deviceclass.resource.kubernetes.io/gpu.nvidia.com of container main: 1 × gpu.nvidia.com"}},
		},
		"the extended resource's claim once made": {
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"example.com/gpu": resource.MustParse("2")}
				p.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "two-allocated"}
			}),
			want: Demand{Milli: 2000, Devices: 2, Allocated: true, Claims: []string{"claim two-allocated for extended resources (allocated): 2 × gpu.nvidia.com"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := PodDemand(tc.pod, src, DefaultGPUClasses, nil)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("PodDemand (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestHasClaims(t *testing.T) {
	cases := map[string]struct {
		req  corev1.ResourceList
		want bool
	}{
		"cpu and memory":      {req: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}, want: false},
		"hugepages":           {req: corev1.ResourceList{"hugepages-2Mi": resource.MustParse("1Mi")}, want: false},
		"an extended one":     {req: corev1.ResourceList{"example.com/gpu": resource.MustParse("1")}, want: true},
		"a class's implicit":  {req: corev1.ResourceList{"deviceclass.resource.kubernetes.io/x": resource.MustParse("1")}, want: true},
		"kubernetes.io's own": {req: corev1.ResourceList{"storage.kubernetes.io/x": resource.MustParse("1")}, want: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: tc.req}}}}}
			if got := HasClaims(p); got != tc.want {
				t.Errorf("HasClaims = %v, want %v", got, tc.want)
			}
		})
	}
}
