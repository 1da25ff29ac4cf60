package ledgerfeed

import (
	"testing"

	pt "github.com/partita-dev/partita/internal/partitatest"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllertest"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
)

func TestLedgerFeed(t *testing.T) {
	ctx := pt.Context(t)
	podInformer := controllertest.NewFakeInformer() // not synced yet
	informers := &informertest.FakeInformers{Scheme: envtestutil.Scheme(), InformersByGVK: map[schema.GroupVersionKind]toolscache.SharedIndexInformer{
		corev1.SchemeGroupVersion.WithKind("Pod"): podInformer,
	}}
	l := gpu.NewLedger()
	f := New(l)
	if f.Synced() {
		t.Fatal("synced before Watch")
	}
	if err := f.Watch(ctx, informers); err != nil {
		t.Fatal(err)
	}
	if f.Synced() {
		t.Error("synced before the pod informer")
	}
	podInformer.Synced()
	if !f.Synced() {
		t.Error("not synced after both informers")
	}
	nodes, err := informers.FakeInformerFor(ctx, &v1alpha1.GPUNode{})
	if err != nil {
		t.Fatal(err)
	}

	// allocated returns GPU 0's and GPU 1's allocated milli on n1.
	allocated := func() []int64 {
		st := l.State()
		if len(st.Nodes) == 0 {
			return nil
		}
		var out []int64
		for _, d := range st.Nodes[0].Devices {
			out = append(out, d.AllocatedMilli)
		}
		return out
	}
	half := pt.FractionPod("p", "0.5", "500")
	whole := pt.WholePod("w", 1, "1000")
	steps := []struct {
		name string
		do   func()
		want []int64
	}{
		{"a bound pod before its node waits for it", func() { podInformer.Add(pt.Bound(half, "n1", 0)) }, nil},
		{"the node counts it", func() { nodes.Add(pt.H100Node("n1", 2).Obj()) }, []int64{500, 0}},
		{"a whole GPU", func() { podInformer.Add(pt.Bound(whole, "n1", 1)) }, []int64{500, 1000}},
		{"a finished pod frees its device", func() {
			podInformer.Update(pt.Bound(whole, "n1", 1), pt.Bound(whole.Clone().Phase(corev1.PodSucceeded), "n1", 1))
		}, []int64{500, 0}},
		{"a deleted pod frees its slice", func() {
			f.deletePod(toolscache.DeletedFinalStateUnknown{Key: "ns/p", Obj: pt.Bound(half, "n1", 0)})
		}, []int64{0, 0}},
		{"a deleted node leaves the ledger", func() {
			f.deleteNode(toolscache.DeletedFinalStateUnknown{Key: "n1", Obj: pt.H100Node("n1", 2).Obj()})
		}, nil},
		{"objects of other types are ignored", func() {
			f.upsertPod("not a pod")
			f.upsertNode(42)
		}, nil},
	}
	for _, s := range steps {
		s.do()
		if diff := cmp.Diff(s.want, allocated()); diff != "" {
			t.Errorf("%s: allocated milli (-want,+got):\n%s", s.name, diff)
		}
		if errs := l.CheckInvariants(); len(errs) > 0 {
			t.Errorf("%s: invariants: %v", s.name, errs)
		}
	}
}
