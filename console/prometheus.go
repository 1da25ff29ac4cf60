package console

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// The PromQL the console asks. The extender exports the ledger on every
// replica, so nodes are de-duplicated with max before summing; the queue
// gauges come from the leader alone.
const (
	queryAllocated = `sum(max by (node) (partita_gpu_node_allocated_milli)) / 1000`
	queryCapacity  = `sum(max by (node) (partita_gpu_node_capacity_milli)) / 1000`
	queryQueues    = `max by (queue) (partita_queue_allocated_gpus)`
	queryDenials   = `sum by (reason) (increase(partita_webhook_denials_total[24h]))`
)

// Prometheus reads utilisation and denials from a Prometheus server that
// scrapes Partita's components.
type Prometheus struct {
	api promv1.API
	url string
}

// NewPrometheus returns a reader for the Prometheus API at url.
func NewPrometheus(url string) (*Prometheus, error) {
	c, err := promapi.NewClient(promapi.Config{Address: url})
	if err != nil {
		return nil, fmt.Errorf("prometheus at %s: %w", url, err)
	}
	return &Prometheus{api: promv1.NewAPI(c), url: url}, nil
}

// Utilization asks for the allocated share and the queues' GPUs from
// start to end, every step.
func (p *Prometheus) Utilization(ctx context.Context, start, end time.Time, step time.Duration, keep func(string) bool) (Utilization, error) {
	r := promv1.Range{Start: start.Truncate(step), End: end, Step: step}
	u := Utilization{Source: "prometheus", StepSeconds: step.Seconds(), From: start.Unix(), To: end.Unix(), Times: []int64{}, Queues: []QueueSeries{},
		Note: "from Prometheus at " + p.url + ": the extender's ledger (partita_gpu_node_*) and the admission loop's partita_queue_allocated_gpus"}
	for t := r.Start; !t.After(r.End); t = t.Add(step) {
		u.Times = append(u.Times, t.Unix())
	}
	at := func(m model.Matrix) map[string][]*float64 {
		out := map[string][]*float64{}
		for _, ss := range m {
			vals := make([]*float64, len(u.Times))
			for _, pt := range ss.Values {
				i := slices.Index(u.Times, pt.Timestamp.Unix())
				if i >= 0 && !math.IsNaN(float64(pt.Value)) {
					vals[i] = new(float64(pt.Value))
				}
			}
			out[string(ss.Metric["queue"])] = vals
		}
		return out
	}
	query := func(q string) (model.Matrix, error) {
		v, _, _, err := p.api.QueryRange(ctx, q, r)
		if err != nil {
			return nil, fmt.Errorf("prometheus at %s: %s: %w", p.url, q, err)
		}
		m, ok := v.(model.Matrix)
		if !ok {
			return nil, fmt.Errorf("prometheus at %s: %s: got %s, want a matrix", p.url, q, v.Type())
		}
		return m, nil
	}
	alloc, err := query(queryAllocated)
	if err != nil {
		return Utilization{}, err
	}
	capacity, err := query(queryCapacity)
	if err != nil {
		return Utilization{}, err
	}
	queues, err := query(queryQueues)
	if err != nil {
		return Utilization{}, err
	}
	empty := make([]*float64, len(u.Times))
	u.AllocatedGPUs, u.CapacityGPUs = orEmpty(at(alloc)[""], empty), orEmpty(at(capacity)[""], empty)
	u.Share = make([]*float64, len(u.Times))
	for i := range u.Times {
		if a, c := u.AllocatedGPUs[i], u.CapacityGPUs[i]; a != nil && c != nil && *c > 0 {
			u.Share[i] = new(*a / *c)
		}
	}
	byQueue := at(queues)
	names := make([]string, 0, len(byQueue))
	for q := range byQueue {
		if q != "" && keep(q) {
			names = append(names, q)
		}
	}
	slices.Sort(names)
	for _, q := range names {
		u.Queues = append(u.Queues, QueueSeries{Queue: q, GPUs: byQueue[q]})
	}
	return u, nil
}

func orEmpty(v, empty []*float64) []*float64 {
	if v == nil {
		return empty
	}
	return v
}

// Denials asks for the webhook's refusals by reason over the last day.
func (p *Prometheus) Denials(ctx context.Context, now time.Time) ([]DenialCount, error) {
	v, _, _, err := p.api.Query(ctx, queryDenials, now)
	if err != nil {
		return nil, fmt.Errorf("prometheus at %s: %s: %w", p.url, queryDenials, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("prometheus at %s: %s: got %s, want a vector", p.url, queryDenials, v.Type())
	}
	out := []DenialCount{}
	for _, s := range vec {
		out = append(out, DenialCount{Reason: string(s.Metric["reason"]), Count: math.Round(float64(s.Value))})
	}
	slices.SortFunc(out, func(a, b DenialCount) int { return compareNsName("", a.Reason, "", b.Reason) })
	return out, nil
}
