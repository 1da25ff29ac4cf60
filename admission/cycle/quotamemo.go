package cycle

import (
	"context"
	"slices"
	"strconv"
)

// NumbersOnlyQuota is implemented by a QuotaChecker that can say whether
// its answers depend only on a question's numbers (what the workload asks
// for, its kind, queue and priority, the queues' usage, the cluster), not
// on which workload asks nor on when it is asked: a cycle then asks it
// once per distinct question. Workloads that wait behind a full cluster
// ask the same question again and again; the policy costs tens of
// microseconds an answer.
type NumbersOnlyQuota interface {
	QuotaByNumbers() bool
}

// memoQuota answers each distinct question of one cycle once.
type memoQuota struct {
	checker QuotaChecker
	answers map[quotaQuestion]QuotaVerdict
}

// quotaQuestion is a QuotaRequest without the asking workload's identity.
type quotaQuestion struct {
	gang          bool
	queue         string
	priority      int32
	members       int
	gpu, cpu, mem int64
	q             QueueUsage
	ancestors     string
	cluster       [3]int64
}

// memoized wraps quota when its answers may be shared within a cycle.
func memoized(quota QuotaChecker) QuotaChecker {
	if n, ok := quota.(NumbersOnlyQuota); ok && n.QuotaByNumbers() {
		return &memoQuota{checker: quota, answers: map[quotaQuestion]QuotaVerdict{}}
	}
	return quota
}

func (m *memoQuota) CheckQuota(ctx context.Context, req *QuotaRequest) (*QuotaVerdict, error) {
	if req.Workload == nil {
		return m.checker.CheckQuota(ctx, req)
	}
	key := questionOf(req)
	if v, ok := m.answers[key]; ok {
		return &QuotaVerdict{Allowed: v.Allowed, Reasons: slices.Clone(v.Reasons)}, nil
	}
	v, err := m.checker.CheckQuota(ctx, req)
	if err != nil {
		// A failure (a timeout) is not an answer.
		return nil, err
	}
	m.answers[key] = QuotaVerdict{Allowed: v.Allowed, Reasons: slices.Clone(v.Reasons)}
	return v, nil
}

func questionOf(req *QuotaRequest) quotaQuestion {
	k := quotaQuestion{
		gang: req.Workload.Key.IsGang(), queue: req.Workload.Queue, priority: req.Workload.Priority,
		members: req.Members, gpu: req.GPUMilli, cpu: req.CPUMilli, mem: req.Memory,
		q: req.Queue, cluster: [3]int64{req.ClusterMilli, req.ClusterCPUMilli, req.ClusterMemory},
	}
	if len(req.Ancestors) > 0 {
		var b []byte
		for _, a := range req.Ancestors {
			b = append(b, a.Name...)
			b = append(b, 0)
			for _, n := range []int64{int64(a.Priority), a.QuotaMilli, a.LimitMilli, a.AllocatedMilli, a.FairShareMilli,
				a.CPU.Quota, a.CPU.Limit, a.CPU.Allocated, a.CPU.FairShare, a.Memory.Quota, a.Memory.Limit, a.Memory.Allocated, a.Memory.FairShare} {
				b = strconv.AppendInt(b, n, 36)
				b = append(b, ',')
			}
		}
		k.ancestors = string(b)
	}
	return k
}
