package admission

import (
	"math"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/admission/usage"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// TestUsageOutlivesTheLeader: queue a holds both GPUs while b holds none;
// the loop counts a's usage into its status, a second loop (a new leader)
// carries on from the status, and both the GPU-hours and the shares they
// give match one leader's closed form.
func TestUsageOutlivesTheLeader(t *testing.T) {
	ctx := t.Context()
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(t0)
	nodes := []*v1alpha1.GPUNode{pt.H100Node("n1", 1).Obj(), pt.H100Node("n2", 1).Obj()}
	objs := []client.Object{pt.MakeQueue("a").Obj(), pt.MakeQueue("b").Obj()}
	for i, node := range []string{"n1", "n2"} {
		objs = append(objs, pt.MakePod("a-"+node, "ns").Queue("a").GPUCount(1).Node(node).
			Resource("", v1alpha1.ResourceGPUMilli, "1000").Created(t0.Add(-time.Duration(i)*time.Minute)).
			Annotation(v1alpha1.AnnotationAdmitted, t0.Format(time.RFC3339)).Obj())
	}
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Queue{}, &v1alpha1.PodGroup{}, &corev1.Pod{}).Build()
	opts := DefaultAdmitterOptions()
	opts.Usage = usage.Config{Weight: 1, HalfLife: time.Minute, Window: 10 * time.Minute, WindowType: v1alpha1.UsageWindowSliding}

	// start is a new leader: a ledger and a loop fed from the API server.
	start := func() *Admitter {
		t.Helper()
		var pods corev1.PodList
		if err := c.List(ctx, &pods); err != nil {
			t.Fatal(err)
		}
		var queues v1alpha1.QueueList
		if err := c.List(ctx, &queues); err != nil {
			t.Fatal(err)
		}
		var gns []v1alpha1.GPUNode
		for _, n := range nodes {
			gns = append(gns, *n)
		}
		a := NewAdmitter(gpu.BuildLedger(gns, pods.Items, gpu.WithClock(clk)), c, nil, nil, nil, func() bool { return true }, opts, nil, clk)
		a.usage.restore = true // as Start does
		for _, n := range []string{"n1", "n2"} {
			a.Cache().UpsertNode(pt.MakeNode(n).Obj())
		}
		for i := range queues.Items {
			a.Cache().UpsertQueue(&queues.Items[i])
		}
		for i := range pods.Items {
			a.Cache().UpsertPod(&pods.Items[i])
		}
		return a
	}
	run := func(a *Admitter, until time.Time) {
		t.Helper()
		for ; !clk.Now().After(until); clk.Step(time.Second) {
			if err := a.Cycle(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	first := start()
	run(first, t0.Add(3*time.Minute))
	// The first leader is gone less than a persist period (25 s) after its
	// last write; the second starts 20 seconds later.
	clk.Step(20 * time.Second)
	second := start()
	end := t0.Add(5 * time.Minute)
	run(second, end)

	status := func(name string) *v1alpha1.QueueUsage {
		var q v1alpha1.Queue
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &q); err != nil {
			t.Fatal(err)
		}
		if q.Status.Usage == nil {
			t.Fatalf("queue %s has no status.usage: %+v", name, q.Status)
		}
		return q.Status.Usage
	}
	a := status("a")
	// 2 GPUs for 5 minutes at a half-life of a minute, as of the last
	// write (at most one persist period, 25 s here, before the end).
	at := a.UpdateTime.Time
	h := 60.0
	want := 2 * h / math.Ln2 * (1 - math.Exp2(-at.Sub(t0).Seconds()/h)) / 3600
	got := a.Hours.Name(v1alpha1.ResourceGPU, "").AsApproximateFloat64()
	if math.Abs(got-want) > 1e-3*want {
		t.Errorf("queue a used %v GPU-hours by %v, want %v (2 GPUs since %v)", got, at, want, t0)
	}
	// The cluster's 2 GPUs over the 10-minute window: 5 of 10 minutes held.
	wantShare := (1 - math.Exp2(-at.Sub(t0).Seconds()/h)) / (1 - math.Exp2(-10))
	if got := a.Share.Name(v1alpha1.ResourceGPU, "").AsApproximateFloat64(); math.Abs(got-wantShare) > 1e-3 {
		t.Errorf("queue a's share of the cluster %v, want %v", got, wantShare)
	}
	if len(a.Buckets) == 0 || a.WindowType != v1alpha1.UsageWindowSliding || a.HalfLife.Duration != time.Minute {
		t.Errorf("queue a's usage status lacks its history or settings: %+v", a)
	}
	if b := status("b"); !b.Hours.Name(v1alpha1.ResourceGPU, "").IsZero() || len(b.Buckets) != 0 {
		t.Errorf("queue b used nothing, its status says %+v", b)
	}
	if a.FairShareWithoutUsage == nil {
		t.Errorf("queue a's status does not say its fair share without usage")
	}
	if since, period := end.Sub(at), opts.Usage.PersistEvery(); since > period {
		t.Errorf("usage last written %v before the end: more than one persist period (%v)", since, period)
	}
}

// TestUsageOffClearsStatus: a loop that does not weigh usage removes what
// one that did wrote, so that nobody reads stale history.
func TestUsageOffClearsStatus(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC))
	q := pt.MakeQueue("a").Obj()
	q.Status.Usage = &v1alpha1.QueueUsage{WindowType: v1alpha1.UsageWindowSliding}
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(q).
		WithStatusSubresource(&v1alpha1.Queue{}).Build()
	a := NewAdmitter(gpu.BuildLedger(nil, nil), c, nil, nil, nil, func() bool { return true }, DefaultAdmitterOptions(), nil, clk)
	a.Cache().UpsertQueue(q)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.Queue
	if err := c.Get(ctx, client.ObjectKey{Name: "a"}, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Usage != nil {
		t.Errorf("status.usage left as %+v with usage off", got.Status.Usage)
	}
}

// TestUsageWritesStayBoundedWhenDropped: with a Queue CRD from before
// status.usage the API server drops what the loop writes, so the queue's
// status never shows it; the loop still writes it once per persist period,
// not every cycle.
func TestUsageWritesStayBoundedWhenDropped(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	opts := DefaultAdmitterOptions()
	opts.Usage = usage.Config{Weight: 1, HalfLife: time.Minute, Window: 10 * time.Minute, WindowType: v1alpha1.UsageWindowSliding}
	a := NewAdmitter(gpu.BuildLedger(nil, nil), nil, nil, nil, nil, func() bool { return true }, opts, nil, testingclock.NewFakeClock(t0))
	a.usage.reports = map[string]usage.Report{}
	period := opts.Usage.PersistEvery()
	fresh := 0
	for now := t0; now.Before(t0.Add(10 * period)); now = now.Add(time.Second) {
		if _, ok := a.usageStatus(t.Context(), cycle.QueueReport{Name: "a"}, nil, now); ok {
			fresh++
		}
	}
	if fresh != 10 {
		t.Errorf("%d writes in 10 persist periods of %v at a cycle a second, want 10", fresh, period)
	}
}
