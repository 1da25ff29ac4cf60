package cycle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// QuotaChecker answers the quota policy (data.partita.quota): may the queue
// take the workload now?
type QuotaChecker interface {
	CheckQuota(ctx context.Context, req *QuotaRequest) (*QuotaVerdict, error)
}

// QuotaRequest is one question to the quota policy. Usage includes what the
// loop has admitted and not seen bound yet.
type QuotaRequest struct {
	Workload *Workload
	// Members and GPUMilli are what admitting the workload now adds, and
	// CPUMilli and Memory (bytes) the CPU and memory its pods request.
	Members  int
	GPUMilli int64
	CPUMilli int64
	Memory   int64
	// Queue is the workload's queue; Ancestors its parent first, up to the
	// root.
	Queue     QueueUsage
	Ancestors []QueueUsage
	// ClusterMilli is the cluster's healthy GPU capacity; ClusterCPUMilli
	// and ClusterMemory the allocatable CPU and memory of its GPU nodes.
	ClusterMilli    int64
	ClusterCPUMilli int64
	ClusterMemory   int64
}

// QueueUsage is a queue's settings and usage: GPUs in milli-GPUs, CPU and
// Memory in milli-CPUs and bytes.
type QueueUsage struct {
	Name     string
	Priority int32
	// QuotaMilli and LimitMilli are -1 for the whole capacity and no limit.
	QuotaMilli, LimitMilli int64
	AllocatedMilli         int64
	FairShareMilli         int64
	CPU, Memory            ResourceUsage
}

// ResourceUsage is a queue's settings and usage of CPU or memory; Quota and
// Limit are -1 for the whole capacity and no limit.
type ResourceUsage struct {
	Quota, Limit, Allocated, FairShare int64
}

// QuotaVerdict is the quota policy's answer.
type QuotaVerdict struct {
	Allowed bool
	// Reasons say why not, in words.
	Reasons []string
}

// Options tune a cycle.
type Options struct {
	// Now is the cycle's time.
	Now time.Time
	// Placement is the device placement of pods that choose none.
	Placement gpu.Placement
	// PreemptMinRuntime protects a workload admitted less than this long ago
	// from reclaim and preemption.
	PreemptMinRuntime time.Duration
	// DisablePreemption turns reclaim and preemption off.
	DisablePreemption bool
	// MaxPreemptionSearches is how many victim searches a cycle runs
	// whatever their workloads' size (each costs a few gang placements);
	// MaxSearchedMembers may allow more. 0 means 16.
	MaxPreemptionSearches int
	// MaxSearchedMembers lets a cycle search for more workloads than
	// MaxPreemptionSearches while the members of all it searched for stay
	// within it: a search costs in proportion to the members it places, so
	// single pods get many searches a cycle and large gangs
	// MaxPreemptionSearches. (At 16 a cycle, a reclaim of 2,000 single
	// pods went at 16 evictions a cycle: 6 pods/s at 500 nodes.) 0 means
	// 256.
	MaxSearchedMembers int
	// BackoffUntil says until when a requeued workload waits; nil for none.
	BackoffUntil func(WorkloadKey) time.Time
	// FairShares, when set, carries the last division from cycle to cycle.
	FairShares *FairShares
	// StarvationBound is how long a queue's head of line may wait before
	// the cycle holds room for it (starvation.go); 0 turns that off.
	StarvationBound time.Duration
	// Rooms, when set, carries the rooms held for heads of line from cycle
	// to cycle.
	Rooms *Rooms
	// Domains, when set, carries topology domains from cycle to cycle.
	Domains *Domains
	// Unevictable are workloads that may not be victims this cycle, with
	// why: their eviction was refused (a PodDisruptionBudget) or is being
	// finished. Waits that could have evicted them say so.
	Unevictable map[WorkloadKey]string
	// Usage, when set, weighs each queue's past usage in the fair-share
	// division (time-based fair share).
	Usage *Usage
	// Claims, when set, simulates the allocation of the ResourceClaims of
	// gangs whose members carry them (Member.Claims): such a gang is
	// admitted, each member pinned to a node, only when all their claims
	// can be allocated at once. Nil ungates claim gangs unpinned.
	Claims ClaimAllocator
	// ModelsHeld, when set, says which nodes hold a pod's models
	// (partita.dev/model) and how much of them: a gang goes to nodes that
	// hold its models when it fits there, else anywhere.
	ModelsHeld func(namespace string, models []string) map[string]float64
	// firstFit places a gang in the first domain of its required level,
	// by name, that takes it, instead of the one with the least room: what
	// the placement-quality benchmark compares best fit with.
	firstFit bool
}

// Usage is the queues' past usage, which time-based fair share weighs.
type Usage struct {
	// Weight is how much usage counts (fairshare.Options.UsageWeight).
	Weight float64
	// Share is each queue's usage, its subtree's included, as a share of
	// the cluster's capacity over the window: GPU, CPU and memory.
	Share map[string][3]float64
	// GPUHours is each queue's decayed GPU-hours in the window, for
	// messages.
	GPUHours map[string]float64
	// Window says what the usage covers, for messages: "sliding 168h
	// window, half-life 24h".
	Window string
}

