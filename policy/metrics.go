package policy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values of partita_policy_loads_total's result.
const (
	loadLoaded  = "loaded"
	loadRefused = "refused"
)

// Metrics are the policy engine's Prometheus metrics. A nil *Metrics
// records nothing.
type Metrics struct {
	info            *prometheus.GaugeVec
	loads           *prometheus.CounterVec
	evalErrors      *prometheus.CounterVec
	evalDuration    *prometheus.HistogramVec
	stateWrites     prometheus.Counter
	stateQueues     prometheus.Gauge
	stateNamespaces prometheus.Gauge
	// evals are each decision point's series, resolved once: the admitter
	// evaluates quota about a thousand times a cycle.
	evals [numPoints]evalSeries
}

// NewMetrics creates the policy metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_policy_info",
			Help: "The policy version in force (a digest of its modules) and where it came from (default, or configmap:<names>); always 1.",
		}, []string{"version", "source"}),
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_policy_loads_total",
			Help: "Policy loads by result: loaded, or refused (did not compile; the last good policy stays).",
		}, []string{"result"}),
		evalErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_policy_evaluation_errors_total",
			Help: "Policy evaluations that failed (runtime error, wrong result shape, timeout) by decision: admission (the pod was refused), quota (the workload stays pending) or workload (the workload map could not group the pod, which waits).",
		}, []string{"decision"}),
		evalDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "partita_policy_evaluation_duration_seconds",
			Help:    "Time to evaluate one decision by decision: admission (data.partita.admission for one pod), quota (data.partita.quota for one workload) or workload (data.partita.workload for one pod).",
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 50e-3, 0.25},
		}, []string{"decision"}),
		stateWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "partita_policy_state_writes_total",
			Help: "Batches of cluster state written to the policy's in-memory store.",
		}),
		stateQueues: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "partita_policy_state_queues",
			Help: "Queues in the policy's state.",
		}),
		stateNamespaces: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "partita_policy_state_namespaces",
			Help: "Namespaces in the policy's state.",
		}),
	}
	for point := range numPoints {
		m.evals[point] = evalSeries{
			duration: m.evalDuration.WithLabelValues(point.String()),
			errors:   m.evalErrors.WithLabelValues(point.String()),
		}
	}
	reg.MustRegister(m.info, m.loads, m.evalErrors, m.evalDuration, m.stateWrites, m.stateQueues, m.stateNamespaces)
	return m
}

// evalSeries are one decision point's evaluation metrics.
type evalSeries struct {
	duration prometheus.Observer
	errors   prometheus.Counter
}

func (m *Metrics) setVersion(version, source string) {
	if m == nil {
		return
	}
	m.info.Reset()
	m.info.WithLabelValues(version, source).Set(1)
}

func (m *Metrics) load(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.loads.WithLabelValues(loadLoaded).Inc()
		return
	}
	m.loads.WithLabelValues(loadRefused).Inc()
}

func (m *Metrics) evaluation(point decisionPoint, d time.Duration, err error) {
	if m == nil {
		return
	}
	s := m.evals[point]
	s.duration.Observe(d.Seconds())
	if err != nil {
		s.errors.Inc()
	}
}

func (m *Metrics) stateWritten(st State) {
	if m == nil {
		return
	}
	m.stateWrites.Inc()
	m.stateQueues.Set(float64(len(st.Queues)))
	m.stateNamespaces.Set(float64(len(st.Namespaces)))
}
