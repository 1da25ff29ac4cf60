package cycle

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
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
	// Elastic: the workload map lets the member run beyond its gang's
	// minimum, admitted as room allows and evicted first.
	Elastic bool
	// Claims is set for a member that asks for its GPUs through
	// ResourceClaims only (WithClaims): GPUMilli is what they ask or hold.
	// kube-scheduler's DRA plugin allocates its devices, so the loop does
	// not place it on the ledger; it charges it to its queue.
	Claims *dra.Demand
	// SubGroup is the part of its gang the member belongs to (its
	// partita.dev/sub-group label, or the workload map's answer); "" for
	// none.
	SubGroup string

	// sig and shape memoise constraintSig and requestShape: a member is
	// immutable, and only the loop's goroutine reads it.
	sig, shape string
	// memory: the request asks for GPU memory, so what the member holds
	// depends on its devices (memoryRequest, read once).
	memory bool
	// node is where the ledger holds the member's devices: its node, or
	// the node of its reservation (partita.dev/node) while unbound; uid is
	// the pod's. Kept here so that charging members never reads their pods.
	node string
	uid  types.UID
}

// Workload is a gang or a single pod, as one cycle sees it.
type Workload struct {
	Key WorkloadKey
	// Queue is the leaf queue: the one its members' labels name (fixed at
	// creation, checked by the webhook), else the PodGroup's, else the
	// cache's default queue.
	Queue string
	// QueueConflict says, when set, why the workload cannot be admitted:
	// its members name different queues, or a queue other than their
	// PodGroup's. The members stay charged to Queue.
	QueueConflict string
	// Priority is the lowest priority among the members, and never more
	// than the PodGroup's PriorityClass: a PodGroup can lower its members'
	// priority, never raise it.
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
	// Topology is what the workload asks of the network topology: its
	// PodGroup's annotations, else the workload map's answer, else its
	// members' annotations (docs/guide/topology.md).
	Topology v1alpha1.TopologyRequest
	// SubGroups are the gang's parts: its PodGroup's spec.subGroups, or
	// the workload map's.
	SubGroups []v1alpha1.SubGroup
	// TimeoutSeconds is the PodGroup's scheduleTimeoutSeconds, 0 for the
	// loop's default.
	TimeoutSeconds int32
	// Pending are the members that wait behind the gate, oldest first.
	Pending []*Member
	// Active are the members admitted or bound and not done.
	Active []*Member
	// Succeeded counts the members that ran to completion: they count as
	// started for a gang, and hold nothing.
	Succeeded int32
	// Kind and OwnerName name a gang of the workload map for people
	// ("JobSet", "llama-ft"); Owner is its top owner. Empty otherwise.
	Kind, OwnerName string
	Owner           Owner
	// RuleQueue and PriorityClassName are what the workload map's rule
	// names for a mapped gang, empty when nothing.
	RuleQueue, PriorityClassName string
	// RuleTopology and RuleSubGroups are what the workload map's rule says
	// of a mapped gang's topology and parts: the PodGroup the loop keeps
	// for it shows them (its partita.dev/topology* annotations and
	// spec.subGroups).
	RuleTopology  v1alpha1.TopologyRequest
	RuleSubGroups []v1alpha1.SubGroup
	// Unready says why the workload cannot be admitted yet: the workload
	// map cannot group it, or the PodGroup that must carry the queue its
	// rule names does not exist yet.
	Unready string
	// Elastic: some member may run beyond the minimum.
	Elastic bool
	// PodGroup says, for a gang of the workload map, how the PodGroup the
	// loop keeps for it stands.
	PodGroup MappedPodGroup

	activeMilli, pendingMilli int64
	// activeCPU and pendingCPU (milli-CPUs), activeMemory and
	// pendingMemory (bytes) are the members' CPU and memory requests.
	activeCPU, pendingCPU       int64
	activeMemory, pendingMemory int64
	started                     time.Time
	terminating                 bool
	// deviceCharged: a member asks for GPU memory, whose share depends on
	// the device it gets, so its charge is read from the ledger.
	deviceCharged bool
	// held memoises what the active members hold when every one of them is
	// bound and shows its devices in the ledger: that changes only with a
	// node's inventory (heldEpoch, gpu.Snapshot.InventoryEpoch) or with the
	// members, which make a new Workload. Only the loop's goroutine touches
	// it.
	held      int64
	heldEpoch uint64
	heldValid bool
	// placeKey and placeGroups memoise the placement question of the
	// pending members, the same every cycle.
	placeKey    string
	placeGroups []constraintGroup
	// priorityClass is the PriorityClass a mapped gang's rule names, for
	// the cache to rebuild the gang when the class changes.
	priorityClass string
}

