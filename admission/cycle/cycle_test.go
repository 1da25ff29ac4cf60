package cycle

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	. "github.com/partita-dev/partita/internal/partitatest"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// world is the cluster a test cycle runs on.
type world struct {
	nodes     []*corev1.Node
	gpuNodes  []*v1alpha1.GPUNode
	queues    []*v1alpha1.Queue
	podGroups []*v1alpha1.PodGroup
	pods      []*corev1.Pod
	// mapped is the workload map's answer by pod name (tablemap).
	mapped map[string]Mapping
	// defaultQueue is the cache's WithDefaultQueue.
	defaultQueue string
	// priorityClasses are PriorityClass values by name.
	priorityClasses map[string]int32
	// silent are nodes whose agent stopped reporting (last heartbeat t0,
	// silent for 3m).
	silent []string
	// claims are the ResourceClaims and templates pods name (WithClaims).
	claims *ClaimSource
	// topologies are the cluster's Topologies.
	topologies []*v1alpha1.Topology
}

// tablemap is the workload map as a table: package workloadmap computes
// the answers from the rules and the owners, and is tested there; here
// they are the input.
type tablemap map[string]Mapping

func (m tablemap) Map(pod *corev1.Pod) Mapping { return m[pod.Name] }
func (tablemap) Forget(types.UID)              {}

// rayGang is the workload map's answer for the pods of RayCluster rc, of
// minimum n: its workers are elastic.
func rayGang(rc string, n int32, elastic bool) Mapping {
	return Mapping{Gang: "raycluster-" + rc, MinMember: n, Elastic: elastic, Kind: "RayCluster", Name: rc,
		Owner: Owner{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: rc, UID: types.UID("uid-" + rc)}}
}

// rayCluster is a head and workers of RayCluster rc in queue q, gated or
// (running, from admitted) bound to nodes n-0, n-1, ...; the head and the
// first min-1 workers are its minimum.
func rayCluster(rc, q string, workers int, running []string, admitted time.Time, minWorkers int32) ([]*corev1.Pod, map[string]Mapping) {
	mapped := map[string]Mapping{}
	var pods []*corev1.Pod
	for i := range workers + 1 {
		name := fmt.Sprintf("%s-worker-%d", rc, i-1)
		if i == 0 {
			name = rc + "-head"
		}
		var p *PodWrapper
		if i < len(running) {
			p = MakePod(name, "ns").Queue(q).GPUCount(1).Node(running[i]).Created(admitted).
				Annotation(v1alpha1.AnnotationAdmitted, admitted.Add(time.Duration(i)*time.Second).Format(time.RFC3339))
		} else {
			p = gated(name, q, 1).Created(t0.Add(time.Duration(i) * time.Second))
		}
		pods = append(pods, p.Obj())
		mapped[name] = rayGang(rc, minWorkers+1, i > 0)
	}
	return pods, mapped
}

// gpuNodes makes n nodes named prefix-i with perNode 80GB devices.
func gpuNodes(prefix string, n, perNode int) ([]*corev1.Node, []*v1alpha1.GPUNode) {
	var nodes []*corev1.Node
	var gns []*v1alpha1.GPUNode
	for i := range n {
		name := fmt.Sprintf("%s-%d", prefix, i)
		nodes = append(nodes, MakeNode(name).Obj())
		gns = append(gns, MakeGPUNode(name).Devices(perNode, "NVIDIA H100 80GB HBM3", 81559).Obj())
	}
	return nodes, gns
}

// gated is a pending pod of queue q asking for whole GPUs.
func gated(name, q string, gpus int) *PodWrapper {
	return MakePod(name, "ns").Queue(q).GPUCount(gpus).SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0)
}

// running is a bound pod of queue q admitted at admitted.
func running(name, q, node string, gpus int, admitted time.Time) *PodWrapper {
	return MakePod(name, "ns").Queue(q).GPUCount(gpus).Node(node).Created(admitted).
		Annotation(v1alpha1.AnnotationAdmitted, admitted.Format(time.RFC3339))
}

// limitQuota stands in for the default Rego quota policy (tested in
// package policy): it enforces the GPU, CPU and memory limits of the queue
// and its ancestors.
type limitQuota struct{}

func (limitQuota) CheckQuota(_ context.Context, r *QuotaRequest) (*QuotaVerdict, error) {
	v := &QuotaVerdict{Allowed: true}
	for _, q := range append([]QueueUsage{r.Queue}, r.Ancestors...) {
		if q.LimitMilli >= 0 && q.AllocatedMilli+r.GPUMilli > q.LimitMilli {
			v.Allowed = false
			v.Reasons = append(v.Reasons, fmt.Sprintf("queue %s is at its limit: %s of %s GPUs", q.Name, gpu.FormatMilli(q.AllocatedMilli), gpu.FormatMilli(q.LimitMilli)))
		}
		if q.CPU.Limit >= 0 && q.CPU.Allocated+r.CPUMilli > q.CPU.Limit {
			v.Allowed = false
			v.Reasons = append(v.Reasons, fmt.Sprintf("queue %s is at its CPU limit: %s of %s CPUs", q.Name, gpu.FormatMilli(q.CPU.Allocated), gpu.FormatMilli(q.CPU.Limit)))
		}
		if q.Memory.Limit >= 0 && q.Memory.Allocated+r.Memory > q.Memory.Limit {
			v.Allowed = false
			v.Reasons = append(v.Reasons, fmt.Sprintf("queue %s is at its memory limit: %d of %d bytes", q.Name, q.Memory.Allocated, q.Memory.Limit))
		}
	}
	return v, nil
}

// outcome is what a user sees of a cycle.
type outcome struct {
	// Admitted maps a workload to its members as pod@node, sorted.
	Admitted map[string][]string
	// Waiting maps a workload to "Reason: message".
	Waiting map[string]string
	// Evicted are the victims, as workload (reclaim|preempt).
	Evicted []string
}

// checkOutcome compares a cycle's outcome with want, whose nil maps mean
// none.
func checkOutcome(t *testing.T, want, got outcome) {
	t.Helper()
	if want.Admitted == nil {
		want.Admitted = map[string][]string{}
	}
	if want.Waiting == nil {
		want.Waiting = map[string]string{}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
}

// build makes the loop's cache and the ledger of w.
func (w world) build(t testing.TB) (*Cache, *gpu.Ledger) {
	t.Helper()
	opts2 := []CacheOption{WithMapper(tablemap(w.mapped)), WithDefaultQueue(w.defaultQueue)}
	if w.claims != nil {
		src := *w.claims
		opts2 = append(opts2, WithClaims(func(p *corev1.Pod) dra.Demand { return dra.PodDemand(p, src, dra.DefaultGPUClasses, nil) }))
	}
	cache := NewCache(opts2...)
	for name, v := range w.priorityClasses {
		cache.UpsertPriorityClass(name, v)
	}
	for _, n := range w.nodes {
		cache.UpsertNode(n)
	}
	for _, q := range w.queues {
		cache.UpsertQueue(q)
	}
	for _, pg := range w.podGroups {
		cache.UpsertPodGroup(pg)
	}
	for _, topo := range w.topologies {
		cache.UpsertTopology(topo)
	}
	var gns []v1alpha1.GPUNode
	for _, n := range w.gpuNodes {
		gns = append(gns, *n)
	}
	ledger := gpu.BuildLedger(gns, nil)
	for _, n := range w.silent {
		ledger.SetAgentSilent(n, &gpu.AgentSilentError{LastHeartbeat: t0, For: 3 * time.Minute})
	}
	for _, p := range w.pods {
		cache.UpsertPod(p)
		if p.Spec.NodeName == "" {
			continue
		}
		req, errs := gpu.ParsePod(p)
		if len(errs) == 0 && req == nil {
			continue // no GPU (or its claims hold them): nothing in the ledger
		}
		if len(errs) > 0 || req == nil {
			t.Fatalf("pod %s: %v", p.Name, errs)
		}
		a, err := ledger.Choose(p.Spec.NodeName, req, "")
		if err != nil {
			t.Fatalf("place running pod %s: %v", p.Name, err)
		}
		if err := ledger.Assume(a); err != nil {
			t.Fatalf("assume running pod %s: %v", p.Name, err)
		}
	}
	return cache, ledger
}

func runWorld(t testing.TB, w world, opts Options) (outcome, *Result) {
	t.Helper()
	cache, ledger := w.build(t)
	if opts.Now.IsZero() {
		opts.Now = t0.Add(time.Hour)
	}
	res := Run(context.Background(), cache.State(), ledger.Snapshot(), limitQuota{}, opts)
	out := outcome{Admitted: map[string][]string{}, Waiting: map[string]string{}}
	for _, a := range res.Admissions {
		var ms []string
		for _, m := range a.Members {
			ms = append(ms, m.Member.Pod.Name+"@"+m.Allocation.Node)
		}
		ms = append(out.Admitted[a.Workload.Key.String()], ms...)
		slices.Sort(ms)
		out.Admitted[a.Workload.Key.String()] = ms
	}
	for _, wt := range res.Waiting {
		out.Waiting[wt.Workload.Key.String()] = wt.Reason + ": " + wt.Message
		// The admitter folds the telling of a wait for terminating victims
		// into the eviction's: the flags must say what the message says.
		if evicting := strings.HasPrefix(wt.Message, "evicting "); wt.Evicting != evicting {
			t.Errorf("wait of %s: Evicting = %v for %q", wt.Workload.Key, wt.Evicting, wt.Message)
		}
		if terminating := strings.HasPrefix(wt.Message, "waiting for ") && strings.Contains(wt.Message, "evicted or deleted pods to terminate"); wt.Terminating != terminating {
			t.Errorf("wait of %s: Terminating = %v for %q", wt.Workload.Key, wt.Terminating, wt.Message)
		}
	}
	for _, e := range res.Evictions {
		kind := "preempt"
		if e.Reclaim {
			kind = "reclaim"
		}
		victim := e.Victim.Key.String()
		if len(e.Members) < len(e.Victim.Active) {
			for _, m := range e.Members {
				victim += " " + m.Pod.Name
			}
		}
		out.Evicted = append(out.Evicted, victim+" ("+kind+")")
	}
	return out, res
}

// mappedPodGroup is the PodGroup the loop keeps for a gang of the workload
// map, owned by the object of UID owner.
func mappedPodGroup(name, queue string, owner types.UID) *v1alpha1.PodGroup {
	pg := MakePodGroup(name, "ns").MinMember(1).Queue(queue).Obj()
	pg.Labels = map[string]string{v1alpha1.LabelWorkloadKind: "Job"}
	pg.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "one", UID: owner}}
	return pg
}