// Admission lets a workload's pending members go.
type Admission struct {
	Workload *Workload
	// Members are the members admitted now, each with the devices simulated
	// for it.
	Members []MemberAdmission
	// Pin is set for gangs: members are pinned to their nodes and the
	// devices reserved; single pods are only ungated.
	Pin bool
	// Hold is set for single pods placed on the ledger (not through
	// claims) that ask for GPU memory or that carry no constraint the cycle
	// does not weigh (placedAsScheduled): the devices simulated for them
	// are held in the ledger for a while, so that the extender binds them
	// where they were charged (a memory slice holds a larger share of a
	// smaller device) and where the cycle counted them, and its filter
	// offers kube-scheduler that one node, which then skips scoring and the
	// extender's prioritize. No node affinity is written: once the hold
	// lapses (InflightTTL passed and kube-scheduler refused the pod, see
	// gpu's reservedEntry) the pod may go anywhere, and is charged what it
	// holds.
	Hold bool
}

// MemberAdmission is one admitted member.
type MemberAdmission struct {
	Member     *Member
	Allocation *gpu.PodAllocation
	// Domain are the node labels (and values) of the topology domains the
	// member must stay in, for a member not pinned to its node; nil when
	// its workload requires none.
	Domain map[string]string
}

// Wait says why a workload waits.
type Wait struct {
	Workload *Workload
	// Reason is one of api/v1alpha1's Reason* constants.
	Reason string
	// Message says why in words, with the numbers.
	Message string
	// Evicting is set when the workload waits for victims the cycle
	// evicts for it; Terminating when it waits for pods already being
	// deleted. The second usually follows the first for the same victims,
	// and says nothing new to the pod's owner.
	Evicting, Terminating bool
}

// Eviction evicts a whole workload, or elastic members of it beyond its
// minimum, to make room for another.
type Eviction struct {
	Victim *Workload
	// Members are the pods to evict: all of Victim.Active, or elastic
	// members beyond the gang's minimum.
	Members []*Member
	// For is the workload the room is made for.
	For *Workload
	// Reclaim is set when the victim's queue is over its fair share and the
	// preemptor's below; otherwise it is priority preemption in one queue.
	Reclaim bool
	Message string
}

// QueueReport is a queue's numbers after a cycle, for its status and
// metrics. Parents sum their children.
type QueueReport struct {
	Name             string
	AllocatedMilli   int64
	RequestedMilli   int64
	FairShareMilli   int64
	PendingWorkloads int32
	Children         []string
	// CPU (milli-CPUs) and Memory (bytes) allocated, requested and fair
	// share.
	CPU, Memory ResourceReport
	// FairShareWithoutUsage is the fair share the queue would have if
	// usage did not count (milli-GPUs, milli-CPUs, bytes); nil unless
	// Options.Usage is set.
	FairShareWithoutUsage *[3]int64
}

// ResourceReport is a queue's allocation, request and fair share of CPU
// or memory.
type ResourceReport struct {
	Allocated, Requested, FairShare int64
}

// Result is what a cycle decided.
type Result struct {
	Admissions []Admission
	Waiting    []Wait
	Evictions  []Eviction
	Queues     []QueueReport
	// Rooms are the rooms held for heads of line that waited too long.
	Rooms []RoomReport
	// ClusterMilli is the healthy GPU capacity divided; ClusterCPUMilli and
	// ClusterMemory the CPU and memory.
	ClusterMilli    int64
	ClusterCPUMilli int64
	ClusterMemory   int64
}

// Run decides one admission cycle on snap, a fresh ledger snapshot that
// already holds the reservations not yet seen on pods. It changes snap:
// admitted members are assumed on it.
func Run(ctx context.Context, st *State, snap *gpu.Snapshot, quota QuotaChecker, opts Options) *Result {
	c := newCycle(ctx, st, snap, quota, opts)
	c.run()
	return c.result()
}

// queueState is a queue during a cycle.
type queueState struct {
	*Queue
	parent    *queueState
	allocated int64
	pending   int64
	fairShare int64
	// baseShare is the fair share without usage (GPU, CPU, memory), with
	// Options.Usage.
	baseShare [3]int64
	// cpu (milli-CPUs) and memory (bytes): the pods' requests.
	cpu, memory amounts
	// workloads are the queue's workloads with pending members, in
	// admission order; next is the first not tried yet.
	workloads []*Workload
	next      int
	waiting   int32
	// index is the queue's position in the cycle's heap, -1 when out.
	index int
}

// amounts are a queue's allocation, waiting demand and fair share of one
// resource.
type amounts struct {
	alloc, pending, fairShare int64
}

