package usage

import (
	"math"
	"slices"
	"time"
)

// Amounts are GPUs, CPU cores and memory bytes held (a rate), or their
// integral over time in GPU-, core- and byte-seconds.
type Amounts struct {
	GPU, CPU, Memory float64
}

func (a Amounts) scaled(f float64) Amounts {
	return Amounts{GPU: a.GPU * f, CPU: a.CPU * f, Memory: a.Memory * f}
}

func (a Amounts) plus(b Amounts) Amounts {
	return Amounts{GPU: a.GPU + b.GPU, CPU: a.CPU + b.CPU, Memory: a.Memory + b.Memory}
}

func (a Amounts) isZero() bool { return a == Amounts{} }

// bucket is a queue's use in [start, end), decayed to end, in
// resource-seconds.
type bucket struct {
	start, end time.Time
	used       Amounts
}

// Report is a queue's usage at one moment.
type Report struct {
	// Used is the decayed usage in the window, in resource-seconds; a
	// parent's includes its children's.
	Used Amounts
	// Share is Used over what the cluster's capacity would have given in
	// the window with the same decay (0 to 1, more if the capacity shrank).
	Share Amounts
}

// Hours returns r.Used in resource-hours.
func (r Report) Hours() Amounts { return r.Used.scaled(1.0 / 3600) }

// Tracker integrates what queues hold over time. It is not safe for
// concurrent use: the admission loop calls it from its cycle only.
type Tracker struct {
	cfg   Config
	width time.Duration
	// last is when Observe last counted up to; zero before the first.
	last time.Time
	// held is what each queue held at the last Observe; nil right after
	// Restore, when the first Observe fills the gap since the last write.
	held    map[string]Amounts
	history map[string][]bucket
}

// NewTracker returns a tracker with no history; cfg must be valid.
func NewTracker(cfg Config) *Tracker {
	return &Tracker{cfg: cfg, width: cfg.bucketWidth(), history: map[string][]bucket{}}
}

// Config returns the tracker's settings.
func (t *Tracker) Config() Config { return t.cfg }

// Observe counts what each queue held since the last call (as it held then)
// up to now, and takes held (each queue's own workloads' allocation, not its
// children's) as what they hold from now on. The first call after Restore
// counts the time since the history was written with held: gaps longer
// than the window count as the window.
func (t *Tracker) Observe(now time.Time, held map[string]Amounts) {
	if t.last.IsZero() {
		t.last = now
		t.held = held
		return
	}
	if !now.After(t.last) {
		t.held = held
		return
	}
	from := t.last
	if t.held == nil {
		t.held = held
		from = later(from, now.Add(-t.cfg.Window))
	}
	for name, rate := range t.held {
		if !rate.isZero() {
			t.history[name] = t.add(t.history[name], rate, from, now)
		}
	}
	t.last = now
	t.held = held
	t.prune(now)
}

// add integrates rate over [from, to] into bs, split at bucket boundaries.
func (t *Tracker) add(bs []bucket, rate Amounts, from, to time.Time) []bucket {
	h := t.cfg.HalfLife.Seconds()
	for p := from; p.Before(to); {
		start := floorTo(p, t.width)
		end := start.Add(t.width)
		q := earlier(end, to)
		// x × (h/ln 2) × (0.5^((E−q)/h) − 0.5^((E−p)/h))
		f := h / math.Ln2 * (decay(end.Sub(q), h) - decay(end.Sub(p), h))
		if n := len(bs); n > 0 && bs[n-1].start.Equal(start) {
			bs[n-1].used = bs[n-1].used.plus(rate.scaled(f))
		} else {
			bs = append(bs, bucket{start: start, end: end, used: rate.scaled(f)})
		}
		p = q
	}
	return bs
}

// decay is 0.5^(age/h), age in any sign.
func decay(age time.Duration, h float64) float64 {
	return math.Exp2(-age.Seconds() / h)
}

// maxAgeHalfLives bounds a bucket's age: 2^-30 is below 10⁻⁹.
const maxAgeHalfLives = 30

// prune drops buckets that ended before the window or so long ago that
// they count for nothing, and queues left without any.
func (t *Tracker) prune(now time.Time) {
	cut := later(t.cfg.windowStart(now), now.Add(-maxAgeHalfLives*t.cfg.HalfLife))
	for name, bs := range t.history {
		i := 0
		for i < len(bs) && !bs[i].end.After(cut) {
			i++
		}
		if i == len(bs) {
			delete(t.history, name)
			continue
		}
		if i > 0 {
			t.history[name] = slices.Clone(bs[i:])
		}
	}
}

// Forget drops the history of queues that are not in keep.
func (t *Tracker) Forget(keep func(name string) bool) {
	for name := range t.history {
		if !keep(name) {
			delete(t.history, name)
		}
	}
}

// own returns a queue's own decayed usage in the window at now.
func (t *Tracker) own(name string, now time.Time) Amounts {
	h := t.cfg.HalfLife.Seconds()
	lo := t.cfg.windowStart(now)
	var sum Amounts
	for _, b := range t.history[name] {
		if !b.end.After(lo) {
			continue
		}
		f := decay(now.Sub(b.end), h)
		if b.start.Before(lo) {
			// The window's start cuts the bucket: count the part inside.
			f *= b.end.Sub(lo).Seconds() / b.end.Sub(b.start).Seconds()
		}
		sum = sum.plus(b.used.scaled(f))
	}
	return sum
}

// potential is what one unit of capacity held throughout the window gives
// at now: ∫ 0.5^((now−s)/h) ds from the window's start to now, in seconds.
func (t *Tracker) potential(now time.Time) float64 {
	h := t.cfg.HalfLife.Seconds()
	return h / math.Ln2 * (1 - decay(now.Sub(t.cfg.windowStart(now)), h))
}

// Usage returns every queue's usage at now, for the queues of the tree
// parents describes (queue name to parent name, "" for top level): its own
// plus its descendants', and as a share of capacity over the window.
func (t *Tracker) Usage(now time.Time, parents map[string]string, capacity Amounts) map[string]Report {
	out := make(map[string]Report, len(parents))
	for name := range parents {
		out[name] = Report{}
	}
	for name := range t.history {
		if _, ok := parents[name]; !ok {
			continue
		}
		used := t.own(name, now)
		if used.isZero() {
			continue
		}
		// Up the tree; a cycle in parents (the cycle breaks those) stops
		// after as many steps as there are queues.
		steps := 0
		for q := name; q != "" && steps <= len(parents); q, steps = parents[q], steps+1 {
			r, ok := out[q]
			if !ok {
				break
			}
			r.Used = r.Used.plus(used)
			out[q] = r
		}
	}
	p := t.potential(now)
	for name, r := range out {
		r.Share = Amounts{GPU: ratio(r.Used.GPU, capacity.GPU*p), CPU: ratio(r.Used.CPU, capacity.CPU*p), Memory: ratio(r.Used.Memory, capacity.Memory*p)}
		out[name] = r
	}
	return out
}

func ratio(a, b float64) float64 {
	if b <= 0 || a <= 0 {
		return 0
	}
	return a / b
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
