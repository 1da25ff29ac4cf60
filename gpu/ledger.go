package gpu

import (
	"fmt"
	"hash/maphash"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Ledger is the per-device accounting of GPU slices, derived from GPUNodes
// and pods (DESIGN §3): informers feed it with UpsertNode, DeleteNode,
// UpsertPod and DeletePod; bind and the admitter record decisions at once
// with Assume, before the pod shows them.
//
// It is safe for concurrent use. Every method that returns state returns a
// copy.
type Ledger struct {
	lock sync.RWMutex
	v    view
	// nodeIdxShared is set while a snapshot may hold v.nodeIdx; the next
	// write clones the map first. Atomic because Snapshot sets it under the
	// read lock.
	nodeIdxShared atomic.Bool
	// pods are every pod that holds devices, assumed or seen, by UID; the
	// same entries as in the nodes' pod lists.
	pods map[types.UID]*podEntry
	// garbage counts abandoned device slots and node slots since the last
	// compaction.
	garbage int
	// reserved are the entries read from pods' reservations (they expire),
	// by UID: a subset of pods.
	reserved map[types.UID]*podEntry
	clock    Clock
}

// Clock tells the time; k8s.io/utils/clock's clocks are Clocks.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// LedgerOption configures a Ledger.
type LedgerOption func(*Ledger)

// WithClock sets the clock that reservations expire by (the real clock by
// default).
func WithClock(c Clock) LedgerOption { return func(l *Ledger) { l.clock = c } }

// NewLedger returns an empty ledger.
func NewLedger(opts ...LedgerOption) *Ledger {
	l := &Ledger{
		v:        view{nodeIdx: map[string]int32{}, tenantSeed: maphash.MakeSeed()},
		pods:     map[types.UID]*podEntry{},
		reserved: map[types.UID]*podEntry{},
		clock:    realClock{},
	}
	for _, o := range opts {
		o(l)
	}
	return l
}

// BuildLedger returns the ledger of the given objects, as if each had been
// upserted in turn. The same objects give the same State at the same time
// (reservations expire by the ledger's clock, see WithClock).
func BuildLedger(nodes []v1alpha1.GPUNode, pods []corev1.Pod, opts ...LedgerOption) *Ledger {
	l := NewLedger(opts...)
	now := l.clock.Now()
	for i := range nodes {
		l.upsertNode(InventoryFromGPUNode(&nodes[i]), heartbeatOf(&nodes[i]))
	}
	for i := range pods {
		l.upsertPod(&pods[i], entryFromPod(&pods[i], now))
	}
	return l
}

// UpsertNode adds or updates a node's inventory. The node's pods are counted
// again against the new inventory; allocations on devices that turned
// unhealthy stay (see Stranded), and nothing new goes there.
//
// The agent must report a lost device as Unhealthy rather than drop it: an
// allocation on a device missing from the inventory is not counted, so the
// device could be given again if it came back.
func (l *Ledger) UpsertNode(node *v1alpha1.GPUNode) {
	inv := InventoryFromGPUNode(node)
	l.lock.Lock()
	defer l.lock.Unlock()
	l.upsertNode(inv, heartbeatOf(node))
}

// DeleteNode removes a node's inventory. Its pods are kept, and counted again
// if the node comes back.
func (l *Ledger) DeleteNode(name string) {
	l.lock.Lock()
	defer l.lock.Unlock()
	slot, ok := l.v.slot(name)
	if !ok || !l.v.nodes[slot].present() {
		return
	}
	n := &l.v.nodes[slot]
	l.v.inventoryEpoch++
	l.garbage += int(n.capacity) + 1
	n.inv, n.first, n.n, n.capacity = nil, 0, 0, 0
	n.heartbeat, n.silent = time.Time{}, nil
	l.maybeCompact()
}

// UpsertPod adds or updates a pod. A bound pod with allocation annotations
// holds its devices (counted once its node's GPUNode is known); so does an
// unbound pod with a reservation (partita.dev/reservation, see Reservation)
// until it expires; a pod that Succeeded or Failed frees them (a terminating
// pod still holds them, as its containers may still run). An update that
// shows no allocation yet (the pod is not bound) keeps a decision recorded
// by Assume. Pods without a UID are ignored.
func (l *Ledger) UpsertPod(pod *corev1.Pod) {
	e := entryFromPod(pod, l.clock.Now())
	l.lock.Lock()
	defer l.lock.Unlock()
	l.upsertPod(pod, e)
}

// DeletePod removes a pod and frees what it held, assumed or seen.
func (l *Ledger) DeletePod(uid types.UID) {
	l.lock.Lock()
	defer l.lock.Unlock()
	if e := l.pods[uid]; e != nil {
		l.removeEntry(e)
	}
}

// Assume records a bind decision at once, before the pod shows it. It
// refuses, with an *InsufficientError, a *NodeNotFoundError or an
// *InvalidAllocationError, an allocation that would break an invariant, so
// that two concurrent binds never get the same slice. Assuming the same
// devices for a pod again is a no-op; different ones return
// ErrAlreadyAllocated.
func (l *Ledger) Assume(a *PodAllocation) error {
	l.lock.Lock()
	defer l.lock.Unlock()
	if old := l.pods[a.UID]; old != nil && a.UID != "" {
		return sameOrConflict(&l.v, old, a)
	}
	e, err := l.v.assumeEntry(a, false)
	if err != nil {
		return fmt.Errorf("assume pod %s/%s: %w", a.Namespace, a.Name, err)
	}
	l.addEntry(e)
	return nil
}

// Forget drops a decision recorded by Assume that the pod does not show yet
// (the bind failed, or a reservation expired). What a pod shows stays until
// the pod ends or is deleted, or, for a reservation the pod carries, until
// it expires (ExpireReservations).
func (l *Ledger) Forget(uid types.UID) {
	l.lock.Lock()
	defer l.lock.Unlock()
	if e := l.pods[uid]; e != nil && e.assumed {
		l.removeEntry(e)
	}
}

// ExpireReservations drops the reservations read from pods that have
// expired by the ledger's clock, and returns how many. Upserting a pod
// ignores an expired reservation; this drops those whose pods did not
// change since. Callers run it every second or so.
func (l *Ledger) ExpireReservations() int {
	now := l.clock.Now()
	l.lock.Lock()
	defer l.lock.Unlock()
	n := 0
	for _, e := range l.reserved {
		if !now.Before(e.expires) && !e.untilTried {
			l.removeEntry(e)
			n++
		}
	}
	return n
}

// Heartbeats returns the latest agent heartbeat of every node with an
// inventory and one.
func (l *Ledger) Heartbeats() map[string]time.Time {
	l.lock.RLock()
	defer l.lock.RUnlock()
	out := make(map[string]time.Time, len(l.v.nodes))
	for i := range l.v.nodes {
		if n := &l.v.nodes[i]; n.present() && !n.heartbeat.IsZero() {
			out[n.name] = n.heartbeat
		}
	}
	return out
}

// SetAgentSilent marks node's agent silent (e non-nil) or reporting (nil).
// A silent node takes no new pods: Fit, Choose and Assume answer e, Score
// gives 0 and gangs are placed elsewhere; what it holds stays counted. The
// mark is ignored, and cleared later, once the node shows a heartbeat newer
// than e.LastHeartbeat: an agent that reports again is not silent.
func (l *Ledger) SetAgentSilent(node string, e *AgentSilentError) {
	l.lock.Lock()
	defer l.lock.Unlock()
	slot, ok := l.v.slot(node)
	if !ok {
		return
	}
	n := &l.v.nodes[slot]
	if e != nil {
		if n.heartbeat.After(e.LastHeartbeat) {
			return
		}
		c := *e
		c.Node = node
		e = &c
	}
	n.silent = e
}

// SilentAgents returns the nodes whose agent is marked silent, by name.
func (l *Ledger) SilentAgents() []AgentSilentError {
	l.lock.RLock()
	defer l.lock.RUnlock()
	var out []AgentSilentError
	for i := range l.v.nodes {
		if n := &l.v.nodes[i]; n.silent != nil && n.present() {
			out = append(out, *n.silent)
		}
	}
	slices.SortFunc(out, func(a, b AgentSilentError) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// Fit reports whether req fits node now, as Choose would place it with the
// pod's own placement: nil, a *NodeNotFoundError, or an *InsufficientError
// with the numbers. (Placement changes the answer only for pods with several
// GPU containers of several devices each, which greedy placement may fit in
// one order and not the other.)
func (l *Ledger) Fit(node string, req *PodRequest) error {
	l.lock.RLock()
	defer l.lock.RUnlock()
	return l.v.fit(node, req)
}

// Choose picks devices on node for every GPU container of req. Binpack (the
// default) gives each container the fullest devices that still fit, spread
// the emptiest; ties go to the lower index; a container's whole devices are
// never shared with another container; a multi-device slice takes devices of
// one memory size. An empty placement means the pod's own, else binpack.
// Choose records nothing: pass the result to Assume.
func (l *Ledger) Choose(node string, req *PodRequest, placement Placement) (*PodAllocation, error) {
	l.lock.RLock()
	defer l.lock.RUnlock()
	return l.v.choose(node, req, placement)
}

// Score rates node for req from 0 to MaxScore, 0 when it does not fit.
// Binpack favours fuller devices, fuller nodes and nodes with fewer partly
// used devices; spread favours emptier devices and nodes.
func (l *Ledger) Score(node string, req *PodRequest, placement Placement) int64 {
	l.lock.RLock()
	defer l.lock.RUnlock()
	return l.v.score(node, req, placement)
}

// Snapshot returns a copy of the ledger to try placements on and throw away.
func (l *Ledger) Snapshot() *Snapshot {
	s := &Snapshot{}
	l.Refresh(s)
	return s
}

// Refresh makes s a fresh snapshot of the ledger, reusing its memory: the
// admission loop can keep one Snapshot and refresh it every cycle, which
// copies without allocating. Nothing else may still use s.
func (l *Ledger) Refresh(s *Snapshot) {
	l.lock.RLock()
	defer l.lock.RUnlock()
	l.nodeIdxShared.Store(true)
	clear(s.v.nodes)
	*s = Snapshot{v: view{
		nodes:          append(s.v.nodes[:0], l.v.nodes...),
		devices:        append(s.v.devices[:0], l.v.devices...),
		nodeIdx:        l.v.nodeIdx,
		inventoryEpoch: l.v.inventoryEpoch,
		tenantSeed:     l.v.tenantSeed,
	}}
}

// Allocation returns what the pod holds, assumed or seen.
func (l *Ledger) Allocation(uid types.UID) (*PodAllocation, bool) {
	l.lock.RLock()
	defer l.lock.RUnlock()
	e := l.pods[uid]
	if e == nil {
		return nil, false
	}
	var inv *NodeInventory
	if n, ok := l.v.presentNode(e.node); ok {
		inv = n.inv
	}
	return e.allocation(inv), true
}

// Node returns a node's inventory.
func (l *Ledger) Node(name string) (*NodeInventory, bool) {
	l.lock.RLock()
	defer l.lock.RUnlock()
	n, ok := l.v.presentNode(name)
	if !ok {
		return nil, false
	}
	return n.inv.clone(), true
}

// Nodes returns the names of the nodes with an inventory, sorted.
func (l *Ledger) Nodes() []string {
	l.lock.RLock()
	defer l.lock.RUnlock()
	return l.v.sortedNodeNames()
}

// MaxDeviceMemoryMiB is the memory of the largest device in the ledger, the
// reference for MilliResource; 0 when there is none.
func (l *Ledger) MaxDeviceMemoryMiB() int64 {
	l.lock.RLock()
	defer l.lock.RUnlock()
	var out int64
	for i := range l.v.nodes {
		n := &l.v.nodes[i]
		for _, d := range l.v.devs(n) {
			out = max(out, d.memoryMiB)
		}
	}
	return out
}

func (l *Ledger) upsertNode(inv *NodeInventory, heartbeat time.Time) {
	slot := l.slotFor(inv.Name)
	n := &l.v.nodes[slot]
	if heartbeat.After(n.heartbeat) {
		n.heartbeat = heartbeat
		if n.silent != nil && heartbeat.After(n.silent.LastHeartbeat) {
			n.silent = nil // the agent reported again
		}
	}
	if n.present() && inventoryEqual(n.inv, inv) {
		return
	}
	l.v.inventoryEpoch++
	want := int32(len(inv.Devices))
	if want > n.capacity {
		l.garbage += int(n.capacity)
		n.first, n.capacity = int32(len(l.v.devices)), want
		l.v.devices = append(l.v.devices, make([]deviceState, want)...)
	}
	n.n, n.inv = want, inv
	devs := l.v.devs(n)
	for j, d := range inv.Devices {
		// Another DRA driver's device takes nothing from the ledger, but
		// its pods still hold it: it counts in the capacity (foreign).
		devs[j] = deviceState{memoryMiB: d.MemoryMiB, index: d.Index, healthy: d.Healthy && d.DRADriver == "", foreign: d.Healthy && d.DRADriver != "",
			oneTenant: inv.Isolation == v1alpha1.IsolationMPS}
	}
	for _, e := range n.pods {
		l.v.charge(n, e, 1)
	}
	l.maybeCompact()
}

func (l *Ledger) upsertPod(pod *corev1.Pod, e *podEntry) {
	if pod.UID == "" {
		return
	}
	old := l.pods[pod.UID]
	switch {
	case e == nil:
		terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
		if old != nil && (terminal || !old.assumed) {
			l.removeEntry(old)
		}
	case old == nil:
		l.addEntry(e)
	case old.equal(e):
	default:
		l.removeEntry(old)
		l.addEntry(e)
	}
}

// slotFor returns the node's slot, adding an absent one if needed.
func (l *Ledger) slotFor(name string) int32 {
	if i, ok := l.v.nodeIdx[name]; ok {
		return i
	}
	l.ownNodeIdx()
	i := int32(len(l.v.nodes))
	l.v.nodes = append(l.v.nodes, nodeState{name: name})
	l.v.nodeIdx[name] = i
	return i
}

// ownNodeIdx clones the node index if a snapshot may hold it.
func (l *Ledger) ownNodeIdx() {
	if l.nodeIdxShared.Load() {
		l.v.nodeIdx = maps.Clone(l.v.nodeIdx)
		l.nodeIdxShared.Store(false)
	}
}

func (l *Ledger) addEntry(e *podEntry) {
	n := &l.v.nodes[l.slotFor(e.node)]
	n.pods = append(n.pods[:len(n.pods):len(n.pods)], e)
	l.v.charge(n, e, 1)
	l.pods[e.uid] = e
	if !e.expires.IsZero() {
		l.reserved[e.uid] = e
	}
}

func (l *Ledger) removeEntry(e *podEntry) {
	delete(l.pods, e.uid)
	delete(l.reserved, e.uid)
	slot, ok := l.v.slot(e.node)
	if !ok {
		return
	}
	n := &l.v.nodes[slot]
	l.v.charge(n, e, -1)
	n.pods = without(n.pods, e)
	if !n.present() && len(n.pods) == 0 {
		l.garbage++
		l.maybeCompact()
	}
}

// without returns a new slice of pods without e.
func without(pods []*podEntry, e *podEntry) []*podEntry {
	i := slices.Index(pods, e)
	if i < 0 {
		return pods
	}
	if len(pods) == 1 {
		return nil
	}
	out := make([]*podEntry, 0, len(pods)-1)
	out = append(out, pods[:i]...)
	return append(out, pods[i+1:]...)
}

// maybeCompact rebuilds the flat slices once abandoned slots make up half of
// them, so that node churn does not grow them without bound.
func (l *Ledger) maybeCompact() {
	if l.garbage < 1024 || 2*l.garbage < len(l.v.devices)+len(l.v.nodes) {
		return
	}
	nodes := make([]nodeState, 0, len(l.v.nodes))
	devices := make([]deviceState, 0, len(l.v.devices))
	idx := make(map[string]int32, len(l.v.nodes))
	for i := range l.v.nodes {
		n := l.v.nodes[i]
		if !n.present() && len(n.pods) == 0 {
			continue
		}
		if n.present() {
			devs := l.v.devs(&n)
			n.first, n.capacity = int32(len(devices)), n.n
			devices = append(devices, devs...)
		}
		idx[n.name] = int32(len(nodes))
		nodes = append(nodes, n)
	}
	l.v = view{nodes: nodes, devices: devices, nodeIdx: idx, inventoryEpoch: l.v.inventoryEpoch, tenantSeed: l.v.tenantSeed}
	l.nodeIdxShared.Store(false)
	l.garbage = 0
}

func inventoryEqual(a, b *NodeInventory) bool {
	return a.Name == b.Name && a.Isolation == b.Isolation && slices.Equal(a.Devices, b.Devices)
}

// sameOrConflict is Assume's answer for a pod that already holds devices.
func sameOrConflict(v *view, old *podEntry, a *PodAllocation) error {
	e := &podEntry{node: a.Node}
	n, _ := v.presentNode(a.Node)
	for _, ca := range a.Containers {
		ec := entryContainer{name: ca.Container, uuids: ca.DeviceUUIDs}
		if len(ec.uuids) == 0 && n != nil {
			for _, idx := range ca.DeviceIndexes {
				if d, ok := n.inv.DeviceByIndex(idx); ok {
					ec.uuids = append(ec.uuids, d.UUID)
				}
			}
		}
		e.containers = append(e.containers, ec)
	}
	if old.sameDevices(e) {
		return nil
	}
	return fmt.Errorf("assume pod %s/%s: %w", a.Namespace, a.Name, ErrAlreadyAllocated)
}

// entryFromPod reads what a pod holds at now: nil when it holds nothing
// (not bound and no live reservation, no allocation annotations, or
// finished). It reads leniently, because the pod's annotations are the
// truth whatever they say: problems are kept in the entry (see Stranded),
// and a container whose request cannot be read counts as holding its
// devices whole, or its memory limit.
func entryFromPod(pod *corev1.Pod, now time.Time) *podEntry {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	if pod.Spec.NodeName == "" {
		return reservedEntry(pod, now)
	}
	anns, err := readAllocationAnnotations(pod.Annotations)
	if len(anns) == 0 {
		return nil
	}
	e := &podEntry{namespace: pod.Namespace, name: pod.Name, uid: pod.UID, node: pod.Spec.NodeName}
	var problems []string
	if err != nil {
		problems = append(problems, err.Error())
	}
	if n, ok := pod.Annotations[v1alpha1.AnnotationNode]; ok && n != pod.Spec.NodeName {
		problems = append(problems, fmt.Sprintf("%s is %q but the pod is bound to %q", v1alpha1.AnnotationNode, n, pod.Spec.NodeName))
	}
	req, errs := ParsePod(pod)
	switch {
	case len(errs) > 0:
		problems = append(problems, "request: "+errs.ToAggregate().Error())
	case req == nil:
		problems = append(problems, "devices but no GPU request")
	}
	used := make([]bool, len(anns))
	if req != nil {
		for _, rc := range req.Containers {
			ec := entryContainer{name: rc.Name, wantCount: rc.Count}
			switch {
			case rc.MemoryMiB > 0:
				ec.reqMemMiB = rc.MemoryMiB
			default:
				ec.milli = rc.Milli
			}
			if i := slices.IndexFunc(anns, func(a annotatedContainer) bool { return a.name == rc.Name }); i >= 0 {
				used[i] = true
				ec.uuids, ec.memMiB, ec.smPercent = anns[i].uuids, anns[i].memLimitMiB, anns[i].smPercent
			} else {
				problems = append(problems, fmt.Sprintf("container %s asks for GPUs but has no devices", rc.Name))
			}
			e.containers = append(e.containers, ec)
		}
	}
	for i, a := range anns {
		if used[i] {
			continue
		}
		ec := entryContainer{name: a.name, uuids: a.uuids, wantCount: -1, memMiB: a.memLimitMiB, smPercent: a.smPercent}
		if req != nil {
			ec.wantCount = 0
			problems = append(problems, fmt.Sprintf("container %s has devices but asks for no GPU", a.name))
		}
		if a.memLimitMiB > 0 {
			ec.reqMemMiB = a.memLimitMiB
		} else {
			ec.milli = MilliPerGPU
		}
		e.containers = append(e.containers, ec)
	}
	e.problem = strings.Join(problems, "; ")
	return e
}
