package report

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Unlimited is a quota or limit of -1: the whole capacity for a quota, no
// cap for a limit (DESIGN §5).
const Unlimited int64 = -1

// QueuesReport is the queue tree of `ctl queues`, GPU amounts in
// milli-GPUs.
type QueuesReport struct {
	// Queues are in tree order: each parent above its children, siblings
	// by name.
	Queues []QueueReport `json:"queues"`
}

// QueueReport is one queue's GPU settings, its status as the admission
// loop wrote it, and its pods.
type QueueReport struct {
	// Name is the queue's name.
	Name string `json:"name"`
	// Parent is the parent queue, "" for a top-level queue.
	Parent string `json:"parent,omitempty"`
	// Depth is 0 for a top-level queue.
	Depth int `json:"depth"`
	// Leaf is set for a queue without children: only leaves take work.
	Leaf bool `json:"leaf"`
	// Note says what is wrong with the queue's place in the tree, if
	// anything: a parent that does not exist, or a loop of parents.
	Note string `json:"note,omitempty"`
	// Priority is the queue's priority.
	Priority int32 `json:"priority"`
	// QuotaMilli is the deserved GPUs, Unlimited for the whole capacity.
	QuotaMilli int64 `json:"quotaMilli"`
	// LimitMilli is the hard cap, Unlimited for none.
	LimitMilli int64 `json:"limitMilli"`
	// OverQuotaWeight weighs the queue's share of what is left over quota.
	OverQuotaWeight int32 `json:"overQuotaWeight"`
	// AllocatedMilli is status.allocated's GPUs, nil when not reported.
	AllocatedMilli *int64 `json:"allocatedMilli"`
	// FairShareMilli is status.fairShare's GPUs, nil when not reported.
	FairShareMilli *int64 `json:"fairShareMilli"`
	// RequestedMilli is status.requested's GPUs, nil when not reported.
	RequestedMilli *int64 `json:"requestedMilli"`
	// UsageGPUHours is status.usage.hours' GPUs: what the queue (a parent
	// with its children) used over the usage window, in GPU-hours decayed
	// by the half-life. The usage fields are nil, and left out of JSON,
	// unless the admission loop weighs usage in fair share
	// (--fair-share-usage-weight) and has reported it.
	UsageGPUHours *float64 `json:"usageGPUHours,omitempty"`
	// UsageShare is status.usage.share's GPUs: that usage over what the
	// cluster's GPUs would have given in the same window (0 to 1).
	UsageShare *float64 `json:"usageShare,omitempty"`
	// FairShareWithoutUsageMilli is the GPU fair share the queue would
	// have if usage did not count. Where it differs from FairShareMilli,
	// history decided (HistoryDecided).
	FairShareWithoutUsageMilli *int64 `json:"fairShareWithoutUsageMilli,omitempty"`
	// UsageWindow says what the usage covers, as the admission loop logs
	// it: "sliding 168h window, half-life 24h".
	UsageWindow string `json:"usageWindow,omitempty"`
	// PendingWorkloads is status.pendingWorkloads.
	PendingWorkloads int32 `json:"pendingWorkloads"`
	// Running counts the queue's pods bound to a node (a parent's sums its
	// children's), Succeeded and Failed pods aside.
	Running int `json:"running"`
	// Admitted counts the queue's pods out of the admission gate and not
	// bound yet: kube-scheduler has them.
	Admitted int `json:"admitted"`
	// Gated counts the queue's pods still held by the admission gate.
	Gated int `json:"gated"`
	// CPU is the queue's CPU in milli-CPUs, Memory its memory in bytes:
	// settings from the spec, what its pods request from the status.
	CPU    ResourceReport `json:"cpu"`
	Memory ResourceReport `json:"memory"`
}

