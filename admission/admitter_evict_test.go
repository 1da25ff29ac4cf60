package admission

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/google/go-cmp/cmp"
	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// evictionWorld is a queue whose low-priority gang "low" holds both GPUs
// of n1 and n2, and a high-priority gang "high" of two that waits for them.
type evictionWorld struct {
	clk    *testingclock.FakeClock
	c      client.Client
	ledger *gpu.Ledger
	a      *Admitter
	uids   map[types.UID]bool
}

var evictionT0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// evictionObjects are the world's objects as a user creates them.
func evictionObjects() (pods []*corev1.Pod, others []client.Object) {
	admitted := evictionT0.Add(-time.Hour).Format(admittedLayout)
	for i, node := range []string{"n1", "n2"} {
		name := fmt.Sprintf("low-%d", i)
		p := pt.WholePod(name, 1, "1000").Queue("a").PodGroup("low").Label("app", name).
			Annotation(v1alpha1.AnnotationAdmitted, admitted).Created(evictionT0.Add(-time.Hour)).Obj()
		p.Spec.PriorityClassName = "low"
		p.Annotations[v1alpha1.AnnotationDevicesPrefix+pt.DefaultContainer] = pt.DeviceUUID(node, 0)
		p.Spec.NodeName = node
		pods = append(pods, p)
	}
	for i := range 2 {
		p := pt.WholePod(fmt.Sprintf("high-%d", i), 1, "1000").Queue("a").PodGroup("high").
			SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(evictionT0).Obj()
		p.Spec.PriorityClassName = "high"
		pods = append(pods, p)
	}
	for _, p := range pods {
		p.UID = ""
	}
	others = []client.Object{
		pt.MakeQueue("a").Obj(),
		pt.MakePodGroup("low", "ns").MinMember(2).Obj(),
		pt.MakePodGroup("high", "ns").MinMember(2).Obj(),
	}
	return pods, others
}

// start builds the admitter over what c holds, as the extender does from
// its informers.
func (w *evictionWorld) start(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	ctx := t.Context()
	var pods corev1.PodList
	if err := w.c.List(ctx, &pods); err != nil {
		t.Fatal(err)
	}
	w.ledger = gpu.BuildLedger([]v1alpha1.GPUNode{*pt.H100Node("n1", 1).Obj(), *pt.H100Node("n2", 1).Obj()}, pods.Items, gpu.WithClock(w.clk))
	opts := DefaultAdmitterOptions()
	opts.PreemptMinRuntime = time.Minute
	w.a = NewAdmitter(w.ledger, w.c, cs, nil, nil, func() bool { return true }, opts, nil, w.clk)
	w.refresh(t)
}

// refresh feeds the admitter's cache what c holds now.
func (w *evictionWorld) refresh(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	cache := w.a.Cache()
	cache.UpsertPriorityClass("low", 10)
	cache.UpsertPriorityClass("high", 1000)
	for _, n := range []string{"n1", "n2"} {
		cache.UpsertNode(pt.MakeNode(n).Obj())
	}
	var pods corev1.PodList
	if err := w.c.List(ctx, &pods); err != nil {
		t.Fatal(err)
	}
	seen := map[types.UID]bool{}
	for i := range pods.Items {
		cache.UpsertPod(&pods.Items[i])
		seen[pods.Items[i].UID] = true
	}
	for uid := range w.uids {
		if !seen[uid] {
			cache.DeletePod(uid)
			w.ledger.DeletePod(uid)
		}
	}
	w.uids = seen
	var pgs v1alpha1.PodGroupList
	if err := w.c.List(ctx, &pgs); err != nil {
		t.Fatal(err)
	}
	for i := range pgs.Items {
		cache.UpsertPodGroup(&pgs.Items[i])
	}
	cache.UpsertQueue(pt.MakeQueue("a").Obj())
}