func gang(name, q string, n, minMember int, gpus int) ([]*corev1.Pod, *v1alpha1.PodGroup) {
	var pods []*corev1.Pod
	for i := range n {
		pods = append(pods, gated(fmt.Sprintf("%s-%d", name, i), q, gpus).PodGroup(name).Obj())
	}
	return pods, MakePodGroup(name, "ns").MinMember(int32(minMember)).Obj()
}

func TestCycle(t *testing.T) {
	nodes3, gpus3 := gpuNodes("n", 3, 1)
	nodes4, gpus4 := gpuNodes("n", 4, 1)
	nodes2, gpus2 := gpuNodes("n", 2, 1)
	nodes1, gpus1 := gpuNodes("n", 1, 1)
	nodes2x2, gpus2x2 := gpuNodes("n", 2, 2)
	nodes2x4, gpus2x4 := gpuNodes("n", 2, 4)
	gang4, pg4 := gang("train", "a", 4, 4, 1)
	gang3of4, _ := gang("train", "a", 3, 4, 1)
	queueA := MakeQueue("a").Obj()
	queueB := MakeQueue("b").GPU("1", "-1", 1).Obj()
	limited := MakeQueue("a").GPU("0", "1", 1).Obj()
	jobGang := Mapping{Gang: "job-train", MinMember: 4, Kind: "Job", Name: "train", Owner: Owner{Kind: "Job", Name: "train", UID: "uid-train"}}
	queuedGang := Mapping{Gang: "job-one", MinMember: 1, Queue: "a", Kind: "Job", Name: "one", Owner: Owner{Kind: "Job", Name: "one", UID: "uid-one"}}

	// eightEach: a runs 8 single pods, the youngest last; b asks for 8.
	var eightEach []*corev1.Pod
	for i := range 8 {
		eightEach = append(eightEach, running(fmt.Sprintf("a-%d", i), "a", fmt.Sprintf("n-%d", i/4), 1, t0.Add(time.Duration(i)*time.Second)).Obj(),
			gated(fmt.Sprintf("b-%d", i), "b", 1).Obj())
	}

	// afterReclaim: the cycle after b's first four reclaimed a-4..a-7:
	// a-6 and a-7 are gone and b-0, b-1 hold their GPUs; a-4 and a-5 are
	// still terminating.
	var afterReclaim []*corev1.Pod
	for i := range 8 {
		switch {
		case i < 4:
			afterReclaim = append(afterReclaim, running(fmt.Sprintf("a-%d", i), "a", "n-0", 1, t0.Add(time.Duration(i)*time.Second)).Obj())
		case i < 6:
			afterReclaim = append(afterReclaim, running(fmt.Sprintf("a-%d", i), "a", "n-1", 1, t0.Add(time.Duration(i)*time.Second)).Terminating(t0.Add(time.Hour)).Obj())
		}
		if i < 2 {
			afterReclaim = append(afterReclaim, running(fmt.Sprintf("b-%d", i), "b", "n-1", 1, t0.Add(time.Hour)).Obj())
		} else {
			afterReclaim = append(afterReclaim, gated(fmt.Sprintf("b-%d", i), "b", 1).Obj())
		}
	}

	cases := map[string]struct {
		world world
		opts  Options
		want  outcome
	}{
		"a gang that does not fit waits whole": {
			world: world{nodes: nodes3, gpuNodes: gpus3, queues: []*v1alpha1.Queue{queueA}, pods: gang4, podGroups: []*v1alpha1.PodGroup{pg4}},
			want: outcome{Waiting: map[string]string{
				"ns/train": "WaitingForCapacity: gang needs 4 × 1 GPU; at most 3 fit now",
			}},
		},
		"a gang goes around a node whose agent is silent": {
			world: world{nodes: nodes4, gpuNodes: gpus4, silent: []string{"n-1"}, queues: []*v1alpha1.Queue{queueA}, pods: gang3of4,
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(3).Obj()}},
			want: outcome{Admitted: map[string][]string{
				"ns/train": {"train-0@n-0", "train-1@n-2", "train-2@n-3"},
			}},
		},
		"a gang that needs the silent node waits and says why": {
			world: world{nodes: nodes4, gpuNodes: gpus4, silent: []string{"n-3"}, queues: []*v1alpha1.Queue{queueA}, pods: gang4, podGroups: []*v1alpha1.PodGroup{pg4}},
			want: outcome{Waiting: map[string]string{
				"ns/train": "WaitingForCapacity: gang needs 4 × 1 GPU; at most 3 fit now: the agent on node n-3 has not reported for 3m0s (last heartbeat 2026-11-29T12:00:00Z): the node takes no new GPU pods until it does",
			}},
		},
		"a pod whose only node is silent waits and says why": {
			world: world{nodes: nodes1, gpuNodes: gpus1, silent: []string{"n-0"}, queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{gated("p", "a", 1).Obj()}},
			want: outcome{Waiting: map[string]string{
				"ns/p": "WaitingForCapacity: pod needs 1 GPU; no node has room now: the agent on node n-0 has not reported for 3m0s (last heartbeat 2026-11-29T12:00:00Z): the node takes no new GPU pods until it does",
			}},
		},
		"a gang that fits starts whole, one pod per device": {
			world: world{nodes: nodes4, gpuNodes: gpus4, queues: []*v1alpha1.Queue{queueA}, pods: gang4, podGroups: []*v1alpha1.PodGroup{pg4}},
			want: outcome{Admitted: map[string][]string{
				"ns/train": {"train-0@n-0", "train-1@n-1", "train-2@n-2", "train-3@n-3"},
			}},
		},
		"an incomplete gang waits for its members": {
			world: world{nodes: nodes4, gpuNodes: gpus4, queues: []*v1alpha1.Queue{queueA}, pods: gang3of4, podGroups: []*v1alpha1.PodGroup{pg4}},
			want: outcome{Waiting: map[string]string{
				"ns/train": "WaitingForMembers: gang ns/train needs 4 pods before any starts; 3 exist",
			}},
		},
		"a pod group of unknown size waits and says how to size it": {
			world: world{nodes: nodes4, gpuNodes: gpus4, queues: []*v1alpha1.Queue{queueA}, pods: gang3of4},
			want: outcome{Waiting: map[string]string{
				"ns/train": "WaitingForMembers: pod group train has no PodGroup object and its pods set no partita.dev/min-member: create the PodGroup with spec.minMember, or annotate the pods",
			}},
		},
		"min-member on the pods sizes a gang without a PodGroup": {
			world: world{nodes: nodes4, gpuNodes: gpus4, queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				gated("w-0", "a", 1).PodGroup("w").Annotation(v1alpha1.AnnotationMinMember, "2").Obj(),
				gated("w-1", "a", 1).PodGroup("w").Annotation(v1alpha1.AnnotationMinMember, "2").Obj(),
			}},
			want: outcome{Admitted: map[string][]string{"ns/w": {"w-0@n-0", "w-1@n-1"}}},
		},
		"a queue at its limit holds the next pod": {
			world: world{nodes: nodes4, gpuNodes: gpus4, queues: []*v1alpha1.Queue{limited}, pods: []*corev1.Pod{
				running("old", "a", "n-0", 1, t0).Obj(),
				gated("next", "a", 1).Obj(),
			}},
			want: outcome{Waiting: map[string]string{"ns/next": "WaitingForQuota: queue a is at its limit: 1 of 1 GPUs"}},
		},
		"a queue below its fair share goes first": {
			world: world{nodes: nodes2, gpuNodes: gpus2, queues: []*v1alpha1.Queue{queueA, MakeQueue("b").Obj()}, pods: []*corev1.Pod{
				gated("a-1", "a", 1).Obj(),
				gated("a-2", "a", 1).Created(t0.Add(time.Second)).Obj(),
				gated("b-1", "b", 1).Created(t0.Add(2 * time.Second)).Obj(),
			}},
			want: outcome{
				Admitted: map[string][]string{"ns/a-1": {"a-1@n-0"}, "ns/b-1": {"b-1@n-1"}},
				Waiting:  map[string]string{"ns/a-2": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0")},
			},
		},
		"a queue below its fair share reclaims the youngest workload of a queue above its own": {
			world: world{nodes: nodes2, gpuNodes: gpus2, queues: []*v1alpha1.Queue{queueA, queueB}, pods: []*corev1.Pod{
				running("a-old", "a", "n-0", 1, t0).Obj(),
				running("a-young", "a", "n-1", 1, t0.Add(time.Minute)).Obj(),
				gated("b-1", "b", 1).Obj(),
			}},
			opts: Options{PreemptMinRuntime: time.Minute},
			want: outcome{
				Waiting: map[string]string{"ns/b-1": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/a-young"},
				Evicted: []string{"ns/a-young (reclaim)"},
			},
		},
		"reclaim takes the victim that leaves its queue at its fair share, not the youngest": {
			// a deserves 2 of the 4 GPUs and holds 3; b deserves 2 and asks
			// for 2 on one node. Taking a-big would leave a at 1, below its
			// share, and the next cycle would reclaim it back.
			world: world{nodes: nodes2x2, gpuNodes: gpus2x2, queues: []*v1alpha1.Queue{
				MakeQueue("a").GPU("2", "-1", 0).Obj(), MakeQueue("b").GPU("2", "-1", 0).Obj(),
			}, pods: []*corev1.Pod{
				running("a-small", "a", "n-0", 1, t0).Obj(),
				running("a-big", "a", "n-1", 2, t0.Add(time.Minute)).Obj(),
				gated("b-1", "b", 2).Obj(),
			}},
			want: outcome{
				Waiting: map[string]string{"ns/b-1": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/a-small"},
				Evicted: []string{"ns/a-small (reclaim)"},
			},
		},
		"reclaim never drops a victim's queue below its fair share": {
			// a deserves 1 and holds a-big (2 GPUs); c deserves 1 and holds
			// 2 single GPUs; b deserves 2 and asks for 2 on one node. Only
			// one of c's pods may go, which is not enough: b waits.
			world: world{nodes: nodes2x2, gpuNodes: gpus2x2, queues: []*v1alpha1.Queue{
				MakeQueue("a").GPU("1", "-1", 0).Obj(), MakeQueue("b").GPU("2", "-1", 0).Obj(), MakeQueue("c").GPU("1", "-1", 0).Obj(),
			}, pods: []*corev1.Pod{
				running("c-1", "c", "n-0", 1, t0).Obj(),
				running("c-2", "c", "n-0", 1, t0.Add(time.Minute)).Obj(),
				running("a-big", "a", "n-1", 2, t0.Add(2*time.Minute)).Obj(),
				gated("b-1", "b", 2).Obj(),
			}},
			want: outcome{Waiting: map[string]string{
				"ns/b-1": "WaitingForCapacity: pod needs 2 GPUs; no node has room now: node n-0: 0 GPUs free; pod needs 2 whole GPUs (container main)",
			}},
		},
		"one cycle's searches together leave the victim's queue its fair share": {
			// a holds 8 single pods and deserves 4; b deserves 4 and asks
			// for 8 single pods. Each of b's first four reclaims one of
			// a's; the rest wait, as a would drop below its fair share.
			world: world{nodes: nodes2x4, gpuNodes: gpus2x4, queues: []*v1alpha1.Queue{queueA, MakeQueue("b").Obj()}, pods: eightEach},
			want: outcome{
				Waiting: map[string]string{
					"ns/b-0": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/a-7",
					"ns/b-1": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/a-6",
					"ns/b-2": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/a-5",
					"ns/b-3": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/a-4",
					"ns/b-4": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0"),
					"ns/b-5": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0"),
					"ns/b-6": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0"),
					"ns/b-7": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0"),
				},
				Evicted: []string{"ns/a-7 (reclaim)", "ns/a-6 (reclaim)", "ns/a-5 (reclaim)", "ns/a-4 (reclaim)"},
			},
		},
		"pods still terminating from a reclaim leave their queue: nothing more is evicted": {
			// a's fair share is 4: its two terminating pods no longer
			// count, and b's two pods waiting for them count for b. Taking
			// a-3 for b-4 would leave a 3 and b 5 for good.
			world: world{nodes: nodes2x4, gpuNodes: gpus2x4, queues: []*v1alpha1.Queue{queueA, MakeQueue("b").Obj()}, pods: afterReclaim},
			opts:  Options{Now: t0.Add(2 * time.Hour)},
			want: outcome{
				Waiting: map[string]string{
					"ns/b-2": "WaitingForCapacity: waiting for 2 evicted or deleted pods to terminate to make room",
					"ns/b-3": "WaitingForCapacity: waiting for 2 evicted or deleted pods to terminate to make room",
					"ns/b-4": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0"),
					"ns/b-5": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0"),
					"ns/b-6": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0"),
					"ns/b-7": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0"),
				},
			},
		},
		"a workload younger than the minimum runtime is not reclaimed": {
			world: world{nodes: nodes2, gpuNodes: gpus2, queues: []*v1alpha1.Queue{queueA, queueB}, pods: []*corev1.Pod{
				running("a-old", "a", "n-0", 1, t0.Add(30*time.Second)).Obj(),
				running("a-young", "a", "n-1", 1, t0.Add(time.Minute)).Obj(),
				gated("b-1", "b", 1).Obj(),
			}},
			opts: Options{Now: t0.Add(80 * time.Second), PreemptMinRuntime: time.Minute},
			want: outcome{Waiting: map[string]string{"ns/b-1": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0")}},
		},
		"higher priority preempts lower in the same queue": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				running("low", "a", "n-0", 1, t0).Priority(0).Obj(),
				gated("high", "a", 1).Priority(100).Obj(),
			}},
			want: outcome{
				Waiting: map[string]string{"ns/high": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/low"},
				Evicted: []string{"ns/low (preempt)"},
			},
		},
		"a victim whose eviction was refused is spared, and the wait says why": {
			world: world{nodes: nodes2, gpuNodes: gpus2, queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				running("low-a", "a", "n-0", 1, t0).Priority(0).Obj(),
				running("low-b", "a", "n-1", 1, t0.Add(time.Minute)).Priority(0).Obj(),
				gated("high", "a", 1).Priority(100).Obj(),
			}},
			opts: Options{Unevictable: map[WorkloadKey]string{{Namespace: "ns", Pod: "low-b"}: "a PodDisruptionBudget refused it"}},
			want: outcome{
				Waiting: map[string]string{"ns/high": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/low-a"},
				Evicted: []string{"ns/low-a (preempt)"},
			},
		},
		"with every victim spared the wait names them": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				running("low", "a", "n-0", 1, t0).Priority(0).Obj(),
				gated("high", "a", 1).Priority(100).Obj(),
			}},
			opts: Options{Unevictable: map[WorkloadKey]string{{Namespace: "ns", Pod: "low"}: "a PodDisruptionBudget refused it"}},
			want: outcome{Waiting: map[string]string{
				"ns/high": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0") + "; ns/low is not evicted: a PodDisruptionBudget refused it",
			}},
		},
		"equal priority in one queue preempts nothing": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				running("first", "a", "n-0", 1, t0).Obj(),
				gated("second", "a", 1).Obj(),
			}},
			want: outcome{Waiting: map[string]string{"ns/second": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0")}},
		},
		"room being freed by terminating pods is waited for, not evicted again": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				running("low", "a", "n-0", 1, t0).Priority(0).Terminating(t0.Add(time.Hour)).Obj(),
				gated("high", "a", 1).Priority(100).Obj(),
			}},
			want: outcome{Waiting: map[string]string{"ns/high": "WaitingForCapacity: waiting for 1 evicted or deleted pods to terminate to make room"}},
		},
		"room an eviction frees is kept from workloads tried after the preemptor": {
			world: world{nodes: nodes2x2[:1], gpuNodes: gpus2x2[:1], queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				running("low", "a", "n-0", 1, t0).Priority(0).Obj(),
				gated("high", "a", 2).Priority(100).Obj(),
				gated("mid", "a", 1).Priority(50).Obj(),
			}},
			want: outcome{
				Waiting: map[string]string{
					"ns/high": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/low",
					"ns/mid": "WaitingForCapacity: pod needs 1 GPU; no node has room now: node n-0: no healthy GPU with room; pod needs a whole GPU (container main)" +
						"; GPUs 0, 1 of node n-0 are kept for ns/high, which waits for pods being evicted or deleted to make room",
				},
				Evicted: []string{"ns/low (preempt)"},
			},
		},
		"room being freed is kept from workloads tried after the one waiting for it": {
			world: world{nodes: nodes2x2[:1], gpuNodes: gpus2x2[:1], queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				running("low", "a", "n-0", 1, t0).Priority(0).Terminating(t0.Add(time.Hour)).Obj(),
				gated("high", "a", 2).Priority(100).Obj(),
				gated("mid", "a", 1).Priority(50).Obj(),
			}},
			want: outcome{Waiting: map[string]string{
				"ns/high": "WaitingForCapacity: waiting for 1 evicted or deleted pods to terminate to make room",
				"ns/mid": "WaitingForCapacity: pod needs 1 GPU; no node has room now: node n-0: no healthy GPU with room; pod needs a whole GPU (container main)" +
					"; GPUs 0, 1 of node n-0 are kept for ns/high, which waits for pods being evicted or deleted to make room",
			}},
		},
		"taints, selectors and cordons keep pods off nodes": {
			world: world{
				nodes: []*corev1.Node{
					MakeNode("n-0").Taint("dedicated", "infer").Obj(),
					MakeNode("n-1").Unschedulable().Obj(),
					MakeNode("n-2").Label("pool", "train").Obj(),
					MakeNode("n-3").Obj(),
				},
				gpuNodes: gpus4, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{
					gated("anywhere", "a", 1).Obj(),
					gated("train", "a", 1).NodeSelector("pool", "train").Created(t0.Add(-time.Second)).Obj(),
					gated("infer", "a", 1).NodeSelector("pool", "infer").Obj(),
				},
			},
			want: outcome{
				Admitted: map[string][]string{"ns/anywhere": {"anywhere@n-3"}, "ns/train": {"train@n-2"}},
				Waiting:  map[string]string{"ns/infer": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + errNoCandidate.Error()},
			},
		},
		"a gang with a topology key stays in one domain": {
			world: world{
				nodes: []*corev1.Node{
					MakeNode("n-0").Label("zone", "a").Obj(),
					MakeNode("n-1").Label("zone", "b").Obj(),
					MakeNode("n-2").Label("zone", "b").Obj(),
				},
				gpuNodes: []*v1alpha1.GPUNode{
					MakeGPUNode("n-0").Devices(2, "NVIDIA H100 80GB HBM3", 81559).Obj(),
					MakeGPUNode("n-1").Devices(1, "NVIDIA H100 80GB HBM3", 81559).Obj(),
					MakeGPUNode("n-2").Devices(2, "NVIDIA H100 80GB HBM3", 81559).Obj(),
				},
				queues:    []*v1alpha1.Queue{queueA},
				pods:      []*corev1.Pod{gated("z-0", "a", 1).PodGroup("z").Obj(), gated("z-1", "a", 1).PodGroup("z").Obj(), gated("z-2", "a", 1).PodGroup("z").Obj()},
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("z", "ns").MinMember(3).TopologyKey("zone").Obj()},
			},
			want: outcome{Admitted: map[string][]string{"ns/z": {"z-0@n-1", "z-1@n-2", "z-2@n-2"}}},
		},
		"CPU room caps how many members a node takes": {
			world: world{
				nodes:    []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourceCPU, "2").Obj(), MakeNode("n-1").Obj()},
				gpuNodes: []*v1alpha1.GPUNode{MakeGPUNode("n-0").Devices(8, "NVIDIA H100 80GB HBM3", 81559).Obj(), MakeGPUNode("n-1").Devices(1, "NVIDIA H100 80GB HBM3", 81559).Obj()},
				queues:   []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{
					gated("c-0", "a", 1).PodGroup("c").Request(DefaultContainer, corev1.ResourceCPU, "1").Obj(),
					gated("c-1", "a", 1).PodGroup("c").Request(DefaultContainer, corev1.ResourceCPU, "1").Obj(),
					gated("c-2", "a", 1).PodGroup("c").Request(DefaultContainer, corev1.ResourceCPU, "1").Obj(),
				},
				podGroups: []*v1alpha1.PodGroup{MakePodGroup("c", "ns").MinMember(3).Obj()},
			},
			want: outcome{Admitted: map[string][]string{"ns/c": {"c-0@n-1", "c-1@n-0", "c-2@n-0"}}},
		},
		"the workload map makes a gang of a Job's pods": {
			world: world{nodes: nodes3, gpuNodes: gpus3, queues: []*v1alpha1.Queue{queueA},
				mapped: map[string]Mapping{"train-a": jobGang, "train-b": jobGang, "train-c": jobGang, "train-d": jobGang},
				pods: []*corev1.Pod{
					gated("train-a", "a", 1).OwnedBy("Job", "train").Obj(), gated("train-b", "a", 1).OwnedBy("Job", "train").Obj(),
					gated("train-c", "a", 1).OwnedBy("Job", "train").Obj(), gated("train-d", "a", 1).OwnedBy("Job", "train").Obj(),
				}},
			want: outcome{Waiting: map[string]string{"ns/workload/job-train": "WaitingForCapacity: gang needs 4 × 1 GPU; at most 3 fit now"}},
		},
		"a gang of the workload map is named after its workload": {
			world: world{nodes: nodes3, gpuNodes: gpus3, queues: []*v1alpha1.Queue{queueA},
				mapped: map[string]Mapping{"train-a": jobGang, "train-b": jobGang, "train-c": jobGang},
				pods: []*corev1.Pod{
					gated("train-a", "a", 1).Obj(), gated("train-b", "a", 1).Obj(), gated("train-c", "a", 1).Obj(),
				}},
			want: outcome{Waiting: map[string]string{"ns/workload/job-train": "WaitingForMembers: gang Job ns/train needs 4 pods before any starts; 3 exist"}},
		},
		"pods the workload map leaves alone are single pods": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA},
				pods: []*corev1.Pod{gated("train-a", "a", 1).OwnedBy("Job", "train").Obj(), gated("train-b", "a", 1).OwnedBy("Job", "train").Created(t0.Add(time.Second)).Obj()}},
			want: outcome{
				Admitted: map[string][]string{"ns/train-a": {"train-a@n-0"}},
				Waiting:  map[string]string{"ns/train-b": "WaitingForCapacity: pod needs 1 GPU; no node has room now: " + noRoom("n-0")},
			},
		},
		"a pod the workload map cannot group yet waits for it": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA},
				mapped: map[string]Mapping{"p": {Waiting: "waiting to read JobSet ns/js"}},
				pods:   []*corev1.Pod{gated("p", "a", 1).Obj()}},
			want: outcome{Waiting: map[string]string{"ns/p": "WaitingForWorkload: waiting to read JobSet ns/js"}},
		},
		"a rule's queue waits for the PodGroup that carries it": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA, MakeQueue("default").Obj()}, defaultQueue: "default",
				mapped: map[string]Mapping{"p": queuedGang},
				pods:   []*corev1.Pod{gated("p", "default", 1).Obj()}},
			want: outcome{Waiting: map[string]string{"ns/workload/job-one": "WaitingForWorkload: waiting for PodGroup ns/job-one to name queue a, as the workload rule of Job ns/one does " +
				"(the admission loop creates it; the PodGroup webhook checks that namespace ns may use the queue)"}},
		},
		"a rule's queue is taken once its PodGroup names it": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{limited, MakeQueue("default").Obj()}, defaultQueue: "default",
				mapped:    map[string]Mapping{"p": queuedGang, "q": queuedGang},
				podGroups: []*v1alpha1.PodGroup{mappedPodGroup("job-one", "a", "uid-one")},
				pods:      []*corev1.Pod{gated("p", "default", 1).Obj(), gated("q", "default", 1).Obj()}},
			want: outcome{Waiting: map[string]string{"ns/workload/job-one": "WaitingForQuota: queue a is at its limit: 0 of 1 GPUs"}},
		},
		"a PodGroup of another owner does not carry a rule's queue": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA, MakeQueue("default").Obj()}, defaultQueue: "default",
				mapped:    map[string]Mapping{"p": queuedGang},
				podGroups: []*v1alpha1.PodGroup{mappedPodGroup("job-one", "a", "uid-someone-else")},
				pods:      []*corev1.Pod{gated("p", "default", 1).Obj()}},
			want: outcome{Waiting: map[string]string{"ns/workload/job-one": "WaitingForWorkload: PodGroup ns/job-one, which must carry the queue a that the workload rule of Job ns/one names, " +
				"exists but was not made by Partita for Job one (it is not owned by it, or lacks the label partita.dev/workload-kind): delete or rename it"}},
		},
		"a rule's queue that its pods contradict is a conflict": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA, queueB}, defaultQueue: "default",
				mapped: map[string]Mapping{"p": queuedGang},
				pods:   []*corev1.Pod{gated("p", "b", 1).Obj()}},
			want: outcome{Waiting: map[string]string{"ns/workload/job-one": "QueueConflict: the workload rule puts Job ns/one in queue a but its pods name queue b: " +
				"give the pods the label partita.dev/queue: a (or none), or change the rule"}},
		},
		"a pod naming a mapped gang's PodGroup does not join it": {
			world: world{nodes: nodes1, gpuNodes: gpus1, queues: []*v1alpha1.Queue{queueA},
				podGroups: []*v1alpha1.PodGroup{mappedPodGroup("job-one", "a", "uid-one")},
				pods:      []*corev1.Pod{gated("intruder", "a", 1).PodGroup("job-one").Obj()}},
			want: outcome{Waiting: map[string]string{"ns/job-one": "WaitingForMembers: pod group job-one has no PodGroup object and its pods set no partita.dev/min-member: create the PodGroup with spec.minMember, or annotate the pods"}},
		},
		"a pod in a queue that does not exist waits": {
			world: world{nodes: nodes1, gpuNodes: gpus1, pods: []*corev1.Pod{gated("p", "ghost", 1).Obj()}},
			want:  outcome{Waiting: map[string]string{"ns/p": "WaitingForQuota: queue ghost does not exist: create the Queue, or name an existing leaf queue"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, _ := runWorld(t, tc.world, tc.opts)
			checkOutcome(t, tc.want, got)
		})
	}
}

