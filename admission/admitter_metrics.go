package admission

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
)

// AdmitterMetrics are the admission loop's Prometheus metrics. A nil
// *AdmitterMetrics records nothing.
type AdmitterMetrics struct {
	cycle          *prometheus.HistogramVec
	admissions     *prometheus.CounterVec
	evictions      *prometheus.CounterVec
	pending        *prometheus.GaugeVec
	queueAllocated *prometheus.GaugeVec
	queueRequested *prometheus.GaugeVec
	queueFairShare *prometheus.GaugeVec
	queuePending   *prometheus.GaugeVec
	queueUsage     *prometheus.GaugeVec
	usageWrites    prometheus.Counter
}

// NewAdmitterMetrics creates the loop's metrics and registers them on reg.
func NewAdmitterMetrics(reg prometheus.Registerer) *AdmitterMetrics {
	queue := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"queue"})
	}
	m := &AdmitterMetrics{
		cycle: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "partita_admission_cycle_duration_seconds",
			Help:    "Time of one admission cycle, by phase: decide (ordering, quota, placement, victims) and total (with the API writes).",
			Buckets: []float64{1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5, 5},
		}, []string{"phase"}),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_admission_admitted_total",
			Help: "Workloads admitted, by kind: gang or pod.",
		}, []string{"kind"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_admission_evictions_total",
			Help: "Workloads evicted, by cause: reclaim, preempt, timeout, or refused (gang members kube-scheduler kept refusing at the nodes they were pinned to).",
		}, []string{"cause"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_admission_pending_workloads",
			Help: "Workloads waiting for admission after the last cycle, by reason.",
		}, []string{"reason"}),
		queueAllocated: queue("partita_queue_allocated_gpus", "GPUs the queue's admitted workloads hold."),
		queueRequested: queue("partita_queue_requested_gpus", "GPUs the queue holds and waits for."),
		queueFairShare: queue("partita_queue_fair_share_gpus", "The queue's fair share of GPUs (DESIGN §6)."),
		queuePending:   queue("partita_queue_pending_workloads", "Workloads of the queue waiting for admission."),
		queueUsage:     queue("partita_queue_usage_gpu_hours", "GPU-hours the queue (with its children) used in the usage window, decayed by the half-life; set while time-based fair share is on."),
		usageWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "partita_queue_usage_writes_total",
			Help: "Queue status writes that carried new usage history (at most one per queue per usage persist period).",
		}),
	}
	for _, r := range []string{v1alpha1.ReasonWaitingForQuota, v1alpha1.ReasonWaitingForMembers, v1alpha1.ReasonWaitingForCapacity, v1alpha1.ReasonScheduleTimeout, v1alpha1.ReasonEvictionRefused} {
		m.pending.WithLabelValues(r)
	}
	reg.MustRegister(m.cycle, m.admissions, m.evictions, m.pending, m.queueAllocated, m.queueRequested, m.queueFairShare, m.queuePending, m.queueUsage, m.usageWrites)
	return m
}

func (m *AdmitterMetrics) observeCycle(res *cycle.Result, decide, total time.Duration) {
	if m == nil {
		return
	}
	m.cycle.WithLabelValues("decide").Observe(decide.Seconds())
	m.cycle.WithLabelValues("total").Observe(total.Seconds())
	counts := map[string]float64{}
	for _, w := range res.Waiting {
		counts[w.Reason]++
	}
	for _, r := range []string{v1alpha1.ReasonWaitingForQuota, v1alpha1.ReasonWaitingForMembers, v1alpha1.ReasonWaitingForCapacity, v1alpha1.ReasonScheduleTimeout, v1alpha1.ReasonEvictionRefused} {
		m.pending.WithLabelValues(r).Set(counts[r])
	}
}

func (m *AdmitterMetrics) admitted(gang bool) {
	if m == nil {
		return
	}
	kind := "pod"
	if gang {
		kind = "gang"
	}
	m.admissions.WithLabelValues(kind).Inc()
}

func (m *AdmitterMetrics) evicted(cause string) {
	if m == nil {
		return
	}
	m.evictions.WithLabelValues(cause).Inc()
}

func (m *AdmitterMetrics) queue(r cycle.QueueReport) {
	if m == nil {
		return
	}
	m.queueAllocated.WithLabelValues(r.Name).Set(float64(r.AllocatedMilli) / 1000)
	m.queueRequested.WithLabelValues(r.Name).Set(float64(r.RequestedMilli) / 1000)
	m.queueFairShare.WithLabelValues(r.Name).Set(float64(r.FairShareMilli) / 1000)
	m.queuePending.WithLabelValues(r.Name).Set(float64(r.PendingWorkloads))
}

func (m *AdmitterMetrics) usage(queue string, gpuHours float64) {
	if m == nil {
		return
	}
	m.queueUsage.WithLabelValues(queue).Set(gpuHours)
}

func (m *AdmitterMetrics) usageWritten() {
	if m == nil {
		return
	}
	m.usageWrites.Inc()
}