// MappedPodGroup is how the PodGroup the loop keeps for a gang of the
// workload map stands.
type MappedPodGroup int

// States of a mapped gang's PodGroup.
const (
	// PodGroupMissing: no PodGroup of the gang's name exists.
	PodGroupMissing MappedPodGroup = iota
	// PodGroupInSync: the loop's PodGroup says what the rule says.
	PodGroupInSync
	// PodGroupStale: the loop's PodGroup says something else (the rule
	// changed, or someone edited it): its spec is written again.
	PodGroupStale
	// PodGroupForeign: a PodGroup of that name exists that the loop did not
	// make for this gang; it is left alone.
	PodGroupForeign
)

// Name is how messages name the workload for people: "JobSet
// team-a/llama-ft" for a gang of the workload map, namespace/name else.
func (w *Workload) Name() string {
	if w.Kind != "" {
		return w.Kind + " " + w.Key.Namespace + "/" + w.OwnerName
	}
	return w.Key.String()
}

// Extras are the active elastic members beyond the gang's minimum, the
// most recently admitted first: those that may be evicted one by one
// without breaking the gang.
func (w *Workload) Extras() []*Member {
	if !w.Elastic {
		return nil
	}
	// Members being deleted count neither as extras nor towards the
	// minimum: they are going.
	var out []*Member
	staying := int(w.Succeeded)
	for _, m := range w.Active {
		if m.Pod.DeletionTimestamp != nil {
			continue
		}
		staying++
		if m.Elastic {
			out = append(out, m)
		}
	}
	n := staying - int(w.MinMember)
	if n <= 0 {
		return nil
	}
	slices.SortFunc(out, func(a, b *Member) int {
		return cmp.Or(b.Admitted.Compare(a.Admitted), b.Pod.CreationTimestamp.Compare(a.Pod.CreationTimestamp.Time), cmp.Compare(b.Pod.Name, a.Pod.Name))
	})
	return out[:min(n, len(out))]
}

// ActiveMilli is what the active members hold, in milli-GPUs.
func (w *Workload) ActiveMilli() int64 { return w.activeMilli }

// PendingMilli is what the pending members ask for, in milli-GPUs.
func (w *Workload) PendingMilli() int64 { return w.pendingMilli }

// Started is when the workload's current admission began: the earliest
// admission time among the active members (their creation time when the
// loop never admitted them).
func (w *Workload) Started() time.Time { return w.started }

// Terminating reports whether an active member is being deleted.
func (w *Workload) Terminating() bool { return w.terminating }

// summarise computes what a cycle asks of a workload many times; a
// workload is immutable once built.
func (w *Workload) summarise() {
	for _, m := range w.Pending {
		w.pendingMilli += m.GPUMilli
		w.pendingCPU += m.CPUMilli
		w.pendingMemory += m.Memory
		w.deviceCharged = w.deviceCharged || m.memory
	}
	for _, m := range w.Active {
		w.activeMilli += m.GPUMilli
		w.activeCPU += m.CPUMilli
		w.activeMemory += m.Memory
		w.deviceCharged = w.deviceCharged || m.memory
		at := m.Admitted
		if at.IsZero() {
			at = m.Pod.CreationTimestamp.Time
		}
		if w.started.IsZero() || at.Before(w.started) {
			w.started = at
		}
		if m.Pod.DeletionTimestamp != nil {
			w.terminating = true
		}
	}
}

// memoryRequest reports whether r asks for an amount of GPU memory, whose
// share of a device depends on the device.
func memoryRequest(r *gpu.PodRequest) bool {
	if r == nil {
		return false
	}
	for _, c := range r.Containers {
		if c.MemoryMiB > 0 {
			return true
		}
	}
	return false
}

// Settings are a queue's quota, limit and over-quota weight of one resource
// in its base unit (milli-GPUs, milli-CPUs, bytes); a quota of -1 is the
// whole capacity, a limit of -1 none.
type Settings struct {
	Quota, Limit int64
	Weight       int32
}

