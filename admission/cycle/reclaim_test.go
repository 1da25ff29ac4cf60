package cycle

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	. "github.com/partita-dev/partita/internal/partitatest"
)

// TestReclaimFreesWholeNodesForAGang is KAI's "one large job reclaims its
// room" scenario at a twentieth of its size: queue a borrowed every GPU
// with single-GPU pods started round-robin over the nodes, so the youngest
// victims are spread over all of them; queue b's gang needs whole nodes.
// Victims taken one by one in order of importance free a GPU on every node
// and none whole; the search must take nodes' victims together, and no
// more than the gang needs.
func TestReclaimFreesWholeNodesForAGang(t *testing.T) {
	const nodes, perNode = 20, 8
	ns, gns := gpuNodes("n", nodes, perNode)
	var pods []*corev1.Pod
	for i := range nodes * perNode {
		pods = append(pods, running(fmt.Sprintf("a-%03d", i), "a", fmt.Sprintf("n-%d", i%nodes), 1, t0.Add(time.Duration(i)*time.Second)).Obj())
	}
	members, pg := gang("big", "b", nodes/2, nodes/2, perNode)
	pods = append(pods, members...)
	w := world{nodes: ns, gpuNodes: gns, pods: pods, podGroups: []*v1alpha1.PodGroup{pg},
		queues: []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj()}}
	out, _ := runWorld(t, w, Options{})

	if got, want := len(out.Evicted), nodes*perNode/2; got != want {
		t.Fatalf("evicted %d workloads, want %d (the gang's 80 GPUs, a's pods beyond its fair share); waiting: %v", got, want, out.Waiting)
	}
	// The victims fill whole nodes: ten nodes lose all eight pods.
	perVictimNode := map[string]int{}
	for _, e := range out.Evicted {
		var i int
		if _, err := fmt.Sscanf(e, "ns/a-%03d (reclaim)", &i); err != nil {
			t.Fatalf("unexpected victim %q", e)
		}
		perVictimNode[fmt.Sprintf("n-%d", i%nodes)]++
	}
	var emptied []string
	for n, k := range perVictimNode {
		if k != perNode {
			t.Errorf("node %s loses %d pods, not all %d: the gang cannot use it", n, k, perNode)
		}
		emptied = append(emptied, n)
	}
	slices.Sort(emptied)
	wait := out.Waiting["ns/big"]
	if !strings.HasPrefix(wait, "WaitingForCapacity: evicting 80 workload(s) to make room") {
		t.Errorf("gang's wait = %q", wait)
	}
	// Every node costs the same evictions: those whose pods started last
	// lose the least work.
	want := []string{"n-10", "n-11", "n-12", "n-13", "n-14", "n-15", "n-16", "n-17", "n-18", "n-19"}
	if diff := cmp.Diff(want, emptied); diff != "" {
		t.Errorf("nodes emptied (-want +got):\n%s", diff)
	}
}

// BenchmarkReclaimForALargeGang is one admission cycle of KAI's "one
// 250-pod / 2,000-GPU job reclaims its room" scenario: 500 nodes × 8 GPUs
// all held by queue a's 4,000 single-GPU pods, and queue b's gang of
// 250 × 8 GPUs. The cycle chooses the 2,000 victims (250 whole nodes).
func BenchmarkReclaimForALargeGang(b *testing.B) {
	const nodes, perNode = 500, 8
	ns, gns := gpuNodes("n", nodes, perNode)
	var pods []*corev1.Pod
	for i := range nodes * perNode {
		pods = append(pods, running(fmt.Sprintf("a-%04d", i), "a", fmt.Sprintf("n-%d", i%nodes), 1, t0.Add(time.Duration(i)*time.Second)).Obj())
	}
	members, pg := gang("big", "b", nodes/2, nodes/2, perNode)
	pods = append(pods, members...)
	w := world{nodes: ns, gpuNodes: gns, pods: pods, podGroups: []*v1alpha1.PodGroup{pg},
		queues: []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj()}}
	cache, ledger := w.build(b)
	st := cache.State()
	var res *Result
	for b.Loop() {
		res = Run(context.Background(), st, ledger.Snapshot(), limitQuota{}, Options{Now: t0.Add(2 * time.Hour)})
	}
	if len(res.Evictions) != nodes*perNode/2 {
		b.Fatalf("evictions: %d, want %d; waiting: %v", len(res.Evictions), nodes*perNode/2, res.Waiting)
	}
	b.ReportMetric(float64(len(res.Evictions)), "victims")
}