type cycle struct {
	ctx    context.Context
	st     *State
	snap   *gpu.Snapshot
	quota  QuotaChecker
	opts   Options
	queues map[string]*queueState
	// extra are the CPU and memory requests, and the number of pods, the
	// cycle placed on each node.
	extra map[string]*[3]int64
	// failedShapes are member requests that found no room this cycle: room
	// only shrinks within a cycle, so they fail again.
	failedShapes map[string]*failure
	evicting     map[WorkloadKey]bool
	// evictingMembers are elastic members chosen as victims this cycle.
	evictingMembers map[types.UID]bool
	// extras are the elastic gangs whose members beyond the minimum wait
	// for the end of the cycle (admitExtras).
	extras   []extraWork
	searches int
	// searchedMembers counts the members of the workloads searched for.
	searchedMembers int
	// terminatingLooks counts the workloads placed with the room of pods
	// already terminating (evictFor), bounded apart from searches.
	terminatingLooks int
	// candidates caches staticCandidates by constraint signature; nodeNames
	// are the snapshot's nodes in name order; terminating caches
	// terminatingVictims.
	candidates  map[string][]string
	nodeNames   []string
	terminating []victim
	// over caches overFairShare.
	over []*queueState
	// evictableByQueue caches evictable; spared are the workloads it left
	// out for Options.Unevictable.
	evictableByQueue map[string][]*Workload
	spared           []spared
	// victimsSorted caches victimOrder; victimBuf is the searches' shared
	// buffer of candidates.
	victimsSorted, victimBuf []victim
	clusterMilli             int64
	// clusterCPU and clusterMemory are the allocatable CPU (milli) and
	// memory (bytes) of the nodes with a GPU inventory: what queues' CPU
	// and memory fair shares divide.
	clusterCPU, clusterMemory int64
	// rooms are held for heads of line (starvation.go), roomOf by head;
	// liftKey prefixes the failure memo while rooms are lifted;
	// ignoreNodeUse makes room() count a node's allocatable alone, while
	// findRoom takes pods off the snapshot.
	rooms     []*room
	roomOf    map[*Workload]*room
	roomNotes map[string]string
	// notedWaits are wait messages joined with their room notes.
	notedWaits map[[2]string]string
	roomsFree  bool
	// headrooms are the quota held for heads of line (headroom.go),
	// headroomOf by head.
	headrooms  []*headroom
	headroomOf map[*Workload]*headroom
	// anchors are the nodes of the members of each workload placed in this
	// cycle: its later members join their topology domain.
	anchors map[*Workload][]string
	// topoQuestions are placeQuestion's answers for topology workloads,
	// until members of them are placed.
	topoQuestions map[*Workload]askedPlacement
	// topo caches topology domains (topology.go).
	topo *topoState
	// moving is what the evictions chosen in the cycle will change in each
	// queue's holdings (move).
	moving map[*queueState][3]int64
	// holds are the devices withheld for workloads that wait for
	// evictions (holdFor).
	holds []hold
	// holdLines caches holdNote's lines by constraint signature.
	holdLines map[string][]holdLine
	// lifted are the rooms open to the workload being tried (lift), and
	// liftOpen whether their devices are unwithheld now (openLifted).
	lifted        []*room
	liftOpen      bool
	liftKey       string
	ignoreNodeUse bool
	// claimSession is the cycle's simulation of claim allocations (Options.
	// Claims), started on first use; claimErr is why it could not start.
	// claimCandidates caches claimNodes by constraint signature.
	claimSession    ClaimSession
	claimErr        error
	claimCandidates map[string][]*corev1.Node
	// held memoises activeCharge of device-charged workloads, computed
	// before the cycle changes the snapshot. Keyed by the workload itself:
	// hashing a pointer costs a fraction of hashing a WorkloadKey.
	held map[*Workload]int64

	admissions []Admission
	waiting    []Wait
	evictions  []Eviction
}

