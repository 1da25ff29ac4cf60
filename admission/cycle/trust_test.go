package cycle

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	. "github.com/partita-dev/partita/internal/partitatest"
)

// Device memory of the models the tests mix.
const (
	l4MiB   = 23034
	h200MiB = 143771
)

// canonical is p as the webhook leaves it in a cluster whose largest
// device has refMiB: partita.dev/gpu-milli is the request's lower bound.
func canonical(t *testing.T, p *corev1.Pod, refMiB int64) *corev1.Pod {
	t.Helper()
	r, errs := gpu.ParsePod(p)
	if len(errs) > 0 || r == nil {
		t.Fatalf("pod %s: %v", p.Name, errs)
	}
	return gpu.ApplyCanonical(p, r, refMiB)
}

// mixedModels is an L4 node and an H200 node, one device each.
func mixedModels() ([]*corev1.Node, []*v1alpha1.GPUNode) {
	return []*corev1.Node{MakeNode("l4").Label("model", "l4").Obj(), MakeNode("h200").Label("model", "h200").Obj()},
		[]*v1alpha1.GPUNode{
			MakeGPUNode("l4").Devices(1, "NVIDIA L4", l4MiB).Obj(),
			MakeGPUNode("h200").Devices(1, "NVIDIA H200", h200MiB).Obj(),
		}
}

// slice is a pending 20Gi pod of queue q that only fits the L4.
func slice(t *testing.T, name, q string, created time.Time) *corev1.Pod {
	return canonical(t, MakePod(name, "ns").Queue(q).GPUMemory("20Gi").NodeSelector("model", "l4").
		SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(created).Obj(), h200MiB)
}

