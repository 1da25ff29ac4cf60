package admission

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/policy"
)

// BenchmarkTopologyCycle is one admission cycle at issue 28's scale: 5,000
// nodes × 8 GPUs in a Topology of 4 levels (2 zones, 10 blocks, 250 racks
// of 20 nodes, hosts), 7 GPUs of every node taken by 35,000 running pods
// (so that a rack has 20 scattered free GPUs), 100 queues, and 1,000
// pending gangs of 8 × 1 GPU: half require a rack and prefer hosts, a
// quarter require a block and prefer racks, a quarter prefer a rack. The
// quota policy is the real default Rego bundle. One op is what the loop
// does each cycle before it writes: copy the state, refresh the ledger
// snapshot, decide every workload.
func BenchmarkTopologyCycle(b *testing.B) {
	const (
		nodes, perNode, used = 5000, 8, 7
		queues, gangs, size  = 100, 1000, 8
		zone, block, rack    = "topology.kubernetes.io/zone", "network.example.com/block", "network.example.com/rack"
		host                 = "kubernetes.io/hostname"
	)
	ctx := context.Background()
	engine, err := policy.NewEngine(ctx)
	if err != nil {
		b.Fatal(err)
	}
	cache := cycle.NewCache()
	cache.UpsertTopology(partitatest.MakeTopology("net", zone, block, rack, host).Obj())
	var gns []v1alpha1.GPUNode
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		cache.UpsertNode(partitatest.MakeNode(name).Label(zone, fmt.Sprintf("z%d", i/2500)).Label(block, fmt.Sprintf("b%d", i/500)).
			Label(rack, fmt.Sprintf("r%d", i/20)).Label(host, name).Obj())
		gns = append(gns, *partitatest.MakeGPUNode(name).Devices(perNode, "NVIDIA H100 80GB HBM3", 81559).Obj())
	}
	for q := range queues {
		cache.UpsertQueue(partitatest.MakeQueue(fmt.Sprintf("team-%d", q)).GPU("300", "-1", 1).Obj())
	}
	created := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var running []corev1.Pod
	for i := range nodes * used {
		node := fmt.Sprintf("node-%04d", i/used)
		p := wholeRunningPod(fmt.Sprintf("run-%05d", i), fmt.Sprintf("team-%d", i%queues), node, int32(i%used), created)
		running = append(running, *p)
		cache.UpsertPod(p)
	}
	ledger := gpu.BuildLedger(gns, running)
	// The running pods' workloads were built by the cycles before the
	// gangs came (the cache builds only what changed).
	cache.State()
	for g := range gangs {
		q := fmt.Sprintf("team-%d", g%queues)
		ann := map[string]string{v1alpha1.AnnotationTopology: "net"}
		switch g % 4 {
		case 0, 1:
			ann[v1alpha1.AnnotationTopologyRequired], ann[v1alpha1.AnnotationTopologyPreferred] = rack, host
		case 2:
			ann[v1alpha1.AnnotationTopologyRequired], ann[v1alpha1.AnnotationTopologyPreferred] = block, rack
		default:
			ann[v1alpha1.AnnotationTopologyPreferred] = rack
		}
		for m := range size {
			cache.UpsertPod(partitatest.MakePod(fmt.Sprintf("g-%d-%d", g, m), "bench").Queue(q).SchedulingGates(v1alpha1.SchedulingGateAdmission).
				Created(created.Add(time.Duration(g)*time.Second)).PodGroup(fmt.Sprintf("g-%d", g)).
				Annotation(v1alpha1.AnnotationMinMember, fmt.Sprint(size)).Annotations(ann).GPUCount(1).Obj())
		}
	}
	asked := 0
	quota := askCounter{PolicyQuota: PolicyQuota{Engine: engine}, asked: &asked}
	snap := ledger.Snapshot()
	now := created.Add(time.Hour)
	var res *cycle.Result
	var shares cycle.FairShares
	var rooms cycle.Rooms
	var domains cycle.Domains
	b.ResetTimer()
	for b.Loop() {
		st := cache.State()
		ledger.Refresh(snap)
		res = cycle.Run(ctx, st, snap, quota, cycle.Options{Now: now, Placement: gpu.PlacementBinpack, PreemptMinRuntime: time.Minute,
			FairShares: &shares, StarvationBound: DefaultStarvationBound, Rooms: &rooms, Domains: &domains})
	}
	b.StopTimer()
	b.ReportMetric(float64(asked)/float64(b.N), "policy-evals/op")
	b.ReportMetric(float64(len(res.Waiting)), "waiting-workloads")
	b.ReportMetric(float64(len(res.Admissions)), "admitted")
	b.ReportMetric(float64(len(res.Evictions)), "evictions")
}

// askCounter counts the quota policy's evaluations.
type askCounter struct {
	PolicyQuota
	asked *int
}

func (q askCounter) CheckQuota(ctx context.Context, r *cycle.QuotaRequest) (*cycle.QuotaVerdict, error) {
	*q.asked++
	return q.PolicyQuota.CheckQuota(ctx, r)
}