// noRoom is gpu's explanation for one whole GPU on a full 1-GPU node.
func noRoom(node string) string {
	return "node " + node + ": no healthy GPU with room; pod needs a whole GPU (container main)"
}

func TestQueueReports(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 2)
	_, res := runWorld(t, world{
		nodes: nodes, gpuNodes: gns,
		queues: []*v1alpha1.Queue{MakeQueue("org").Obj(), MakeQueue("a").Parent("org").Obj(), MakeQueue("b").Parent("org").Obj()},
		pods: []*corev1.Pod{
			running("a-1", "a", "n-0", 1, t0).Obj(),
			gated("b-1", "b", 1).Obj(),
			gated("b-2", "b", 4).Obj(),
		},
	}, Options{})
	want := []QueueReport{
		{Name: "a", AllocatedMilli: 1000, RequestedMilli: 1000, FairShareMilli: 1000},
		{Name: "b", AllocatedMilli: 1000, RequestedMilli: 5000, FairShareMilli: 3000, PendingWorkloads: 1},
		{Name: "org", AllocatedMilli: 2000, RequestedMilli: 6000, FairShareMilli: 4000, PendingWorkloads: 1, Children: []string{"a", "b"}},
	}
	if diff := cmp.Diff(want, res.Queues); diff != "" {
		t.Errorf("queue reports (-want +got):\n%s", diff)
	}
}

