package admission

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/extender"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/policy"
)

// releasedPods records what the loop hands bind (extender.ReleasedPods
// there).
type releasedPods map[types.UID]*corev1.Pod

func (r releasedPods) Put(pod *corev1.Pod) { r[pod.UID] = pod }

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
	ledger := gpu.BuildLedger([]v1alpha1.GPUNode{*l4, *h200}, nil, gpu.WithClock(clk))
	opts := DefaultAdmitterOptions()
	released := releasedPods{}
	opts.Released = released
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
	// Bind finds the release while its informer still shows the gate.
	if r := released[pod.UID]; r == nil || r.ResourceVersion != got.ResourceVersion || len(r.Spec.SchedulingGates) != 0 {
		t.Errorf("released pods hold %+v, want the pod as the release wrote it (resourceVersion %s)", r, got.ResourceVersion)
	}
	// The hold travels on the pod: a ledger that sees it (another
	// replica's, or this one's after a restart) holds the same device.
	res, err := gpu.ParseReservation(got.Annotations[v1alpha1.AnnotationReservation])
	if err != nil || res.Node != "l4" || !res.Expires.Equal(clk.Now().Add(opts.InflightTTL)) {
		t.Fatalf("reservation %+v (%v); want node l4 until %s", res, err, clk.Now().Add(opts.InflightTTL))
	}
	ledger.UpsertPod(&got)
	var q v1alpha1.Queue
	if err := c.Get(ctx, client.ObjectKey{Name: "a"}, &q); err != nil {
		t.Fatal(err)
	}
	if alloc := q.Status.Allocated[v1alpha1.ResourceGPU]; alloc.Cmp(resource.MustParse("890m")) != 0 {
		t.Errorf("queue a allocated %s, want 890m (what the slice holds of the L4)", alloc.String())
	}
	// Ungated and still unbound past the hold, kube-scheduler not having
	// tried it yet (a long backlog): the hold stays, or the next cycle
	// would give its device to another pod as well.
	got.ResourceVersion = ""
	cache.UpsertPod(&got)
	clk.Step(opts.InflightTTL + time.Second)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := ledger.Allocation(pod.UID); !ok {
		t.Error("the hold of a pod kube-scheduler has not tried lapsed at InflightTTL")
	}
	// Refused by kube-scheduler: the devices go back.
	got.Status.Conditions = append(got.Status.Conditions, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable})
	ledger.UpsertPod(&got)
	cache.UpsertPod(&got)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if a, ok := ledger.Allocation(pod.UID); ok {
		t.Errorf("the hold outlived InflightTTL after kube-scheduler refused the pod: %+v", a)
	}
}

// TestAdmitterHoldsFractionsWhereItPlacedThem: a single fractional pod is
// held on the device the cycle packed it onto, like a memory slice, so
// that the extender's filter offers kube-scheduler that node alone (it
// then skips scoring, and the extender's prioritize), and a pod admitted
// in the same cycle is not bound onto room the cycle counted for another.
func TestAdmitterHoldsFractionsWhereItPlacedThem(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	nodes := []v1alpha1.GPUNode{*pt.H100Node("n1", 1).Obj(), *pt.H100Node("n2", 1).Obj()}
	queue := pt.MakeQueue("a").Obj()
	// n1's device is half taken: binpacking puts the half there.
	busy := pt.Bound(pt.FractionPod("busy", "0.5", "500").Queue("a").Annotation(v1alpha1.AnnotationAdmitted, clk.Now().Format(admittedLayout)), "n1", 0)
	half := pt.FractionPod("half", "0.5", "500").Queue("a").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(clk.Now()).Obj()
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(busy, half.DeepCopy(), queue.DeepCopy()).
		WithStatusSubresource(&v1alpha1.Queue{}, &corev1.Pod{}).Build()
	ledger := gpu.BuildLedger(nodes, []corev1.Pod{*busy}, gpu.WithClock(clk))
	opts := DefaultAdmitterOptions()
	a := NewAdmitter(ledger, c, nil, nil, nil, func() bool { return true }, opts, nil, clk)
	cache := a.Cache()
	for _, n := range []string{"n1", "n2"} {
		cache.UpsertNode(pt.MakeNode(n).Obj())
	}
	cache.UpsertQueue(queue)
	cache.UpsertPod(busy)
	cache.UpsertPod(half)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	held, ok := ledger.Allocation(half.UID)
	if !ok || held.Node != "n1" {
		t.Fatalf("ledger holds %+v, %v; want half held on n1, where the cycle packed it", held, ok)
	}
	var got corev1.Pod
	if err := c.Get(ctx, client.ObjectKeyFromObject(half), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.SchedulingGates) != 0 || got.Spec.Affinity != nil || got.Annotations[v1alpha1.AnnotationReservation] == "" {
		t.Fatalf("released pod: gates %v, affinity %+v, reservation %q; want ungated, not pinned, with its reservation",
			got.Spec.SchedulingGates, got.Spec.Affinity, got.Annotations[v1alpha1.AnnotationReservation])
	}
	e := extender.New(ledger, c, nil)
	res, err := e.Filter(ctx, &extenderv1.ExtenderArgs{Pod: &got, NodeNames: &[]string{"n1", "n2"}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"n1"}, *res.NodeNames); diff != "" {
		t.Errorf("filter passed (-want +got):\n%s\nfailed: %v", diff, res.FailedAndUnresolvableNodes)
	}
}