func (w *evictionWorld) cycle(t *testing.T) {
	t.Helper()
	if err := w.a.Cycle(t.Context()); err != nil {
		t.Fatal(err)
	}
	w.refresh(t)
}

// evicted lists the low gang's pods that are gone or being deleted.
func (w *evictionWorld) evicted(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, name := range []string{"low-0", "low-1"} {
		var p corev1.Pod
		err := w.c.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: name}, &p)
		if apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil) {
			out = append(out, name)
		} else if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func (w *evictionWorld) podGroupStatus(t *testing.T, name string) (string, string) {
	t.Helper()
	var pg v1alpha1.PodGroup
	if err := w.c.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: name}, &pg); err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(pg.Status.Conditions, v1alpha1.PodGroupConditionAdmitted)
	if c == nil {
		return "", pg.Status.Reason
	}
	return c.Reason, pg.Status.Reason
}

// TestEvictionRespectsBudgetsWhole runs against a real API server, whose
// Eviction API enforces PodDisruptionBudgets from their status: a budget
// that refuses one member of the victim gang keeps the whole gang, says
// so on the preemptor's PodGroup, and once the budget allows it the gang
// goes whole.
func TestEvictionRespectsBudgetsWhole(t *testing.T) {
	ctx := t.Context()
	cfg, c := envtestutil.Start(t)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]int32{"low": 10, "high": 1000} {
		if err := c.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: v}); err != nil {
			t.Fatal(err)
		}
	}
	pods, others := evictionObjects()
	for _, o := range others {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods {
		if err := c.Create(ctx, p); err != nil {
			t.Fatalf("create %s: %v", p.Name, err)
		}
		if p.Spec.NodeName != "" {
			p.Status.Phase = corev1.PodRunning
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			if err := c.Status().Update(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One member of the victim gang is under a budget that allows nothing.
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "keep-low-0", Namespace: "ns"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptrTo(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "low-0"}}}}
	if err := c.Create(ctx, pdb); err != nil {
		t.Fatal(err)
	}
	setBudget := func(allowed int32) {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKeyFromObject(pdb), pdb); err != nil {
			t.Fatal(err)
		}
		// What kube-controller-manager's disruption controller writes.
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: allowed,
			CurrentHealthy: 1, DesiredHealthy: 1 - allowed, ExpectedPods: 1}
		if err := c.Status().Update(ctx, pdb); err != nil {
			t.Fatal(err)
		}
	}
	setBudget(0)

	w := &evictionWorld{clk: testingclock.NewFakeClock(evictionT0), c: c}
	w.start(t, cs)
	w.cycle(t)
	if got := w.evicted(t); len(got) != 0 {
		t.Fatalf("evicted %v although the budget refuses low-0", got)
	}
	reason, msg := w.podGroupStatus(t, "high")
	if reason != v1alpha1.ReasonEvictionRefused || !strings.Contains(msg, "could not evict ns/low to make room, so nothing was evicted: PodDisruptionBudget ns/keep-low-0 allows 0 disruption(s) now") {
		t.Errorf("PodGroup high: reason %q, %q; want EvictionRefused naming the budget", reason, msg)
	}
	// The next cycles spare the gang, and still say why.
	w.clk.Step(time.Second)
	w.cycle(t)
	if got := w.evicted(t); len(got) != 0 {
		t.Fatalf("evicted %v in the cycle after the refusal", got)
	}
	reason, msg = w.podGroupStatus(t, "high")
	if reason != v1alpha1.ReasonEvictionRefused || !strings.Contains(msg, "ns/low is not evicted: its eviction was refused (PodDisruptionBudget ns/keep-low-0") {
		t.Errorf("PodGroup high after a cycle: reason %q, %q", reason, msg)
	}

	// The budget allows one disruption, the spare time passes: the gang
	// goes whole.
	setBudget(1)
	w.clk.Step(EvictionRetry)
	w.cycle(t)
	if got := w.evicted(t); len(got) != 2 {
		t.Errorf("evicted %v once the budget allows it, want the whole gang", got)
	}
}