// Queue is one queue as a cycle sees it: GPUs in milli-GPUs, CPU in
// milli-CPUs, memory in bytes.
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
	// AllocatedMilli and PendingMilli are what the queue's own workloads
	// hold and wait for (its children's not included).
	AllocatedMilli, PendingMilli int64
	// CPU and Memory are the queue's settings of those resources.
	CPU, Memory Settings
	// AllocatedCPUMilli, PendingCPUMilli, AllocatedMemory and
	// PendingMemory are the CPU and memory its own workloads' pods request,
	// admitted and waiting.
	AllocatedCPUMilli, PendingCPUMilli int64
	AllocatedMemory, PendingMemory     int64
}

// Node is a node and what its pods request.
type Node struct {
	Node *corev1.Node
	// CPUMilli and Memory are the requests of the pods bound or pinned to
	// it, and Pods how many they are.
	CPUMilli, Memory int64
	Pods             int64

	// alloc memoises the node's allocatable pods, milli-CPUs and memory
	// bytes, read once a State (allocRead): room() asks for them for every
	// candidate node of every placement. Only the cycle's goroutine
	// touches them.
	alloc     [3]int64
	allocRead bool
}

// allocatable is the node's allocatable pods, milli-CPUs and memory bytes.
func (n *Node) allocatable() [3]int64 {
	if !n.allocRead {
		a := n.Node.Status.Allocatable
		n.alloc, n.allocRead = [3]int64{a.Pods().Value(), a.Cpu().MilliValue(), a.Memory().Value()}, true
	}
	return n.alloc
}

// State is what one cycle works on: a copy taken under the cache's lock.
// Workloads and the slices of Active are shared with the cache and with
// other States: they are immutable.
type State struct {
	// Queues by name.
	Queues map[string]*Queue
	// Pending are the workloads with a pending member, by queue, in
	// admission order (priority, then age).
	Pending map[string][]*Workload
	// Active are the workloads with an active member, by queue.
	Active map[string][]*Workload
	// Gangs are the gangs with a pending or an active member.
	Gangs []*Workload
	// Terminating are the workloads with an active member being deleted.
	Terminating []*Workload
	// DeviceCharged are the workloads with active members that ask for GPU
	// memory: what they hold is read from the ledger snapshot, as it
	// depends on the devices they got.
	DeviceCharged []*Workload
	// Elastic are the workloads with active elastic members beyond their
	// minimum (Workload.Extras).
	Elastic []*Workload
	// DefaultQueue is the queue of workloads that name none, "" for none.
	DefaultQueue string
	// Nodes by name.
	Nodes map[string]*Node
	// Topologies are the levels (node labels, broadest first) of each
	// Topology, by name.
	Topologies map[string][]string
	// Generation is the cache's generation the state was taken at.
	Generation uint64
	// NodeEpoch changes whenever a node is added or removed, or its labels,
	// taints or schedulability change (Domains).
	NodeEpoch uint64
}

