package admission

import (
	"cmp"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Member is one pod of a workload.
type Member struct {
	// Pod is the pod as the informer has it; never modified.
	Pod *corev1.Pod
	// Request is its GPU request.
	Request *gpu.PodRequest
	// GPUMilli is its partita.dev/gpu-milli request.
	GPUMilli int64
	// CPUMilli and Memory are its CPU and memory requests.
	CPUMilli, Memory int64
	// Admitted is when the loop admitted it; zero for a waiting pod.
	Admitted time.Time
	// Bound reports whether it has a node.
	Bound bool
}

// Workload is a gang or a single pod, as one cycle sees it.
type Workload struct {
	Key WorkloadKey
	// Queue is the leaf queue: the PodGroup's, else the members'.
	Queue string
	// Priority is the highest priority among the members.
	Priority int32
	// Created is the PodGroup's creation time, else its oldest member's.
	Created time.Time
	// MinMember is how many members must be placeable before any starts: 1
	// for a single pod. 0 means the gang's size is unknown (no PodGroup and
	// no partita.dev/min-member).
	MinMember int32
	// HasPodGroup reports whether a PodGroup object describes the gang.
	HasPodGroup bool
	// PodGroupStatus is the PodGroup's status as last written.
	PodGroupStatus v1alpha1.PodGroupStatus
	// TopologyKey is the PodGroup's preferred topology domain label.
	TopologyKey string
	// TimeoutSeconds is the PodGroup's scheduleTimeoutSeconds, 0 for the
	// loop's default.
	TimeoutSeconds int32
	// Pending are the members that wait behind the gate, oldest first.
	Pending []*Member
	// Active are the members admitted or bound and not done.
	Active []*Member
}

// ActiveMilli is what the active members hold, in milli-GPUs.
func (w *Workload) ActiveMilli() int64 {
	var sum int64
	for _, m := range w.Active {
		sum += m.GPUMilli
	}
	return sum
}

// Started is when the workload's current admission began: the earliest
// admission time among the active members (their creation time when the
// loop never admitted them).
func (w *Workload) Started() time.Time {
	var t time.Time
	for _, m := range w.Active {
		at := m.Admitted
		if at.IsZero() {
			at = m.Pod.CreationTimestamp.Time
		}
		if t.IsZero() || at.Before(t) {
			t = at
		}
	}
	return t
}

// Queue is one queue as a cycle sees it, in GPU milli-units.
type Queue struct {
	Name   string
	Parent string
	// Priority is spec.priority (default 100).
	Priority int32
	// Created orders queues created at the same time by name.
	Created time.Time
	// QuotaMilli, LimitMilli: -1 as in the spec.
	QuotaMilli, LimitMilli int64
	// Weight is the over-quota weight.
	Weight int32
	// Children are the names of the child queues, sorted.
	Children []string
	// Status is the queue's status as last written.
	Status v1alpha1.QueueStatus
}

// Node is a node and what its pods request.
type Node struct {
	Node *corev1.Node
	// CPUMilli and Memory are the requests of the pods bound to it.
	CPUMilli, Memory int64
}

// State is what one cycle works on: a copy taken under the cache's lock.
type State struct {
	// Queues by name.
	Queues map[string]*Queue
	// Workloads with a pending or an active member, in no order.
	Workloads []*Workload
	// Nodes by name.
	Nodes map[string]*Node
	// Generation is the cache's generation the state was taken at.
	Generation uint64
}

// State copies what a cycle needs.
func (c *Cache) State() *State {
	c.lock.Lock()
	defer c.lock.Unlock()
	st := &State{
		Queues:     make(map[string]*Queue, len(c.queues)),
		Workloads:  make([]*Workload, 0, len(c.workloads)),
		Nodes:      make(map[string]*Node, len(c.nodes)),
		Generation: c.generation,
	}
	for name, q := range c.queues {
		st.Queues[name] = queueFromSpec(name, q)
	}
	for name, q := range st.Queues {
		if p := st.Queues[q.Parent]; p != nil {
			p.Children = append(p.Children, name)
		}
	}
	for _, q := range st.Queues {
		slices.Sort(q.Children)
	}
	for name, n := range c.nodes {
		if n.node != nil {
			st.Nodes[name] = &Node{Node: n.node, CPUMilli: n.cpuMilli, Memory: n.memory}
		}
	}
	for key, pods := range c.workloads {
		w := c.workload(key, pods)
		if w != nil {
			st.Workloads = append(st.Workloads, w)
		}
	}
	return st
}

// workload builds one workload from its pods; nil when it has neither
// pending nor active members.
func (c *Cache) workload(key WorkloadKey, pods map[types.UID]*podInfo) *Workload {
	w := &Workload{Key: key, MinMember: 1}
	var annMin int32
	for _, p := range pods {
		switch {
		case p.done:
			continue
		case p.gated:
			if p.terminating {
				continue
			}
			w.Pending = append(w.Pending, member(p))
		default:
			w.Active = append(w.Active, member(p))
		}
		if w.Queue == "" {
			w.Queue = p.queue
		}
		if len(w.Pending)+len(w.Active) == 1 || p.priority > w.Priority {
			w.Priority = p.priority
		}
		if t := p.pod.CreationTimestamp.Time; w.Created.IsZero() || t.Before(w.Created) {
			w.Created = t
		}
		annMin = max(annMin, p.minMember)
	}
	if len(w.Pending) == 0 && len(w.Active) == 0 {
		return nil
	}
	if key.IsGang() {
		w.MinMember = annMin
		if pg := c.podGroups[types.NamespacedName{Namespace: key.Namespace, Name: key.PodGroup}]; pg != nil {
			w.HasPodGroup = true
			w.PodGroupStatus = pg.status
			w.MinMember = pg.minMember
			w.TopologyKey = pg.topologyKey
			w.TimeoutSeconds = pg.timeout
			if pg.queue != "" {
				w.Queue = pg.queue
			}
			if !pg.created.IsZero() {
				w.Created = pg.created
			}
		}
	}
	byAge := func(a, b *Member) int {
		return cmp.Or(a.Pod.CreationTimestamp.Time.Compare(b.Pod.CreationTimestamp.Time), cmp.Compare(a.Pod.Name, b.Pod.Name))
	}
	slices.SortFunc(w.Pending, byAge)
	slices.SortFunc(w.Active, byAge)
	return w
}

func member(p *podInfo) *Member {
	return &Member{Pod: p.pod, Request: p.req, GPUMilli: p.gpuMilli, CPUMilli: p.cpuMilli, Memory: p.memory, Admitted: p.admitted, Bound: p.node != ""}
}

func queueFromSpec(name string, q *queueInfo) *Queue {
	out := &Queue{
		Name: name, Parent: q.spec.Parent, Priority: v1alpha1.DefaultQueuePriority, Created: q.created,
		QuotaMilli: 0, LimitMilli: -1, Weight: 1, Status: q.status,
	}
	if q.spec.Priority != nil {
		out.Priority = *q.spec.Priority
	}
	if g := q.spec.Resources.GPU; g != nil {
		if g.Quota != nil {
			out.QuotaMilli = milliOrUnlimited(g.Quota.MilliValue())
		}
		if g.Limit != nil {
			out.LimitMilli = milliOrUnlimited(g.Limit.MilliValue())
		}
		if g.OverQuotaWeight != nil {
			out.Weight = *g.OverQuotaWeight
		}
	}
	return out
}

// milliOrUnlimited maps -1 (as milli, -1000) to -1.
func milliOrUnlimited(m int64) int64 {
	if m < 0 {
		return -1
	}
	return m
}
