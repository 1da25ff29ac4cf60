package extender

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"

	pt "github.com/partita-dev/partita/internal/partitatest"
)

func TestReleasedPodsExpire(t *testing.T) {
	clk := testingclock.NewFakePassiveClock(time.Now())
	r := NewReleasedPods(clk, time.Minute)
	key := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }
	r.Put(pt.FractionPod("a", "0.5", "500").Obj())
	r.Put(pt.FractionPod("b", "0.5", "500").Obj())
	if p := r.Take(key("a"), "uid-ns-a"); p == nil || p.Name != "a" {
		t.Fatalf("Take(a) = %v, want pod a", p)
	}
	if p := r.Take(key("a"), "uid-ns-a"); p != nil {
		t.Errorf("a second Take(a) = %s, want nil: bind takes a release once", p.Name)
	}
	clk.SetTime(clk.Now().Add(time.Minute))
	if p := r.Take(key("b"), ""); p != nil {
		t.Errorf("Take(b) a minute later = %s, want nil", p.Name)
	}
	r.Put(pt.FractionPod("c", "0.5", "500").Obj())
	clk.SetTime(clk.Now().Add(time.Minute))
	r.Put(pt.FractionPod("d", "0.5", "500").Obj())
	if _, ok := r.pods[key("c")]; ok || len(r.pods) != 1 {
		t.Errorf("after a minute a Put kept %d pods (c among them: %t), want only d: the pods never bound are swept", len(r.pods), ok)
	}
	var none *ReleasedPods
	none.Put(pt.FractionPod("e", "0.5", "500").Obj())
	if p := none.Take(key("e"), ""); p != nil {
		t.Errorf("a nil ReleasedPods gave %s", p.Name)
	}
}