// State copies what a cycle needs. Only workloads whose pods changed since
// the last State are built again; the rest is shared.
func (c *Cache) State() *State {
	c.lock.Lock()
	defer c.lock.Unlock()
	for key := range c.dirty {
		old := c.built[key]
		w := c.workload(key, c.workloads[key])
		c.index(old, -1)
		c.index(w, 1)
		if w != nil {
			c.built[key] = w
		} else {
			delete(c.built, key)
		}
	}
	clear(c.dirty)
	st := &State{
		Queues:       make(map[string]*Queue, len(c.queues)),
		Pending:      make(map[string][]*Workload, len(c.pending)),
		Active:       make(map[string][]*Workload, len(c.active)),
		Gangs:        make([]*Workload, 0, len(c.gangs)),
		Terminating:  make([]*Workload, 0, len(c.terminating)),
		Nodes:        make(map[string]*Node, len(c.nodes)),
		Topologies:   make(map[string][]string, len(c.topologies)),
		Generation:   c.generation,
		NodeEpoch:    c.nodeEpoch,
		DefaultQueue: c.defaultQueue,
	}
	for name, q := range c.queues {
		out := queueFromSpec(name, q)
		if u := c.usage[name]; u != nil {
			out.AllocatedMilli, out.PendingMilli = u[0], u[1]
			out.AllocatedCPUMilli, out.PendingCPUMilli = u[2], u[3]
			out.AllocatedMemory, out.PendingMemory = u[4], u[5]
		}
		st.Queues[name] = out
	}
	for name, q := range st.Queues {
		if p := st.Queues[q.Parent]; p != nil {
			p.Children = append(p.Children, name)
		}
	}
	for _, q := range st.Queues {
		slices.Sort(q.Children)
	}
	for name, levels := range c.topologies {
		st.Topologies[name] = levels
	}
	for name, n := range c.nodes {
		if n.node != nil {
			st.Nodes[name] = &Node{Node: n.node, CPUMilli: n.cpuMilli, Memory: n.memory, Pods: n.pods}
		}
	}
	for q, set := range c.pending {
		if c.pendingSlices[q] == nil {
			ws := make([]*Workload, 0, len(set))
			for _, w := range set {
				ws = append(ws, w)
			}
			slices.SortFunc(ws, workloadOrder)
			c.pendingSlices[q] = ws
		}
		st.Pending[q] = c.pendingSlices[q]
	}
	for q, set := range c.active {
		if c.activeSlices[q] == nil {
			ws := make([]*Workload, 0, len(set))
			for _, w := range set {
				ws = append(ws, w)
			}
			// Lowest priority first: the order victims are looked for in.
			slices.SortFunc(ws, func(a, b *Workload) int { return cmp.Compare(a.Priority, b.Priority) })
			c.activeSlices[q] = ws
		}
		st.Active[q] = c.activeSlices[q]
	}
	for _, w := range c.gangs {
		st.Gangs = append(st.Gangs, w)
	}
	for _, w := range c.terminating {
		st.Terminating = append(st.Terminating, w)
	}
	for _, w := range c.deviceCharged {
		st.DeviceCharged = append(st.DeviceCharged, w)
	}
	for _, w := range c.elastic {
		st.Elastic = append(st.Elastic, w)
	}
	slices.SortFunc(st.Elastic, func(a, b *Workload) int { return compareKeys(a.Key, b.Key) })
	return st
}

// index adds (sign 1) or removes (sign -1) a built workload from the
// cache's indexes and queue usage.
func (c *Cache) index(w *Workload, sign int64) {
	if w == nil {
		return
	}
	u := c.usage[w.Queue]
	if u == nil {
		u = &[6]int64{}
		c.usage[w.Queue] = u
	}
	// GPUs, CPU and memory; each admitted, then waiting.
	u[0] += sign * w.activeMilli
	u[1] += sign * w.pendingMilli
	u[2] += sign * w.activeCPU
	u[3] += sign * w.pendingCPU
	u[4] += sign * w.activeMemory
	u[5] += sign * w.pendingMemory
	put := func(m map[WorkloadKey]*Workload, on bool) {
		if sign > 0 && on {
			m[w.Key] = w
		} else if sign < 0 {
			delete(m, w.Key)
		}
	}
	put(c.gangs, w.Key.IsGang())
	put(c.terminating, w.terminating)
	put(c.deviceCharged, w.deviceCharged && len(w.Active) > 0)
	put(c.elastic, len(w.Extras()) > 0)
	byQueue := func(m map[string]map[WorkloadKey]*Workload, cached map[string][]*Workload) {
		set := m[w.Queue]
		if set == nil {
			set = map[WorkloadKey]*Workload{}
			m[w.Queue] = set
		}
		if sign > 0 {
			set[w.Key] = w
		} else {
			delete(set, w.Key)
			if len(set) == 0 {
				delete(m, w.Queue)
			}
		}
		delete(cached, w.Queue)
	}
	if len(w.Pending) > 0 {
		byQueue(c.pending, c.pendingSlices)
	}
	if len(w.Active) > 0 {
		byQueue(c.active, c.activeSlices)
	}
}

// PodState reports whether the cache has the pod and whether it is bound.
func (c *Cache) PodState(uid types.UID) (present, bound bool) {
	c.lock.Lock()
	defer c.lock.Unlock()
	p := c.pods[uid]
	if p == nil || p.done {
		return false, false
	}
	return true, p.node != ""
}

