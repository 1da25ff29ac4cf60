package cycle

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	. "github.com/partita-dev/partita/internal/partitatest"
)

// TestHeadOfLineHoldsHeadroom: a head that does not fit its queue's limit
// while the queue's pods run would otherwise see every GPU they free go to
// the next small workload of the queue, which does fit. Past the
// starvation bound the head holds the headroom it needs, in its queue and
// its ancestors: what frees adds up until the head fits.
func TestHeadOfLineHoldsHeadroom(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 4)
	limited := MakeQueue("a").GPU("0", "2", 1).Obj()
	org := MakeQueue("org").GPU("0", "2", 1).Obj()
	childA, childB := MakeQueue("a").Parent("org").Obj(), MakeQueue("b").Parent("org").Obj()
	// later are 1-GPU pods of queue q, created long after the head and
	// younger than the bound (the cycle runs at t0+1h).
	later := func(q string) []*corev1.Pod {
		return []*corev1.Pod{
			gated(q+"-later-1", q, 1).Created(t0.Add(58 * time.Minute)).Obj(),
			gated(q+"-later-2", q, 1).Created(t0.Add(59 * time.Minute)).Obj(),
		}
	}
	with := func(pods ...*corev1.Pod) []*corev1.Pod { return append(pods, later("a")...) }
	bound := Options{StarvationBound: 3 * time.Minute}
	headNote := "; it has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s: queue a's limit headroom is held for it as running pods end, and workloads that would take it wait meanwhile"
	heldBack := func(q string) string {
		return "WaitingForQuota: held back: queue " + q + "'s limit headroom is held for ns/head, which needs 2 GPUs and has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s"
	}
	cases := map[string]struct {
		world world
		opts  Options
		want  outcome
	}{
		"without a bound a GPU the queue frees goes to the next small pod": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limited}, pods: with(
				running("r-0", "a", "n-0", 1, t0).Obj(),
				gated("head", "a", 2).Obj(),
			)},
			want: outcome{
				Admitted: map[string][]string{"ns/a-later-1": {"a-later-1@n-0"}},
				Waiting: map[string]string{
					"ns/head":      "WaitingForQuota: queue a is at its limit: 1 of 2 GPUs",
					"ns/a-later-2": "WaitingForQuota: queue a is at its limit: 2 of 2 GPUs",
				},
			},
		},
		"past the bound a queue at its limit says the head holds its headroom": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limited}, pods: with(
				running("r-0", "a", "n-0", 1, t0).Obj(),
				running("r-1", "a", "n-1", 1, t0).Obj(),
				gated("head", "a", 2).Obj(),
			)},
			opts: bound,
			want: outcome{Waiting: map[string]string{
				"ns/head":      "WaitingForQuota: queue a is at its limit: 2 of 2 GPUs" + headNote,
				"ns/a-later-1": "WaitingForQuota: queue a is at its limit: 2 of 2 GPUs",
				"ns/a-later-2": "WaitingForQuota: queue a is at its limit: 2 of 2 GPUs",
			}},
		},
		"past the bound the headroom a running pod frees is held for the head": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limited}, pods: with(
				running("r-0", "a", "n-0", 1, t0).Obj(),
				gated("head", "a", 2).Obj(),
			)},
			opts: bound,
			want: outcome{Waiting: map[string]string{
				"ns/head":      "WaitingForQuota: queue a is at its limit: 1 of 2 GPUs" + headNote,
				"ns/a-later-1": heldBack("a"),
				"ns/a-later-2": heldBack("a"),
			}},
		},
		"once the queue's pods have ended the head starts, not the later pods": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limited}, pods: with(
				gated("head", "a", 2).Obj(),
			)},
			opts: bound,
			want: outcome{
				Admitted: map[string][]string{"ns/head": {"head@n-0"}},
				Waiting: map[string]string{
					"ns/a-later-1": "WaitingForQuota: queue a is at its limit: 2 of 2 GPUs",
					"ns/a-later-2": "WaitingForQuota: queue a is at its limit: 2 of 2 GPUs",
				},
			},
		},
		"a head that waits for devices holds its headroom too": {
			// The limit lets the head in, but no node has 2 GPUs free:
			// its room is held on n-0, and the GPU free on n-1 would
			// take the head's headroom.
			world: world{nodes: nodes[:2], gpuNodes: []*v1alpha1.GPUNode{
				MakeGPUNode("n-0").Devices(2, "NVIDIA H100 80GB HBM3", 81559).Obj(), MakeGPUNode("n-1").Devices(2, "NVIDIA H100 80GB HBM3", 81559).Obj(),
			}, queues: []*v1alpha1.Queue{MakeQueue("a").GPU("0", "3", 1).Obj(), MakeQueue("b").Obj()}, pods: with(
				running("r-0", "a", "n-0", 1, t0).Obj(),
				running("b-0", "b", "n-1", 1, t0).Obj(),
				gated("head", "a", 2).Obj(),
			)},
			opts: bound,
			want: outcome{Waiting: map[string]string{
				"ns/head": "WaitingForCapacity: pod needs 2 GPUs; no node has room now: node n-0: 1 GPU free; pod needs 2 whole GPUs (container main)" +
					"; it has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s: GPUs 0, 1 of node n-0 are held for it, and only workloads that do not need them are admitted meanwhile",
				"ns/a-later-1": heldBack("a"),
				"ns/a-later-2": heldBack("a"),
			}},
		},
		"a parent's limit holds a sibling queue back": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{org, childA, childB}, pods: append(later("b"),
				running("b-0", "b", "n-0", 1, t0).Obj(),
				gated("head", "a", 2).Obj(),
			)},
			opts: bound,
			want: outcome{Waiting: map[string]string{
				"ns/head":      "WaitingForQuota: queue org is at its limit: 1 of 2 GPUs; it has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s: queue org's limit headroom is held for it as running pods end, and workloads that would take it wait meanwhile",
				"ns/b-later-1": heldBack("org"),
				"ns/b-later-2": heldBack("org"),
			}},
		},
		"a sibling queue below its fair share is not held back for a queue at its own": {
			// a holds 1 GPU, its fair share of org's 2; b holds none and
			// goes first, into the head's headroom, up to its own.
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{org, childA, childB}, pods: append(later("b"),
				running("r-0", "a", "n-0", 1, t0).Obj(),
				gated("head", "a", 2).Obj(),
			)},
			opts: bound,
			want: outcome{
				Admitted: map[string][]string{"ns/b-later-1": {"b-later-1@n-0"}},
				Waiting: map[string]string{
					"ns/head":      "WaitingForQuota: queue org is at its limit: 2 of 2 GPUs; it has waited since 2026-11-29 12:00:00, past the starvation bound of 3m0s: queue org's limit headroom is held for it as running pods end, and workloads that would take it wait meanwhile",
					"ns/b-later-2": "WaitingForQuota: queue org is at its limit: 2 of 2 GPUs",
				},
			},
		},
		"of two heads under one limited parent the older goes first": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{org, childA, childB}, pods: []*corev1.Pod{
				gated("head", "a", 2).Obj(),
				gated("b-head", "b", 2).Created(t0.Add(time.Minute)).Obj(),
			}},
			opts: bound,
			want: outcome{
				Admitted: map[string][]string{"ns/head": {"head@n-0"}},
				Waiting: map[string]string{"ns/b-head": "WaitingForQuota: queue org is at its limit: 2 of 2 GPUs" +
					"; it has waited since 2026-11-29 12:01:00, past the starvation bound of 3m0s: queue org's limit headroom is held for it as running pods end, and workloads that would take it wait meanwhile"},
			},
		},
		"a head that never fits the limit holds nothing back": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limited}, pods: with(
				running("r-0", "a", "n-0", 1, t0).Obj(),
				gated("head", "a", 4).Obj(),
			)},
			opts: bound,
			want: outcome{
				Admitted: map[string][]string{"ns/a-later-1": {"a-later-1@n-0"}},
				Waiting: map[string]string{
					"ns/head":      "WaitingForQuota: queue a is at its limit: 1 of 2 GPUs",
					"ns/a-later-2": "WaitingForQuota: queue a is at its limit: 2 of 2 GPUs",
				},
			},
		},
		"a head that never fits the limit is nobody's head: the next one holds the headroom": {
			world: world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{limited}, pods: with(
				running("r-0", "a", "n-0", 1, t0).Obj(),
				gated("huge", "a", 4).Obj(),
				gated("head", "a", 2).Created(t0.Add(time.Minute)).Obj(),
			)},
			opts: bound,
			want: outcome{Waiting: map[string]string{
				"ns/huge": "WaitingForQuota: queue a is at its limit: 1 of 2 GPUs",
				"ns/head": "WaitingForQuota: queue a is at its limit: 1 of 2 GPUs" +
					"; it has waited since 2026-11-29 12:01:00, past the starvation bound of 3m0s: queue a's limit headroom is held for it as running pods end, and workloads that would take it wait meanwhile",
				"ns/a-later-1": "WaitingForQuota: held back: queue a's limit headroom is held for ns/head, which needs 2 GPUs and has waited since 2026-11-29 12:01:00, past the starvation bound of 3m0s",
				"ns/a-later-2": "WaitingForQuota: held back: queue a's limit headroom is held for ns/head, which needs 2 GPUs and has waited since 2026-11-29 12:01:00, past the starvation bound of 3m0s",
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, _ := runWorld(t, tc.world, tc.opts)
			checkOutcome(t, tc.want, got)
		})
	}
}