func newCycle(ctx context.Context, st *State, snap *gpu.Snapshot, quota QuotaChecker, opts Options) *cycle {
	if opts.MaxPreemptionSearches == 0 {
		opts.MaxPreemptionSearches = 16
	}
	if opts.MaxSearchedMembers == 0 {
		opts.MaxSearchedMembers = 256
	}
	if opts.Placement == "" {
		opts.Placement = gpu.PlacementBinpack
	}
	pending := 0
	for _, ws := range st.Pending {
		pending += len(ws)
	}
	c := &cycle{
		ctx: ctx, st: st, snap: snap, quota: memoized(quota), opts: opts,
		waiting:      make([]Wait, 0, pending),
		queues:       make(map[string]*queueState, len(st.Queues)),
		extra:        map[string]*[3]int64{},
		failedShapes: map[string]*failure{},
		evicting:     map[WorkloadKey]bool{},
		clusterMilli: snap.CapacityMilli(),
	}
	for name, q := range st.Queues {
		c.queues[name] = &queueState{Queue: q, index: -1}
	}
	for _, q := range c.queues {
		q.parent = c.queues[q.Parent]
	}
	breakCycles(c.queues)
	// Queued workloads run on GPU nodes only: their CPU and memory are
	// what queues divide.
	c.nodeNames = snap.Nodes()
	for _, name := range c.nodeNames {
		if n := st.Nodes[name]; n != nil && n.Node != nil {
			c.clusterCPU += n.Node.Status.Allocatable.Cpu().MilliValue()
			c.clusterMemory += n.Node.Status.Allocatable.Memory().Value()
		}
	}
	// The cache counts each member's partita.dev/gpu-milli, exact for
	// fractions and whole GPUs; what a memory request holds depends on its
	// devices and is read from the ledger.
	held := map[string]int64{}
	c.held = map[*Workload]int64{}
	for _, w := range st.DeviceCharged {
		held[w.Queue] += c.activeCharge(w) - w.ActiveMilli()
	}
	for _, q := range c.queues {
		own := q.AllocatedMilli + held[q.Name]
		for a := q; a != nil; a = a.parent {
			a.allocated += own
			a.pending += q.PendingMilli
			a.cpu.alloc += q.AllocatedCPUMilli
			a.cpu.pending += q.PendingCPUMilli
			a.memory.alloc += q.AllocatedMemory
			a.memory.pending += q.PendingMemory
		}
	}
	c.divide()
	// Pods already being deleted leave their queues: reclaim must not count
	// them as held, or a queue whose victims are still terminating looks
	// over its fair share again and loses more (a cycle or two after a
	// reclaim, until they are gone).
	for _, v := range c.terminatingVictims() {
		c.move(v.q, c.victimCharge(v), -1)
	}
	return c
}

// breakCycles makes a queue whose ancestors loop back to it top-level, so
// that walking up always ends; the API server refuses only a queue that is
// its own parent.
func breakCycles(queues map[string]*queueState) {
	for _, q := range queues {
		seen := map[*queueState]bool{q: true}
		for a := q.parent; a != nil; a = a.parent {
			if seen[a] {
				q.parent = nil
				break
			}
			seen[a] = true
		}
	}
}

func (c *cycle) run() {
	var h queueHeap
	var orphans []*Workload
	for name, ws := range c.st.Pending {
		q := c.queues[name]
		if q == nil {
			orphans = append(orphans, ws...)
			continue
		}
		// Shared with the cache: read, never reordered.
		q.workloads = ws
	}
	slices.SortFunc(orphans, workloadOrder)
	for _, w := range orphans {
		if w.Queue == "" {
			// No queue: nothing to account it against, only room.
			c.admitOrWait(nil, w)
			continue
		}
		msg := fmt.Sprintf("queue %s does not exist: create the Queue, or name an existing leaf queue", w.Queue)
		if w.Queue == c.st.DefaultQueue {
			msg = fmt.Sprintf("queue %s, the cluster's default queue for pods that name none, does not exist: create it (the chart and `partita dev up` do), or name an existing leaf queue", w.Queue)
		}
		c.wait(w, v1alpha1.ReasonWaitingForQuota, msg)
	}
	c.holdRooms()
	for _, q := range c.queues {
		if len(q.workloads) == 0 {
			continue
		}
		h.push(q)
	}
	for h.len() > 0 {
		if c.ctx.Err() != nil {
			return
		}
		q := h.pop()
		for q.next < len(q.workloads) {
			w := q.workloads[q.next]
			q.next++
			if c.admitOrWait(q, w) {
				break
			}
		}
		if q.next < len(q.workloads) {
			h.push(q)
		}
	}
	c.admitExtras()
}

// workloadOrder is the order within a queue: priority, then age, then key.
func workloadOrder(a, b *Workload) int {
	return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.Created.Compare(b.Created), compareKeys(a.Key, b.Key))
}

func compareKeys(a, b WorkloadKey) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.PodGroup, b.PodGroup),
		strings.Compare(a.Workload, b.Workload), strings.Compare(a.Pod, b.Pod))
}

// activeCharge is what w's active members hold, in milli-GPUs, as the queue
// is charged for them: for members that ask for GPU memory, the share of
// each device they hold in the ledger snapshot (gpu.Snapshot.HeldMilli),
// else their partita.dev/gpu-milli.
//
// A workload whose members are all bound and shown in the ledger keeps the
// sum until a node's inventory changes (Workload.held): a cycle over 40,000
// running memory slices then reads the ledger for none of them. Otherwise
// the sum is kept for the cycle only, since the cycle changes its snapshot
// as it simulates evictions.
func (c *cycle) activeCharge(w *Workload) int64 {
	if !w.deviceCharged {
		return w.activeMilli
	}
	epoch := c.snap.InventoryEpoch()
	if w.heldValid && w.heldEpoch == epoch {
		return w.held
	}
	if v, ok := c.held[w]; ok {
		return v
	}
	var sum int64
	stable := true
	for _, m := range w.Active {
		v, shown := c.memberCharge(m)
		sum += v
		stable = stable && shown && m.Bound
	}
	if stable {
		w.held, w.heldEpoch, w.heldValid = sum, epoch, true
	} else {
		c.held[w] = sum
	}
	return sum
}