// workload builds one workload from its pods; nil when it has neither
// pending nor active members.
func (c *Cache) workload(key WorkloadKey, pods map[types.UID]*podInfo) *Workload {
	w := &Workload{Key: key, MinMember: 1}
	var annMin int32
	var queues []string
	var mapping Mapping
	for _, p := range pods {
		switch {
		case p.done:
			if p.pod.Status.Phase == corev1.PodSucceeded {
				w.Succeeded++
			}
			continue
		case p.gated:
			if p.terminating {
				continue
			}
			w.Pending = append(w.Pending, member(p))
		default:
			w.Active = append(w.Active, member(p))
		}
		if p.queue != "" && !slices.Contains(queues, p.queue) {
			queues = append(queues, p.queue)
		}
		if len(w.Pending)+len(w.Active) == 1 || p.priority < w.Priority {
			w.Priority = p.priority
		}
		if t := p.pod.CreationTimestamp.Time; w.Created.IsZero() || t.Before(w.Created) {
			w.Created = t
		}
		annMin = max(annMin, p.minMember)
		if p.unready != "" {
			w.Unready = p.unready
		}
		mapping = mergeMapping(mapping, p.mapping)
	}
	if len(w.Pending) == 0 && len(w.Active) == 0 {
		return nil
	}
	// The members' labels are the truth: the webhook fixed and checked
	// them at creation, so a PodGroup's queue never moves a member.
	slices.Sort(queues)
	if len(queues) > 0 {
		w.Queue = queues[0]
	}
	if len(queues) > 1 {
		w.QueueConflict = fmt.Sprintf("the pods of %s name different queues (%s); a workload goes to one queue: give its pods the same %s label",
			key, strings.Join(queues, ", "), v1alpha1.LabelQueue)
	}
	if key.Workload != "" {
		c.mappedGang(w, mapping)
	}
	if key.PodGroup != "" {
		w.MinMember = annMin
		// A PodGroup the loop keeps for a gang of the workload map is not
		// this gang's, whatever its members' label says.
		if pg := c.podGroups[types.NamespacedName{Namespace: key.Namespace, Name: key.PodGroup}]; pg != nil && !pg.mapped {
			w.HasPodGroup = true
			w.PodGroupStatus = pg.status
			w.MinMember = pg.minMember
			w.TopologyKey = pg.topologyKey
			w.Topology, w.SubGroups = pg.topology, pg.subGroups
			w.TimeoutSeconds = pg.timeout
			switch {
			case pg.queue == "" || pg.queue == w.Queue:
			case w.Queue == "":
				// Members from before the webhook gave every GPU pod a
				// queue take their PodGroup's.
				w.Queue = pg.queue
			case w.QueueConflict == "":
				w.QueueConflict = fmt.Sprintf("the pods of gang %s name queue %s but its PodGroup names queue %s; a gang's members go to their PodGroup's queue: "+
					"create the pods again without a queue label (they then take the PodGroup's), or set the PodGroup's spec.queue to %s",
					key, w.Queue, pg.queue, w.Queue)
			}
			if v, ok := c.priorityClasses[pg.priority]; ok && pg.priority != "" && v < w.Priority {
				// The PodGroup's class lowers the gang's priority; it never
				// raises it above what the members' own classes give them
				// (which operators restrict with ResourceQuota scopes).
				w.Priority = v
			}
			if !pg.created.IsZero() {
				w.Created = pg.created
			}
		}
	}
	c.workloadTopology(w, mapping)
	if w.Queue == "" {
		w.Queue = c.defaultQueue
	}
	byAge := func(a, b *Member) int {
		return cmp.Or(a.Pod.CreationTimestamp.Time.Compare(b.Pod.CreationTimestamp.Time), cmp.Compare(a.Pod.Name, b.Pod.Name))
	}
	// Pending members that must be in the minimum come first (a Ray head
	// before its workers), so that the minimum is what starts first.
	slices.SortFunc(w.Pending, func(a, b *Member) int {
		if a.Elastic != b.Elastic {
			if a.Elastic {
				return 1
			}
			return -1
		}
		return byAge(a, b)
	})
	slices.SortFunc(w.Active, byAge)
	chargeSharedClaimsOnce(w)
	w.summarise()
	return w
}