// TestHeadroomAccumulates: cycle after cycle, as the queue's running pods
// end, the later pods wait and the head starts once its headroom is free.
func TestHeadroomAccumulates(t *testing.T) {
	nodes, gns := gpuNodes("n", 2, 4)
	var rooms Rooms
	var shares FairShares
	opts := Options{StarvationBound: 3 * time.Minute, Rooms: &rooms, FairShares: &shares}
	head := gated("head", "a", 2).Obj()
	stream := []*corev1.Pod{
		gated("later-1", "a", 1).Created(t0.Add(58 * time.Minute)).Obj(),
		gated("later-2", "a", 1).Created(t0.Add(59 * time.Minute)).Obj(),
	}
	w := world{nodes: nodes, gpuNodes: gns, queues: []*v1alpha1.Queue{MakeQueue("a").GPU("0", "2", 1).Obj()}}
	for i, runs := range [][]*corev1.Pod{
		{running("r-0", "a", "n-0", 1, t0).Obj(), running("r-1", "a", "n-1", 1, t0).Obj()},
		{running("r-1", "a", "n-1", 1, t0).Obj()},
		nil,
	} {
		w.pods = append(append(append([]*corev1.Pod{}, runs...), head), stream...)
		got, _ := runWorld(t, w, opts)
		want := map[string][]string{}
		if len(runs) == 0 {
			want["ns/head"] = []string{"head@n-0"}
		}
		if diff := cmp.Diff(want, got.Admitted); diff != "" {
			t.Errorf("cycle %d with %d pods running: admitted (-want +got):\n%s", i, len(runs), diff)
		}
	}
}