// TestCycleTrust: what a tenant writes never takes another team's queue,
// a higher priority, or more GPUs than its queue is charged for.
func TestCycleTrust(t *testing.T) {
	nodes1, gpus1 := gpuNodes("n", 1, 1)
	nodes2, gpus2 := gpuNodes("n", 2, 1)
	mixed, mixedGPUs := mixedModels()
	queueA, queueB := MakeQueue("a").Obj(), MakeQueue("b").GPU("1", "-1", 1).Obj()
	defaultQueue := MakeQueue(v1alpha1.DefaultQueueName).Priority(0).GPU("0", "-1", 1).Obj()
	oneGPU := MakeQueue("a").GPU("0", "1", 1).Obj()

	cases := map[string]struct {
		world world
		opts  Options
		want  outcome
		// wantAllocated are queues' allocated milli-GPUs after the cycle.
		wantAllocated map[string]int64
		// wantHold are the admitted workloads whose devices are held.
		wantHold []string
	}{
		"a PodGroup naming another queue than its members moves nothing": {
			world: world{nodes: nodes2, gpuNodes: gpus2, queues: []*v1alpha1.Queue{queueA, queueB},
				pods: []*corev1.Pod{
					running("g-0", "a", "n-0", 1, t0).PodGroup("g").Obj(),
					gated("g-1", "a", 1).PodGroup("g").Obj(),
				},
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("g", "ns").MinMember(2).Queue("b").Obj()}},
			want: outcome{Waiting: map[string]string{
				"ns/g": "QueueConflict: the pods of gang ns/g name queue a but its PodGroup names queue b; a gang's members go to their PodGroup's queue: " +
					"create the pods again without a queue label (they then take the PodGroup's), or set the PodGroup's spec.queue to a",
			}},
			wantAllocated: map[string]int64{"a": 1000, "b": 0},
		},
		"members without a queue label take their PodGroup's": {
			world: world{nodes: nodes2, gpuNodes: gpus2, queues: []*v1alpha1.Queue{queueA, queueB},
				pods:      []*corev1.Pod{gated("g-0", "", 1).PodGroup("g").Obj(), gated("g-1", "", 1).PodGroup("g").Obj()},
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("g", "ns").MinMember(2).Queue("b").Obj()}},
			want:          outcome{Admitted: map[string][]string{"ns/g": {"g-0@n-0", "g-1@n-1"}}},
			wantAllocated: map[string]int64{"a": 0, "b": 2000},
		},
		"the pods of one gang naming two queues wait": {
			world: world{nodes: nodes2, gpuNodes: gpus2, queues: []*v1alpha1.Queue{queueA, queueB},
				pods: []*corev1.Pod{
					gated("g-0", "a", 1).PodGroup("g").Annotation(v1alpha1.AnnotationMinMember, "2").Obj(),
					gated("g-1", "b", 1).PodGroup("g").Annotation(v1alpha1.AnnotationMinMember, "2").Obj(),
				}},
			want: outcome{Waiting: map[string]string{
				"ns/g": "QueueConflict: the pods of ns/g name different queues (a, b); a workload goes to one queue: give its pods the same partita.dev/queue label",
			}},
		},
		"a PodGroup's class never raises its members' priority": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA},
				priorityClasses: map[string]int32{"urgent": 1000},
				pods: []*corev1.Pod{
					running("low", "a", "n-0", 1, t0).Priority(10).Obj(),
					gated("g-0", "a", 1).PodGroup("g").Priority(10).Obj(),
				},
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("g", "ns").PriorityClassName("urgent").Obj()}},
			want: outcome{Waiting: map[string]string{"ns/g": "WaitingForCapacity: gang needs 1 GPU; it does not fit now: " + noRoom("n-0")}},
		},
		"a PodGroup's class lowers its members' priority": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA},
				priorityClasses: map[string]int32{"batch": 5},
				pods: []*corev1.Pod{
					running("mid", "a", "n-0", 1, t0).Priority(50).Obj(),
					gated("g-0", "a", 1).PodGroup("g").Priority(100).Obj(),
				},
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("g", "ns").PriorityClassName("batch").Obj()}},
			want: outcome{Waiting: map[string]string{"ns/g": "WaitingForCapacity: gang needs 1 GPU; it does not fit now: " + noRoom("n-0")}},
		},
		"without a PodGroup class the members' own priority preempts": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{
					running("mid", "a", "n-0", 1, t0).Priority(50).Obj(),
					gated("g-0", "a", 1).PodGroup("g").Priority(100).Obj(),
				},
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("g", "ns").Obj()}},
			want: outcome{
				Waiting: map[string]string{"ns/g": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/mid"},
				Evicted: []string{"ns/mid (preempt)"},
			},
		},
		"a pod without a queue goes to the default queue": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{defaultQueue}, defaultQueue: v1alpha1.DefaultQueueName,
				pods: []*corev1.Pod{gated("p", "", 1).Obj()}},
			want:          outcome{Admitted: map[string][]string{"ns/p": {"p@n-0"}}},
			wantAllocated: map[string]int64{v1alpha1.DefaultQueueName: 1000},
			// Every single pod is held where the cycle placed it.
			wantHold: []string{"ns/p"},
		},
		"what the default queue borrows is reclaimed": {
			world: world{nodes: nodes2, gpuNodes: gpus2, queues: []*v1alpha1.Queue{defaultQueue, queueB}, defaultQueue: v1alpha1.DefaultQueueName,
				pods: []*corev1.Pod{
					running("d-old", "", "n-0", 1, t0).Obj(),
					running("d-young", "", "n-1", 1, t0.Add(time.Minute)).Obj(),
					gated("b-1", "b", 1).Obj(),
				}},
			opts: Options{PreemptMinRuntime: time.Minute},
			want: outcome{
				Waiting: map[string]string{"ns/b-1": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/d-young"},
				Evicted: []string{"ns/d-young (reclaim)"},
			},
		},
		"without the default Queue a pod that names none waits and says why": {
			world: world{nodes: nodes1, gpuNodes: gpus1, defaultQueue: v1alpha1.DefaultQueueName, pods: []*corev1.Pod{gated("p", "", 1).Obj()}},
			want: outcome{Waiting: map[string]string{
				"ns/p": "WaitingForQuota: queue default, the cluster's default queue for pods that name none, does not exist: create it (the chart and `partita dev up` do), or name an existing leaf queue",
			}},
		},
		"a single pod kube-scheduler may place elsewhere is not held": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{func() *corev1.Pod {
					p := gated("spread", "a", 1).Obj()
					p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule}}
					return p
				}()}},
			want:          outcome{Admitted: map[string][]string{"ns/spread": {"spread@n-0"}}},
			wantAllocated: map[string]int64{"a": 1000},
		},
		"a memory slice is charged its share of the device it gets": {
			world: world{nodes: mixed, gpuNodes: mixedGPUs, queues: []*v1alpha1.Queue{oneGPU},
				pods: []*corev1.Pod{slice(t, "first", "a", t0), slice(t, "second", "a", t0.Add(time.Second))}},
			want: outcome{
				Admitted: map[string][]string{"ns/first": {"first@l4"}},
				Waiting: map[string]string{
					"ns/second": "WaitingForQuota: queue a is at its limit: 0.89 of 1 GPUs",
				},
			},
			wantAllocated: map[string]int64{"a": 890},
			wantHold:      []string{"ns/first"},
		},
		"a memory slice its queue cannot hold on the device it would get waits": {
			world: world{nodes: mixed, gpuNodes: mixedGPUs, queues: []*v1alpha1.Queue{MakeQueue("a").GPU("0", "0.5", 1).Obj()},
				pods: []*corev1.Pod{slice(t, "only", "a", t0)}},
			want: outcome{Waiting: map[string]string{
				// 142 (its share of the largest device) would pass; 890 does not.
				"ns/only": "WaitingForQuota: queue a is at its limit: 0 of 0.5 GPUs (a memory request is charged its share of the device chosen for it: 0.89 GPUs)",
			}},
			wantAllocated: map[string]int64{"a": 0},
		},
		"a bound memory slice is charged what it holds": {
			world: world{nodes: mixed, gpuNodes: mixedGPUs, queues: []*v1alpha1.Queue{MakeQueue("a").GPU("0", "2", 1).Obj()},
				pods: []*corev1.Pod{
					canonical(t, MakePod("held", "ns").Queue("a").GPUMemory("20Gi").Node("l4").Created(t0).Obj(), h200MiB),
					canonical(t, MakePod("next", "ns").Queue("a").GPUMemory("20Gi").NodeSelector("model", "h200").
						SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0).Obj(), h200MiB),
				}},
			want: outcome{Admitted: map[string][]string{"ns/next": {"next@h200"}}},
			// 890 of the L4 and 143 of the H200; counted by partita.dev/gpu-milli
			// (142 each) it would be 284.
			wantAllocated: map[string]int64{"a": 890 + 143},
			wantHold:      []string{"ns/next"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, res := runWorld(t, tc.world, tc.opts)
			if tc.want.Admitted == nil {
				tc.want.Admitted = map[string][]string{}
			}
			if tc.want.Waiting == nil {
				tc.want.Waiting = map[string]string{}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			if tc.wantAllocated != nil {
				alloc := map[string]int64{}
				for _, q := range res.Queues {
					if _, ok := tc.wantAllocated[q.Name]; ok {
						alloc[q.Name] = q.AllocatedMilli
					}
				}
				if diff := cmp.Diff(tc.wantAllocated, alloc); diff != "" {
					t.Errorf("allocated (-want +got):\n%s", diff)
				}
			}
			var hold []string
			for _, a := range res.Admissions {
				if a.Hold {
					hold = append(hold, a.Workload.Key.String())
				}
			}
			if diff := cmp.Diff(tc.wantHold, hold); diff != "" {
				t.Errorf("held admissions (-want +got):\n%s", diff)
			}
		})
	}
}