// TestEvictionFinishesAPartlyEvictedGang: should an eviction fail after
// the checks passed (a budget changed in between), the loop evicts nothing
// more for anyone until the victim is gone whole, and finishes it first.
// The API error is injected; TestEvictionRespectsBudgetsWhole has the real
// Eviction API.
func TestEvictionFinishesAPartlyEvictedGang(t *testing.T) {
	pods, others := evictionObjects()
	var objs []client.Object
	var rtObjs []runtime.Object
	for i, p := range pods {
		p.UID = pt.MakePod(p.Name, "ns").Obj().UID
		// What the API server's Priority admission writes.
		p.Spec.Priority = ptrTo(map[string]int32{"low": 10, "high": 1000}[p.Spec.PriorityClassName])
		if p.Spec.NodeName != "" {
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		objs = append(objs, p)
		rtObjs = append(rtObjs, pods[i])
	}
	objs = append(objs, others...)
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Queue{}, &v1alpha1.PodGroup{}, &corev1.Pod{}).Build()
	cs := k8sfake.NewClientset(rtObjs...)
	failures := 1
	var real []string
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := action.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		if len(ev.DeleteOptions.DryRun) > 0 {
			return true, nil, nil
		}
		if ev.Name == "low-1" && failures > 0 {
			failures--
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		real = append(real, ev.Name)
		// The eviction deletes the pod, as the API server does.
		var p corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ev.Namespace, Name: ev.Name}, &p); err == nil {
			_ = c.Delete(context.Background(), &p)
		}
		return true, nil, nil
	})
	w := &evictionWorld{clk: testingclock.NewFakeClock(evictionT0), c: c}
	w.start(t, cs)
	w.cycle(t)
	if fmt.Sprint(real) != "[low-0]" {
		r, m := w.podGroupStatus(t, "high")
		t.Fatalf("real evictions %v, want low-0 before low-1 failed (high: %s %s)", real, r, m)
	}
	reason, msg := w.podGroupStatus(t, "high")
	if reason != v1alpha1.ReasonEvictionRefused || !strings.Contains(msg, "evicting ns/low to make room stopped after 1 of its pods") {
		t.Errorf("PodGroup high: reason %q, %q", reason, msg)
	}
	// The next cycle finishes the gang before deciding anything.
	w.clk.Step(time.Second)
	w.cycle(t)
	if fmt.Sprint(real) != "[low-0 low-1]" {
		t.Errorf("real evictions %v, want the rest of the gang finished", real)
	}
	if len(w.a.finishing) != 0 {
		t.Errorf("still finishing %v", w.a.finishing)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestRefusalsKeepTheWaitsReason: a workload that waits for a limit's
// headroom reclaims too (cycle: reclaim under a limit); when its evictions
// are refused it reads EvictionRefused like one that waits for room, and
// while a victim is being evicted whole its reason stays the cycle's.
func TestRefusalsKeepTheWaitsReason(t *testing.T) {
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	key := func(name string) cycle.WorkloadKey { return cycle.WorkloadKey{Namespace: "ns", Pod: name} }
	result := func() *cycle.Result {
		return &cycle.Result{Waiting: []cycle.Wait{
			{Workload: &cycle.Workload{Key: key("quota")}, Reason: v1alpha1.ReasonWaitingForQuota, Message: "evicting 1 workload(s) to make room under queue p's limit: ns/x"},
			{Workload: &cycle.Workload{Key: key("room")}, Reason: v1alpha1.ReasonWaitingForCapacity, Message: "evicting 1 workload(s) to make room: ns/y"},
			{Workload: &cycle.Workload{Key: key("members")}, Reason: v1alpha1.ReasonWaitingForMembers, Message: "gang needs 2 pods"},
		}}
	}
	reasons := func(res *cycle.Result) map[string]string {
		out := map[string]string{}
		for _, w := range res.Waiting {
			out[w.Workload.Key.Pod] = w.Reason + ": " + w.Message
		}
		return out
	}

	a := &Admitter{refusedFor: map[cycle.WorkloadKey]time.Time{key("quota"): now.Add(time.Minute), key("room"): now.Add(time.Minute), key("members"): now.Add(time.Minute)}}
	res := result()
	a.noteRefusals(res, now)
	want := map[string]string{
		"quota":   v1alpha1.ReasonEvictionRefused + ": evicting 1 workload(s) to make room under queue p's limit: ns/x",
		"room":    v1alpha1.ReasonEvictionRefused + ": evicting 1 workload(s) to make room: ns/y",
		"members": v1alpha1.ReasonWaitingForMembers + ": gang needs 2 pods",
	}
	if diff := cmp.Diff(want, reasons(res)); diff != "" {
		t.Errorf("after a refusal (-want +got):\n%s", diff)
	}

	res = result()
	a.rewriteMessage(res, key("quota"), "waiting until ns/v is evicted whole before evicting anything more")
	if got, want := reasons(res)["quota"], v1alpha1.ReasonWaitingForQuota+": waiting until ns/v is evicted whole before evicting anything more"; got != want {
		t.Errorf("while a victim is evicted whole: %q, want %q", got, want)
	}
}

// TestEvictionsShareOneReadOfTheBudgets: the victims of several
// preemptors in one cycle are checked against budgets read once per
// namespace, and what earlier evictions of the cycle took of a budget
// counts: two single pods under a budget of one disruption, each the
// victim of another preemptor, are not both evicted.
func TestEvictionsShareOneReadOfTheBudgets(t *testing.T) {
	admitted := evictionT0.Add(-time.Hour).Format(admittedLayout)
	var pods []*corev1.Pod
	for i, node := range []string{"n1", "n2"} {
		p := pt.WholePod(fmt.Sprintf("low-%d", i), 1, "1000").Queue("a").Label("app", "low").
			Annotation(v1alpha1.AnnotationAdmitted, admitted).Created(evictionT0.Add(-time.Hour)).Obj()
		p.Spec.PriorityClassName = "low"
		p.Annotations[v1alpha1.AnnotationDevicesPrefix+pt.DefaultContainer] = pt.DeviceUUID(node, 0)
		p.Spec.NodeName = node
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		pods = append(pods, p)
		h := pt.WholePod(fmt.Sprintf("high-%d", i), 1, "1000").Queue("a").
			SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(evictionT0.Add(time.Duration(i) * time.Second)).Obj()
		h.Spec.PriorityClassName = "high"
		pods = append(pods, h)
	}
	objs := []client.Object{pt.MakeQueue("a").Obj(), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "one-low", Namespace: "ns"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: ptrTo(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "low"}}},
		// The Eviction API takes a disruption off the status; the fake
		// one does not, and the list is read once: the loop must count.
		Status: policyv1.PodDisruptionBudgetStatus{DisruptionsAllowed: 1, CurrentHealthy: 2, DesiredHealthy: 1, ExpectedPods: 2},
	}}
	var rtObjs []runtime.Object
	for _, p := range pods {
		p.Spec.Priority = ptrTo(map[string]int32{"low": 10, "high": 1000}[p.Spec.PriorityClassName])
		objs = append(objs, p)
		rtObjs = append(rtObjs, p)
	}
	budgetLists := 0
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Queue{}, &v1alpha1.PodGroup{}, &corev1.Pod{}, &policyv1.PodDisruptionBudget{}).
		WithInterceptorFuncs(interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*policyv1.PodDisruptionBudgetList); ok {
				budgetLists++
			}
			return c.List(ctx, list, opts...)
		}}).Build()
	cs := k8sfake.NewClientset(rtObjs...)
	var mu sync.Mutex
	var real []string
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := action.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		if len(ev.DeleteOptions.DryRun) > 0 {
			return true, nil, nil
		}
		mu.Lock()
		real = append(real, ev.Name)
		mu.Unlock()
		var p corev1.Pod
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ev.Namespace, Name: ev.Name}, &p); err == nil {
			_ = c.Delete(context.Background(), &p)
		}
		return true, nil, nil
	})
	w := &evictionWorld{clk: testingclock.NewFakeClock(evictionT0), c: c}
	w.start(t, cs)
	w.cycle(t)
	if len(real) != 1 {
		t.Fatalf("evicted %v: the budget allows one disruption", real)
	}
	if budgetLists != 1 {
		t.Errorf("the budgets of namespace ns were listed %d times in one cycle, want once", budgetLists)
	}
	// The other victim is spared, saying why (the preemptor's wait and
	// the next cycles' "is not evicted" read it).
	var refused []string
	for k, r := range w.a.refused {
		refused = append(refused, k.String()+": "+r.why)
	}
	if len(refused) != 1 || !strings.Contains(refused[0], "PodDisruptionBudget ns/one-low allows 0 disruption(s) now and the eviction takes 1 of its pods") {
		t.Errorf("victims spared: %q; want one, naming the budget's spent disruption", refused)
	}
}

