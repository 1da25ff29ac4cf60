package usage

import (
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Status returns what a Queue's status.usage says of the queue at now: r
// (from Usage) and the queue's own buckets.
func (t *Tracker) Status(name string, now time.Time, r Report) *v1alpha1.QueueUsage {
	st := &v1alpha1.QueueUsage{
		Hours:      resources(r.Hours()),
		Share:      resources(r.Share),
		HalfLife:   metav1.Duration{Duration: t.cfg.HalfLife},
		Window:     metav1.Duration{Duration: t.cfg.Window},
		WindowType: t.cfg.WindowType,
		UpdateTime: &metav1.Time{Time: now.Truncate(time.Second)},
	}
	for _, b := range t.history[name] {
		st.Buckets = append(st.Buckets, v1alpha1.UsageBucket{
			Start: metav1.Time{Time: b.start}, End: metav1.Time{Time: b.end},
			Used: resources(b.used.scaled(1.0 / 3600)),
		})
	}
	return st
}

// Restore takes the queues' history from their status (by queue name), as
// a new leader does before its first cycle, unless the tracker counted up
// to a later time itself (it led before and nobody wrote since). Usage
// counted with another half-life is converted as if used at an even rate
// in each bucket; buckets of another width are kept as they are.
func (t *Tracker) Restore(statuses map[string]*v1alpha1.QueueUsage) {
	var latest time.Time
	for _, st := range statuses {
		if st != nil && st.UpdateTime != nil && st.UpdateTime.After(latest) {
			latest = st.UpdateTime.Time
		}
	}
	if latest.IsZero() || !t.last.IsZero() && !latest.After(t.last) {
		return
	}
	h := t.cfg.HalfLife.Seconds()
	t.history = map[string][]bucket{}
	for name, st := range statuses {
		if st == nil {
			continue
		}
		var bs []bucket
		for _, b := range st.Buckets {
			if !b.End.After(b.Start.Time) {
				continue
			}
			used := amounts(b.Used).scaled(3600)
			if old := st.HalfLife.Seconds(); old > 0 && old != h {
				used = used.scaled(evenIntegral(b.End.Sub(b.Start.Time), h) / evenIntegral(b.End.Sub(b.Start.Time), old))
			}
			if n := len(bs); n > 0 && b.Start.Time.Before(bs[n-1].end) {
				continue // out of order or overlapping: written by hand
			}
			bs = append(bs, bucket{start: b.Start.Time, end: b.End.Time, used: used})
		}
		if len(bs) > maxBuckets {
			bs = bs[len(bs)-maxBuckets:]
		}
		if len(bs) > 0 {
			t.history[name] = bs
		}
	}
	t.last = latest
	t.held = nil
}

// maxBuckets is the most buckets Restore takes of a queue, the CRD's
// bound; the tracker keeps at most about 92 (doc.go).
const maxBuckets = 128

// evenIntegral is ∫ 0.5^((L−s)/h) ds over [0, L]: what a unit rate over a
// bucket of length L adds, decayed to its end.
func evenIntegral(l time.Duration, h float64) float64 {
	return h / math.Ln2 * (1 - decay(l, h))
}

// resources converts amounts to a status resource list: gpu and cpu to the
// micro-unit, memory to the unit.
func resources(a Amounts) corev1.ResourceList {
	return corev1.ResourceList{
		v1alpha1.ResourceGPU:    micro(a.GPU),
		v1alpha1.ResourceCPU:    micro(a.CPU),
		v1alpha1.ResourceMemory: *resource.NewQuantity(clampInt(a.Memory), resource.DecimalSI),
	}
}

func micro(v float64) resource.Quantity {
	return *resource.NewScaledQuantity(clampInt(v*1e6), resource.Micro)
}

// clampInt rounds v to an int64, negative and NaN to 0, huge to the largest.
func clampInt(v float64) int64 {
	switch {
	case !(v > 0):
		return 0
	case v >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(math.Round(v))
}

func amounts(l corev1.ResourceList) Amounts {
	get := func(name corev1.ResourceName) float64 {
		q, ok := l[name]
		if !ok {
			return 0
		}
		v := q.AsApproximateFloat64()
		if !(v > 0) || math.IsInf(v, 0) {
			return 0
		}
		return v
	}
	return Amounts{GPU: get(v1alpha1.ResourceGPU), CPU: get(v1alpha1.ResourceCPU), Memory: get(v1alpha1.ResourceMemory)}
}
