package extender

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// TestAdmitterHoldsMemorySlices: a single pod that asks for GPU memory is
// charged its share of the device the cycle chose, so the ledger holds
// that device for it (the extender's filter sends the pod there) until it
// binds or the hold lapses after InflightTTL; a queue's status shows what
// the slice holds, not its share of the largest device.
func TestAdmitterHoldsMemorySlices(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	l4 := pt.MakeGPUNode("l4").Devices(1, "NVIDIA L4", 23034).Obj()
	h200 := pt.MakeGPUNode("h200").Devices(1, "NVIDIA H200", 143771).Obj()
	pod := pt.MakePod("slice", "ns").Queue("a").GPUMemory("20Gi").NodeSelector("model", "l4").
		SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(clk.Now()).Obj()
	r, _ := gpu.ParsePod(pod)
	pod = gpu.ApplyCanonical(pod, r, 143771)
	queue := pt.MakeQueue("a").GPU("0", "1", 1).Obj()
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(pod.DeepCopy(), queue.DeepCopy()).
		WithStatusSubresource(&v1alpha1.Queue{}, &corev1.Pod{}).Build()
	ledger := gpu.BuildLedger([]v1alpha1.GPUNode{*l4, *h200}, nil)
	opts := DefaultAdmitterOptions()
	a := NewAdmitter(ledger, c, nil, nil, nil, func() bool { return true }, opts, nil, clk)
	cache := a.Cache()
	cache.UpsertNode(pt.MakeNode("l4").Label("model", "l4").Allocatable(corev1.ResourceCPU, "64").Obj())
	cache.UpsertNode(pt.MakeNode("h200").Label("model", "h200").Obj())
	cache.UpsertQueue(queue)
	cache.UpsertPod(pod)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	held, ok := ledger.Allocation(pod.UID)
	if !ok || held.Node != "l4" || held.Milli() != 890 {
		t.Fatalf("ledger holds %+v, %v; want the L4's device, 890 milli", held, ok)
	}
	var got corev1.Pod
	if err := c.Get(ctx, client.ObjectKeyFromObject(pod), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.SchedulingGates) != 0 || got.Spec.Affinity != nil {
		t.Errorf("released pod: gates %v, affinity %+v; want ungated and not pinned", got.Spec.SchedulingGates, got.Spec.Affinity)
	}
	var q v1alpha1.Queue
	if err := c.Get(ctx, client.ObjectKey{Name: "a"}, &q); err != nil {
		t.Fatal(err)
	}
	if alloc := q.Status.Allocated[v1alpha1.ResourceGPU]; alloc.Cmp(resource.MustParse("890m")) != 0 {
		t.Errorf("queue a allocated %s, want 890m (what the slice holds of the L4)", alloc.String())
	}
	// Ungated and still unbound past the hold: the devices go back.
	got.ResourceVersion = ""
	cache.UpsertPod(&got)
	clk.Step(opts.InflightTTL + time.Second)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if a, ok := ledger.Allocation(pod.UID); ok {
		t.Errorf("the hold outlived InflightTTL: %+v", a)
	}
}