// TestReclaimEvictsManyVictimsAtOnce: a gang that reclaims many single
// pods gets them all evicted in the cycle that chose them, without dry
// runs where no budget could refuse.
func TestReclaimEvictsManyVictimsAtOnce(t *testing.T) {
	const victims = 40
	objs, rtObjs, gns := singleGPUVictims(victims)
	for i := range victims / 2 {
		p := pt.WholePod(fmt.Sprintf("b-%d", i), 1, "1000").Queue("b").PodGroup("big").
			SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(evictionT0).Obj()
		objs, rtObjs = append(objs, p), append(rtObjs, p)
	}
	objs = append(objs, pt.MakeQueue("a").Obj(), pt.MakeQueue("b").Obj(), pt.MakePodGroup("big", "ns").MinMember(victims/2).Obj())
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Queue{}, &v1alpha1.PodGroup{}, &corev1.Pod{}).Build()
	cs := k8sfake.NewClientset(rtObjs...)
	var evicted, dryRuns atomic.Int32
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		if len(action.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction).DeleteOptions.DryRun) == 0 {
			evicted.Add(1)
		} else {
			dryRuns.Add(1)
		}
		return true, nil, nil
	})
	a := admitterOf(t, c, cs, gns)
	a.Cache().UpsertPodGroup(pt.MakePodGroup("big", "ns").MinMember(victims / 2).Obj())
	if err := a.Cycle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := evicted.Load(); got != victims/2 {
		var pg v1alpha1.PodGroup
		_ = c.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: "big"}, &pg)
		t.Fatalf("evicted %d pods in the cycle, want %d (a's pods beyond its fair share); PodGroup big: %s", got, victims/2, pg.Status.Reason)
	}
	// No budget selects them: a dry run could not be refused.
	if got := dryRuns.Load(); got != 0 {
		t.Errorf("%d dry-run evictions of pods no budget selects", got)
	}
}

