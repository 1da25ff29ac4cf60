package admission

import (
	"context"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/policy"
)

// PolicyQuota answers the admission loop's quota questions with the Rego
// decision data.partita.quota.
type PolicyQuota struct {
	Engine *policy.Engine
}

// CheckQuota implements cycle.QuotaChecker.
func (p PolicyQuota) CheckQuota(ctx context.Context, r *cycle.QuotaRequest) (*cycle.QuotaVerdict, error) {
	kind, name := policy.QuotaKindPod, r.Workload.Key.Pod
	if r.Workload.Key.IsGang() {
		// A gang of the workload map is its PodGroup too.
		kind, name = policy.QuotaKindPodGroup, r.Workload.Key.GangName()
	}
	in := &policy.QuotaInput{
		Workload: policy.QuotaWorkload{
			Namespace: r.Workload.Key.Namespace, Name: name, Kind: kind, Queue: r.Workload.Queue,
			Members: int32(r.Members), GPUMilli: r.GPUMilli, CPUMilli: r.CPUMilli, MemoryBytes: r.Memory, Priority: r.Workload.Priority,
		},
		Queue:   quotaQueue(r.Queue),
		Cluster: policy.QuotaCluster{GPUMilli: r.ClusterMilli, CPUMilli: r.ClusterCPUMilli, MemoryBytes: r.ClusterMemory},
	}
	for _, a := range r.Ancestors {
		in.Ancestors = append(in.Ancestors, quotaQueue(a))
	}
	d, err := p.Engine.Quota(ctx, in)
	if err != nil {
		return nil, err
	}
	return &cycle.QuotaVerdict{Allowed: d.Allowed, Reasons: d.Reasons}, nil
}

// QuotaByNumbers implements cycle.NumbersOnlyQuota: whether the policy in
// force answers by a question's numbers alone.
func (p PolicyQuota) QuotaByNumbers() bool { return p.Engine.QuotaByNumbers() }

func quotaQueue(u cycle.QueueUsage) policy.QuotaQueue {
	return policy.QuotaQueue{Name: u.Name, Priority: u.Priority,
		GPU: policy.QuotaResource{QuotaMilli: u.QuotaMilli, LimitMilli: u.LimitMilli, AllocatedMilli: u.AllocatedMilli, FairShareMilli: u.FairShareMilli},
		CPU: policy.QuotaResource{QuotaMilli: u.CPU.Quota, LimitMilli: u.CPU.Limit, AllocatedMilli: u.CPU.Allocated, FairShareMilli: u.CPU.FairShare},
		Memory: policy.QuotaBytes{QuotaBytes: u.Memory.Quota, LimitBytes: u.Memory.Limit, AllocatedBytes: u.Memory.Allocated,
			FairShareBytes: u.Memory.FairShare},
	}
}
