package console

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Utilization is GPU allocation over time, as the plots draw it: one time
// axis and series aligned on it (null where a series has no point).
type Utilization struct {
	// Source is prometheus or sampled (the console's own samples).
	Source string `json:"source"`
	// StepSeconds is the spacing of the points.
	StepSeconds float64 `json:"stepSeconds"`
	// From and To are the range asked for, in Unix seconds.
	From int64 `json:"from"`
	To   int64 `json:"to"`
	// Times are the points' times, in Unix seconds.
	Times []int64 `json:"times"`
	// Share is the allocated share of the cluster's healthy GPUs, 0 to 1.
	Share []*float64 `json:"share"`
	// CapacityGPUs is the cluster's healthy GPUs.
	CapacityGPUs []*float64 `json:"capacityGPUs"`
	// AllocatedGPUs is what the slices hold.
	AllocatedGPUs []*float64 `json:"allocatedGPUs"`
	// Queues are the GPUs each queue holds (a parent its subtree's).
	Queues []QueueSeries `json:"queues"`
	// Note says what the numbers are, or why some are missing.
	Note string `json:"note,omitempty"`
}

// QueueSeries is one queue's GPUs over time.
type QueueSeries struct {
	Queue string     `json:"queue"`
	GPUs  []*float64 `json:"gpus"`
}

// Sample is the cluster's allocation at one moment, in milli-GPUs.
type Sample struct {
	Time           time.Time
	CapacityMilli  int64
	AllocatedMilli int64
	// Queues are what each queue's pods hold.
	Queues map[string]int64
}

// sampleOf is s's allocation now.
func sampleOf(s *Snapshot, now time.Time) Sample {
	q := make(map[string]int64, len(s.queueHeldMilli))
	for k, v := range s.queueHeldMilli {
		q[k] = v
	}
	return Sample{Time: now, CapacityMilli: s.capacityMilli, AllocatedMilli: s.allocatedMilli, Queues: q}
}

// History is the console's own short record of allocation, so the plots
// work on a cluster without Prometheus: one Sample per interval, kept for
// the window.
type History struct {
	interval time.Duration
	window   time.Duration

	lock    sync.Mutex
	samples []Sample
}

// NewHistory keeps a sample per interval for window.
func NewHistory(interval, window time.Duration) *History {
	return &History{interval: interval, window: window}
}

// Add records a sample and drops those older than the window.
func (h *History) Add(s Sample) {
	h.lock.Lock()
	defer h.lock.Unlock()
	h.samples = append(h.samples, s)
	cut := 0
	for cut < len(h.samples) && s.Time.Sub(h.samples[cut].Time) > h.window {
		cut++
	}
	if cut > 0 {
		h.samples = slices.Delete(h.samples, 0, cut)
	}
}

// Run samples current() every interval until ctx ends.
func (h *History) Run(ctx context.Context, current func() *Snapshot, now func() time.Time) {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	sample := func() {
		if s := current(); s != nil {
			h.Add(sampleOf(s, now()))
		}
	}
	sample()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			sample()
		}
	}
}

// Series returns the samples since from, with the queues keep lets
// through.
func (h *History) Series(from, to time.Time, keep func(queue string) bool) Utilization {
	h.lock.Lock()
	samples := slices.Clone(h.samples)
	h.lock.Unlock()
	u := Utilization{Source: "sampled", StepSeconds: h.interval.Seconds(), From: from.Unix(), To: to.Unix(), Times: []int64{}, Share: []*float64{},
		CapacityGPUs: []*float64{}, AllocatedGPUs: []*float64{}, Queues: []QueueSeries{},
		Note: "sampled by the console every " + h.interval.String() + " since it started (kept for " + h.window.String() + "); point it at Prometheus (--prometheus-url) for longer history"}
	var names []string
	seen := map[string]bool{}
	for _, s := range samples {
		if s.Time.Before(from) {
			continue
		}
		for q := range s.Queues {
			if !seen[q] && keep(q) {
				seen[q] = true
				names = append(names, q)
			}
		}
	}
	slices.Sort(names)
	index := map[string]int{}
	for i, n := range names {
		index[n] = i
		u.Queues = append(u.Queues, QueueSeries{Queue: n, GPUs: []*float64{}})
	}
	for _, s := range samples {
		if s.Time.Before(from) {
			continue
		}
		u.Times = append(u.Times, s.Time.Unix())
		var share *float64
		if s.CapacityMilli > 0 {
			share = new(float64(s.AllocatedMilli) / float64(s.CapacityMilli))
		}
		u.Share = append(u.Share, share)
		u.CapacityGPUs = append(u.CapacityGPUs, new(milliToGPUs(s.CapacityMilli)))
		u.AllocatedGPUs = append(u.AllocatedGPUs, new(milliToGPUs(s.AllocatedMilli)))
		for i := range u.Queues {
			u.Queues[i].GPUs = append(u.Queues[i].GPUs, new(0.0))
		}
		for q, m := range s.Queues {
			if i, ok := index[q]; ok {
				*u.Queues[i].GPUs[len(u.Times)-1] = milliToGPUs(m)
			}
		}
	}
	return u
}