// TestReservationsOutliveTheAdmitter: a gang the loop pinned carries its
// reservation on its pods, so that a new process, whose ledger and cache
// are built from the API objects alone, keeps the devices for it: a pod
// that comes later waits instead of taking them, and the extender's filter
// sends it nowhere else either, until the reservation expires.
func TestReservationsOutliveTheAdmitter(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	nodes := []*v1alpha1.GPUNode{pt.H100Node("n1", 1).Obj(), pt.H100Node("n2", 1).Obj()}
	queue := pt.MakeQueue("a").Obj()
	pg := pt.MakePodGroup("train", "ns").MinMember(2).ScheduleTimeoutSeconds(300).Obj()
	var objs []client.Object
	for _, name := range []string{"train-0", "train-1"} {
		objs = append(objs, pt.MakePod(name, "ns").Queue("a").GPUCount(1).PodGroup("train").
			Resource("", v1alpha1.ResourceGPUMilli, "1000").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(clk.Now()).Obj())
	}
	objs = append(objs, queue, pg)
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Queue{}, &v1alpha1.PodGroup{}, &corev1.Pod{}).Build()

	// start is a fresh extender process: a ledger and a loop fed from what
	// the API server holds.
	start := func() (*gpu.Ledger, *Admitter) {
		t.Helper()
		var pods corev1.PodList
		if err := c.List(ctx, &pods); err != nil {
			t.Fatal(err)
		}
		var gns []v1alpha1.GPUNode
		for _, n := range nodes {
			gns = append(gns, *n)
		}
		ledger := gpu.BuildLedger(gns, pods.Items, gpu.WithClock(clk))
		a := NewAdmitter(ledger, c, nil, nil, nil, func() bool { return true }, DefaultAdmitterOptions(), nil, clk)
		cache := a.Cache()
		for _, n := range []string{"n1", "n2"} {
			cache.UpsertNode(pt.MakeNode(n).Obj())
		}
		cache.UpsertQueue(queue)
		cache.UpsertPodGroup(pg)
		for i := range pods.Items {
			cache.UpsertPod(&pods.Items[i])
		}
		return ledger, a
	}
	_, first := start()
	if err := first.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	// The first process is gone before kube-scheduler binds the members;
	// a pod that would fit on their devices comes.
	late := pt.MakePod("late", "ns").Queue("a").GPUCount(1).Resource("", v1alpha1.ResourceGPUMilli, "1000").
		SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(clk.Now().Add(time.Second)).Obj()
	if err := c.Create(ctx, late); err != nil {
		t.Fatal(err)
	}
	clk.Step(10 * time.Second)
	ledger, second := start()
	if err := second.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := c.Get(ctx, client.ObjectKeyFromObject(late), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.SchedulingGates) == 0 {
		t.Fatalf("the late pod was admitted onto the gang's reserved devices: %v", got.Annotations)
	}
	e := extender.New(ledger, c, nil)
	res, err := e.Filter(ctx, &extenderv1.ExtenderArgs{Pod: late, NodeNames: &[]string{"n1", "n2"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(*res.NodeNames) != 0 {
		t.Errorf("filter passed %v for the late pod; the gang holds both GPUs", *res.NodeNames)
	}
	for _, name := range []string{"train-0", "train-1"} {
		var m corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, &m); err != nil {
			t.Fatal(err)
		}
		held, ok := ledger.Allocation(m.UID)
		if !ok || held.Node != m.Annotations[v1alpha1.AnnotationNode] {
			t.Errorf("the new ledger holds %+v, %v for %s, pinned to %s", held, ok, name, m.Annotations[v1alpha1.AnnotationNode])
		}
	}

	// Past the gang's schedule timeout the reservations lapse everywhere.
	clk.Step(5 * time.Minute)
	if n := ledger.ExpireReservations(); n != 2 {
		t.Errorf("ExpireReservations after the timeout dropped %d, want 2", n)
	}
}

// TestAdmitterEnforcesCPUAndMemoryQuotas: through the default Rego quota
// policy, a queue's CPU and memory limits hold its pods back like its GPU
// limit, and its status shows the CPU and memory its pods request.
func TestAdmitterEnforcesCPUAndMemoryQuotas(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	engine, err := policy.NewEngine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	queue := pt.MakeQueue("a").CPU("2", "4", 1).Memory("8Gi", "16Gi", 1).Obj()
	old := pt.Bound(pt.WholePod("old", 1, "1000").Queue("a").Request("", corev1.ResourceCPU, "3").Request("", corev1.ResourceMemory, "12Gi").
		Annotation(v1alpha1.AnnotationAdmitted, clk.Now().Format(admittedLayout)), "n1", 0)
	cpu := pt.WholePod("cpu", 1, "1000").Queue("a").Request("", corev1.ResourceCPU, "2").
		SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(clk.Now()).Obj()
	mem := pt.WholePod("mem", 1, "1000").Queue("a").Request("", corev1.ResourceMemory, "8Gi").
		SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(clk.Now().Add(time.Second)).Obj()
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(old, cpu, mem, queue).
		WithStatusSubresource(&v1alpha1.Queue{}, &corev1.Pod{}).Build()
	ledger := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 4).Obj()}, old)
	a := NewAdmitter(ledger, c, nil, nil, PolicyQuota{Engine: engine}, func() bool { return true }, DefaultAdmitterOptions(), nil, clk)
	cache := a.Cache()
	cache.UpsertNode(pt.MakeNode("n1").Obj())
	cache.UpsertQueue(queue)
	for _, p := range []*corev1.Pod{old, cpu, mem} {
		cache.UpsertPod(p)
	}
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"cpu": "queue a is at its CPU limit: 3 of 4 CPUs, and the workload needs 2",
		"mem": "queue a is at its memory limit: 12Gi of 16Gi, and the workload needs 8Gi",
	} {
		var p corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: "ns", Name: name}, &p); err != nil {
			t.Fatal(err)
		}
		if len(p.Spec.SchedulingGates) == 0 {
			t.Errorf("pod %s was admitted past its queue's limit", name)
		}
		// The condition is written by a writer goroutine that Start runs;
		// the cycle's reason is in the told map.
		if got := a.told[cycle.WorkloadKey{Namespace: "ns", Pod: name}]; got.said != a.tellHash(v1alpha1.ReasonWaitingForQuota, want, false) {
			t.Errorf("pod %s was told another wait (reason %q), want %s: %q", name, got.reason, v1alpha1.ReasonWaitingForQuota, want)
		}
	}
	var q v1alpha1.Queue
	if err := c.Get(ctx, client.ObjectKey{Name: "a"}, &q); err != nil {
		t.Fatal(err)
	}
	alloc := q.Status.Allocated
	if cpu, mem := alloc[v1alpha1.ResourceCPU], alloc[v1alpha1.ResourceMemory]; cpu.Cmp(resource.MustParse("3")) != 0 || mem.Cmp(resource.MustParse("12Gi")) != 0 {
		t.Errorf("queue a allocated %v, want 3 CPUs and 12Gi", alloc)
	}
	if req := q.Status.Requested[v1alpha1.ResourceCPU]; req.Cmp(resource.MustParse("5")) != 0 {
		t.Errorf("queue a requested %s CPUs, want 5", req.String())
	}
}