// mergeMapping combines the answers for a gang's members: the largest
// minimum, and the first of the other fields that any member has.
// workloadTopology completes what w asks of the topology when its
// PodGroup asks nothing: the workload map's answer (mapping), else its
// first member that asks; and orders its pending members so that the
// first MinMember of them hold each sub-group's minimum.
func (c *Cache) workloadTopology(w *Workload, mapping Mapping) {
	if w.Topology.IsZero() {
		w.Topology = mapping.Topology
	}
	if len(w.SubGroups) == 0 {
		w.SubGroups = mapping.SubGroups
	}
	if w.Topology.IsZero() {
		for _, ms := range [][]*Member{w.Pending, w.Active} {
			for _, m := range ms {
				if r := v1alpha1.TopologyRequestOf(m.Pod.Annotations); !r.IsZero() {
					w.Topology = r
					break
				}
			}
			if !w.Topology.IsZero() {
				break
			}
		}
	}
	if len(w.SubGroups) == 0 || !w.Key.IsGang() {
		return
	}
	// Each sub-group's minimum counts towards the gang's: the members
	// placed first are those the sub-groups still need, oldest first.
	var sum int32
	need := map[string]int32{}
	for _, sg := range w.SubGroups {
		sum += sg.MinMember
		need[sg.Name] = sg.MinMember
	}
	w.MinMember = max(w.MinMember, sum)
	for _, m := range w.Active {
		if m.Pod.DeletionTimestamp == nil {
			need[m.SubGroup]--
		}
	}
	first := make([]*Member, 0, len(w.Pending))
	var rest []*Member
	for _, m := range w.Pending {
		if need[m.SubGroup] > 0 {
			need[m.SubGroup]--
			first = append(first, m)
		} else {
			rest = append(rest, m)
		}
	}
	w.Pending = append(first, rest...)
}

func mergeMapping(acc, m Mapping) Mapping {
	if acc.Gang == "" {
		return m
	}
	acc.MinMember = max(acc.MinMember, m.MinMember)
	acc.Queue = cmp.Or(acc.Queue, m.Queue)
	acc.PriorityClassName = cmp.Or(acc.PriorityClassName, m.PriorityClassName)
	if acc.Topology.IsZero() {
		acc.Topology = m.Topology
	}
	if len(acc.SubGroups) == 0 {
		acc.SubGroups = m.SubGroups
	}
	return acc
}

// mappedGang completes a gang of the workload map: its minimum, name and
// rule from the members' answers; its status, and the queue its rule
// names, from the PodGroup the loop keeps for it once that exists and is
// owned by the gang's top owner (the PodGroup webhook has then checked the
// namespace may use the queue).
func (c *Cache) mappedGang(w *Workload, m Mapping) {
	w.MinMember = max(m.MinMember, 1)
	w.Kind, w.OwnerName, w.Owner = m.Kind, m.Name, m.Owner
	w.RuleQueue, w.PriorityClassName, w.priorityClass = m.Queue, m.PriorityClassName, m.PriorityClassName
	w.RuleTopology, w.RuleSubGroups = m.Topology, m.SubGroups
	for _, p := range w.Pending {
		w.Elastic = w.Elastic || p.Elastic
	}
	for _, p := range w.Active {
		w.Elastic = w.Elastic || p.Elastic
	}
	pg := c.podGroups[types.NamespacedName{Namespace: w.Key.Namespace, Name: w.Key.Workload}]
	switch {
	case pg == nil:
		w.PodGroup = PodGroupMissing
	case !pg.mapped || !ownedBy(pg.owners, m.Owner.UID):
		// Someone else's PodGroup of that name: neither its status nor its
		// queue is the gang's.
		w.PodGroup, pg = PodGroupForeign, nil
	case pg.minMember != w.MinMember || pg.queue != m.Queue || pg.priority != m.PriorityClassName ||
		pg.partitaTopology != m.Topology || !slices.Equal(pg.subGroups, m.SubGroups):
		w.PodGroup = PodGroupStale
	default:
		w.PodGroup = PodGroupInSync
	}
	if pg != nil {
		w.HasPodGroup = true
		w.PodGroupStatus = pg.status
		if !pg.created.IsZero() {
			w.Created = pg.created
		}
	}
	if v, ok := c.priorityClasses[m.PriorityClassName]; ok && m.PriorityClassName != "" && v < w.Priority {
		w.Priority = v
	}
	switch {
	case m.Queue == "" || m.Queue == w.Queue || w.QueueConflict != "":
	case w.Queue != "" && w.Queue != c.defaultQueue:
		w.QueueConflict = fmt.Sprintf("the workload rule puts %s in queue %s but its pods name queue %s: give the pods the label %s: %s (or none), or change the rule",
			w.Name(), m.Queue, w.Queue, v1alpha1.LabelQueue, m.Queue)
	case w.PodGroup == PodGroupForeign:
		w.Unready = fmt.Sprintf("PodGroup %s/%s, which must carry the queue %s that the workload rule of %s names, exists but was not made by Partita for %s %s (it is not owned by it, or lacks the label %s): delete or rename it",
			w.Key.Namespace, w.Key.Workload, m.Queue, w.Name(), m.Owner.Kind, m.Owner.Name, v1alpha1.LabelWorkloadKind)
	case pg == nil || pg.queue != m.Queue:
		w.Unready = fmt.Sprintf("waiting for PodGroup %s/%s to name queue %s, as the workload rule of %s does (the admission loop creates it; the PodGroup webhook checks that namespace %s may use the queue)",
			w.Key.Namespace, w.Key.Workload, m.Queue, w.Name(), w.Key.Namespace)
	default:
		// Members that named no queue (the webhook gave them the cluster's
		// default) take the one the rule names.
		w.Queue = m.Queue
	}
}

