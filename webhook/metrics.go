package webhook

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values of partita_webhook_bad_requests_total's reason.
const (
	badRequestTooLarge = "too_large"
	badRequestDecode   = "decode"
	// A caller without the API server's client certificate (401), or with
	// one of a name not allowed (403).
	badRequestUnauthenticated = "unauthenticated"
	badRequestForbidden       = "forbidden"
)

// Label values of partita_webhook_admission_requests_total's result.
const (
	resultAllowed = "allowed"
	resultDenied  = "denied"
	resultError   = "error"
)

// Metrics are the webhook's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	duration    *prometheus.HistogramVec
	requests    *prometheus.CounterVec
	denials     *prometheus.CounterVec
	badRequests *prometheus.CounterVec
}

// NewMetrics creates the webhook metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "partita_webhook_admission_duration_seconds",
			Help:    "Time to answer one AdmissionReview, by webhook (mutate-pods, validate-pods, validate-policies, validate-podgroups) and operation (CREATE, UPDATE), decoding and encoding included.",
			Buckets: []float64{100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 500e-3, 1, 3},
		}, []string{"webhook", "operation"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_webhook_admission_requests_total",
			Help: "AdmissionReviews answered, by webhook, operation and result (allowed, denied, error).",
		}, []string{"webhook", "operation", "result"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_webhook_denials_total",
			Help: "Refused requests by webhook and reason: InvalidRequest, SystemKey, Policy, PolicyError, Immutable, NotCanonical, InvalidPolicy, Malformed, NotFound, QueueConflict, SubGroupConflict, InvalidTopology.",
		}, []string{"webhook", "reason"}),
		badRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_webhook_bad_requests_total",
			Help: "HTTP requests answered without an AdmissionReview, by reason: too_large (over --max-request-bytes, 413), decode (not an AdmissionReview v1, 400), unauthenticated (no valid client certificate of the API server, 401) or forbidden (a certificate of a name not allowed, 403).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.duration, m.requests, m.denials, m.badRequests)
	return m
}

func (m *Metrics) observe(webhook, operation string, d time.Duration, res Result) {
	if m == nil {
		return
	}
	m.duration.WithLabelValues(webhook, operation).Observe(d.Seconds())
	result := resultAllowed
	if res.Err != nil {
		result = resultError
		if de, ok := asDenial(res.Err); ok {
			result = resultDenied
			m.denials.WithLabelValues(webhook, string(de.Reason)).Inc()
		}
	}
	m.requests.WithLabelValues(webhook, operation, result).Inc()
}

func (m *Metrics) badRequest(reason string) {
	if m == nil {
		return
	}
	m.badRequests.WithLabelValues(reason).Inc()
}
