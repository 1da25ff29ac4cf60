package cycle

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Elastic members (docs/workloads.md): a gang of the workload map whose
// rule marks members elastic (a RayCluster's workers beyond minReplicas)
// runs once its minimum fits. The members beyond the minimum are tried
// after every queue's workloads have had their turn in the cycle, so they
// take only room that no minimum wants; they never evict anything; and
// they are the first victims, one by one, when another queue's minimum (or
// a higher-priority minimum of their own queue) needs room.

// extraWork is an elastic gang whose members beyond the minimum wait.
type extraWork struct {
	q *queueState
	w *Workload
	// admitted: the gang's minimum was admitted earlier in this cycle.
	admitted bool
}

// admitExtras admits, in the order the gangs were reached, the elastic
// members beyond their gang's minimum that fit now and that the quota
// policy allows, each on its own.
func (c *cycle) admitExtras() {
	for _, e := range c.extras {
		if c.ctx.Err() != nil {
			return
		}
		w := e.w
		var placed []MemberAdmission
		reason, msg := v1alpha1.ReasonWaitingForCapacity, ""
		from := 0
		if e.admitted {
			from = min(max(0, int(w.MinMember)-len(w.Active)-int(w.Succeeded)), len(w.Pending))
		}
		var held int64
		for _, m := range w.Pending[from:] {
			if e.q != nil {
				v, err := c.checkQuota(e.q, w, []*Member{m}, held+m.GPUMilli)
				if err != nil || !v.Allowed {
					reason = v1alpha1.ReasonWaitingForQuota
					msg = fmt.Sprintf("the quota policy (data.partita.quota) failed, so the workload waits: %v", err)
					if err == nil {
						msg = strings.Join(v.Reasons, "; ")
					}
					break
				}
			}
			more, err := c.place(w, []*Member{m}, true)
			if err != nil {
				continue
			}
			placed = append(placed, more...)
			held += m.GPUMilli
		}
		if len(placed) > 0 && c.commit(e.q, w, placed) {
			continue
		}
		if e.admitted {
			// Its minimum was admitted now: its pending members are told
			// that, not that they wait.
			continue
		}
		if msg == "" {
			msg = fmt.Sprintf("%s runs its minimum of %d; its %d elastic member(s) beyond it wait for room that no workload's minimum wants",
				w.Name(), w.MinMember, len(w.Pending))
		}
		c.wait(w, reason, msg)
	}
}

// elasticVictims are the elastic members beyond their gang's minimum that
// may be evicted, one by one, for w's minimum: those of other queues, and
// those of lower-priority gangs of w's queue; the lowest priority first,
// then the most recently admitted. Members admitted less than
// PreemptMinRuntime ago are spared, as whole workloads are.
func (c *cycle) elasticVictims(q *queueState, w *Workload) []victim {
	var out []victim
	for _, ew := range c.st.Elastic {
		if ew == w || ew.Key == w.Key || c.evicting[ew.Key] {
			continue
		}
		if ew.Queue == q.Name && ew.Priority >= w.Priority {
			continue
		}
		vq := c.queues[ew.Queue]
		for _, m := range ew.Extras() {
			if c.evictingMembers[m.uid] {
				continue
			}
			at := m.Admitted
			if at.IsZero() {
				at = m.Pod.CreationTimestamp.Time
			}
			if c.opts.Now.Sub(at) < c.opts.PreemptMinRuntime {
				continue
			}
			out = append(out, victim{w: ew, q: vq, members: []*Member{m}, elastic: true, reclaim: ew.Queue != q.Name})
		}
	}
	slices.SortStableFunc(out, func(a, b victim) int {
		return cmp.Or(cmp.Compare(a.w.Priority, b.w.Priority), b.members[0].Admitted.Compare(a.members[0].Admitted))
	})
	return out
}

// markEvicting records the victims chosen in this cycle, so that later
// searches do not count them again.
func (c *cycle) markEvicting(v victim) {
	if !v.elastic {
		c.evicting[v.w.Key] = true
		return
	}
	if c.evictingMembers == nil {
		c.evictingMembers = map[types.UID]bool{}
	}
	for _, m := range v.members {
		c.evictingMembers[m.uid] = true
	}
}

func elasticEvictionMessage(v victim, q *queueState, w *Workload) string {
	return fmt.Sprintf("elastic member of %s, beyond its minimum of %d, evicted to make room for the minimum of %s (queue %s)",
		v.w.Name(), v.w.MinMember, w.Name(), q.Name)
}