// ownedBy reports whether a PodGroup's owners are the gang's top owner (or,
// for a gang without one, none).
func ownedBy(owners []types.UID, uid types.UID) bool {
	if uid == "" {
		return len(owners) == 0
	}
	return slices.Contains(owners, uid)
}

// chargeSharedClaimsOnce charges each ResourceClaim that several of the
// workload's members name (dra.Demand.Shared) to one of them, the first
// by pod name, rather than to each.
func chargeSharedClaimsOnce(w *Workload) {
	var named []*Member
	for _, ms := range [][]*Member{w.Active, w.Pending} {
		for _, m := range ms {
			if m.Claims != nil && len(m.Claims.Shared) > 0 {
				named = append(named, m)
			}
		}
	}
	if len(named) < 2 {
		return
	}
	slices.SortFunc(named, func(a, b *Member) int { return strings.Compare(a.Pod.Name, b.Pod.Name) })
	charged := map[string]bool{}
	for _, m := range named {
		for _, sc := range m.Claims.Shared {
			if charged[sc.Claim] {
				m.GPUMilli -= sc.Milli
				continue
			}
			charged[sc.Claim] = true
		}
	}
}

func member(p *podInfo) *Member {
	m := &Member{Pod: p.pod, Request: p.req, GPUMilli: p.gpuMilli, CPUMilli: p.cpuMilli, Memory: p.memory, Admitted: p.admitted, Bound: p.node != "",
		memory: memoryRequest(p.req), node: p.node, uid: p.pod.UID, Elastic: p.mapping.Elastic, Claims: p.claims,
		SubGroup: cmp.Or(p.mapping.SubGroup, v1alpha1.SubGroupOf(p.pod.Labels))}
	if m.node == "" {
		m.node = p.pod.Annotations[v1alpha1.AnnotationNode]
	}
	return m
}

func queueFromSpec(name string, q *queueInfo) *Queue {
	out := &Queue{
		Name: name, Parent: q.spec.Parent, Priority: v1alpha1.DefaultQueuePriority, Created: q.created, Status: q.status,
	}
	if q.spec.Priority != nil {
		out.Priority = *q.spec.Priority
	}
	gpu := settingsOf(q.spec.Resources.GPU, func(v resource.Quantity) int64 { return v.MilliValue() })
	out.QuotaMilli, out.LimitMilli, out.Weight = gpu.Quota, gpu.Limit, gpu.Weight
	out.CPU = settingsOf(q.spec.Resources.CPU, func(v resource.Quantity) int64 { return v.MilliValue() })
	out.Memory = settingsOf(q.spec.Resources.Memory, func(v resource.Quantity) int64 { return v.Value() })
	return out
}

// settingsOf reads one resource's settings with unit (milli-units or
// bytes); the defaults are quota 0, no limit, weight 1. A negative amount
// is -1, the whole capacity or no limit.
func settingsOf(r *v1alpha1.ResourceQuota, unit func(resource.Quantity) int64) Settings {
	out := Settings{Quota: 0, Limit: -1, Weight: 1}
	if r == nil {
		return out
	}
	amount := func(v resource.Quantity) int64 {
		if v.Sign() < 0 {
			return -1
		}
		return unit(v)
	}
	if r.Quota != nil {
		out.Quota = amount(*r.Quota)
	}
	if r.Limit != nil {
		out.Limit = amount(*r.Limit)
	}
	if r.OverQuotaWeight != nil {
		out.Weight = *r.OverQuotaWeight
	}
	return out
}