// memberCharge is what one active member holds: the ledger's share of its
// devices, looked for on its node (or its reservation's), and whether the
// ledger shows it; a member the ledger does not show holding anything
// (ungated, its hold lapsed, not bound yet) counts its
// partita.dev/gpu-milli.
func (c *cycle) memberCharge(m *Member) (int64, bool) {
	if !m.memory {
		return m.GPUMilli, true
	}
	if v, ok := c.snap.HeldMilli(m.uid, m.node); ok {
		return v, true
	}
	return m.GPUMilli, false
}

// admitOrWait tries one workload, with the rooms that do not hold
// against it open; it reports whether it was admitted.
func (c *cycle) admitOrWait(q *queueState, w *Workload) bool {
	lifted := c.lift(q, w)
	ok := c.tryAdmit(q, w)
	c.close(lifted, w, ok)
	return ok
}

func (c *cycle) tryAdmit(q *queueState, w *Workload) bool {
	if w.QueueConflict != "" {
		c.wait(w, v1alpha1.ReasonQueueConflict, w.QueueConflict)
		return false
	}
	if q != nil && len(q.Children) > 0 {
		c.wait(w, v1alpha1.ReasonWaitingForQuota, fmt.Sprintf("queue %s is not a leaf (it has child queues %s); only leaf queues take work", q.Name, strings.Join(q.Children, ", ")))
		return false
	}
	if until := c.backoff(w.Key); until.After(c.opts.Now) {
		c.wait(w, v1alpha1.ReasonScheduleTimeout, fmt.Sprintf("requeued after its schedule timeout; tries again in %s", until.Sub(c.opts.Now).Round(time.Second)))
		return false
	}
	if w.Unready != "" {
		c.wait(w, v1alpha1.ReasonWaitingForWorkload, w.Unready)
		return false
	}
	required := len(w.Pending)
	if w.Key.IsGang() {
		if w.MinMember == 0 {
			msg := fmt.Sprintf("pod group %s has no PodGroup object and its pods set no %s: create the PodGroup with spec.minMember, or annotate the pods", w.Key.PodGroup, v1alpha1.AnnotationMinMember)
			c.wait(w, v1alpha1.ReasonWaitingForMembers, msg)
			return false
		}
		// Members that ran to completion count as started.
		have := len(w.Pending) + len(w.Active) + int(w.Succeeded)
		if have < int(w.MinMember) {
			c.wait(w, v1alpha1.ReasonWaitingForMembers, fmt.Sprintf("gang %s needs %d pods before any starts; %d exist", w.Name(), w.MinMember, have))
			return false
		}
		// Members already admitted count; the rest of minMember must be
		// placed together, and pending pods beyond it go if they fit.
		required = min(max(0, int(w.MinMember)-len(w.Active)-int(w.Succeeded)), len(w.Pending))
	}
	if f, known := c.knownFailure(w, w.Pending[:required]); known && !c.mayEvictFor(q, w) {
		// Room only shrinks within a cycle: a question already answered
		// no is answered no again, without asking the policy.
		msg := f.message(w, w.Pending[:required])
		if why := c.sparedFor(q, w, nil); why != "" {
			msg += "; " + why
		}
		c.wait(w, v1alpha1.ReasonWaitingForCapacity, msg)
		return false
	}
	// An elastic gang asks for its minimum now; the members beyond it are
	// tried once every queue's minimum has been (admitExtras).
	pending := w.Pending
	if w.Elastic {
		if required == 0 {
			c.extras = append(c.extras, extraWork{q: q, w: w})
			return false
		}
		pending = w.Pending[:required]
	}
	var milli int64
	for _, m := range pending {
		milli += m.GPUMilli
	}
	if q != nil {
		v, heldBack, err := c.quotaVerdict(q, w, pending, milli)
		if err != nil {
			c.wait(w, v1alpha1.ReasonWaitingForQuota, fmt.Sprintf("the quota policy (data.partita.quota) failed, so the workload waits: %v; check the policy ConfigMaps labelled %s=rego and the extender's log", err, v1alpha1.LabelPolicy))
			return false
		}
		if !v.Allowed {
			// What a starved head's headroom alone holds back is not
			// reclaimed: that would make the room the head is owed.
			if heldBack {
				c.wait(w, v1alpha1.ReasonWaitingForQuota, strings.Join(v.Reasons, "; "))
				return false
			}
			if c.reclaimUnderLimit(q, w, pending, milli, w.Pending[:required]) {
				return false
			}
			msg := strings.Join(v.Reasons, "; ")
			_, scope := c.limitScope(q, pending, milli)
			if why := c.sparedFor(q, w, scope); why != "" {
				msg += "; " + why
			}
			c.wait(w, v1alpha1.ReasonWaitingForQuota, msg)
			return false
		}
	}
	placed, err := c.place(w, w.Pending[:required], true)
	if err != nil {
		if !c.preempt(q, w, w.Pending[:required]) {
			f, _ := c.knownFailure(w, w.Pending[:required])
			msg := f.message(w, w.Pending[:required])
			if why := c.sparedFor(q, w, nil); why != "" {
				msg += "; " + why
			}
			c.wait(w, v1alpha1.ReasonWaitingForCapacity, msg)
		}
		return false
	}
	if !w.Topology.IsZero() || len(w.SubGroups) > 0 {
		// Members beyond the minimum join the domains it was placed in.
		if c.anchors == nil {
			c.anchors = map[*Workload][]string{}
		}
		for _, p := range placed {
			if p.Allocation.Node != "" {
				c.anchors[w] = append(c.anchors[w], p.Allocation.Node)
				delete(c.topoQuestions, w)
			}
		}
	}
	for _, m := range pending[required:] {
		if more, err := c.place(w, []*Member{m}, true); err == nil {
			placed = append(placed, more...)
		}
	}
	if len(placed) == 0 {
		c.wait(w, v1alpha1.ReasonWaitingForCapacity, capacityMessage(w, w.Pending[:1], errors.New("no node has room now")))
		return false
	}
	if !c.commit(q, w, placed) {
		return false
	}
	if len(w.Pending) > required && w.Elastic {
		c.extras = append(c.extras, extraWork{q: q, w: w, admitted: true})
	}
	return true
}