// TestReclaimForManySinglePodsInOneCycle: KAI's reclaim scenario in
// small: a holds every GPU with single pods, b's 20 single pods take back
// its fair share. One cycle evicts for all of them (more than the 16
// searches a cycle gives gangs), and a refused eviction spares its victim
// without stopping the other preemptors' evictions.
func TestReclaimForManySinglePodsInOneCycle(t *testing.T) {
	const victims = 40
	objs, rtObjs, gns := singleGPUVictims(victims)
	for i := range victims / 2 {
		p := pt.WholePod(fmt.Sprintf("b-%d", i), 1, "1000").Queue("b").
			SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(evictionT0.Add(time.Duration(i) * time.Millisecond)).Obj()
		objs, rtObjs = append(objs, p), append(rtObjs, p)
	}
	objs = append(objs, pt.MakeQueue("a").Obj(), pt.MakeQueue("b").Obj())
	c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(objs...).
		WithStatusSubresource(&v1alpha1.Queue{}, &v1alpha1.PodGroup{}, &corev1.Pod{}).Build()
	cs := k8sfake.NewClientset(rtObjs...)
	var mu sync.Mutex
	var evicted, refused []string
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		ev := action.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction)
		mu.Lock()
		defer mu.Unlock()
		if len(refused) == 0 {
			// The first eviction is refused, as a budget changed since
			// the preflight would.
			refused = append(refused, ev.Name)
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		evicted = append(evicted, ev.Name)
		return true, nil, nil
	})
	a := admitterOf(t, c, cs, gns)
	if err := a.Cycle(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, want := len(evicted), victims/2-1; got != want {
		t.Errorf("evicted %d pods in the cycle, want %d (one for each of b's pods but the one whose eviction was refused): %v", got, want, evicted)
	}
	// What each of b's pods is told: the conditions queued for them.
	told := map[string]int{}
	for _, q := range a.conditions {
		for {
			pc, ok := q.take()
			if !ok {
				break
			}
			switch {
			case pc.cond.Reason == v1alpha1.ReasonEvictionRefused && strings.Contains(pc.cond.Message, "could not evict ns/"+refused[0]):
				told["refused"]++
			case strings.Contains(pc.cond.Message, "evicting 1 workload(s) to make room"):
				told["evicting"]++
			default:
				told[pc.cond.Reason+": "+pc.cond.Message]++
			}
		}
	}
	if diff := cmp.Diff(map[string]int{"refused": 1, "evicting": victims/2 - 1}, told); diff != "" {
		t.Errorf("b's pods told (-want +got):\n%s", diff)
	}
}