func TestFairSharesCarryOverOnlyWhileNothingChanged(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 2)
	queues := []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj()}
	var memo FairShares
	share := func(pods ...*corev1.Pod) map[string]int64 {
		_, res := runWorld(t, world{nodes: nodes, gpuNodes: gns, queues: queues, pods: pods}, Options{FairShares: &memo})
		out := map[string]int64{}
		for _, q := range res.Queues {
			out[q.Name] = q.FairShareMilli
		}
		return out
	}
	first := share(gated("a-1", "a", 4).Obj())
	if diff := cmp.Diff(map[string]int64{"a": 4000, "b": 0}, first); diff != "" {
		t.Errorf("first division (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(first, share(gated("a-1", "a", 4).Obj())); diff != "" {
		t.Errorf("same demand, other division (-want +got):\n%s", diff)
	}
	second := share(gated("a-1", "a", 4).Obj(), gated("b-1", "b", 4).Obj())
	if diff := cmp.Diff(map[string]int64{"a": 2000, "b": 2000}, second); diff != "" {
		t.Errorf("after b asked, the old division was kept (-want +got):\n%s", diff)
	}
}

func TestElastic(t *testing.T) {
	nodes5, gpus5 := gpuNodes("n", 5, 1)
	nodes4, gpus4 := gpuNodes("n", 4, 1)
	nodes3, gpus3 := gpuNodes("n", 3, 1)
	nodes2, gpus2 := gpuNodes("n", 2, 1)
	queues := []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj()}
	grows, growsMap := rayCluster("rc", "a", 6, nil, t0, 2)
	crowded, crowdedMap := rayCluster("rc", "a", 2, []string{"n-0", "n-1"}, t0, 1)
	full, fullMap := rayCluster("rc", "a", 3, []string{"n-0", "n-1", "n-2", "n-3"}, t0, 1)
	headOnly, headOnlyMap := rayCluster("rc", "a", 1, []string{"n-0"}, t0, 0)
	// Mid-eviction: of the two elastic workers evicted for b-gang,
	// worker-1 is still terminating on n-2 and worker-2 is gone from n-3;
	// the RayCluster's controller made worker-3 and worker-4 to replace them.
	evicting, evictingMap := rayCluster("rc", "a", 5, []string{"n-0", "n-1", "n-2"}, t0, 1)
	evicting[2].DeletionTimestamp = &metav1.Time{Time: t0.Add(time.Hour)}
	evicting = slices.Delete(evicting, 3, 4)
	// The same with both still terminating, and a third elastic worker
	// running: the minimum's count must not take a terminating one for an
	// extra.
	draining, drainingMap := rayCluster("rc", "a", 4, []string{"n-0", "n-1", "n-2", "n-3", "n-4"}, t0, 1)
	draining[3].DeletionTimestamp = &metav1.Time{Time: t0.Add(time.Hour)}
	draining[4].DeletionTimestamp = &metav1.Time{Time: t0.Add(time.Hour)}
	bGang, bPodGroup := gang("b-gang", "b", 2, 2, 1)

	cases := map[string]struct {
		world world
		opts  Options
		want  outcome
	}{
		"an elastic gang starts at its minimum and takes what room is left": {
			world: world{nodes: nodes5, gpuNodes: gpus5, queues: queues, pods: grows, mapped: growsMap},
			want: outcome{Admitted: map[string][]string{"ns/workload/raycluster-rc": {
				"rc-head@n-0", "rc-worker-0@n-1", "rc-worker-1@n-2", "rc-worker-2@n-3", "rc-worker-3@n-4",
			}}},
		},
		"elastic members take only room that no workload's minimum wants": {
			world: world{nodes: nodes3, gpuNodes: gpus3, queues: queues, mapped: crowdedMap,
				pods: append(crowded, gated("b-1", "b", 1).Created(t0.Add(time.Hour)).Obj())},
			want: outcome{
				Admitted: map[string][]string{"ns/b-1": {"b-1@n-2"}},
				Waiting: map[string]string{"ns/workload/raycluster-rc": "WaitingForCapacity: RayCluster ns/rc runs its minimum of 2; " +
					"its 1 elastic member(s) beyond it wait for room that no workload's minimum wants"},
			},
		},
		"another queue's minimum evicts elastic members first, one by one": {
			world: world{nodes: nodes4, gpuNodes: gpus4, queues: queues, mapped: fullMap,
				pods: append(full, bGang...), podGroups: []*v1alpha1.PodGroup{bPodGroup}},
			want: outcome{
				Waiting: map[string]string{"ns/b-gang": "WaitingForCapacity: evicting 2 workload(s) to make room: " +
					"RayCluster ns/rc (elastic member rc-worker-2), RayCluster ns/rc (elastic member rc-worker-1)"},
				Evicted: []string{"ns/workload/raycluster-rc rc-worker-2 (reclaim)", "ns/workload/raycluster-rc rc-worker-1 (reclaim)"},
			},
		},
		"elastic members admitted within the minimum runtime are spared": {
			world: world{nodes: nodes4, gpuNodes: gpus4, queues: queues, mapped: fullMap,
				pods: append(full, bGang...), podGroups: []*v1alpha1.PodGroup{bPodGroup}},
			opts: Options{Now: t0.Add(2 * time.Second), PreemptMinRuntime: time.Minute},
			want: outcome{Waiting: map[string]string{"ns/b-gang": "WaitingForCapacity: gang needs 2 × 1 GPU; at most 0 fit now"}},
		},
		"room freed for a minimum is not taken by elastic members meanwhile": {
			world: world{nodes: nodes4, gpuNodes: gpus4, queues: queues, mapped: evictingMap,
				pods: append(evicting, bGang...), podGroups: []*v1alpha1.PodGroup{bPodGroup}},
			want: outcome{Waiting: map[string]string{
				"ns/b-gang": "WaitingForCapacity: waiting for 1 evicted or deleted pods to terminate to make room",
				"ns/workload/raycluster-rc": "WaitingForCapacity: RayCluster ns/rc runs its minimum of 2; " +
					"its 2 elastic member(s) beyond it wait for room that no workload's minimum wants" +
					"; GPU 0 of node n-3 is kept for ns/b-gang, which waits for pods being evicted or deleted to make room",
			}},
		},
		"terminating members are not counted as running elastic ones": {
			world: world{nodes: nodes5, gpuNodes: gpus5, queues: queues, mapped: drainingMap,
				pods: append(draining, append(bGang,
					gated("b-1", "b", 1).Created(t0.Add(time.Hour)).Obj(),
					gated("b-2", "b", 1).Created(t0.Add(2*time.Hour)).Obj())...), podGroups: []*v1alpha1.PodGroup{bPodGroup}},
			want: outcome{
				Waiting: map[string]string{
					"ns/b-gang": "WaitingForCapacity: waiting for 2 evicted or deleted pods to terminate to make room",
					"ns/b-1":    "WaitingForCapacity: evicting 1 workload(s) to make room: RayCluster ns/rc (elastic member rc-worker-1)",
					"ns/b-2":    "WaitingForCapacity: pod needs 1 GPU; no node has room now: node n-0: no healthy GPU with room; pod needs a whole GPU (container main)",
				},
				Evicted: []string{"ns/workload/raycluster-rc rc-worker-1 (reclaim)"},
			},
		},
		"elastic members never evict": {
			world: world{nodes: nodes2, gpuNodes: gpus2, queues: queues, mapped: headOnlyMap,
				pods: append(headOnly, running("b-1", "b", "n-1", 1, t0).Obj())},
			want: outcome{Waiting: map[string]string{"ns/workload/raycluster-rc": "WaitingForCapacity: RayCluster ns/rc runs its minimum of 1; " +
				"its 1 elastic member(s) beyond it wait for room that no workload's minimum wants"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, _ := runWorld(t, tc.world, tc.opts)
			checkOutcome(t, tc.want, got)
		})
	}
}