// commit admits members placed on the snapshot, unless the quota policy
// refuses what they hold on the devices chosen; it reports whether they
// were admitted.
func (c *cycle) commit(q *queueState, w *Workload, placed []MemberAdmission) bool {
	// The quota check before placing counted each member's partita.dev/gpu-milli, a
	// lower bound for a memory request (its share of the largest device).
	// What the members will hold is their share of the devices chosen
	// now: ask again with that, and keep them waiting if it is too much.
	var admitted, estimate int64
	unpinned := false
	for _, ma := range placed {
		admitted += ma.Allocation.Milli()
		estimate += ma.Member.GPUMilli
		if ma.Member.Claims != nil {
			// Its claims ask for GPUMilli; the ledger chose nothing.
			admitted += ma.Member.GPUMilli
			unpinned = unpinned || ma.Allocation.Node == ""
		}
	}
	if q != nil && admitted > estimate {
		ms := make([]*Member, len(placed))
		for i, ma := range placed {
			ms[i] = ma.Member
		}
		v, err := c.checkQuota(q, w, ms, admitted)
		if err != nil || !v.Allowed {
			for _, ma := range placed {
				c.snap.Forget(ma.Member.Pod.UID)
			}
			msg := fmt.Sprintf("the quota policy (data.partita.quota) failed, so the workload waits: %v; check the policy ConfigMaps labelled %s=rego and the extender's log", err, v1alpha1.LabelPolicy)
			if err == nil {
				msg = strings.Join(v.Reasons, "; ") + fmt.Sprintf(" (a memory request is charged its share of the device chosen for it: %s GPUs)", gpu.FormatMilli(admitted))
			}
			c.wait(w, v1alpha1.ReasonWaitingForQuota, msg)
			return false
		}
	}
	var cpu, mem int64
	for _, ma := range placed {
		c.charge(ma.Allocation.Node, ma.Member)
		cpu += ma.Member.CPUMilli
		mem += ma.Member.Memory
	}
	for a := q; a != nil; a = a.parent {
		a.allocated += admitted
		a.pending -= estimate
		a.cpu.alloc += cpu
		a.cpu.pending -= cpu
		a.memory.alloc += mem
		a.memory.pending -= mem
	}
	gang := w.Key.IsGang()
	// A gang whose members tie pods to one another in ways the cycle does
	// not weigh (pinnable) goes unpinned: kube-scheduler places its
	// members, with the extender's filter, after the cycle found room for
	// all of them. A gang with memory slices stays pinned: a slice's
	// charge depends on the device.
	if gang && !slices.ContainsFunc(placed, func(ma MemberAdmission) bool { return ma.Member.memory }) &&
		slices.ContainsFunc(placed, func(ma MemberAdmission) bool { return !pinnable(ma.Member.Pod) }) {
		unpinned = true
	}
	// A gang's claim members are pinned to the nodes the simulation of
	// their claims found (Options.Claims); without one they go unpinned.
	// A single pod's claims hold its devices: the ledger has none to hold.
	// A memory slice is held wherever it goes (its charge depends on the
	// device); another single pod only when the cycle weighed everything
	// kube-scheduler would (placedAsScheduled).
	hold := !gang && !slices.ContainsFunc(placed, func(ma MemberAdmission) bool {
		return ma.Member.Claims != nil || (!ma.Member.memory && !placedAsScheduled(ma.Member.Pod))
	})
	if plan, _ := c.topoPlanOf(w); plan != nil {
		// Members kube-scheduler places (not pinned) are kept inside the
		// domains the cycle chose for them.
		for i := range placed {
			placed[i].Domain = c.memberDomain(plan, placed[i].Member, placed[i].Allocation.Node)
		}
	}
	c.admissions = append(c.admissions, Admission{Workload: w, Members: placed, Pin: gang && !unpinned, Hold: hold})
	if h := c.headroomOf[w]; h != nil {
		// Its queues now hold what it asked for.
		h.consumed = true
	}
	return true
}

