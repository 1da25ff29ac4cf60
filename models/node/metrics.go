package node

import "github.com/prometheus/client_golang/prometheus"

// Metrics of a node's model cache (docs/models.md).
type Metrics struct {
	Hits         prometheus.Counter
	Misses       prometheus.Counter
	Failures     prometheus.Counter
	Evictions    prometheus.Counter
	OriginBytes  prometheus.Counter
	PeerBytes    prometheus.Counter
	ServedBytes  prometheus.Counter
	FetchSeconds prometheus.Histogram
}

// NewMetrics registers the metrics with reg (nil: registered nowhere).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Hits:        prometheus.NewCounter(prometheus.CounterOpts{Name: "partita_model_cache_hits_total", Help: "Model volumes served from the node's cache without a fetch."}),
		Misses:      prometheus.NewCounter(prometheus.CounterOpts{Name: "partita_model_cache_misses_total", Help: "Model versions fetched because the node's cache lacked them."}),
		Failures:    prometheus.NewCounter(prometheus.CounterOpts{Name: "partita_model_fetch_failures_total", Help: "Model fills that failed."}),
		Evictions:   prometheus.NewCounter(prometheus.CounterOpts{Name: "partita_model_cache_evictions_total", Help: "Model versions evicted to make room."}),
		OriginBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "partita_model_origin_bytes_total", Help: "Bytes read from models' sources (S3, HTTP, files)."}),
		PeerBytes:   prometheus.NewCounter(prometheus.CounterOpts{Name: "partita_model_peer_bytes_total", Help: "Bytes of models read from other nodes' caches."}),
		ServedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "partita_model_served_bytes_total", Help: "Bytes of models this cache sent to other nodes' caches."}),
		FetchSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "partita_model_fetch_seconds", Help: "Time to fetch and verify one model version.",
			Buckets: prometheus.ExponentialBuckets(0.5, 2, 12)}),
	}
	if reg != nil {
		reg.MustRegister(m.Hits, m.Misses, m.Failures, m.Evictions, m.OriginBytes, m.PeerBytes, m.ServedBytes, m.FetchSeconds)
	}
	return m
}