// BenchmarkCycleWithFiftyThousandPending is issue 31's memory goal at the
// loop's end: 500 nodes × 8 GPUs full of 4,000 running single-GPU pods of
// queue a, and 50,000 pending single-GPU pods of queues b and c (none fits;
// b and c may reclaim from a down to its fair share). It reports the time
// of one cycle and the heap the cache, the pods (as an informer holds them)
// and a cycle's result keep alive.
func BenchmarkCycleWithFiftyThousandPending(b *testing.B) {
	const nodes, perNode, pending = 500, 8, 50_000
	ns, gns := gpuNodes("n", nodes, perNode)
	var pods []*corev1.Pod
	for i := range nodes * perNode {
		pods = append(pods, running(fmt.Sprintf("a-%04d", i), "a", fmt.Sprintf("n-%d", i%nodes), 1, t0.Add(time.Duration(i)*time.Millisecond)).Obj())
	}
	for i := range pending {
		q := "b"
		if i%2 == 1 {
			q = "c"
		}
		pods = append(pods, gated(fmt.Sprintf("%s-%05d", q, i), q, 1).Created(t0.Add(time.Duration(i)*time.Millisecond)).Obj())
	}
	w := world{nodes: ns, gpuNodes: gns, pods: pods,
		queues: []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj(), MakeQueue("c").Obj()}}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cache, ledger := w.build(b)
	var res *Result
	for b.Loop() {
		res = Run(context.Background(), cache.State(), ledger.Snapshot(), limitQuota{}, Options{Now: t0.Add(2 * time.Hour)})
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "heap-MiB")
	b.ReportMetric(float64(len(res.Waiting)), "waiting")
	b.ReportMetric(float64(len(res.Evictions)), "evictions")
	runtime.KeepAlive(pods)
	runtime.KeepAlive(cache)
}

// TestWaitsForTerminatingPodsLeaveTheSearchesToOthers: preemptors that
// only wait for pods they already evicted to terminate do not use up the
// cycle's victim searches; the preemptors behind them still reclaim. (In
// the 2,000-pod reclaim at 500 nodes, the waits took every search of most
// cycles: reclaim went at the pace of pods terminating, 5 a second.)
func TestWaitsForTerminatingPodsLeaveTheSearchesToOthers(t *testing.T) {
	const nodes, perNode, waiting = 10, 8, 20
	ns, gns := gpuNodes("n", nodes, perNode)
	var pods []*corev1.Pod
	// a holds all 80 GPUs; 20 of its pods are terminating, evicted for b's
	// first 20, which wait for them.
	for i := range nodes * perNode {
		p := running(fmt.Sprintf("a-%02d", i), "a", fmt.Sprintf("n-%d", i%nodes), 1, t0.Add(time.Duration(i)*time.Second))
		if i >= nodes*perNode-waiting {
			p = p.Terminating(t0.Add(time.Hour))
		}
		pods = append(pods, p.Obj())
	}
	for i := range 2 * waiting {
		pods = append(pods, gated(fmt.Sprintf("b-%02d", i), "b", 1).Created(t0.Add(time.Duration(i)*time.Second)).Obj())
	}
	w := world{nodes: ns, gpuNodes: gns, pods: pods, queues: []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj()}}
	out, _ := runWorld(t, w, Options{Now: t0.Add(2 * time.Hour)})
	waits := 0
	for _, msg := range out.Waiting {
		if strings.Contains(msg, "to terminate to make room") {
			waits++
		}
	}
	if waits != waiting {
		t.Errorf("%d workloads wait for terminating pods, want %d", waits, waiting)
	}
	// The other 20 each evict one (single pods: within the cycle's 256
	// searched members).
	if got := len(out.Evicted); got != waiting {
		t.Errorf("evicted %d workloads in the cycle, want %d (one for each preemptor not waiting); waiting: %v", got, waiting, out.Waiting)
	}
}