// ResourceReport is a queue's settings and usage of CPU or memory. Set is
// true when the spec configures the resource; the amounts in the status
// are nil until the admission loop reports them.
type ResourceReport struct {
	Set       bool   `json:"set"`
	Quota     int64  `json:"quota"`
	Limit     int64  `json:"limit"`
	Weight    int32  `json:"overQuotaWeight"`
	Allocated *int64 `json:"allocated"`
	FairShare *int64 `json:"fairShare"`
	Requested *int64 `json:"requested"`
}

// Queues builds the queue tree from c's Queues and the pods labelled with
// partita.dev/queue.
func Queues(c *Cluster) QueuesReport {
	byName := map[string]*v1alpha1.Queue{}
	children := map[string][]string{}
	for i := range c.Queues {
		q := &c.Queues[i]
		byName[q.Name] = q
	}
	var roots []string
	orphan := map[string]bool{}
	for name, q := range byName {
		switch {
		case q.Spec.Parent == "":
			roots = append(roots, name)
		case byName[q.Spec.Parent] == nil:
			roots = append(roots, name)
			orphan[name] = true
		default:
			children[q.Spec.Parent] = append(children[q.Spec.Parent], name)
		}
	}
	sort.Strings(roots)
	for _, cs := range children {
		sort.Strings(cs)
	}

	type podCounts struct{ running, admitted, gated int }
	counts := map[string]*podCounts{}
	for i := range c.Pods {
		p := &c.Pods[i]
		q := p.Labels[v1alpha1.LabelQueue]
		if q == "" || finished(p) {
			continue
		}
		if counts[q] == nil {
			counts[q] = &podCounts{}
		}
		switch {
		case p.Spec.NodeName != "":
			counts[q].running++
		case hasGate(p, v1alpha1.SchedulingGateAdmission):
			counts[q].gated++
		default:
			counts[q].admitted++
		}
	}

	var out QueuesReport
	seen := map[string]bool{}
	// walk returns the pods of the queue and its descendants, so parents
	// show their subtree's.
	var walk func(name string, depth int) podCounts
	walk = func(name string, depth int) podCounts {
		seen[name] = true
		q := byName[name]
		i := len(out.Queues)
		out.Queues = append(out.Queues, queueReport(q, depth, len(children[name]) == 0))
		if orphan[name] {
			out.Queues[i].Note = fmt.Sprintf("parent %q does not exist", q.Spec.Parent)
		}
		var sum podCounts
		if pc := counts[name]; pc != nil {
			sum = *pc
		}
		for _, ch := range children[name] {
			s := walk(ch, depth+1)
			sum.running += s.running
			sum.admitted += s.admitted
			sum.gated += s.gated
		}
		out.Queues[i].Running, out.Queues[i].Admitted, out.Queues[i].Gated = sum.running, sum.admitted, sum.gated
		return sum
	}
	for _, r := range roots {
		walk(r, 0)
	}
	// Queues in a loop of parents are reached from no root; the admission
	// loop cannot use them, and the user must see them to fix them.
	var loop []string
	for name := range byName {
		if !seen[name] {
			loop = append(loop, name)
		}
	}
	sort.Strings(loop)
	for _, name := range loop {
		qr := queueReport(byName[name], 0, false)
		qr.Note = "in a loop of parents"
		if pc := counts[name]; pc != nil {
			qr.Running, qr.Admitted, qr.Gated = pc.running, pc.admitted, pc.gated
		}
		out.Queues = append(out.Queues, qr)
	}
	if out.Queues == nil {
		out.Queues = []QueueReport{}
	}
	return out
}

