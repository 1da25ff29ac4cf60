package admission

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/events"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// TestRefusedPins: a gang member pinned to a node that kube-scheduler keeps
// refusing (a reason the cycle does not model) is not left to wait out the
// schedule timeout beside the members that run: past RefusedPinTimeout the
// loop evicts it, so that its controller's replacement waits behind the
// gate and is placed again; a gang none of whose members runs is requeued
// whole at once. Bare pods are never deleted.
func TestRefusedPins(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const refusal = "0/2 nodes are available: 1 Too many pods, 1 node(s) didn't match Pod's node affinity/selector."
	member := func(name string, admitted time.Duration, owned bool) *pt.PodWrapper {
		w := pt.WholePod(name, 1, "1000").Queue("a").PodGroup("train").Created(now.Add(-time.Hour)).
			Annotation(v1alpha1.AnnotationAdmitted, now.Add(-admitted).Format(admittedLayout))
		if owned {
			w.OwnedBy("Job", "train")
		}
		return w
	}
	running := func(name string, device int32) *corev1.Pod {
		return pt.Bound(member(name, 2*time.Minute, true), "n1", device)
	}
	refused := func(name string, admitted time.Duration, owned bool) *corev1.Pod {
		return member(name, admitted, owned).PinnedTo("n2").Unschedulable(refusal).Obj()
	}
	type result struct {
		Evicted []string
		// Events are the PinRefused and ScheduleTimeout events, as
		// "type reason message".
		Events  []string
		Backoff bool
		// Phase and Reason are the PodGroup's status.
		Phase  v1alpha1.PodGroupPhase
		Reason string
	}
	evictedTrain2 := "Warning PinRefused kube-scheduler refuses member train-2 at node n2, where it is pinned, 2m0s after its admission (" + refusal +
		"); evicted train-2 so that the loop places it again; the 2 bound members keep running"
	cases := map[string]struct {
		pods      []*corev1.Pod
		minMember int32
		// timeout is RefusedPinTimeout; cycles how many cycles run, a
		// second apart. then are pods that come before the second cycle,
		// when the evicted ones are gone: their controller's replacements.
		timeout time.Duration
		cycles  int
		then    []*corev1.Pod
		want    result
	}{
		"a member refused beside running ones is evicted to be placed again": {
			pods: []*corev1.Pod{running("train-0", 0), running("train-1", 1), refused("train-2", 2*time.Minute, true)},
			want: result{Evicted: []string{"train-2"}, Events: []string{evictedTrain2, evictedTrain2}, Phase: v1alpha1.PodGroupAdmitted},
		},
		"it is evicted once": {
			pods: []*corev1.Pod{running("train-0", 0), running("train-1", 1), refused("train-2", 2*time.Minute, true)}, cycles: 2,
			want: result{Evicted: []string{"train-2"}, Events: []string{evictedTrain2, evictedTrain2}, Phase: v1alpha1.PodGroupAdmitted},
		},
		"a refused member beyond the gang's minimum is evicted too": {
			pods: []*corev1.Pod{running("train-0", 0), running("train-1", 1), refused("train-2", 2*time.Minute, true)}, minMember: 2,
			want: result{Evicted: []string{"train-2"}, Events: []string{evictedTrain2, evictedTrain2}, Phase: v1alpha1.PodGroupRunning},
		},
		"a refusal younger than the bound waits": {
			pods: []*corev1.Pod{running("train-0", 0), running("train-1", 1), refused("train-2", 30*time.Second, true)},
			want: result{Phase: v1alpha1.PodGroupAdmitted},
		},
		"a member kube-scheduler has not refused waits": {
			pods: []*corev1.Pod{running("train-0", 0), running("train-1", 1), member("train-2", 2*time.Minute, true).PinnedTo("n2").Obj()},
			want: result{Phase: v1alpha1.PodGroupAdmitted},
		},
		"without the bound the schedule timeout decides": {
			pods:    []*corev1.Pod{running("train-0", 0), running("train-1", 1), refused("train-2", 2*time.Minute, true)},
			timeout: -1,
			want:    result{Phase: v1alpha1.PodGroupAdmitted},
		},
		"a bare member is left pinned, and told once": {
			pods: []*corev1.Pod{running("train-0", 0), running("train-1", 1), refused("train-2", 2*time.Minute, false)}, cycles: 2,
			want: result{
				Events: slices.Repeat([]string{"Warning PinRefused kube-scheduler refuses member train-2 at node n2, where it is pinned, 2m0s after its admission (" + refusal +
					"); train-2 has no controller, so it is left pinned until the gang's schedule timeout (5m0s)"}, 2),
				Phase: v1alpha1.PodGroupAdmitted,
			},
		},
		"a replacement refused again requeues the gang whole": {
			pods:   []*corev1.Pod{running("train-0", 0), running("train-1", 1), refused("train-2", 2*time.Minute, true)},
			cycles: 2, then: []*corev1.Pod{refused("train-3", 89*time.Second, true)},
			want: result{
				Evicted: []string{"train-0", "train-1", "train-2", "train-3"},
				Events: append([]string{evictedTrain2, evictedTrain2}, slices.Repeat([]string{"Warning PinRefused again after the loop placed refused members anew, " +
					"kube-scheduler refuses member train-3 at node n2, where it is pinned, 1m30s after its admission (" + refusal +
					"); evicted 3 pods with a controller; the gang is requeued and tries again in 10s"}, 3)...),
				Backoff: true,
				Phase:   v1alpha1.PodGroupFailed,
				Reason: "again after the loop placed refused members anew, kube-scheduler refuses member train-3 at node n2, where it is pinned, 1m30s after its admission (" + refusal +
					"); evicted 3 pods with a controller; the gang is requeued and tries again in 10s",
			},
		},
		"a replacement beyond the minimum refused again stays pinned": {
			pods:   []*corev1.Pod{running("train-0", 0), running("train-1", 1), refused("train-2", 2*time.Minute, true)},
			cycles: 3, then: []*corev1.Pod{refused("train-3", 89*time.Second, true)}, minMember: 2,
			want: result{
				Evicted: []string{"train-2"},
				Events: []string{evictedTrain2, evictedTrain2,
					"Warning PinRefused again after the loop placed refused members anew, kube-scheduler refuses member train-3 at node n2, where it is pinned, 1m30s after its admission (" + refusal +
						"); train-3 is left pinned while the gang runs at its minimum",
					"Warning PinRefused again after the loop placed refused members anew, kube-scheduler refuses member train-3 at node n2, where it is pinned, 1m30s after its admission (" + refusal +
						"); train-3 is left pinned while the gang runs at its minimum",
				},
				Phase: v1alpha1.PodGroupRunning,
			},
		},
		"a gang none of whose members runs is requeued whole": {
			pods: []*corev1.Pod{
				member("train-0", 2*time.Minute, true).PinnedTo("n1").Obj(),
				member("train-1", 2*time.Minute, true).PinnedTo("n1").Obj(),
				refused("train-2", 2*time.Minute, true),
			},
			want: result{
				Evicted: []string{"train-0", "train-1", "train-2"},
				Events: slices.Repeat([]string{"Warning PinRefused kube-scheduler refuses member train-2 at node n2, where it is pinned, 2m0s after its admission (" + refusal +
					"); evicted 3 pods with a controller; the gang is requeued and tries again in 10s"}, 3),
				Backoff: true,
				Phase:   v1alpha1.PodGroupFailed,
				Reason: "kube-scheduler refuses member train-2 at node n2, where it is pinned, 2m0s after its admission (" + refusal +
					"); evicted 3 pods with a controller; the gang is requeued and tries again in 10s",
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			clk := testingclock.NewFakeClock(now)
			pg := pt.MakePodGroup("train", "ns").MinMember(3).Obj()
			if tc.minMember > 0 {
				pg.Spec.MinMember = tc.minMember
			}
			queue := pt.MakeQueue("a").Obj()
			c := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(pg.DeepCopy(), queue.DeepCopy()).
				WithStatusSubresource(&v1alpha1.Queue{}, &v1alpha1.PodGroup{}, &corev1.Pod{}).Build()
			cs := k8sfake.NewClientset()
			var got result
			cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
				if action.GetSubresource() == "eviction" {
					got.Evicted = append(got.Evicted, action.(k8stesting.CreateAction).GetObject().(*policyv1.Eviction).Name)
				}
				return true, nil, nil
			})
			rec := events.NewFakeRecorder(50)
			opts := DefaultAdmitterOptions()
			switch {
			case tc.timeout < 0:
				opts.RefusedPinTimeout = 0
			case tc.timeout > 0:
				opts.RefusedPinTimeout = tc.timeout
			}
			ledger := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 4).Obj(), pt.H100Node("n2", 4).Obj()}, tc.pods...)
			a := NewAdmitter(ledger, c, cs, rec, nil, func() bool { return true }, opts, nil, clk)
			cache := a.Cache()
			for _, n := range []string{"n1", "n2"} {
				cache.UpsertNode(pt.MakeNode(n).Obj())
			}
			cache.UpsertQueue(queue)
			cache.UpsertPodGroup(pg)
			for _, p := range tc.pods {
				cache.UpsertPod(p)
			}
			for i := range max(tc.cycles, 1) {
				if i == 1 && tc.then != nil {
					for _, name := range got.Evicted {
						cache.DeletePod(pt.MakePod(name, "ns").Obj().UID)
					}
					for _, p := range tc.then {
						cache.UpsertPod(p)
					}
				}
				if err := a.Cycle(ctx); err != nil {
					t.Fatal(err)
				}
				var cur v1alpha1.PodGroup
				if err := c.Get(ctx, client.ObjectKeyFromObject(pg), &cur); err != nil {
					t.Fatal(err)
				}
				cache.UpsertPodGroup(&cur)
				clk.Step(time.Second)
			}
			for len(rec.Events) > 0 {
				e := <-rec.Events
				if strings.HasPrefix(e, "Warning "+v1alpha1.ReasonPinRefused+" ") || strings.HasPrefix(e, "Warning "+v1alpha1.ReasonScheduleTimeout+" ") {
					got.Events = append(got.Events, e)
				}
			}
			_, got.Backoff = a.backoff[cycle.WorkloadKey{Namespace: "ns", PodGroup: "train"}]
			var cur v1alpha1.PodGroup
			if err := c.Get(ctx, client.ObjectKeyFromObject(pg), &cur); err != nil {
				t.Fatal(err)
			}
			got.Phase, got.Reason = cur.Status.Phase, cur.Status.Reason
			slices.Sort(got.Evicted)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