func (c *cycle) backoff(k WorkloadKey) time.Time {
	if c.opts.BackoffUntil == nil {
		return time.Time{}
	}
	return c.opts.BackoffUntil(k)
}

func (c *cycle) wait(w *Workload, reason, msg string) {
	if q := c.queues[w.Queue]; q != nil {
		q.waiting++
	}
	if reason == v1alpha1.ReasonWaitingForCapacity && len(c.holds) > 0 {
		msg += c.holdNote(w)
	}
	if reason == v1alpha1.ReasonWaitingForCapacity && len(c.rooms) > 0 {
		if note := c.roomNote(w); note != "" {
			// Thousands of workloads wait with the same message and note:
			// join each pair once.
			k := [2]string{msg, note}
			full, ok := c.notedWaits[k]
			if !ok {
				full = msg + note
				if c.notedWaits == nil {
					c.notedWaits = map[[2]string]string{}
				}
				c.notedWaits[k] = full
			}
			msg = full
		}
	}
	c.waiting = append(c.waiting, Wait{Workload: w, Reason: reason, Message: msg})
}

// usage is q's QueueUsage now.
func (q *queueState) usage() QueueUsage {
	return QueueUsage{Name: q.Name, Priority: q.Priority, QuotaMilli: q.QuotaMilli, LimitMilli: q.LimitMilli, AllocatedMilli: q.allocated, FairShareMilli: q.fairShare,
		CPU:    ResourceUsage{Quota: q.CPU.Quota, Limit: q.CPU.Limit, Allocated: q.cpu.alloc, FairShare: q.cpu.fairShare},
		Memory: ResourceUsage{Quota: q.Memory.Quota, Limit: q.Memory.Limit, Allocated: q.memory.alloc, FairShare: q.memory.fairShare},
	}
}

// checkQuota asks the quota policy whether q may take members of w now,
// holding milli milli-GPUs and requesting the members' CPU and memory,
// with the headroom held for heads of line counted as held (headroom.go).
func (c *cycle) checkQuota(q *queueState, w *Workload, members []*Member, milli int64) (*QuotaVerdict, error) {
	v, _, err := c.quotaVerdict(q, w, members, milli)
	return v, err
}

// quotaVerdict is checkQuota, and reports too whether the verdict turns w
// away only for the headroom held for heads of line (held back).
func (c *cycle) quotaVerdict(q *queueState, w *Workload, members []*Member, milli int64) (v *QuotaVerdict, heldBack bool, err error) {
	if c.quota == nil {
		return &QuotaVerdict{Allowed: true}, false, nil
	}
	if len(c.headrooms) > 0 {
		return c.quotaWithHeadroom(q, w, members, milli)
	}
	v, err = c.quota.CheckQuota(c.ctx, c.quotaRequest(q, w, members, milli))
	return v, false, err
}

// quotaRequest is the question checkQuota asks, with the queues' usage now.
func (c *cycle) quotaRequest(q *queueState, w *Workload, members []*Member, milli int64) *QuotaRequest {
	req := &QuotaRequest{Workload: w, Members: len(members), GPUMilli: milli, Queue: q.usage(),
		ClusterMilli: c.clusterMilli, ClusterCPUMilli: c.clusterCPU, ClusterMemory: c.clusterMemory}
	for _, m := range members {
		req.CPUMilli += m.CPUMilli
		req.Memory += m.Memory
	}
	for a := q.parent; a != nil; a = a.parent {
		req.Ancestors = append(req.Ancestors, a.usage())
	}
	return req
}

// charge records a member's CPU and memory, and the pod itself, on its
// node for the rest of the cycle.
func (c *cycle) charge(node string, m *Member) {
	if node == "" {
		// A claim member kube-scheduler places: no node of the cycle's.
		return
	}
	e := c.extra[node]
	if e == nil {
		e = &[3]int64{}
		c.extra[node] = e
	}
	e[0] += m.CPUMilli
	e[1] += m.Memory
	e[2]++
}

