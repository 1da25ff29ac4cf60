package cycle

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	. "github.com/partita-dev/partita/internal/partitatest"
)

// BenchmarkTopologyTrace is placement quality on a fragmented trace (issue
// 28): 2 blocks × 4 racks × 4 nodes × 8 GPUs (racks of 32 GPUs); for 300
// steps, each running workload ends with probability 1/20 a step, and
// about 1.5 new workloads arrive (about 85% of the GPUs asked for at steady state) (sizes 1, 2, 4, 8, 16 and 32 GPUs of 1-GPU
// pods, the small ones more often), each requiring one rack. One admission
// cycle runs a step. Reported, for best fit (the loop's) and first fit
// (the first rack by name that takes the gang):
//
//   - placed: workloads admitted over the trace;
//   - gpu-util: the share of GPUs busy, averaged over the steps;
//   - stranded-gpus: free GPUs, averaged over the steps where a waiting
//     workload asks for no more than the free total (it waits for a rack,
//     not for GPUs), else 0;
//   - big-wait-steps: the mean wait of the placed workloads of 16 GPUs
//     or more, in steps: what fragmentation costs the large ones;
//   - in-domain: the share of placed workloads inside one rack (1 by
//     construction: a required level is never broken).
//
// Each result is over 10 traces of fixed seeds: both strategies see the
// same arrivals and lifetimes.
func BenchmarkTopologyTrace(b *testing.B) {
	for _, fit := range []struct {
		name  string
		first bool
	}{{"best-fit", false}, {"first-fit", true}} {
		b.Run(fit.name, func(b *testing.B) {
			var r traceResult
			for b.Loop() {
				r = traceResult{}
				for seed := range uint64(traceSeeds) {
					one := runTopologyTrace(b, fit.first, 300, seed)
					r.placed += one.placed
					r.waiting += one.waiting
					r.util += one.util / traceSeeds
					r.stranded += one.stranded / traceSeeds
					r.inDomain += one.inDomain / traceSeeds
					r.bigWait += one.bigWait / traceSeeds
				}
			}
			b.ReportMetric(float64(r.placed), "placed")
			b.ReportMetric(r.util, "gpu-util")
			b.ReportMetric(r.stranded, "stranded-gpus")
			b.ReportMetric(r.inDomain, "in-domain")
			b.ReportMetric(r.bigWait, "big-wait-steps")
			b.ReportMetric(float64(r.waiting), "waiting-at-end")
		})
	}
}

type traceResult struct {
	placed             int
	util, stranded     float64
	inDomain           float64
	submitted, waiting int
	// bigWait is the mean wait, in steps, of the placed workloads of 16
	// GPUs or more.
	bigWait float64
}

// traceSeeds is how many traces (seeds 0, 1, ...) a result sums (placed,
// waiting-at-end) or averages (the rest) over.
const traceSeeds = 10

func runTopologyTrace(b *testing.B, firstFit bool, steps int, seed uint64) traceResult {
	b.Helper()
	nodes, gns := rackedNodes(2, 4, 4, 8)
	var inv []v1alpha1.GPUNode
	for _, g := range gns {
		inv = append(inv, *g)
	}
	ledger := gpu.BuildLedger(inv, nil)
	cache := NewCache()
	for _, n := range nodes {
		cache.UpsertNode(n)
	}
	cache.UpsertQueue(MakeQueue("a").Obj())
	cache.UpsertTopology(MakeTopology("net", labelBlock, labelRack).Obj())
	capacity := len(nodes) * 8
	rng := rand.New(rand.NewPCG(28, seed))
	sizes := []int{1, 1, 1, 2, 2, 4, 4, 8, 8, 16, 32}
	type running struct {
		pods []*corev1.Pod
	}
	var live []running
	pending := map[string]int{}
	arrived := map[string]int{}
	var bigWaits, bigPlaced int
	var res traceResult
	var busy, strandedSum float64
	var placedInDomain int
	ann := map[string]string{v1alpha1.AnnotationTopology: "net", v1alpha1.AnnotationTopologyRequired: labelRack}
	now := t0
	for step := range steps {
		now = now.Add(time.Minute)
		// Ends.
		kept := live[:0]
		for _, w := range live {
			if rng.IntN(20) == 0 {
				for _, p := range w.pods {
					cache.DeletePod(p.UID)
					ledger.Forget(p.UID)
				}
				continue
			}
			kept = append(kept, w)
		}
		live = kept
		// Arrivals.
		for range rng.IntN(4) {
			size := sizes[rng.IntN(len(sizes))]
			name := fmt.Sprintf("w%d-%d", step, res.submitted)
			res.submitted++
			cache.UpsertPodGroup(MakePodGroup(name, "ns").MinMember(int32(size)).Annotation(v1alpha1.AnnotationTopology, "net").
				Annotation(v1alpha1.AnnotationTopologyRequired, labelRack).Obj())
			for i := range size {
				p := gated(fmt.Sprintf("%s-%d", name, i), "a", 1).PodGroup(name).Annotations(ann).Created(now).Obj()
				p.UID = types.UID(p.Name)
				cache.UpsertPod(p)
			}
			pending[name] = size
			arrived[name] = step
		}
		out := Run(context.Background(), cache.State(), ledger.Snapshot(), nil, Options{Now: now, DisablePreemption: true, firstFit: firstFit})
		for _, a := range out.Admissions {
			var pods []*corev1.Pod
			racks := map[string]bool{}
			for _, m := range a.Members {
				p := m.Member.Pod.DeepCopy()
				p.Spec.SchedulingGates = nil
				p.Spec.NodeName = m.Allocation.Node
				p.Annotations[v1alpha1.AnnotationAdmitted] = now.Format(time.RFC3339)
				cache.UpsertPod(p)
				if err := ledger.Assume(m.Allocation); err != nil {
					b.Fatalf("assume %s: %v", p.Name, err)
				}
				pods = append(pods, p)
				racks[rackOf(m.Allocation.Node)] = true
			}
			live = append(live, running{pods: pods})
			if pending[a.Workload.Key.PodGroup] >= 16 {
				bigWaits += step - arrived[a.Workload.Key.PodGroup]
				bigPlaced++
			}
			delete(pending, a.Workload.Key.PodGroup)
			res.placed++
			if len(racks) == 1 {
				placedInDomain++
			}
		}
		held := 0
		for _, w := range live {
			held += len(w.pods)
		}
		busy += float64(held) / float64(capacity)
		free := capacity - held
		for _, size := range pending {
			if size <= free {
				strandedSum += float64(free)
				break
			}
		}
	}
	res.util = busy / float64(steps)
	res.stranded = strandedSum / float64(steps)
	res.waiting = len(pending)
	if bigPlaced > 0 {
		res.bigWait = float64(bigWaits) / float64(bigPlaced)
	}
	if res.placed > 0 {
		res.inDomain = float64(placedInDomain) / float64(res.placed)
	}
	return res
}