// TestAdmitterTellsOnlyPodsThatWaited: a pod admitted in the cycle that
// first sees it gets no Admitted event and no condition (its release
// writes partita.dev/admitted); a pod that was told it waits is told, by
// an event and its condition, once it is admitted.
func TestAdmitterTellsOnlyPodsThatWaited(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	queue := pt.MakeQueue("a").Obj()
	gated := func(name string, at time.Time) *corev1.Pod {
		return pt.WholePod(name, 1, "1000").Queue("a").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(at).Obj()
	}
	first, second := gated("first", clk.Now()), gated("second", clk.Now().Add(time.Second))
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(first, second, queue).
		WithStatusSubresource(&v1alpha1.Queue{}, &corev1.Pod{}).Build()
	ledger := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 1).Obj()})
	rec := events.NewFakeRecorder(10)
	a := NewAdmitter(ledger, c, nil, rec, nil, func() bool { return true }, DefaultAdmitterOptions(), nil, clk)
	cache := a.Cache()
	cache.UpsertNode(pt.MakeNode("n1").Obj())
	cache.UpsertQueue(queue)
	cache.UpsertPod(first)
	cache.UpsertPod(second)
	queued := func() map[string]corev1.PodCondition {
		out := map[string]corev1.PodCondition{}
		for _, q := range a.conditions {
			for c, ok := q.take(); ok; c, ok = q.take() {
				out[c.pod.Name] = c.cond
			}
		}
		return out
	}
	said := func() []string {
		var out []string
		for {
			select {
			case e := <-rec.Events:
				out = append(out, e)
			default:
				return out
			}
		}
	}
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	got := queued()
	if c, ok := got["first"]; ok {
		t.Errorf("the pod admitted in its first cycle got the condition %+v; want none", c)
	}
	if c := got["second"]; c.Status != corev1.ConditionFalse || c.Reason != v1alpha1.ReasonWaitingForCapacity {
		t.Errorf("the waiting pod's condition is %+v, want False %s", c, v1alpha1.ReasonWaitingForCapacity)
	}
	evs := said()
	if len(evs) != 1 || !strings.Contains(evs[0], v1alpha1.ReasonWaitingForCapacity) {
		t.Errorf("events %q; want one %s (for the waiting pod) and no Admitted", evs, v1alpha1.ReasonWaitingForCapacity)
	}
	var released corev1.Pod
	if err := c.Get(ctx, client.ObjectKeyFromObject(first), &released); err != nil {
		t.Fatal(err)
	}
	if released.Annotations[v1alpha1.AnnotationAdmitted] == "" || len(released.Spec.SchedulingGates) != 0 {
		t.Fatalf("the first pod was not released: gates %v, annotations %v", released.Spec.SchedulingGates, released.Annotations)
	}

	// The first pod goes; the second, told it waits, is admitted and told.
	cache.DeletePod(first.UID)
	ledger.DeletePod(first.UID)
	clk.Step(time.Second)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	if c := queued()["second"]; c.Status != corev1.ConditionTrue || c.Reason != v1alpha1.ReasonAdmitted {
		t.Errorf("the pod that waited has the condition %+v once admitted, want True %s", c, v1alpha1.ReasonAdmitted)
	}
	if evs := said(); len(evs) != 1 || !strings.Contains(evs[0], v1alpha1.ReasonAdmitted) {
		t.Errorf("events %q once the waiting pod is admitted; want one %s", evs, v1alpha1.ReasonAdmitted)
	}
	if len(a.toldPods) != 0 {
		t.Errorf("told pods %v after the admission, want none", a.toldPods)
	}
}

