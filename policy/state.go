package policy

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// State is the cluster state the policy reads at data.partita.state:
// aggregated per queue and per namespace, never whole objects (DESIGN §10:
// policies that read whole objects run out of memory).
type State struct {
	// Queues are the queues by name.
	Queues map[string]QueueState `json:"queues"`
	// Namespaces are the namespaces by name.
	Namespaces map[string]NamespaceState `json:"namespaces"`
}

// QueueState is one queue as the policy sees it.
type QueueState struct {
	// Parent is the parent queue, empty for a top-level queue.
	Parent string `json:"parent"`
	// Children are the queues whose parent this is, sorted; a queue with
	// children is not a leaf and takes no work.
	Children []string `json:"children"`
	// Ancestors are the parent, its parent and so on up to the root. A
	// parent that does not exist ends the chain.
	Ancestors []string `json:"ancestors"`
	// Namespaces are spec.namespaces.
	Namespaces []string `json:"namespaces"`
	// NamespaceSelector is true when the queue has spec.namespaceSelector;
	// the namespaces it matches list the queue in NamespaceState.Queues.
	NamespaceSelector bool `json:"namespaceSelector"`
	// Priority is spec.priority (default 100).
	Priority int32 `json:"priority"`
	// GPU is the queue's GPU quota, limit and usage.
	GPU ResourceState `json:"gpu"`
	// PendingWorkloads is status.pendingWorkloads.
	PendingWorkloads int32 `json:"pendingWorkloads"`
}

// ResourceState is a queue's quota, limit and usage of one resource, in
// milli-units (1000 = one GPU).
type ResourceState struct {
	// QuotaMilli is spec quota; -1 means the whole capacity.
	QuotaMilli int64 `json:"quotaMilli"`
	// LimitMilli is spec limit; -1 means none.
	LimitMilli int64 `json:"limitMilli"`
	// AllocatedMilli is status.allocated.
	AllocatedMilli int64 `json:"allocatedMilli"`
	// RequestedMilli is status.requested (allocated plus pending).
	RequestedMilli int64 `json:"requestedMilli"`
	// EffectiveLimitMilli is the tightest limit of the queue and its
	// ancestors: more can never be admitted to it. -1 means none.
	EffectiveLimitMilli int64 `json:"effectiveLimitMilli"`
}

// NamespaceState is one namespace as the policy sees it.
type NamespaceState struct {
	// Labels are the namespace's labels.
	Labels map[string]string `json:"labels"`
	// Queues are the queues whose spec.namespaceSelector matches the
	// namespace, sorted.
	Queues []string `json:"queues"`
}

// NamespaceInfo is what BuildState needs of a namespace.
type NamespaceInfo struct {
	// Name is the namespace's name.
	Name string
	// Labels are its labels.
	Labels map[string]string
}

// BuildState aggregates queues and namespaces into the policy's state. A
// queue whose namespace selector does not parse selects nothing; its name
// is returned in the error, which the caller logs.
func BuildState(queues []v1alpha1.Queue, namespaces []NamespaceInfo) (State, error) {
	st := State{
		Queues:     make(map[string]QueueState, len(queues)),
		Namespaces: make(map[string]NamespaceState, len(namespaces)),
	}
	parents := make(map[string]string, len(queues))
	for i := range queues {
		parents[queues[i].Name] = queues[i].Spec.Parent
	}
	children := map[string][]string{}
	for i := range queues {
		if p := queues[i].Spec.Parent; p != "" {
			children[p] = append(children[p], queues[i].Name)
		}
	}
	type selector struct {
		queue string
		sel   labels.Selector
	}
	var selectors []selector
	var bad []string
	for i := range queues {
		q := &queues[i]
		qs := QueueState{
			Parent:            q.Spec.Parent,
			Children:          sortedOrEmpty(children[q.Name]),
			Ancestors:         ancestors(q.Name, parents),
			Namespaces:        slices.Clone(q.Spec.Namespaces),
			NamespaceSelector: q.Spec.NamespaceSelector != nil,
			Priority:          v1alpha1.DefaultQueuePriority,
			GPU:               gpuState(q),
			PendingWorkloads:  q.Status.PendingWorkloads,
		}
		if qs.Namespaces == nil {
			qs.Namespaces = []string{}
		}
		if q.Spec.Priority != nil {
			qs.Priority = *q.Spec.Priority
		}
		st.Queues[q.Name] = qs
		if q.Spec.NamespaceSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(q.Spec.NamespaceSelector)
			if err != nil {
				bad = append(bad, q.Name)
				continue
			}
			selectors = append(selectors, selector{queue: q.Name, sel: sel})
		}
	}
	for name, qs := range st.Queues {
		eff := qs.GPU.LimitMilli
		for _, a := range qs.Ancestors {
			if l := st.Queues[a].GPU.LimitMilli; l >= 0 && (eff < 0 || l < eff) {
				eff = l
			}
		}
		qs.GPU.EffectiveLimitMilli = eff
		st.Queues[name] = qs
	}
	for _, ns := range namespaces {
		nsState := NamespaceState{Labels: ns.Labels, Queues: []string{}}
		if nsState.Labels == nil {
			nsState.Labels = map[string]string{}
		}
		set := labels.Set(ns.Labels)
		for _, s := range selectors {
			if s.sel.Matches(set) {
				nsState.Queues = append(nsState.Queues, s.queue)
			}
		}
		slices.Sort(nsState.Queues)
		st.Namespaces[ns.Name] = nsState
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return st, fmt.Errorf("parse namespace selector of queues %v: they select no namespace", bad)
	}
	return st, nil
}

// ancestors walks up from name; a cycle or a missing parent ends the walk.
func ancestors(name string, parents map[string]string) []string {
	out := []string{}
	seen := map[string]bool{name: true}
	for p := parents[name]; p != "" && !seen[p]; p = parents[p] {
		if _, ok := parents[p]; !ok {
			break
		}
		seen[p] = true
		out = append(out, p)
	}
	return out
}

func sortedOrEmpty(s []string) []string {
	if len(s) == 0 {
		return []string{}
	}
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func gpuState(q *v1alpha1.Queue) ResourceState {
	rs := ResourceState{QuotaMilli: 0, LimitMilli: -1}
	if g := q.Spec.Resources.GPU; g != nil {
		if g.Quota != nil {
			rs.QuotaMilli = milliOrMinusOne(*g.Quota)
		}
		if g.Limit != nil {
			rs.LimitMilli = milliOrMinusOne(*g.Limit)
		}
	}
	if v, ok := q.Status.Allocated[v1alpha1.ResourceGPU]; ok {
		rs.AllocatedMilli = v.MilliValue()
	}
	if v, ok := q.Status.Requested[v1alpha1.ResourceGPU]; ok {
		rs.RequestedMilli = v.MilliValue()
	}
	return rs
}

// milliOrMinusOne keeps -1 ("none", "whole capacity") as -1 rather than
// -1000.
func milliOrMinusOne(q resource.Quantity) int64 {
	if q.Sign() < 0 {
		return -1
	}
	return q.MilliValue()
}
