package admission

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/admission/usage"
	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/policy"
)

// BenchmarkAdmissionCycle is one admission cycle at the scale of the issue:
// 5,000 nodes × 8 GPUs, all taken by 40,000 running pods, 1,000 queues (10
// parents of 100 leaves, limits on), and 50,000 pending pods: in every leaf
// 30 single pods (whole and half GPUs) and 20 in gangs of 4. The quota
// policy is the real default Rego bundle. One op is what the loop does per
// cycle: copy the state, refresh the ledger snapshot, decide.
func BenchmarkAdmissionCycle(b *testing.B) {
	benchmarkAdmissionCycle(b, wholeRunningPod, benchUsage{})
}

// BenchmarkAdmissionCycleWithUsage is BenchmarkAdmissionCycle with
// time-based fair share on, as the loop runs it: each op also counts every
// queue's usage (usage.Tracker Observe and Usage) one second later than the
// last, so the division is computed anew (with and without usage) every
// cycle. The settings are the worst case for the tracker, a 1h half-life in
// a 168h window: 30-minute buckets, about 60 a queue, warmed with 31 hours
// of history.
//
// Queues that hold the same for hours have shares that hardly move, and the
// fair-share memo (keyed on usage to 1/10,000) holds; /divide drops the memo
// before every op, so that each cycle divides twice (with and without
// usage), as when usage moves every cycle.
func BenchmarkAdmissionCycleWithUsage(b *testing.B) {
	cfg := usage.Config{Weight: 1, HalfLife: time.Hour, Window: 168 * time.Hour, WindowType: v1alpha1.UsageWindowSliding}
	b.Run("memo", func(b *testing.B) { benchmarkAdmissionCycle(b, wholeRunningPod, benchUsage{cfg: &cfg}) })
	b.Run("divide", func(b *testing.B) { benchmarkAdmissionCycle(b, wholeRunningPod, benchUsage{cfg: &cfg, dropMemo: true}) })
}

// benchUsage turns time-based fair share on in benchmarkAdmissionCycle:
// cfg nil leaves it off; dropMemo divides anew every op.
type benchUsage struct {
	cfg      *usage.Config
	dropMemo bool
}

func wholeRunningPod(name, q, node string, device int32, created time.Time) *corev1.Pod {
	return partitatest.MakePod(name, "bench").Queue(q).GPUCount(1).Node(node).Created(created).
		Annotation(v1alpha1.AnnotationDevicesPrefix+partitatest.DefaultContainer, partitatest.DeviceUUID(node, device)).Obj()
}

// BenchmarkMemorySliceCycle is BenchmarkAdmissionCycle with every running
// pod a 79Gi memory slice, one per device, so that the cluster is as full:
// each cycle reads what the 40,000 slices hold from the ledger snapshot
// (gpu.Snapshot.HeldMilli), the worst case of charging queues what pods
// hold.
func BenchmarkMemorySliceCycle(b *testing.B) {
	benchmarkAdmissionCycle(b, func(name, q, node string, device int32, created time.Time) *corev1.Pod {
		p := partitatest.MakePod(name, "bench").Queue(q).GPUMemory("79Gi").Node(node).Created(created).
			Annotation(v1alpha1.AnnotationDevicesPrefix+partitatest.DefaultContainer, partitatest.DeviceUUID(node, device)).Obj()
		r, _ := gpu.ParsePod(p)
		return gpu.ApplyCanonical(p, r, 81559)
	}, benchUsage{})
}