func queueReport(q *v1alpha1.Queue, depth int, leaf bool) QueueReport {
	r := QueueReport{
		Name: q.Name, Parent: q.Spec.Parent, Depth: depth, Leaf: leaf,
		Priority: v1alpha1.DefaultQueuePriority, LimitMilli: Unlimited, OverQuotaWeight: 1,
		PendingWorkloads: q.Status.PendingWorkloads,
	}
	if q.Spec.Priority != nil {
		r.Priority = *q.Spec.Priority
	}
	// The defaults are fairshare's: quota 0, limit -1, weight 1.
	if g := q.Spec.Resources.GPU; g != nil {
		if g.Quota != nil {
			r.QuotaMilli = amountMilli(*g.Quota)
		}
		if g.Limit != nil {
			r.LimitMilli = amountMilli(*g.Limit)
		}
		if g.OverQuotaWeight != nil {
			r.OverQuotaWeight = *g.OverQuotaWeight
		}
	}
	r.AllocatedMilli = statusMilli(q.Status.Allocated)
	r.FairShareMilli = statusMilli(q.Status.FairShare)
	r.RequestedMilli = statusMilli(q.Status.Requested)
	if u := q.Status.Usage; u != nil {
		r.UsageGPUHours = statusFloat(u.Hours)
		r.UsageShare = statusFloat(u.Share)
		r.FairShareWithoutUsageMilli = statusMilli(u.FairShareWithoutUsage)
		r.UsageWindow = v1alpha1.DescribeUsageWindow(u.WindowType, u.Window.Duration, u.HalfLife.Duration)
	}
	r.CPU = resourceReport(q, q.Spec.Resources.CPU, v1alpha1.ResourceCPU, func(v resource.Quantity) int64 { return v.MilliValue() })
	r.Memory = resourceReport(q, q.Spec.Resources.Memory, v1alpha1.ResourceMemory, func(v resource.Quantity) int64 { return v.Value() })
	return r
}

// resourceReport reads a queue's CPU or memory in unit (milli or bytes).
func resourceReport(q *v1alpha1.Queue, spec *v1alpha1.ResourceQuota, name corev1.ResourceName, unit func(resource.Quantity) int64) ResourceReport {
	r := ResourceReport{Limit: Unlimited, Weight: 1}
	amount := func(v resource.Quantity) int64 {
		if v.CmpInt64(-1) == 0 {
			return Unlimited
		}
		return unit(v)
	}
	if spec != nil {
		r.Set = true
		if spec.Quota != nil {
			r.Quota = amount(*spec.Quota)
		}
		if spec.Limit != nil {
			r.Limit = amount(*spec.Limit)
		}
		if spec.OverQuotaWeight != nil {
			r.Weight = *spec.OverQuotaWeight
		}
	}
	status := func(l corev1.ResourceList) *int64 {
		v, ok := l[name]
		if !ok {
			return nil
		}
		n := unit(v)
		return &n
	}
	r.Allocated, r.FairShare, r.Requested = status(q.Status.Allocated), status(q.Status.FairShare), status(q.Status.Requested)
	return r
}

// amountMilli is a quota or limit in milli-GPUs, keeping -1 as Unlimited.
func amountMilli(q resource.Quantity) int64 {
	if q.CmpInt64(-1) == 0 {
		return Unlimited
	}
	return quantityMilli(q)
}

func statusMilli(l corev1.ResourceList) *int64 {
	q, ok := l[v1alpha1.ResourceGPU]
	if !ok {
		return nil
	}
	m := quantityMilli(q)
	return &m
}

// statusFloat is l's GPU entry as a number, nil when l has none.
func statusFloat(l corev1.ResourceList) *float64 {
	q, ok := l[v1alpha1.ResourceGPU]
	if !ok {
		return nil
	}
	f := QuantityFloat(q)
	return &f
}

// HistoryDecided reports whether the queue's past usage changed its GPU
// fair share: both are reported and they differ.
func (r QueueReport) HistoryDecided() bool {
	return r.FairShareMilli != nil && r.FairShareWithoutUsageMilli != nil && *r.FairShareMilli != *r.FairShareWithoutUsageMilli
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

func hasGate(p *corev1.Pod, name string) bool {
	for _, g := range p.Spec.SchedulingGates {
		if g.Name == name {
			return true
		}
	}
	return false
}
