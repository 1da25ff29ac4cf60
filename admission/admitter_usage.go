package admission

import (
	"context"
	"time"

	"github.com/go-logr/logr"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/admission/usage"
	"github.com/partita-dev/partita/api/v1alpha1"
)

// usageState is the loop's side of time-based fair share: the tracker, and
// this cycle's usage of every queue.
type usageState struct {
	tracker *usage.Tracker
	// restore is set at the start of a leader's term: the next cycle takes
	// the history from the Queues' status first.
	restore bool
	reports map[string]usage.Report
	// written is when this leader last wrote each queue's usage: the
	// persist period holds even if the API server drops what was written
	// (a Queue CRD from before status.usage), and warnedPruned says that
	// was logged.
	written      map[string]time.Time
	warnedPruned bool
}

// countUsage counts what every queue held since the last cycle and returns
// the usage the cycle weighs; nil while time-based fair share is off.
func (a *Admitter) countUsage(st *cycle.State, now time.Time) *cycle.Usage {
	u := a.usage
	if u == nil {
		return nil
	}
	if u.restore {
		statuses := make(map[string]*v1alpha1.QueueUsage, len(st.Queues))
		for name, q := range st.Queues {
			statuses[name] = q.Status.Usage
		}
		u.tracker.Restore(statuses)
		u.restore = false
	}
	held := make(map[string]usage.Amounts, len(st.Queues))
	parents := make(map[string]string, len(st.Queues))
	for name, q := range st.Queues {
		held[name] = usage.Amounts{GPU: float64(q.AllocatedMilli) / 1000, CPU: float64(q.AllocatedCPUMilli) / 1000, Memory: float64(q.AllocatedMemory)}
		parents[name] = q.Parent
	}
	u.tracker.Observe(now, held)
	u.tracker.Forget(func(name string) bool { _, ok := st.Queues[name]; return ok })
	u.reports = u.tracker.Usage(now, parents, a.capacity(st))
	out := &cycle.Usage{
		Weight:   a.opts.Usage.Weight,
		Share:    make(map[string][3]float64, len(u.reports)),
		GPUHours: make(map[string]float64, len(u.reports)),
		Window:   a.opts.Usage.String(),
	}
	for name, r := range u.reports {
		out.Share[name] = [3]float64{r.Share.GPU, r.Share.CPU, r.Share.Memory}
		out.GPUHours[name] = r.Hours().GPU
	}
	return out
}

// capacity is what the cycle divides: the healthy GPUs of the ledger, and
// the allocatable CPU and memory of the nodes that have GPUs.
func (a *Admitter) capacity(st *cycle.State) usage.Amounts {
	c := usage.Amounts{GPU: float64(a.snap.CapacityMilli()) / 1000}
	for _, name := range a.snap.Nodes() {
		if n := st.Nodes[name]; n != nil && n.Node != nil {
			c.CPU += float64(n.Node.Status.Allocatable.Cpu().MilliValue()) / 1000
			c.Memory += float64(n.Node.Status.Allocatable.Memory().Value())
		}
	}
	return c
}

// usageStatus returns what the queue's status.usage should say: nil while
// time-based fair share is off; the current history once per persist
// period (usage.Config.PersistEvery), so that usage costs a bounded number
// of writes; otherwise the last written, with the fair share without
// usage brought up to date (it changes only with demand).
func (a *Admitter) usageStatus(ctx context.Context, r cycle.QueueReport, current *v1alpha1.QueueUsage, now time.Time) (st *v1alpha1.QueueUsage, fresh bool) {
	u := a.usage
	if u == nil {
		return nil, false
	}
	rep := u.reports[r.Name]
	a.metrics.usage(r.Name, rep.Hours().GPU)
	period := a.opts.Usage.PersistEvery()
	last, wrote := u.written[r.Name]
	if current != nil && current.UpdateTime != nil && current.UpdateTime.After(last) {
		last = current.UpdateTime.Time
	}
	switch {
	case now.Sub(last) >= period:
		if current == nil && wrote && !u.warnedPruned {
			u.warnedPruned = true
			logr.FromContextOrDiscard(ctx).Error(nil, "The API server drops Queue status.usage: the Queue CRD predates time-based fair share, so usage does not survive a leader change and is not shown; apply the CRDs of this release (kubectl apply --server-side -f helm/partita/crds/)", "queue", r.Name)
		}
		if u.written == nil {
			u.written = map[string]time.Time{}
		}
		u.written[r.Name] = now
		st, fresh = u.tracker.Status(r.Name, now, rep), true
	case current == nil:
		return nil, false
	default:
		st = current.DeepCopy()
	}
	st.FairShareWithoutUsage = nil
	if b := r.FairShareWithoutUsage; b != nil {
		st.FairShareWithoutUsage = resourceList(nil, b[0], b[1], b[2])
	}
	return st, fresh
}
