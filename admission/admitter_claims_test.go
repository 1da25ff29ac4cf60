package admission

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/admission/claims"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// TestAdmitterPinsClaimGang: the admitter carries out a claim gang's
// admission by pinning each member to the node the allocator found and
// ungating it, with no reservation and nothing in the ledger.
func TestAdmitterPinsClaimGang(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	nodes, world := pt.NVIDIAClaimWorld(2)
	cc := claims.NewCache(fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(world...).Build(), dra.DefaultGPUClasses, dra.DefaultGPUDrivers)
	pods := []*corev1.Pod{pt.ClaimGangMember("p0", "c0"), pt.ClaimGangMember("p1", "c1")}
	queue := pt.MakeQueue("a").Obj()
	objs := []client.Object{queue.DeepCopy(), pt.MakePodGroup("train", "ns").MinMember(2).Obj()}
	for _, p := range pods {
		objs = append(objs, p.DeepCopy())
	}
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Queue{}, &corev1.Pod{}, &v1alpha1.PodGroup{}).Build()
	ledger := gpu.BuildLedger(nil, nil, gpu.WithClock(clk))
	opts := DefaultAdmitterOptions()
	opts.Claims, opts.ClaimAllocator = cc.Demand, cc
	a := NewAdmitter(ledger, c, nil, nil, nil, func() bool { return true }, opts, nil, clk)
	for _, n := range nodes {
		a.Cache().UpsertNode(n)
	}
	a.Cache().UpsertQueue(queue)
	a.Cache().UpsertPodGroup(pt.MakePodGroup("train", "ns").MinMember(2).Obj())
	for _, p := range pods {
		a.Cache().UpsertPod(p)
	}
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range pods {
		var live corev1.Pod
		if err := c.Get(ctx, client.ObjectKeyFromObject(p), &live); err != nil {
			t.Fatal(err)
		}
		node := ""
		if a := live.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			node = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchFields[0].Values[0]
		}
		got = append(got, fmt.Sprintf("%s gates=%d pinned=%s reservation=%q", live.Name, len(live.Spec.SchedulingGates), node, live.Annotations[v1alpha1.AnnotationReservation]))
		if _, ok := ledger.Allocation(p.UID); ok {
			t.Errorf("the ledger holds devices for claim pod %s", p.Name)
		}
	}
	want := []string{`p0 gates=0 pinned=n-0 reservation=""`, `p1 gates=0 pinned=n-1 reservation=""`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("released pods (-want,+got):\n%s", diff)
	}
}