// TestQuotaSeesWhatASliceHolds: the quota policy is asked with the share of
// the device a memory slice will hold, and sees the queue's allocation
// from the ledger.
func TestQuotaSeesWhatASliceHolds(t *testing.T) {
	mixed, mixedGPUs := mixedModels()
	rec := &recordingQuota{}
	cache := NewCache()
	for _, n := range mixed {
		cache.UpsertNode(n)
	}
	cache.UpsertQueue(MakeQueue("a").GPU("0", "2", 1).Obj())
	var gns []v1alpha1.GPUNode
	for _, n := range mixedGPUs {
		gns = append(gns, *n)
	}
	held := canonical(t, MakePod("held", "ns").Queue("a").GPUMemory("20Gi").Node("l4").Created(t0).
		Annotation(v1alpha1.AnnotationDevicesPrefix+DefaultContainer, DeviceUUID("l4", 0)).Obj(), h200MiB)
	cache.UpsertPod(held)
	cache.UpsertPod(canonical(t, MakePod("next", "ns").Queue("a").GPUMemory("20Gi").NodeSelector("model", "h200").
		SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0).Obj(), h200MiB))
	ledger := gpu.BuildLedger(gns, []corev1.Pod{*held})
	Run(t.Context(), cache.State(), ledger.Snapshot(), rec, Options{Now: t0.Add(time.Hour)})
	want := []string{
		"ns/next: allocated 890, workload 142", // the lower bound first,
		"ns/next: allocated 890, workload 143", // then what it will hold on the H200
	}
	if diff := cmp.Diff(want, rec.asked); diff != "" {
		t.Errorf("quota questions (-want +got):\n%s", diff)
	}
}

