package dra_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
	"github.com/partita-dev/partita/internal/partitatest"
)

// TestAPIServerAccepts checks what Partita writes against a real API server's
// validation of resource.k8s.io/v1: the DeviceClass, a node's slice (request
// policies, consumable capacity, taints) and claim templates of every shape.
func TestAPIServerAccepts(t *testing.T) {
	cfg, _ := envtestutil.Start(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, dc := range dra.DeviceClasses() {
		if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, &dc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("device class: %v", err)
		}
	}
	n := partitatest.MakeGPUNode("n1").Device(0, "NVIDIA H100 80GB HBM3", 81559).Device(1, "NVIDIA L4", 23034).Obj()
	n.Status.Devices[1].Health = v1alpha1.DeviceUnhealthy
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "n1-gpu"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: dra.DriverName, NodeName: ptr.To("n1"),
			Pool:    resourceapi.ResourcePool{Name: "n1", ResourceSliceCount: 1},
			Devices: dra.Devices(dra.NodeDevices{Devices: n.Status.Devices, Mode: v1alpha1.IsolationMPS, ExtenderHeld: []int32{0}}),
		},
	}
	got, err := cs.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("slice: %v", err)
	}
	// Fields behind a feature gate that is off are dropped silently.
	d := got.Spec.Devices[0]
	if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations || d.Capacity[dra.CapacityCompute].RequestPolicy == nil {
		t.Errorf("the API server dropped consumable capacity: %+v", d)
	}
	if len(got.Spec.Devices[1].Taints) != 1 {
		t.Errorf("the unhealthy device lost its taint: %+v", got.Spec.Devices[1])
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []gpu.ContainerRequest{
		{Count: 1, Milli: 250}, {Count: 2, MemoryMiB: 20480}, {Count: 4, Milli: 1000},
		{Count: 1, MemoryMiB: 1 << 20}, {Count: 1, Milli: 300, CoresPercent: 30},
	} {
		tmpl, err := dra.Template("team-a", c, []int64{81559, 23034})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cs.ResourceV1().ResourceClaimTemplates("team-a").Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Errorf("template for %+v: %v", c, err)
		}
	}
}