// TestHeadOfLineHoldsRoom: backfill admits smaller, younger workloads past
// a head of line that does not fit; once the head has waited past the
// starvation bound, the cycle holds room for it and admits behind it only
// what does not need that room.
func TestHeadOfLineHoldsRoom(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 2)
	queueA := MakeQueue("a").Obj()
	// Both nodes are half full; the head asks for 2 GPUs on one node.
	base := []*corev1.Pod{
		running("r-0", "a", "n-0", 1, t0).Obj(),
		running("r-1", "a", "n-1", 1, t0).Obj(),
		gated("head", "a", 2).Obj(),
		gated("young-1", "a", 1).Created(t0.Add(50 * time.Minute)).Obj(),
		gated("young-2", "a", 1).Created(t0.Add(51 * time.Minute)).Obj(),
	}
	headWaits := "WaitingForCapacity: pod needs 2 GPUs; no node has room now: node n-0: 1 GPU free; pod needs 2 whole GPUs (container main)"
	held := "GPUs 0, 1 of node n-0 are held"
	cases := map[string]struct {
		world world
		opts  Options
		want  outcome
	}{
		"without a bound younger pods take every GPU that frees": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{queueA}, pods: base},
			want: outcome{
				Admitted: map[string][]string{"ns/young-1": {"young-1@n-0"}, "ns/young-2": {"young-2@n-1"}},
				Waiting:  map[string]string{"ns/head": headWaits},
			},
		},
		"a head younger than the bound holds nothing": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{queueA}, pods: base},
			opts:  Options{StarvationBound: 2 * time.Hour},
			want: outcome{
				Admitted: map[string][]string{"ns/young-1": {"young-1@n-0"}, "ns/young-2": {"young-2@n-1"}},
				Waiting:  map[string]string{"ns/head": headWaits},
			},
		},
		"past the bound the head holds room and only what misses it is admitted": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{queueA}, pods: base},
			opts:  Options{StarvationBound: 3 * time.Minute},
			want: outcome{
				Admitted: map[string][]string{"ns/young-1": {"young-1@n-1"}},
				Waiting: map[string]string{
					"ns/head": headWaits + "; it has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s: " + held +
						" for it, and only workloads that do not need them are admitted meanwhile",
					"ns/young-2": "WaitingForCapacity: pod needs 1 GPU; no node has room now: node n-0: no healthy GPU with room; pod needs a whole GPU (container main)" +
						"; " + held + " for ns/head, which has waited since 2026-11-29 12:00:00",
				},
			},
		},
		"a head whose room is free starts there": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				running("r-1", "a", "n-1", 1, t0).Obj(),
				gated("head", "a", 2).Obj(),
				gated("young-1", "a", 1).Created(t0.Add(50 * time.Minute)).Obj(),
			}},
			opts: Options{StarvationBound: 3 * time.Minute},
			want: outcome{Admitted: map[string][]string{"ns/head": {"head@n-0"}, "ns/young-1": {"young-1@n-1"}}},
		},
		"a head of higher priority still preempts what holds its room": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{queueA}, pods: []*corev1.Pod{
				running("r-0", "a", "n-0", 1, t0).Priority(0).Obj(),
				running("r-1", "a", "n-1", 1, t0).Priority(0).Obj(),
				gated("head", "a", 2).Priority(100).Obj(),
			}},
			opts: Options{StarvationBound: 3 * time.Minute},
			want: outcome{
				Waiting: map[string]string{"ns/head": "WaitingForCapacity: evicting 1 workload(s) to make room: ns/r-0" +
					"; it has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s: " + held + " for it, and only workloads that do not need them are admitted meanwhile"},
				Evicted: []string{"ns/r-0 (preempt)"},
			},
		},
		"a queue below its fair share is not held back by a queue at its own": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{
				MakeQueue("a").GPU("2", "-1", 0).Obj(), MakeQueue("b").GPU("2", "-1", 0).Obj(),
			}, pods: []*corev1.Pod{
				running("r-0", "a", "n-0", 1, t0).Obj(),
				running("r-1", "a", "n-1", 1, t0).Obj(),
				gated("head", "a", 2).Obj(),
				gated("b-1", "b", 1).Created(t0.Add(55 * time.Minute)).Obj(),
			}},
			opts: Options{StarvationBound: 3 * time.Minute},
			want: outcome{
				Admitted: map[string][]string{"ns/b-1": {"b-1@n-0"}},
				Waiting: map[string]string{"ns/head": "WaitingForCapacity: pod needs 2 GPUs; no node has room now: node n-1: 1 GPU free; pod needs 2 whole GPUs (container main)" +
					"; it has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s: " + held + " for it, and only workloads that do not need them are admitted meanwhile"},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, _ := runWorld(t, tc.world, tc.opts)
			checkOutcome(t, tc.want, got)
		})
	}
}

