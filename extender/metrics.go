package extender

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/partita-dev/partita/gpu"
)

// Metrics are the extender's Prometheus metrics. A nil *Metrics records
// nothing.
type Metrics struct {
	duration    *prometheus.HistogramVec
	filterNodes *prometheus.CounterVec
	binds       *prometheus.CounterVec
	conflicts   prometheus.Counter
	rollbacks   prometheus.Counter
	pending     prometheus.Gauge
	refused     *prometheus.CounterVec
}

// LeaderMetric is the gauge that is 1 on the replica that leads (binds and
// runs the admission loop), else 0: the dev cluster reads it to tell which
// replica leads.
const LeaderMetric = "partita_extender_leader"

// NewMetrics creates the extender's metrics and registers them on reg, with
// the ledger's allocation gauges (read from ledger at each scrape) and the
// leader gauge when ledger and isLeader are given.
func NewMetrics(reg prometheus.Registerer, ledger *gpu.Ledger, isLeader func() bool) *Metrics {
	m := &Metrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "partita_extender_request_duration_seconds",
			Help:    "Time to answer one kube-scheduler request, by verb (filter, prioritize, bind, preempt); decoding and encoding excluded.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 500e-3, 1, 5},
		}, []string{"verb"}),
		filterNodes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_extender_filter_nodes_total",
			Help: "Candidate nodes judged by filter, by reason: Fits, InsufficientGPU, NeverFits, NoGPUInventory, ReservedElsewhere, InvalidRequest, AgentSilent, DRAManaged.",
		}, []string{"reason"}),
		binds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_extender_binds_total",
			Help: "Bind requests answered, by result: Bound, AlreadyBound, NotLeader, Conflict, Refused, Failed.",
		}, []string{"result"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "partita_extender_bind_conflicts_total",
			Help: "Binds refused because the room filter saw on the node was gone (or the pod's GPUs were reserved elsewhere); kube-scheduler retries them.",
		}),
		rollbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "partita_extender_bind_rollbacks_total",
			Help: "GPU assignments dropped from the ledger because their Binding failed or never showed on the pod.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "partita_extender_pending_binds",
			Help: "GPU assignments recorded by bind that the pod does not show yet.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "partita_extender_unauthenticated_requests_total",
			Help: "Requests to the verbs or /debug/* refused because they did not come with kube-scheduler's client certificate, by reason: Unauthenticated (none, or expired), Forbidden (another name).",
		}, []string{"reason"}),
	}
	for _, r := range []string{ReasonFits, ReasonInsufficientGPU, ReasonNeverFits, ReasonNoGPUInventory, ReasonReservedElsewhere, ReasonInvalidRequest, ReasonAgentSilent, ReasonDRAManaged} {
		m.filterNodes.WithLabelValues(r)
	}
	for _, r := range []string{BindBound, BindAlreadyBound, BindNotLeader, BindConflict, BindRefused, BindFailed} {
		m.binds.WithLabelValues(r)
	}
	for _, r := range []string{refusedUnauthenticated, refusedForbidden} {
		m.refused.WithLabelValues(r)
	}
	reg.MustRegister(m.duration, m.filterNodes, m.binds, m.conflicts, m.rollbacks, m.pending, m.refused)
	if ledger != nil {
		reg.MustRegister(&ledgerCollector{ledger: ledger})
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "partita_extender_silent_agent_nodes",
			Help: "GPU nodes whose agent has stopped reporting (no new heartbeat within --agent-heartbeat-timeout): they take no new GPU pods.",
		}, func() float64 { return float64(len(ledger.SilentAgents())) }))
	}
	if isLeader != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: LeaderMetric,
			Help: "1 on the replica that is the elected leader (the one that binds), else 0.",
		}, func() float64 {
			if isLeader() {
				return 1
			}
			return 0
		}))
	}
	return m
}

func (m *Metrics) observeVerb(verb string, d time.Duration) {
	if m == nil {
		return
	}
	m.duration.WithLabelValues(verb).Observe(d.Seconds())
}

func (m *Metrics) observeFilter(counts map[string]int) {
	if m == nil {
		return
	}
	for reason, n := range counts {
		m.filterNodes.WithLabelValues(reason).Add(float64(n))
	}
}

func (m *Metrics) observeBind(result string) {
	if m == nil {
		return
	}
	m.binds.WithLabelValues(result).Inc()
}

func (m *Metrics) conflict() {
	if m == nil {
		return
	}
	m.conflicts.Inc()
}

func (m *Metrics) rollback() {
	if m == nil {
		return
	}
	m.rollbacks.Inc()
}

// Reasons of partita_extender_unauthenticated_requests_total.
const (
	refusedUnauthenticated = "Unauthenticated"
	refusedForbidden       = "Forbidden"
)

// refusedRequest counts a request refused with status (401 or 403).
func (m *Metrics) refusedRequest(status int) {
	if m == nil {
		return
	}
	reason := refusedUnauthenticated
	if status == http.StatusForbidden {
		reason = refusedForbidden
	}
	m.refused.WithLabelValues(reason).Inc()
}

func (m *Metrics) setPending(n int) {
	if m == nil {
		return
	}
	m.pending.Set(float64(n))
}

// ledgerCollector reports the ledger's allocations at each scrape, so no
// series goes stale when a node leaves.
type ledgerCollector struct {
	ledger *gpu.Ledger
}

var (
	descDeviceAllocated = prometheus.NewDesc("partita_gpu_allocated_milli",
		"Milli-GPUs allocated on a device (1000 = whole), from the extender's ledger.", []string{"node", "device"}, nil)
	descNodeAllocated = prometheus.NewDesc("partita_gpu_node_allocated_milli",
		"Milli-GPUs allocated on a node's devices, from the extender's ledger.", []string{"node"}, nil)
	descNodeCapacity = prometheus.NewDesc("partita_gpu_node_capacity_milli",
		"Milli-GPUs of a node's healthy devices (1000 each), from the extender's ledger.", []string{"node"}, nil)
	descLedgerPods = prometheus.NewDesc("partita_extender_ledger_pods",
		"Pods that hold GPUs in the extender's ledger, by whether the pod shows them yet (assumed true or false).", []string{"assumed"}, nil)
)

// Describe implements prometheus.Collector.
func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDeviceAllocated
	ch <- descNodeAllocated
	ch <- descNodeCapacity
	ch <- descLedgerPods
}

// Collect implements prometheus.Collector.
func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.ledger.State()
	for _, n := range st.Nodes {
		var alloc, capacity int64
		for _, d := range n.Devices {
			alloc += d.AllocatedMilli
			if d.Healthy {
				capacity += gpu.MilliPerGPU
			}
			ch <- prometheus.MustNewConstMetric(descDeviceAllocated, prometheus.GaugeValue, float64(d.AllocatedMilli), n.Name, strconv.Itoa(int(d.Index)))
		}
		ch <- prometheus.MustNewConstMetric(descNodeAllocated, prometheus.GaugeValue, float64(alloc), n.Name)
		ch <- prometheus.MustNewConstMetric(descNodeCapacity, prometheus.GaugeValue, float64(capacity), n.Name)
	}
	var assumed, seen int
	for _, p := range st.Pods {
		if p.Assumed {
			assumed++
		} else {
			seen++
		}
	}
	ch <- prometheus.MustNewConstMetric(descLedgerPods, prometheus.GaugeValue, float64(assumed), "true")
	ch <- prometheus.MustNewConstMetric(descLedgerPods, prometheus.GaugeValue, float64(seen), "false")
}