// singleGPUVictims are queue a's victims: n admitted single-GPU pods, each
// holding the one GPU of its node, as objects for the fake clients.
func singleGPUVictims(n int) ([]client.Object, []runtime.Object, []v1alpha1.GPUNode) {
	admitted := evictionT0.Add(-time.Hour).Format(admittedLayout)
	var objs []client.Object
	var rtObjs []runtime.Object
	var gns []v1alpha1.GPUNode
	for i := range n {
		node := fmt.Sprintf("n%d", i)
		gns = append(gns, *pt.H100Node(node, 1).Obj())
		p := pt.WholePod(fmt.Sprintf("a-%d", i), 1, "1000").Queue("a").
			Annotation(v1alpha1.AnnotationAdmitted, admitted).Created(evictionT0.Add(-time.Hour)).Obj()
		p.Annotations[v1alpha1.AnnotationDevicesPrefix+pt.DefaultContainer] = pt.DeviceUUID(node, 0)
		p.Spec.NodeName = node
		objs, rtObjs = append(objs, p), append(rtObjs, p)
	}
	return objs, rtObjs, gns
}

// admitterOf is an admission loop over c's pods on gns, with queues a and
// b in its cache, at evictionT0.
func admitterOf(t *testing.T, c client.Client, cs kubernetes.Interface, gns []v1alpha1.GPUNode) *Admitter {
	t.Helper()
	clk := testingclock.NewFakeClock(evictionT0)
	var pods corev1.PodList
	if err := c.List(t.Context(), &pods); err != nil {
		t.Fatal(err)
	}
	ledger := gpu.BuildLedger(gns, pods.Items, gpu.WithClock(clk))
	a := NewAdmitter(ledger, c, cs, nil, nil, func() bool { return true }, DefaultAdmitterOptions(), nil, clk)
	cache := a.Cache()
	for _, gn := range gns {
		cache.UpsertNode(pt.MakeNode(gn.Name).Obj())
	}
	for i := range pods.Items {
		cache.UpsertPod(&pods.Items[i])
	}
	cache.UpsertQueue(pt.MakeQueue("a").Obj())
	cache.UpsertQueue(pt.MakeQueue("b").Obj())
	return a
}