// TestHeadOfLineRoomStays: the room is kept from cycle to cycle while its
// occupants leave, even where another node becomes the emptier, and the
// head starts there once they have.
func TestHeadOfLineRoomStays(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 3)
	var rooms Rooms
	opts := Options{StarvationBound: 3 * time.Minute, Rooms: &rooms}
	r0 := []*corev1.Pod{running("r-0a", "a", "n-0", 1, t0).Obj(), running("r-0b", "a", "n-0", 1, t0).Obj()}
	head := gated("head", "a", 3).Obj()
	w := world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{MakeQueue("a").Obj()}, pods: append([]*corev1.Pod{
		running("r-1a", "a", "n-1", 1, t0).Obj(), running("r-1b", "a", "n-1", 1, t0).Obj(), running("r-1c", "a", "n-1", 1, t0).Obj(), head,
	}, r0...)}
	_, res := runWorld(t, w, opts)
	want := []RoomReport{{Head: WorkloadKey{Namespace: "ns", Pod: "head"}, Devices: map[string][]string{"n-0": {"GPU-n-0-0", "GPU-n-0-1", "GPU-n-0-2"}}}}
	if diff := cmp.Diff(want, res.Rooms); diff != "" {
		t.Fatalf("rooms (-want +got):\n%s", diff)
	}
	// Two pods of n-1 end: n-1 is now the emptier node, but the room
	// stays on n-0, and a newcomer gets n-1.
	w.pods = append([]*corev1.Pod{running("r-1a", "a", "n-1", 1, t0).Obj(), head, gated("young", "a", 1).Created(t0.Add(50 * time.Minute)).Obj()}, r0...)
	got, res := runWorld(t, w, opts)
	if diff := cmp.Diff(want, res.Rooms); diff != "" {
		t.Errorf("rooms after n-1 emptied (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string][]string{"ns/young": {"young@n-1"}}, got.Admitted); diff != "" {
		t.Errorf("admitted (-want +got):\n%s", diff)
	}
	// The pods in the room end: the head starts there.
	w.pods = []*corev1.Pod{running("r-1a", "a", "n-1", 1, t0).Obj(), running("young", "a", "n-1", 1, t0).Obj(), head}
	got, res = runWorld(t, w, opts)
	if diff := cmp.Diff(map[string][]string{"ns/head": {"head@n-0"}}, got.Admitted); diff != "" || len(res.Rooms) != 0 {
		t.Errorf("admitted (-want +got):\n%s\nrooms %v", diff, res.Rooms)
	}
}

