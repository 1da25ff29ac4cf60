package nodeagent

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Label values of partita_agent_api_writes_total's kind.
const (
	writeGPUNode  = "gpunode"
	writeCapacity = "capacity"
)

// Label values of partita_agent_api_writes_total's result.
const (
	resultOK    = "ok"
	resultError = "error"
)

// Metrics are the agent's Prometheus metrics, on a registry of their own.
// Every series carries the node, so one fleet process serves many nodes'
// series; a node's series are dropped when the agent stops serving it.
type Metrics struct {
	registry *prometheus.Registry

	memoryTotal    *prometheus.GaugeVec
	memoryUsed     *prometheus.GaugeVec
	utilization    *prometheus.GaugeVec
	allocatedMilli *prometheus.GaugeVec
	healthy        *prometheus.GaugeVec
	unattributed   *prometheus.GaugeVec
	capacityMilli  *prometheus.GaugeVec

	podMemoryUsed  *prometheus.GaugeVec
	podMemoryLimit *prometheus.GaugeVec
	overuse        *prometheus.CounterVec
	killErrors     *prometheus.CounterVec

	nvmlErrors   *prometheus.CounterVec
	apiWrites    *prometheus.CounterVec
	mpsRestarts  *prometheus.CounterVec
	mpsDrift     *prometheus.CounterVec
	syncDuration prometheus.Histogram
	nodes        prometheus.Gauge
}

// NewMetrics creates the agent's metrics and registers them, with the Go and
// process collectors, on a new registry.
func NewMetrics() *Metrics {
	dev := []string{"node", "device"}
	slice := []string{"node", "namespace", "pod", "container", "device"}
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		memoryTotal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_gpu_memory_total_bytes", Help: "Memory of each GPU.",
		}, dev),
		memoryUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_gpu_memory_used_bytes", Help: "Memory in use on each GPU.",
		}, dev),
		utilization: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_gpu_utilization_ratio", Help: "Share of time a kernel ran on each GPU over the last sample period, 0 to 1.",
		}, dev),
		allocatedMilli: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_gpu_allocated_milli", Help: "Milli-GPUs of each GPU held by pods' slices (1000 = the whole device).",
		}, dev),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_gpu_healthy", Help: "1 when the GPU is healthy, 0 when it is not.",
		}, dev),
		unattributed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_gpu_unattributed_memory_bytes", Help: "GPU memory held by processes that belong to no slice the agent knows.",
		}, dev),
		capacityMilli: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_node_gpu_milli_capacity", Help: "The partita.dev/gpu-milli capacity the agent publishes for the node (1000 per healthy GPU).",
		}, []string{"node"}),
		podMemoryUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_pod_gpu_memory_used_bytes", Help: "GPU memory a container's processes use on one device.",
		}, slice),
		podMemoryLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "partita_pod_gpu_memory_limit_bytes", Help: "GPU memory limit of a container's slice of one device (absent for whole devices).",
		}, slice),
		overuse: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_gpu_overuse_total", Help: "Times the watchdog found a slice over its memory limit, by the action taken: off, report or kill.",
		}, []string{"node", "action"}),
		killErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_gpu_overuse_kill_errors_total", Help: "Over-limit processes the watchdog failed to end (without hostPID the agent cannot see them).",
		}, []string{"node"}),
		nvmlErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_nvml_errors_total", Help: "NVML calls that failed, by call.",
		}, []string{"call"}),
		apiWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_agent_api_writes_total", Help: "Writes to the API server, by kind (gpunode, capacity) and result (ok, error).",
		}, []string{"kind", "result"}),
		mpsRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_mps_daemon_restarts_total", Help: "MPS control daemons the agent restarted after they exited.",
		}, dev),
		mpsDrift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_mps_limit_drift_total", Help: "Times an MPS daemon's limits were found changed through its control pipe and set again.",
		}, dev),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "partita_agent_sync_duration_seconds", Help: "Time to sync one node: read the GPUs, apply slices, check usage, publish.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 8),
		}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "partita_agent_nodes", Help: "Nodes this agent serves.",
		}),
	}
	m.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.memoryTotal, m.memoryUsed, m.utilization, m.allocatedMilli, m.healthy, m.unattributed, m.capacityMilli,
		m.podMemoryUsed, m.podMemoryLimit, m.overuse, m.killErrors,
		m.nvmlErrors, m.apiWrites, m.mpsRestarts, m.mpsDrift, m.syncDuration, m.nodes,
	)
	return m
}

// Registry is the registry the metrics are on, for the /metrics handler.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// NVMLError counts a failed NVML call.
func (m *Metrics) NVMLError(call string) { m.nvmlErrors.WithLabelValues(call).Inc() }

// reportDevices sets the per-device series of a node from a snapshot.
func (m *Metrics) reportDevices(node string, snap *Snapshot, allocated map[int32]int64, unattributed map[int32]int64) {
	for _, d := range snap.Devices {
		l := []string{node, deviceLabel(d.Index)}
		m.memoryTotal.WithLabelValues(l...).Set(float64(d.MemoryMiB * mib))
		m.memoryUsed.WithLabelValues(l...).Set(float64(d.MemoryUsedBytes))
		if d.UtilizationPercent >= 0 {
			m.utilization.WithLabelValues(l...).Set(float64(d.UtilizationPercent) / 100)
		}
		m.allocatedMilli.WithLabelValues(l...).Set(float64(allocated[d.Index]))
		m.unattributed.WithLabelValues(l...).Set(float64(unattributed[d.Index]))
		h := 0.0
		if schedulable(d.GPUDevice) {
			h = 1
		}
		m.healthy.WithLabelValues(l...).Set(h)
	}
}

// reportSlice sets a slice's used and limit series.
func (m *Metrics) reportSlice(node, namespace, pod string, k sliceKey, usedBytes, limitBytes int64) {
	l := []string{node, namespace, pod, k.Container, deviceLabel(k.Device)}
	m.podMemoryUsed.WithLabelValues(l...).Set(float64(usedBytes))
	if limitBytes > 0 {
		m.podMemoryLimit.WithLabelValues(l...).Set(float64(limitBytes))
	}
}

// clearSlice drops a slice's series.
func (m *Metrics) clearSlice(node, namespace, pod string, k sliceKey) {
	l := prometheus.Labels{"node": node, "namespace": namespace, "pod": pod, "container": k.Container, "device": deviceLabel(k.Device)}
	m.podMemoryUsed.Delete(l)
	m.podMemoryLimit.Delete(l)
}

// clearNode drops every series of a node the agent no longer serves.
func (m *Metrics) clearNode(node string) {
	l := prometheus.Labels{"node": node}
	for _, v := range []*prometheus.GaugeVec{m.memoryTotal, m.memoryUsed, m.utilization, m.allocatedMilli, m.healthy, m.unattributed, m.capacityMilli, m.podMemoryUsed, m.podMemoryLimit} {
		v.DeletePartialMatch(l)
	}
	for _, v := range []*prometheus.CounterVec{m.overuse, m.killErrors, m.mpsRestarts, m.mpsDrift} {
		v.DeletePartialMatch(l)
	}
}

func deviceLabel(index int32) string { return strconv.Itoa(int(index)) }