func (c *cycle) result() *Result {
	r := &Result{Admissions: c.admissions, Waiting: c.waiting, Evictions: c.evictions, Rooms: c.roomReports(),
		ClusterMilli: c.clusterMilli, ClusterCPUMilli: c.clusterCPU, ClusterMemory: c.clusterMemory}
	names := make([]string, 0, len(c.queues))
	for name := range c.queues {
		names = append(names, name)
	}
	slices.Sort(names)
	waiting := map[string]int32{}
	for _, q := range c.queues {
		for a := q; a != nil; a = a.parent {
			waiting[a.Name] += q.waiting
		}
	}
	for _, name := range names {
		q := c.queues[name]
		r.Queues = append(r.Queues, QueueReport{
			Name: name, AllocatedMilli: q.allocated, RequestedMilli: q.allocated + max(0, q.pending),
			FairShareMilli: q.fairShare, PendingWorkloads: waiting[name], Children: q.Children,
			CPU:    ResourceReport{Allocated: q.cpu.alloc, Requested: q.cpu.alloc + max(0, q.cpu.pending), FairShare: q.cpu.fairShare},
			Memory: ResourceReport{Allocated: q.memory.alloc, Requested: q.memory.alloc + max(0, q.memory.pending), FairShare: q.memory.fairShare},
		})
		if c.opts.Usage != nil {
			base := q.baseShare
			r.Queues[len(r.Queues)-1].FairShareWithoutUsage = &base
		}
	}
	return r
}

// capacityMessage says how much of a gang fits now, with the closest node's
// numbers for a single pod.
func capacityMessage(w *Workload, members []*Member, err error) string {
	shape := describeMembers(members)
	var re *roomError
	if errors.As(err, &re) {
		// The GPUs are not what it waits for: say what is.
		if w.Key.IsGang() {
			return fmt.Sprintf("gang needs %s; %v", shape, re)
		}
		return fmt.Sprintf("pod needs %s; %v", shape, re)
	}
	var ge *gpu.GangError
	if len(members) > 1 && errors.As(err, &ge) {
		if ge.Member == 0 && errors.Is(err, errNoCandidate) {
			return fmt.Sprintf("gang needs %s; none fit now: %v", shape, errNoCandidate)
		}
		if gpu.IsAgentSilent(err) {
			// The gang would fit but for a node nobody watches: say so.
			return fmt.Sprintf("gang needs %s; at most %d fit now: %v", shape, ge.Member, ge.Cause)
		}
		return fmt.Sprintf("gang needs %s; at most %d fit now", shape, ge.Member)
	}
	var te *topologyError
	if errors.As(err, &te) {
		if w.Key.IsGang() {
			return fmt.Sprintf("gang needs %s; %v", shape, te)
		}
		return fmt.Sprintf("pod needs %s; %v", shape, te)
	}
	cause := err
	if errors.As(err, &ge) {
		cause = ge.Cause
	}
	if w.Key.IsGang() {
		return fmt.Sprintf("gang needs %s; it does not fit now: %v", shape, cause)
	}
	return fmt.Sprintf("pod needs %s; no node has room now: %v", shape, cause)
}

// describeMembers is "8 × 1 GPU" for alike members, else each in turn.
func describeMembers(members []*Member) string {
	if len(members) == 0 {
		return "nothing"
	}
	first := describeMember(members[0])
	for _, m := range members[1:] {
		if describeMember(m) != first {
			parts := make([]string, len(members))
			for i, m := range members {
				parts[i] = describeMember(m)
			}
			return strings.Join(parts, " + ")
		}
	}
	if len(members) == 1 {
		return first
	}
	return fmt.Sprintf("%d × %s", len(members), first)
}

// describeMember is one member's request in words: its Partita request, or
// for a member with ResourceClaims "2 GPUs through ResourceClaims".
func describeMember(m *Member) string {
	if m.Claims == nil {
		return describeRequest(m.Request)
	}
	unit := " GPUs"
	if m.GPUMilli <= gpu.MilliPerGPU {
		unit = " GPU"
	}
	return gpu.FormatMilli(m.GPUMilli) + unit + " through ResourceClaims"
}

// describeRequest is one pod's request in words: "1 GPU", "0.5 GPU",
// "2 GPUs", "20480MiB of GPU memory".
func describeRequest(r *gpu.PodRequest) string {
	if r == nil {
		return "no GPU"
	}
	parts := make([]string, 0, len(r.Containers))
	for _, ct := range r.Containers {
		var s string
		switch {
		case ct.MemoryMiB > 0:
			s = fmt.Sprintf("%dMiB of GPU memory", ct.MemoryMiB)
			if ct.Count > 1 {
				s = fmt.Sprintf("%d devices with %s each", ct.Count, s)
			}
		case ct.Milli == gpu.MilliPerGPU && ct.Count == 1:
			s = "1 GPU"
		case ct.Milli == gpu.MilliPerGPU:
			s = fmt.Sprintf("%d GPUs", ct.Count)
		case ct.Count == 1:
			s = gpu.FormatMilli(ct.Milli) + " GPU"
		default:
			s = fmt.Sprintf("%d devices with %s GPU each", ct.Count, gpu.FormatMilli(ct.Milli))
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " and ")
}