// TestQueueCPUAndMemory: a queue's CPU and memory are what its pods
// request, divided into fair shares like GPUs, capped by their limits, and
// part of the dominant share that orders the queues.
func TestQueueCPUAndMemory(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 1)
	t.Run("reports", func(t *testing.T) {
		_, res := runWorld(t, world{nodes: nodes, gpuNodes: gns,
			queues: []*v1alpha1.Queue{MakeQueue("a").CPU("2", "-1", 1).Obj(), MakeQueue("b").Obj()},
			pods: []*corev1.Pod{
				running("a-1", "a", "n-0", 1, t0).Request(DefaultContainer, corev1.ResourceCPU, "3").Request(DefaultContainer, corev1.ResourceMemory, "8Gi").Obj(),
				gated("b-1", "b", 1).Request(DefaultContainer, corev1.ResourceCPU, "4").Obj(),
			},
		}, Options{})
		got := map[string][2]ResourceReport{}
		for _, q := range res.Queues {
			got[q.Name] = [2]ResourceReport{q.CPU, q.Memory}
		}
		want := map[string][2]ResourceReport{
			// b-1 is admitted in the cycle: it holds what it requested.
			"a": {{Allocated: 3000, Requested: 3000, FairShare: 3000}, {Allocated: 8 << 30, Requested: 8 << 30, FairShare: 8 << 30}},
			"b": {{Allocated: 4000, Requested: 4000, FairShare: 4000}, {}},
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("CPU and memory reports (-want +got):\n%s", diff)
		}
		if res.ClusterCPUMilli != 128000 || res.ClusterMemory != 1<<40 {
			t.Errorf("cluster CPU %d, memory %d; want the GPU nodes' allocatable, 128 CPUs and 1Ti", res.ClusterCPUMilli, res.ClusterMemory)
		}
	})
	t.Run("limits", func(t *testing.T) {
		got, _ := runWorld(t, world{nodes: nodes, gpuNodes: gns,
			queues: []*v1alpha1.Queue{MakeQueue("a").CPU("0", "4", 1).Memory("0", "16Gi", 1).Obj()},
			pods: []*corev1.Pod{
				running("old", "a", "n-0", 1, t0).Request(DefaultContainer, corev1.ResourceCPU, "3").Request(DefaultContainer, corev1.ResourceMemory, "12Gi").Obj(),
				gated("cpu", "a", 1).Request(DefaultContainer, corev1.ResourceCPU, "2").Obj(),
				gated("mem", "a", 1).Request(DefaultContainer, corev1.ResourceMemory, "8Gi").Created(t0.Add(time.Second)).Obj(),
			},
		}, Options{})
		want := map[string]string{
			"ns/cpu": "WaitingForQuota: queue a is at its CPU limit: 3 of 4 CPUs",
			"ns/mem": "WaitingForQuota: queue a is at its memory limit: 12884901888 of 17179869184 bytes",
		}
		if diff := cmp.Diff(want, got.Waiting); diff != "" {
			t.Errorf("waiting (-want +got):\n%s", diff)
		}
	})
	t.Run("the dominant share orders queues", func(t *testing.T) {
		// a deserves both GPUs and holds one, but holds 6 of the 8 CPUs it
		// deserves 7 of; b deserves no GPU and holds no CPU. By GPUs alone
		// a would go first; by the dominant share b does.
		small := []*corev1.Node{MakeNode("n-0").Allocatable(corev1.ResourceCPU, "4").Obj(), MakeNode("n-1").Allocatable(corev1.ResourceCPU, "4").Obj()}
		got, _ := runWorld(t, world{nodes: small, gpuNodes: gns,
			queues: []*v1alpha1.Queue{MakeQueue("a").GPU("2", "-1", 1).Obj(), MakeQueue("b").Obj()},
			pods: []*corev1.Pod{
				running("a-run", "a", "n-0", 1, t0).Request(DefaultContainer, corev1.ResourceCPU, "6").Obj(),
				gated("a-2", "a", 1).Request(DefaultContainer, corev1.ResourceCPU, "1").Obj(),
				gated("b-1", "b", 1).Request(DefaultContainer, corev1.ResourceCPU, "1").Created(t0.Add(time.Minute)).Obj(),
			},
		}, Options{})
		if diff := cmp.Diff(map[string][]string{"ns/b-1": {"b-1@n-1"}}, got.Admitted); diff != "" {
			t.Errorf("admitted (-want +got):\n%s", diff)
		}
	})
}