type recordingQuota struct{ asked []string }

func (r *recordingQuota) CheckQuota(_ context.Context, q *QuotaRequest) (*QuotaVerdict, error) {
	r.asked = append(r.asked, fmt.Sprintf("%s: allocated %d, workload %d", q.Workload.Key, q.Queue.AllocatedMilli, q.GPUMilli))
	return &QuotaVerdict{Allowed: true}, nil
}

// TestHeldChargeFollowsTheInventory: what a bound slice holds is kept from
// cycle to cycle, and read again when its node's inventory changes.
func TestHeldChargeFollowsTheInventory(t *testing.T) {
	cache := NewCache()
	cache.UpsertNode(MakeNode("n").Obj())
	cache.UpsertQueue(MakeQueue("a").Obj())
	held := canonical(t, MakePod("held", "ns").Queue("a").GPUMemory("20Gi").Node("n").Created(t0).
		Annotation(v1alpha1.AnnotationDevicesPrefix+DefaultContainer, DeviceUUID("n", 0)).Obj(), h200MiB)
	cache.UpsertPod(held)
	ledger := gpu.BuildLedger(nil, []corev1.Pod{*held})
	allocated := func() int64 {
		t.Helper()
		res := Run(t.Context(), cache.State(), ledger.Snapshot(), nil, Options{Now: t0.Add(time.Hour)})
		return res.Queues[0].AllocatedMilli
	}
	if got := allocated(); got != 142 {
		t.Errorf("with no GPUNode yet: allocated %d, want its partita.dev/gpu-milli 142", got)
	}
	ledger.UpsertNode(MakeGPUNode("n").Devices(1, "NVIDIA L4", l4MiB).Obj())
	for range 2 {
		if got := allocated(); got != 890 {
			t.Errorf("on an L4: allocated %d, want 890", got)
		}
	}
	ledger.UpsertNode(MakeGPUNode("n").Devices(1, "NVIDIA H200", h200MiB).Obj())
	if got := allocated(); got != 143 {
		t.Errorf("after the node's device changed to an H200: allocated %d, want 143", got)
	}
}