// TestAdmitterSeesItsOwnReleases: the loop's cache has the pods it
// released as the API server wrote them, before any informer brings them:
// the next cycle neither places them again nor, when one of them is bound
// meanwhile (the ledger holds its devices), tells the pods of its shape
// that there is no room.
func TestAdmitterSeesItsOwnReleases(t *testing.T) {
	ctx := t.Context()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	queue := pt.MakeQueue("a").Obj()
	half := func(name string, at time.Time) *corev1.Pod {
		return pt.FractionPod(name, "0.5", "500").Queue("a").SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(at).Obj()
	}
	first := []*corev1.Pod{half("a", clk.Now()), half("b", clk.Now()), half("c", clk.Now())}
	late := half("d", clk.Now().Add(time.Second))
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(first[0], first[1], first[2], late, queue).
		WithStatusSubresource(&v1alpha1.Queue{}, &corev1.Pod{}).Build()
	ledger := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj()})
	rec := events.NewFakeRecorder(20)
	a := NewAdmitter(ledger, c, nil, rec, nil, func() bool { return true }, DefaultAdmitterOptions(), nil, clk)
	cache := a.Cache()
	cache.UpsertNode(pt.MakeNode("n1").Obj())
	cache.UpsertQueue(queue)
	for _, p := range first {
		cache.UpsertPod(p)
	}
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	// The extender binds a on the device the loop did not pick for it;
	// no informer has told the loop's cache anything yet.
	ledger.UpsertPod(pt.Bound(pt.FractionPod("a", "0.5", "500").Queue("a"), "n1", 1))
	cache.UpsertPod(late)
	clk.Step(time.Second)
	if err := a.Cycle(ctx); err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := c.Get(ctx, client.ObjectKeyFromObject(late), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.SchedulingGates) != 0 {
		t.Errorf("the late pod is still gated; the loop told it to wait (reason %q)", a.told[cycle.WorkloadKey{Namespace: "ns", Pod: "d"}].reason)
	}
	for {
		select {
		case e := <-rec.Events:
			t.Errorf("event %q; want none (every pod fits at once)", e)
			continue
		default:
		}
		break
	}
}