// TestPlacedAsScheduled: a single pod is held where the cycle placed it
// only when kube-scheduler would weigh nothing the cycle does not.
func TestPlacedAsScheduled(t *testing.T) {
	with := func(f func(*corev1.PodSpec)) *corev1.Pod {
		p := gated("p", "a", 1).Obj()
		f(&p.Spec)
		return p
	}
	term := corev1.PodAffinityTerm{TopologyKey: corev1.LabelHostname}
	// want: a single pod is held where the cycle placed it; pinnable: a
	// gang member is pinned there.
	cases := map[string]struct {
		pod      *corev1.Pod
		want     bool
		pinnable bool
	}{
		"plain":                  {pinnable: true, pod: gated("p", "a", 1).Obj(), want: true},
		"required node affinity": {pinnable: true, pod: gated("p", "a", 1).NodeSelector("model", "h100").Obj(), want: true},
		"pod anti-affinity": {pod: with(func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term}}}
		})},
		"preferred pod affinity": {pinnable: true, pod: with(func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: term}}}}
		})},
		"preferred node affinity": {pinnable: true, pod: with(func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1}}}}
		})},
		"topology spread": {pinnable: true, pod: with(func(s *corev1.PodSpec) {
			s.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.ScheduleAnyway}}
		})},
		"required pod affinity": {pod: with(func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{term}}}
		})},
		"topology spread that must hold": {pod: with(func(s *corev1.PodSpec) {
			s.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule}}
		})},
		"host port": {pod: with(func(s *corev1.PodSpec) {
			s.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080}}
		})},
		"persistent volume claim": {pinnable: true, pod: with(func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}
		})},
		"generic ephemeral volume": {pinnable: true, pod: with(func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{}}}}
		})},
		"an emptyDir": {pinnable: true, want: true, pod: with(func(s *corev1.PodSpec) {
			s.Volumes = []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		})},
		"the canonical GPU limit": {pinnable: true, want: true, pod: with(func(s *corev1.PodSpec) {
			s.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceGPUMilli: resource.MustParse("500")}
		})},
		"another extended resource": {pinnable: true, pod: with(func(s *corev1.PodSpec) {
			s.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceGPUMilli: resource.MustParse("500"), "rdma/ib": resource.MustParse("1")}
		})},
		"CPU and memory requests": {pinnable: true, want: true, pod: with(func(s *corev1.PodSpec) {
			s.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("8Gi")}
		})},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := placedAsScheduled(tc.pod); got != tc.want {
				t.Errorf("placedAsScheduled = %v, want %v", got, tc.want)
			}
			if got := pinnable(tc.pod); got != tc.pinnable {
				t.Errorf("pinnable = %v, want %v", got, tc.pinnable)
			}
		})
	}
}

// TestGangsArePinnedUnlessMembersTieToEachOther: a gang's members are
// pinned to the nodes the cycle packed them onto, unless one has a
// constraint between pods the cycle does not weigh (here "one worker a
// node"), which the packing would break and kube-scheduler then refuse:
// that gang is admitted unpinned, for kube-scheduler to place. A gang
// with memory slices stays pinned (a slice's charge depends on its device).
func TestGangsArePinnedUnlessMembersTieToEachOther(t *testing.T) {
	nodes, gpus := gpuNodes("n", 2, 8)
	oneANode := func(p *corev1.Pod) *corev1.Pod {
		p.Labels["job"] = "train"
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"job": "train"}}}}}}
		return p
	}
	cases := map[string]struct {
		member  func(i int) *corev1.Pod
		wantPin bool
	}{
		"plain members are pinned": {
			member:  func(i int) *corev1.Pod { return gated(fmt.Sprintf("train-%d", i), "a", 4).PodGroup("train").Obj() },
			wantPin: true,
		},
		"members that want a node each go unpinned": {
			member: func(i int) *corev1.Pod {
				return oneANode(gated(fmt.Sprintf("train-%d", i), "a", 4).PodGroup("train").Obj())
			},
		},
		"memory slices that want a node each stay pinned": {
			member: func(i int) *corev1.Pod {
				return oneANode(MakePod(fmt.Sprintf("train-%d", i), "ns").Queue("a").GPUMemory("20Gi").PodGroup("train").
					SchedulingGates(v1alpha1.SchedulingGateAdmission).Created(t0).Obj())
			},
			wantPin: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			w := world{nodes: nodes, gpuNodes: gpus, queues: []*v1alpha1.Queue{MakeQueue("a").Obj()},
				pods: []*corev1.Pod{tc.member(0), tc.member(1)}, podGroups: []*v1alpha1.PodGroup{MakePodGroup("train", "ns").MinMember(2).Obj()}}
			_, res := runWorld(t, w, Options{})
			if len(res.Admissions) != 1 || len(res.Admissions[0].Members) != 2 {
				t.Fatalf("admissions %+v, waiting %+v; want the gang admitted whole", res.Admissions, res.Waiting)
			}
			if got := res.Admissions[0].Pin; got != tc.wantPin {
				t.Errorf("Pin = %v, want %v", got, tc.wantPin)
			}
		})
	}
}

func TestUsageWeighsFairShare(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 4)
	w := world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj()}}
	for i := range 8 {
		w.pods = append(w.pods, running(fmt.Sprintf("a-%d", i), "a", fmt.Sprintf("n-%d", i/4), 1, t0).Obj())
		w.pods = append(w.pods, gated(fmt.Sprintf("b-%d", i), "b", 1).Obj())
	}
	usage := &Usage{
		Weight:   1,
		Share:    map[string][3]float64{"a": {0.875, 0, 0}},
		GPUHours: map[string]float64{"a": 12.5, "b": 0},
		Window:   "sliding 168h window, half-life 24h",
	}
	cases := map[string]struct {
		usage       *Usage
		wantShares  map[string]int64
		wantWithout map[string]*[3]int64
		wantNote    string
	}{
		"usage off: even split, no note": {
			wantShares:  map[string]int64{"a": 4000, "b": 4000},
			wantWithout: map[string]*[3]int64{"a": nil, "b": nil},
		},
		"a ran the cluster: b gets the larger share, and the reclaim says why": {
			// KAI's share weights: a 0.5 + (0.5 − 0.875) = 0.125, b 1.
			usage:       usage,
			wantShares:  map[string]int64{"a": 1000, "b": 7000},
			wantWithout: map[string]*[3]int64{"a": {4000, 0, 0}, "b": {4000, 0, 0}},
			wantNote:    "; history decided: queue a used 12.5 GPU-hours (sliding 168h window, half-life 24h) against 0 for queue b",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, res := runWorld(t, w, Options{Usage: tc.usage})
			shares := map[string]int64{}
			without := map[string]*[3]int64{}
			for _, q := range res.Queues {
				shares[q.Name] = q.FairShareMilli
				without[q.Name] = q.FairShareWithoutUsage
			}
			if diff := cmp.Diff(tc.wantShares, shares); diff != "" {
				t.Errorf("fair shares (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantWithout, without); diff != "" {
				t.Errorf("fair shares without usage (-want +got):\n%s", diff)
			}
			if len(res.Evictions) == 0 {
				t.Fatalf("no reclaim for b; waiting: %v", res.Waiting)
			}
			for _, e := range res.Evictions {
				if !strings.HasSuffix(e.Message, tc.wantNote) || (tc.wantNote == "") != !strings.Contains(e.Message, "history decided") {
					t.Errorf("eviction message %q, want it to end with %q", e.Message, tc.wantNote)
				}
			}
		})
	}
}

// TestGangsGoWhereTheirModelIs: a gang whose pods ask for a model goes to
// the nodes that hold it when it fits there whole, else where it fits.
func TestGangsGoWhereTheirModelIs(t *testing.T) {
	nodes, gpus := gpuNodes("n", 4, 8)
	member := func(i int, model string) *corev1.Pod {
		p := gated(fmt.Sprintf("serve-%d", i), "a", 4).PodGroup("serve").Obj()
		if model != "" {
			p.Annotations[v1alpha1.AnnotationModel] = model
		}
		return p
	}
	held := func(namespace string, models []string) map[string]float64 {
		if namespace == "ns" && slices.Equal(models, []string{"llama"}) {
			return map[string]float64{"n-2": 1}
		}
		return nil
	}
	cases := map[string]struct {
		model     string
		members   int
		wantNodes []string
	}{
		"on the node that holds the model":          {model: "llama", members: 2, wantNodes: []string{"n-2", "n-2"}},
		"anywhere when it does not fit there whole": {model: "llama", members: 3, wantNodes: []string{"n-0", "n-0", "n-1"}},
		"a model held nowhere changes nothing":      {model: "mistral", members: 2, wantNodes: []string{"n-0", "n-0"}},
		"no model, packing alone":                   {members: 2, wantNodes: []string{"n-0", "n-0"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var pods []*corev1.Pod
			for i := range tc.members {
				pods = append(pods, member(i, tc.model))
			}
			w := world{nodes: nodes, gpuNodes: gpus, queues: []*v1alpha1.Queue{MakeQueue("a").Obj()},
				pods: pods, podGroups: []*v1alpha1.PodGroup{MakePodGroup("serve", "ns").MinMember(int32(tc.members)).Obj()}}
			_, res := runWorld(t, w, Options{ModelsHeld: held})
			if len(res.Admissions) != 1 {
				t.Fatalf("admissions %+v, waiting %+v; want the gang admitted", res.Admissions, res.Waiting)
			}
			var got []string
			for _, m := range res.Admissions[0].Members {
				got = append(got, m.Allocation.Node)
			}
			slices.Sort(got)
			if diff := cmp.Diff(tc.wantNodes, got); diff != "" {
				t.Errorf("nodes (-want,+got):\n%s", diff)
			}
		})
	}
}