func benchmarkAdmissionCycle(b *testing.B, runningPod func(name, q, node string, device int32, created time.Time) *corev1.Pod, withUsage benchUsage) {
	usageCfg := withUsage.cfg
	const (
		nodes, perNode     = 5000, 8
		parents, leaves    = 10, 100
		pendingPerLeaf     = 50
		singlesPerLeaf     = 30
		gangSize           = 4
		runningPerLeafBase = 40
	)
	ctx := context.Background()
	engine, err := policy.NewEngine(ctx)
	if err != nil {
		b.Fatal(err)
	}
	cache := cycle.NewCache()
	var gns []v1alpha1.GPUNode
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		cache.UpsertNode(partitatest.MakeNode(name).Obj())
		gns = append(gns, *partitatest.MakeGPUNode(name).Devices(perNode, "NVIDIA H100 80GB HBM3", 81559).Obj())
	}
	var queues []string
	for p := range parents {
		parent := fmt.Sprintf("org-%d", p)
		cache.UpsertQueue(partitatest.MakeQueue(parent).GPU("3000", "-1", 1).Obj())
		for l := range leaves {
			name := fmt.Sprintf("team-%d-%d", p, l)
			cache.UpsertQueue(partitatest.MakeQueue(name).Parent(parent).GPU("40", "200", 1).Obj())
			queues = append(queues, name)
		}
	}
	var running []corev1.Pod
	created := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	for i := range nodes * perNode {
		q := queues[i%len(queues)]
		p := runningPod(fmt.Sprintf("run-%05d", i), q, fmt.Sprintf("node-%04d", i/perNode), int32(i%perNode), created)
		running = append(running, *p)
		cache.UpsertPod(p)
	}
	ledger := gpu.BuildLedger(gns, running)
	pending := 0
	for qi, q := range queues {
		for j := range pendingPerLeaf {
			name := fmt.Sprintf("w-%d-%d", qi, j)
			w := partitatest.MakePod(name, "bench").Queue(q).SchedulingGates(v1alpha1.SchedulingGateAdmission).
				Created(created.Add(time.Duration(j) * time.Second))
			switch {
			case j >= singlesPerLeaf:
				g := (j - singlesPerLeaf) / gangSize
				w = w.PodGroup(fmt.Sprintf("g-%d-%d", qi, g)).Annotation(v1alpha1.AnnotationMinMember, fmt.Sprint(gangSize)).GPUCount(1)
			case j%2 == 0:
				w = w.GPUFraction("0.5")
			default:
				w = w.GPUCount(1)
			}
			cache.UpsertPod(w.Obj())
			pending++
		}
	}
	quota := PolicyQuota{Engine: engine}
	snap := ledger.Snapshot()
	now := created.Add(time.Hour)
	var res *cycle.Result
	var shares cycle.FairShares
	var rooms cycle.Rooms
	var tracker *usage.Tracker
	var counted func(st *cycle.State, now time.Time) *cycle.Usage
	if usageCfg != nil {
		tracker = usage.NewTracker(*usageCfg)
		capacity := usage.Amounts{GPU: nodes * perNode}
		counted = func(st *cycle.State, now time.Time) *cycle.Usage {
			held := make(map[string]usage.Amounts, len(st.Queues))
			parents := make(map[string]string, len(st.Queues))
			for name, q := range st.Queues {
				held[name] = usage.Amounts{GPU: float64(q.AllocatedMilli) / 1000}
				parents[name] = q.Parent
			}
			tracker.Observe(now, held)
			reports := tracker.Usage(now, parents, capacity)
			u := &cycle.Usage{Weight: usageCfg.Weight, Share: make(map[string][3]float64, len(reports)), GPUHours: make(map[string]float64, len(reports))}
			for name, r := range reports {
				u.Share[name] = [3]float64{r.Share.GPU}
				u.GPUHours[name] = r.Hours().GPU
			}
			return u
		}
		st := cache.State()
		for t := now.Add(-31 * time.Hour); t.Before(now); t = t.Add(5 * time.Minute) {
			counted(st, t)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		st := cache.State()
		ledger.Refresh(snap)
		var u *cycle.Usage
		if counted != nil {
			now = now.Add(time.Second)
			u = counted(st, now)
		}
		if withUsage.dropMemo {
			shares = cycle.FairShares{}
		}
		// As the extender runs it by default: every queue's head has
		// waited past the starvation bound, so rooms are held too.
		res = cycle.Run(ctx, st, snap, quota, cycle.Options{Now: now, Placement: gpu.PlacementBinpack, PreemptMinRuntime: time.Minute,
			FairShares: &shares, StarvationBound: DefaultStarvationBound, Rooms: &rooms, Usage: u})
	}
	b.StopTimer()
	if usageCfg != nil {
		// Each queue's history is written once per persist period.
		b.ReportMetric(float64(len(queues)+parents)*float64(time.Minute)/float64(usageCfg.PersistEvery()), "usage-writes/min")
	}
	b.ReportMetric(float64(pending), "pending-pods")
	b.ReportMetric(float64(len(res.Waiting)), "waiting-workloads")
	b.ReportMetric(float64(len(res.Admissions)), "admitted")
	b.ReportMetric(float64(len(res.Evictions)), "evictions")
	b.ReportMetric(float64(len(res.Rooms)), "rooms")
}