// TestWaitsChangingOnlyInTheirNumbersAreToldLessOften: a wait whose
// message changes only in its numbers (pods left to terminate, members
// that fit) is told again, as an event and a condition per pending pod,
// at most every progressRefresh; any other change is told at once, but
// for the victims it was told it evicts now terminating.
func TestWaitsChangingOnlyInTheirNumbersAreToldLessOften(t *testing.T) {
	now := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	rec := events.NewFakeRecorder(20)
	clk := testingclock.NewFakeClock(now)
	a := NewAdmitter(pt.Ledger(nil), nil, nil, rec, nil, func() bool { return true }, DefaultAdmitterOptions(), nil, clk)
	pod := pt.WholePod("p", 1, "1000").Queue("a").Obj()
	w := &cycle.Workload{Key: cycle.WorkloadKey{Namespace: "ns", Pod: "p"}, Pending: []*cycle.Member{{Pod: pod}}}
	told := func(at time.Duration, msg string) int {
		t.Helper()
		wt := cycle.Wait{Workload: w, Reason: v1alpha1.ReasonWaitingForCapacity, Message: msg,
			Evicting: strings.HasPrefix(msg, "evicting"), Terminating: strings.Contains(msg, "to terminate")}
		a.tell(&cycle.Result{Waiting: []cycle.Wait{wt}}, now.Add(at))
		return len(rec.Events)
	}
	steps := []struct {
		at   time.Duration
		msg  string
		want int // events so far
	}{
		{0, "waiting for 12 evicted or deleted pods to terminate to make room", 1},
		{time.Second, "waiting for 12 evicted or deleted pods to terminate to make room", 1},
		{2 * time.Second, "waiting for 9 evicted or deleted pods to terminate to make room", 1},
		{20 * time.Second, "waiting for 3 evicted or deleted pods to terminate to make room", 1},
		{31 * time.Second, "waiting for 2 evicted or deleted pods to terminate to make room", 2},
		{32 * time.Second, "evicting 1 workload(s) to make room: ns/x", 3},
		// The victims it was just told of terminating say nothing new.
		{33 * time.Second, "waiting for 1 evicted or deleted pods to terminate to make room", 3},
		{50 * time.Second, "waiting for 1 evicted or deleted pods to terminate to make room", 3},
		{63 * time.Second, "waiting for 1 evicted or deleted pods to terminate to make room", 4},
	}
	for _, s := range steps {
		if got := told(s.at, s.msg); got != s.want {
			t.Fatalf("after %q at %s: %d events, want %d", s.msg, s.at, got, s.want)
		}
	}
}

func TestTellHashShapes(t *testing.T) {
	a := NewAdmitter(pt.Ledger(nil), nil, nil, nil, nil, func() bool { return true }, DefaultAdmitterOptions(), nil, nil)
	cases := map[string]struct {
		a, b      string
		sameShape bool
	}{
		"counts that change":      {a: "waiting for 12 evicted pods", b: "waiting for 9 evicted pods", sameShape: true},
		"several numbers":         {a: "gang needs 10 × 8 GPUs; at most 0 fit now", b: "gang needs 10 × 8 GPUs; at most 3 fit now", sameShape: true},
		"a number's length":       {a: "12 of 100 GPUs", b: "3 of 4 GPUs", sameShape: true},
		"other words":             {a: "waiting for 12 evicted pods", b: "evicting 12 workload(s)"},
		"a number where none was": {a: "queue a is full", b: "queue 1 is full"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := a.tellHash("WaitingForCapacity", tc.a, true) == a.tellHash("WaitingForCapacity", tc.b, true); got != tc.sameShape {
				t.Errorf("same shape = %v, want %v", got, tc.sameShape)
			}
			if a.tellHash("WaitingForCapacity", tc.a, false) == a.tellHash("WaitingForCapacity", tc.b, false) {
				t.Error("different messages hash alike")
			}
			if a.tellHash("WaitingForCapacity", tc.a, true) == a.tellHash("WaitingForQuota", tc.a, true) {
				t.Error("different reasons hash alike")
			}
		})
	}
}
