package report

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// draPod is a pod as the webhook writes it in dra mode: the canonical
// annotations and a claim of Partita's, made (claim name) or not ("").
func draPod(name, fraction, claim string) *corev1.Pod {
	p := pt.MakePod(name, "team-a").GPUFraction(fraction).Obj()
	req, errs := gpu.ParsePod(p)
	if len(errs) > 0 {
		panic(errs)
	}
	out, _, err := dra.ApplyClaims(gpu.ApplyCanonical(p, req, 81920), req, []int64{81920})
	if err != nil {
		panic(err)
	}
	if claim != "" {
		out.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: dra.PodClaimName(0), ResourceClaimName: &claim}}
	}
	return out
}

func allocatedClaim(name string, pod *corev1.Pod, node, device string, milli int64) resourceapi.ResourceClaim {
	c := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pod.Namespace}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Driver: dra.DriverName, Pool: node, Device: device, Request: "gpu/mib81920",
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			dra.CapacityCompute: *resource.NewQuantity(milli, resource.DecimalSI),
			dra.CapacityMemory:  *resource.NewQuantity(milli*81920/1000<<20, resource.BinarySI),
		},
	}}}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	return c
}

func TestWhyClaims(t *testing.T) {
	busy := draPod("busy", "0.75", "busy-gpu")
	busy.Spec.NodeName = "n1"
	waiting := draPod("wait", "0.5", "wait-gpu")
	waiting.Spec.SchedulingGates = nil
	waiting.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/1 nodes are available: 1 cannot allocate all claims."}}
	c := &Cluster{
		GPUNodes:       []v1alpha1.GPUNode{*pt.MakeGPUNode("n1").Devices(1, "H100", 81920).Obj()},
		Pods:           []corev1.Pod{*busy, *waiting},
		ResourceClaims: []resourceapi.ResourceClaim{allocatedClaim("busy-gpu", busy, "n1", "gpu-0", 750), {ObjectMeta: metav1.ObjectMeta{Name: "wait-gpu", Namespace: "team-a"}}},
	}
	r, err := Why(c, "team-a", "wait", now)
	if err != nil {
		t.Fatal(err)
	}
	want := "kube-scheduler's DRA plugin found no device for its claims: 0/1 nodes are available: 1 cannot allocate all claims.; counted from the ResourceClaims' allocations, the emptiest gpu.partita.dev device on the 1 candidate nodes has 0.25 GPU and 20480Mi free, and the pod asks for 0.5 of a GPU"
	if !r.Waiting || !strings.Contains(r.Summary, want) {
		t.Errorf("summary %q, want it to contain %q", r.Summary, want)
	}
	r, err = Why(c, "team-a", "busy", now)
	if err != nil {
		t.Fatal(err)
	}
	if r.Waiting || !strings.Contains(r.Summary, "bound to n1, its claims hold n1 gpu-0 (0.75 GPU)") {
		t.Errorf("bound pod: %+v", r)
	}
}

func TestWhyOtherDriversClaims(t *testing.T) {
	q := pt.MakeQueue("team-a").GPU("1", "1", 1).Obj()
	q.Status.Allocated = corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("1")}
	held := pt.MakeResourceClaim("held", "team-a").Devices("gpu", "gpu.nvidia.com", 1).Allocated("gpu", "gpu.nvidia.com", "n1", "uid-running", "gpu-0").Obj()
	want := pt.MakeResourceClaim("want", "team-a").Devices("gpu", "gpu.nvidia.com", 1).Obj()
	running := pt.MakePod("running", "team-a").UID("uid-running").Queue("team-a").Claim("gpu", "held").Node("n1").Phase(corev1.PodRunning).Obj()
	waiting := pt.MakePod("second", "team-a").Queue("team-a").Claim("gpu", "want").SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj()
	nic := pt.MakePod("nic", "team-a").Claim("nic", "a-nic").Obj()
	c := &Cluster{
		GPUNodes:       []v1alpha1.GPUNode{*pt.MakeGPUNode("n1").Devices(1, "H100", 81920).DRADriver("gpu.nvidia.com", 0).Obj()},
		Pods:           []corev1.Pod{*running, *waiting, *nic},
		Queues:         []v1alpha1.Queue{*q},
		ResourceClaims: []resourceapi.ResourceClaim{*held, *want, *pt.MakeResourceClaim("a-nic", "team-a").Devices("eth", "nic.example.com", 1).Obj()},
	}
	r, err := Why(c, "team-a", "second", now)
	if err != nil {
		t.Fatal(err)
	}
	if w := "queue team-a is at its limit: 1 of 1 GPUs allocated; the pod needs 1 more"; !r.Waiting || !strings.Contains(r.Summary, w) {
		t.Errorf("summary %q, want it to contain %q", r.Summary, w)
	}
	request := findingMessage(r, CheckRequest)
	if w := "asks for 1 GPU through ResourceClaims (claim want: 1 × gpu.nvidia.com)"; request != w {
		t.Errorf("request finding %q, want %q", request, w)
	}
	if _, err := Why(c, "team-a", "nic", now); !errors.Is(err, ErrNotGPUPod) {
		t.Errorf("why of a NIC claim pod: %v, want ErrNotGPUPod", err)
	}
}

// TestWhyGPUClasses: a cluster whose extender counts another DeviceClass as
// GPUs (--gpu-device-classes) is explained with that list.
func TestWhyGPUClasses(t *testing.T) {
	claim := pt.MakeResourceClaim("want", "team-a").Devices("gpu", "gpu.example.com", 1).Obj()
	pod := pt.MakePod("p", "team-a").Queue("team-a").Claim("gpu", "want").SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj()
	c := &Cluster{
		GPUNodes:       []v1alpha1.GPUNode{*pt.MakeGPUNode("n1").Devices(1, "H100", 81920).Obj()},
		Pods:           []corev1.Pod{*pod},
		Queues:         []v1alpha1.Queue{*pt.MakeQueue("team-a").GPU("1", "1", 1).Obj()},
		ResourceClaims: []resourceapi.ResourceClaim{*claim},
	}
	if _, err := Why(c, "team-a", "p", now); !errors.Is(err, ErrNotGPUPod) {
		t.Errorf("why with the default classes: %v, want ErrNotGPUPod", err)
	}
	r, err := WhyWithOptions(c, "team-a", "p", now, WhyOptions{GPUClasses: dra.GPUClasses{"gpu.example.com"}})
	if err != nil {
		t.Fatalf("why with gpu.example.com a GPU class: %v", err)
	}
	request := findingMessage(r, CheckRequest)
	if w := "asks for 1 GPU through ResourceClaims (claim want: 1 × gpu.example.com)"; request != w {
		t.Errorf("request finding %q, want %q", request, w)
	}
	if c.GPUClasses != nil {
		t.Errorf("WhyWithOptions changed the caller's Cluster: GPUClasses %v", c.GPUClasses)
	}
}

// findingMessage is the message of r's finding of check, "" without one.
func findingMessage(r WhyReport, check string) string {
	for _, f := range r.Findings {
		if f.Check == check {
			return f.Message
		}
	}
	return ""
}