// TestSearchesAreBoundedByTheMembersSearched: a cycle searches for at
// least MaxPreemptionSearches workloads, and for more while the members
// of all it searched for stay within MaxSearchedMembers, so single pods
// reclaim many to a cycle and gangs as many as their size allows.
func TestSearchesAreBoundedByTheMembersSearched(t *testing.T) {
	const nodes, perNode = 4, 8
	cases := map[string]struct {
		gangSize int
		want     int
	}{
		// 2 searches, then 2 more within the 4 members.
		"single pods": {gangSize: 1, want: 4},
		// 2 searches of 3 members: 6 members, past the 4.
		"gangs of three": {gangSize: 3, want: 2 * 3},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ns, gns := gpuNodes("n", nodes, perNode)
			var pods []*corev1.Pod
			for i := range nodes * perNode {
				pods = append(pods, running(fmt.Sprintf("a-%02d", i), "a", fmt.Sprintf("n-%d", i%nodes), 1, t0.Add(time.Duration(i)*time.Second)).Obj())
			}
			var pgs []*v1alpha1.PodGroup
			for i := range 6 {
				name := fmt.Sprintf("b-%d", i)
				if tc.gangSize == 1 {
					pods = append(pods, gated(name, "b", 1).Created(t0.Add(time.Duration(i)*time.Second)).Obj())
					continue
				}
				members, pg := gang(name, "b", tc.gangSize, tc.gangSize, 1)
				pods = append(pods, members...)
				pgs = append(pgs, pg)
			}
			w := world{nodes: ns, gpuNodes: gns, pods: pods, podGroups: pgs, queues: []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj()}}
			out, _ := runWorld(t, w, Options{Now: t0.Add(2 * time.Hour), MaxPreemptionSearches: 2, MaxSearchedMembers: 4})
			if got := len(out.Evicted); got != tc.want {
				t.Errorf("evicted %d workloads, want %d; waiting: %v", got, tc.want, out.Waiting)
			}
		})
	}
}

// BenchmarkReclaimForSinglePods is one admission cycle of KAI's reclaim
// scenario: 500 nodes × 8 GPUs held by queue a's 4,000 single-GPU pods,
// and queue b's 2,000 pending single-GPU pods, whose fair share is half
// the cluster. The cycle evicts for as many as its searches allow.
func BenchmarkReclaimForSinglePods(b *testing.B) {
	const nodes, perNode = 500, 8
	ns, gns := gpuNodes("n", nodes, perNode)
	var pods []*corev1.Pod
	for i := range nodes * perNode {
		pods = append(pods, running(fmt.Sprintf("a-%04d", i), "a", fmt.Sprintf("n-%d", i%nodes), 1, t0.Add(time.Duration(i)*time.Second)).Obj())
	}
	for i := range nodes * perNode / 2 {
		pods = append(pods, gated(fmt.Sprintf("b-%04d", i), "b", 1).Created(t0.Add(time.Duration(i)*time.Millisecond)).Obj())
	}
	w := world{nodes: ns, gpuNodes: gns, pods: pods, queues: []*v1alpha1.Queue{MakeQueue("a").Obj(), MakeQueue("b").Obj()}}
	cache, ledger := w.build(b)
	st := cache.State()
	var res *Result
	for b.Loop() {
		res = Run(context.Background(), st, ledger.Snapshot(), limitQuota{}, Options{Now: t0.Add(2 * time.Hour)})
	}
	b.ReportMetric(float64(len(res.Evictions)), "victims")
}
