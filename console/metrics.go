package console

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the console's Prometheus metrics, served at /metrics (in
// local mode behind the token, like the API). A nil *Metrics records
// nothing.
type Metrics struct {
	reg      *prometheus.Registry
	build    prometheus.Histogram
	streams  prometheus.Gauge
	requests *prometheus.CounterVec
}

// NewMetrics makes the console's registry and metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		build: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "partita_console_snapshot_build_seconds",
			Help:    "Time to build one snapshot of the cluster from the informers (the map, the queues, the workloads).",
			Buckets: []float64{1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1, 2.5},
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "partita_console_event_streams",
			Help: "Pages connected to /api/v1/events.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_console_requests_total",
			Help: "API requests answered, by operation (the OpenAPI operationId) and HTTP status code.",
		}, []string{"operation", "code"}),
	}
	m.reg.MustRegister(m.build, m.streams, m.requests, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *Metrics) built(d time.Duration) {
	if m != nil {
		m.build.Observe(d.Seconds())
	}
}

func (m *Metrics) stream(delta float64) {
	if m != nil {
		m.streams.Add(delta)
	}
}

func (m *Metrics) request(operation string, code int) {
	if m != nil {
		m.requests.WithLabelValues(operation, strconv.Itoa(code)).Inc()
	}
}

func (m *Metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}
