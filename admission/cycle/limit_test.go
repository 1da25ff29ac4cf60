package cycle

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	. "github.com/partita-dev/partita/internal/partitatest"
)

// TestReclaimUnderLimit: inside a department capped by a limit, the quota
// policy turns away a child below its fair share while a sibling above its
// own holds the limit; the cycle reclaims for it as it does for devices,
// from the limited subtree only, and only for what the policy then allows.
func TestReclaimUnderLimit(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 8) // room on the nodes: only the limit holds b back
	p := MakeQueue("p").GPU("0", "8", 1).Obj()
	underP := []*v1alpha1.Queue{p, MakeQueue("a").Parent("p").Obj(), MakeQueue("b").Parent("p").Obj()}
	// aHolds are a's n single pods on n-0, admitted from admitted on, one
	// a second: the last is the youngest.
	aHolds := func(n int, admitted time.Time) []*corev1.Pod {
		var pods []*corev1.Pod
		for i := range n {
			pods = append(pods, running(fmt.Sprintf("a-%d", i), "a", "n-0", 1, admitted.Add(time.Duration(i)*time.Second)).Obj())
		}
		return pods
	}
	bAsks := func(n int) []*corev1.Pod {
		var pods []*corev1.Pod
		for i := range n {
			pods = append(pods, gated(fmt.Sprintf("b-%d", i), "b", 1).Obj())
		}
		return pods
	}
	with := func(sets ...[]*corev1.Pod) []*corev1.Pod {
		var out []*corev1.Pod
		for _, s := range sets {
			out = append(out, s...)
		}
		return out
	}
	atLimit := "WaitingForQuota: queue p is at its limit: 8 of 8 GPUs"
	evicting := func(victim string) string {
		return "WaitingForQuota: evicting 1 workload(s) to make room under queue p's limit: " + victim
	}
	// waits says the same of b-from to b-to.
	waits := func(out map[string]string, from, to int, msg func(i int) string) map[string]string {
		for i := from; i <= to; i++ {
			out[fmt.Sprintf("ns/b-%d", i)] = msg(i)
		}
		return out
	}
	allWait := func(msg string) map[string]string {
		return waits(map[string]string{}, 0, 7, func(int) string { return msg })
	}
	// history: a ran the cluster, so a deserves 1 of p's 8 and b 7 (KAI's
	// share weights, as in TestUsageWeighsFairShare, a level down).
	history := &Usage{
		Weight:   1,
		Share:    map[string][3]float64{"p": {0.4375, 0, 0}, "a": {0.4375, 0, 0}},
		GPUHours: map[string]float64{"a": 12.5, "b": 0},
		Window:   "sliding 168h window, half-life 24h",
	}
	ypods, ypg := gang("y", "y", 4, 5, 1)
	var xHolds []*corev1.Pod
	for i := range 8 {
		xHolds = append(xHolds, running(fmt.Sprintf("x-%d", i), "x", "n-1", 1, t0.Add(time.Minute+time.Duration(i)*time.Second)).Obj())
	}

	cases := map[string]struct {
		world world
		opts  Options
		want  outcome
		// wantNote ends every eviction's message; "" means none says
		// history decided.
		wantNote string
	}{
		"a child below its fair share reclaims under its parent's limit, down to its sibling's fair share": {
			// a holds all 8 of p's limit and deserves 4, as b does: b's
			// first four pods each reclaim one of a's, the youngest first.
			world: world{nodes: nodes, gpuNodes: gns, queues: underP, pods: with(aHolds(8, t0), bAsks(8))},
			want: outcome{
				Waiting: waits(waits(map[string]string{}, 0, 3, func(i int) string { return evicting(fmt.Sprintf("ns/a-%d", 7-i)) }),
					4, 7, func(int) string { return atLimit }),
				Evicted: []string{"ns/a-7 (reclaim)", "ns/a-6 (reclaim)", "ns/a-5 (reclaim)", "ns/a-4 (reclaim)"},
			},
		},
		"victims younger than the minimum runtime are spared, and the quota reason stays": {
			world: world{nodes: nodes, gpuNodes: gns, queues: underP, pods: with(aHolds(8, t0.Add(59*time.Minute)), bAsks(8))},
			opts:  Options{PreemptMinRuntime: 2 * time.Minute},
			want:  outcome{Waiting: allWait(atLimit)},
		},
		"with preemption disabled nothing is reclaimed under a limit": {
			world: world{nodes: nodes, gpuNodes: gns, queues: underP, pods: with(aHolds(8, t0), bAsks(8))},
			opts:  Options{DisablePreemption: true},
			want:  outcome{Waiting: allWait(atLimit)},
		},
		"a queue outside the limited subtree is never reclaimed from": {
			// x, beside p, holds n-1 and is 2 GPUs above its fair share
			// (y's incomplete gang wants GPUs too), its pods younger than
			// a's. b-0 may only run on n-1: evicting one of x's pods would
			// give it a device, but no room under p's limit, so it waits;
			// b-1 reclaims from a.
			world: world{nodes: nodes, gpuNodes: gns,
				queues:    append(underP, MakeQueue("x").Obj(), MakeQueue("y").Obj()),
				podGroups: []*v1alpha1.PodGroup{ypg},
				pods: with(aHolds(8, t0), xHolds, ypods, []*corev1.Pod{
					gated("b-0", "b", 1).NodeSelector(corev1.LabelHostname, "n-1").Obj(),
					gated("b-1", "b", 1).Obj(),
				})},
			want: outcome{
				Waiting: map[string]string{
					"ns/b-0": atLimit,
					"ns/b-1": evicting("ns/a-7"),
					"ns/y":   "WaitingForMembers: gang ns/y needs 5 pods before any starts; 4 exist",
				},
				Evicted: []string{"ns/a-7 (reclaim)"},
			},
		},
		"pods already leaving under the limit are waited for, not evicted again": {
			// The cycle after the first case: a's four youngest are
			// terminating, and b's four pods wait for them.
			world: world{nodes: nodes, gpuNodes: gns, queues: underP, pods: with(aHolds(4, t0), []*corev1.Pod{
				running("a-4", "a", "n-0", 1, t0).Terminating(t0.Add(time.Hour)).Obj(),
				running("a-5", "a", "n-0", 1, t0).Terminating(t0.Add(time.Hour)).Obj(),
				running("a-6", "a", "n-0", 1, t0).Terminating(t0.Add(time.Hour)).Obj(),
				running("a-7", "a", "n-0", 1, t0).Terminating(t0.Add(time.Hour)).Obj(),
			}, bAsks(4))},
			want: outcome{Waiting: waits(map[string]string{}, 0, 3, func(int) string {
				return "WaitingForQuota: waiting for 4 evicted or deleted pods to terminate to make room under queue p's limit"
			})},
		},
		"a victim whose eviction was refused is named in the quota wait": {
			// p's limit is 2: a deserves 1 and holds 2, a-0 too young to
			// go and a-1 refused by a PodDisruptionBudget.
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{MakeQueue("p").GPU("0", "2", 1).Obj(), underP[1], underP[2]}, pods: []*corev1.Pod{
				running("a-0", "a", "n-0", 1, t0.Add(59*time.Minute)).Obj(),
				running("a-1", "a", "n-0", 1, t0).Obj(),
				gated("b-0", "b", 1).Obj(),
			}},
			opts: Options{PreemptMinRuntime: 2 * time.Minute, Unevictable: map[WorkloadKey]string{{Namespace: "ns", Pod: "a-1"}: "a PodDisruptionBudget refused it"}},
			want: outcome{Waiting: map[string]string{
				"ns/b-0": "WaitingForQuota: queue p is at its limit: 2 of 2 GPUs; ns/a-1 is not evicted: a PodDisruptionBudget refused it",
			}},
		},
		"a workload held back only by a starved head's headroom reclaims nothing": {
			// head, of a, needs 2 and waits for a's own limit; it holds
			// p's headroom. b's pods would fit p's limit but for that
			// headroom: evicting c's pods (c is above its fair share) would
			// make the room the head is owed.
			world: world{nodes: nodes, gpuNodes: gns,
				queues: []*v1alpha1.Queue{MakeQueue("p").GPU("0", "7", 1).Obj(), MakeQueue("a").Parent("p").GPU("0", "2", 1).Obj(),
					MakeQueue("b").Parent("p").Obj(), MakeQueue("c").Parent("p").Obj()},
				pods: []*corev1.Pod{
					running("r-0", "a", "n-0", 1, t0).Obj(),
					gated("head", "a", 2).Obj(),
					running("c-0", "c", "n-1", 4, t0).Obj(),
					gated("b-0", "b", 1).Created(t0.Add(58 * time.Minute)).Obj(),
				}},
			opts: Options{StarvationBound: 3 * time.Minute},
			want: outcome{Waiting: map[string]string{
				"ns/head": "WaitingForQuota: queue a is at its limit: 1 of 2 GPUs; it has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s: " +
					"queue a's limit headroom is held for it as running pods end, and workloads that would take it wait meanwhile",
				"ns/b-0": "WaitingForQuota: held back: queue p's limit headroom is held for ns/head, which needs 2 GPUs and has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s",
			}},
		},
		"time-based fair share decides how much is reclaimed under the limit": {
			world: world{nodes: nodes, gpuNodes: gns, queues: underP, pods: with(aHolds(8, t0), bAsks(8))},
			opts:  Options{Usage: history},
			want: outcome{
				Waiting: waits(map[string]string{"ns/b-7": atLimit}, 0, 6, func(i int) string { return evicting(fmt.Sprintf("ns/a-%d", 7-i)) }),
				Evicted: []string{"ns/a-7 (reclaim)", "ns/a-6 (reclaim)", "ns/a-5 (reclaim)", "ns/a-4 (reclaim)", "ns/a-3 (reclaim)", "ns/a-2 (reclaim)", "ns/a-1 (reclaim)"},
			},
			wantNote: "; history decided: queue a used 12.5 GPU-hours (sliding 168h window, half-life 24h) against 0 for queue b",
		},
		"higher priority preempts lower in its own queue under the queue's limit": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{MakeQueue("a").GPU("0", "2", 1).Obj()}, pods: []*corev1.Pod{
				running("low-0", "a", "n-0", 1, t0).Priority(0).Obj(),
				running("low-1", "a", "n-0", 1, t0.Add(time.Minute)).Priority(0).Obj(),
				gated("high", "a", 1).Priority(100).Obj(),
			}},
			want: outcome{
				Waiting: map[string]string{"ns/high": "WaitingForQuota: evicting 1 workload(s) to make room under queue a's limit: ns/low-1"},
				Evicted: []string{"ns/low-1 (preempt)"},
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, res := runWorld(t, tc.world, tc.opts)
			checkOutcome(t, tc.want, got)
			for _, e := range res.Evictions {
				if tc.wantNote == "" && strings.Contains(e.Message, "history decided") || !strings.HasSuffix(e.Message, tc.wantNote) {
					t.Errorf("eviction of %s: message %q, want it to end with %q", e.Victim.Key, e.Message, tc.wantNote)
				}
			}
		})
	}
}
