package gpu

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Snapshot is a copy of a Ledger taken at one moment, for the admission loop
// to try placements on (a whole gang, or a gang after evicting victims) and
// throw away. It is not safe for concurrent use and takes no locks.
//
// Taking one copies two flat slices (nodes, and every device as a value
// without pointers) and shares what never changes in place: the node-name
// index (cloned by the ledger on its next write) and the per-node pod lists.
type Snapshot struct {
	v view
	// assumed maps the UIDs of pods assumed on the snapshot to node slots.
	assumed map[types.UID]int32
	// index maps the UIDs of all the snapshot's pods to node slots. It is
	// built once Forget and Allocation have looked for pods not assumed here
	// more than scansBeforeIndex times; until then they scan.
	index map[types.UID]int32
	scans int
	// sorted are the present nodes' slots in name order, built on first use.
	sorted []int32
	// changed are the slots of the nodes whose pods changed on the snapshot
	// (assumed, restored, forgotten), in order, repeats kept: Changes.
	changed []int32
}

// Changes are the nodes whose pods changed on the snapshot since mark (0
// for since it was taken), possibly repeated, and the mark to pass next:
// what lets a caller keep sums over nodes (free room by topology domain)
// up to date without reading every node again.
func (s *Snapshot) Changes(mark int) (nodes []string, next int) {
	if mark >= len(s.changed) {
		return nil, len(s.changed)
	}
	nodes = make([]string, 0, len(s.changed)-mark)
	for _, slot := range s.changed[mark:] {
		nodes = append(nodes, s.v.nodes[slot].name)
	}
	return nodes, len(s.changed)
}

// Fit is Ledger.Fit on the snapshot.
func (s *Snapshot) Fit(node string, req *PodRequest) error {
	return s.v.fit(node, req)
}

// Choose is Ledger.Choose on the snapshot.
func (s *Snapshot) Choose(node string, req *PodRequest, placement Placement) (*PodAllocation, error) {
	return s.v.choose(node, req, placement)
}

// Score is Ledger.Score on the snapshot.
func (s *Snapshot) Score(node string, req *PodRequest, placement Placement) int64 {
	return s.v.score(node, req, placement)
}

// Nodes returns the names of the nodes with an inventory, sorted.
func (s *Snapshot) Nodes() []string {
	slots := s.sortedSlots()
	out := make([]string, len(slots))
	for i, slot := range slots {
		out[i] = s.v.nodes[slot].name
	}
	return out
}

// Assume is Ledger.Assume on the snapshot, with one difference that keeps it
// cheap: it finds a pod that already holds devices if the pod was assumed on
// this snapshot or holds devices on the same node, but not a pod that holds
// devices on another node in the ledger; Ledger.Assume, which the admitter
// calls next, refuses that one.
func (s *Snapshot) Assume(a *PodAllocation) error {
	return s.assume(a, false)
}

// Restore is Assume for an allocation taken off the snapshot with Forget,
// to try a placement without it: it goes back onto its devices even if
// they are withheld (Withhold).
func (s *Snapshot) Restore(a *PodAllocation) error {
	return s.assume(a, true)
}

func (s *Snapshot) assume(a *PodAllocation, restore bool) error {
	if old := s.find(a.UID, a.Node); old != nil && a.UID != "" {
		return sameOrConflict(&s.v, old, a)
	}
	e, err := s.v.assumeEntry(a, restore)
	if err != nil {
		return fmt.Errorf("assume pod %s/%s: %w", a.Namespace, a.Name, err)
	}
	slot, _ := s.v.slot(e.node)
	n := &s.v.nodes[slot]
	n.pods = append(n.pods[:len(n.pods):len(n.pods)], e)
	s.v.charge(n, e, 1)
	s.changed = append(s.changed, slot)
	if s.assumed == nil {
		s.assumed = map[types.UID]int32{}
	}
	s.assumed[e.uid] = slot
	if s.index != nil {
		s.index[e.uid] = slot
	}
	return nil
}

// find returns the entry of uid if it was assumed on the snapshot, is on
// node, or (once the index is built) anywhere.
func (s *Snapshot) find(uid types.UID, node string) *podEntry {
	if slot, ok := s.assumed[uid]; ok {
		return entryOn(&s.v.nodes[slot], uid)
	}
	if s.index != nil {
		if slot, ok := s.index[uid]; ok {
			return entryOn(&s.v.nodes[slot], uid)
		}
		return nil
	}
	if slot, ok := s.v.slot(node); ok {
		return entryOn(&s.v.nodes[slot], uid)
	}
	return nil
}

// HeldMilli is what the pod holds on the snapshot, in milli-GPUs: the share
// the ledger charges each device the pod holds, summed. That share is a
// fraction's milli, 1000 for a whole device, and for a memory request
// ceil(1000 × memory / the device's memory), at most 1000: a 20Gi slice
// holds 890 of a 23034 MiB L4 and 143 of a 143771 MiB H200. Devices the
// node's inventory no longer lists hold nothing, as in the ledger. node is
// where to look for a pod not assumed on the snapshot (its spec.nodeName,
// or the node of its reservation); false when the pod holds nothing there
// or the node has no inventory.
func (s *Snapshot) HeldMilli(uid types.UID, node string) (int64, bool) {
	var n *nodeState
	switch slot, ok := s.assumed[uid]; {
	case ok:
		n = &s.v.nodes[slot]
	case s.index != nil:
		if slot, ok := s.index[uid]; ok {
			n = &s.v.nodes[slot]
		}
	default:
		if slot, ok := s.v.slot(node); ok {
			n = &s.v.nodes[slot]
		}
	}
	if n == nil || !n.present() {
		return 0, false
	}
	e := entryOn(n, uid)
	if e == nil {
		return 0, false
	}
	return s.v.held(n, e), true
}

// Withhold keeps the devices uuids of node from new placements on the
// snapshot (Fit, Choose, PlaceGang and Assume skip or refuse them) until
// Unwithhold; what they hold stays, and Restore puts back there what was
// taken off. The admission loop holds room this way for a workload that
// has waited too long. It withholds all of them, or none and reports
// false when node has no inventory or one of them is missing, unhealthy
// or already withheld.
func (s *Snapshot) Withhold(node string, uuids []string) bool {
	n, ok := s.v.presentNode(node)
	if !ok {
		return false
	}
	devs := s.v.devs(n)
	idx := make([]int, 0, len(uuids))
	for _, u := range uuids {
		j := n.inv.position(u)
		if j < 0 || !devs[j].healthy || devs[j].withheld || slices.Contains(idx, j) {
			return false
		}
		idx = append(idx, j)
	}
	for _, j := range idx {
		devs[j].withheld = true
	}
	return true
}

// Unwithhold lets new placements onto devices Withhold kept from them.
func (s *Snapshot) Unwithhold(node string, uuids []string) {
	n, ok := s.v.presentNode(node)
	if !ok {
		return
	}
	devs := s.v.devs(n)
	for _, u := range uuids {
		if j := n.inv.position(u); j >= 0 {
			devs[j].withheld = false
		}
	}
}

// RoomMilli is the free share of node's devices uuids, withheld or not,
// in milli-GPUs: whether opening a withheld room could change a placement.
func (s *Snapshot) RoomMilli(node string, uuids []string) int64 {
	n, ok := s.v.presentNode(node)
	if !ok {
		return 0
	}
	devs := s.v.devs(n)
	var free int64
	for _, u := range uuids {
		if j := n.inv.position(u); j >= 0 && devs[j].healthy {
			free += freeMilli(&devs[j])
		}
	}
	return free
}

// PodsOn returns the UIDs of the pods that hold devices on node in the
// snapshot, the least holding first (then by UID).
func (s *Snapshot) PodsOn(node string) []types.UID {
	slot, ok := s.v.slot(node)
	if !ok {
		return nil
	}
	n := &s.v.nodes[slot]
	type held struct {
		uid   types.UID
		milli int64
	}
	hs := make([]held, 0, len(n.pods))
	for _, e := range n.pods {
		var m int64
		if n.present() {
			m = s.v.held(n, e)
		}
		hs = append(hs, held{e.uid, m})
	}
	slices.SortFunc(hs, func(a, b held) int {
		if a.milli != b.milli {
			return int(a.milli - b.milli)
		}
		return strings.Compare(string(a.uid), string(b.uid))
	})
	out := make([]types.UID, len(hs))
	for i, h := range hs {
		out[i] = h.uid
	}
	return out
}

// InventoryEpoch changes whenever a node's inventory in the ledger changes
// (a GPUNode added, removed, or its devices changed). What a pod that shows
// its devices holds (HeldMilli) depends only on those devices and the
// inventory, so a caller may keep it while the epoch stays.
func (s *Snapshot) InventoryEpoch() uint64 { return s.v.inventoryEpoch }

func entryOn(n *nodeState, uid types.UID) *podEntry {
	for _, e := range n.pods {
		if e.uid == uid {
			return e
		}
	}
	return nil
}

// scansBeforeIndex is how many lookups of pods not assumed on the snapshot
// scan every node's pods before the snapshot builds a UID index: a scan of
// 40,000 pods costs well under a millisecond, the index about ten.
const scansBeforeIndex = 8

// lookup returns the slot of the node that holds uid.
func (s *Snapshot) lookup(uid types.UID) (int32, bool) {
	if slot, ok := s.assumed[uid]; ok {
		return slot, true
	}
	if s.index == nil && s.scans < scansBeforeIndex {
		s.scans++
		for i := range s.v.nodes {
			if entryOn(&s.v.nodes[i], uid) != nil {
				return int32(i), true
			}
		}
		return 0, false
	}
	s.buildIndex()
	slot, ok := s.index[uid]
	return slot, ok
}

// Forget removes a pod from the snapshot, assumed or seen, and frees what it
// held: the admitter uses it to try a placement without preemption victims.
// Finding a pod not assumed on the snapshot scans every node's pods (about a
// millisecond for 40,000 pods); after scansBeforeIndex such scans the
// snapshot builds a UID index instead.
func (s *Snapshot) Forget(uid types.UID) {
	slot, ok := s.lookup(uid)
	if !ok {
		return
	}
	n := &s.v.nodes[slot]
	if e := entryOn(n, uid); e != nil {
		s.v.charge(n, e, -1)
		n.pods = without(n.pods, e)
		s.changed = append(s.changed, slot)
	}
	delete(s.assumed, uid)
	delete(s.index, uid)
}

// Allocation returns what the pod holds in the snapshot.
func (s *Snapshot) Allocation(uid types.UID) (*PodAllocation, bool) {
	slot, ok := s.lookup(uid)
	if !ok {
		return nil, false
	}
	n := &s.v.nodes[slot]
	if e := entryOn(n, uid); e != nil {
		return e.allocation(n.inv), true
	}
	return nil, false
}

// CheckInvariants is Ledger.CheckInvariants on the snapshot.
func (s *Snapshot) CheckInvariants() []error {
	return s.v.checkInvariants()
}

func (s *Snapshot) buildIndex() {
	if s.index != nil {
		return
	}
	total := 0
	for i := range s.v.nodes {
		total += len(s.v.nodes[i].pods)
	}
	s.index = make(map[types.UID]int32, total)
	for i := range s.v.nodes {
		for _, e := range s.v.nodes[i].pods {
			s.index[e.uid] = int32(i)
		}
	}
}

func (s *Snapshot) sortedSlots() []int32 {
	if s.sorted == nil {
		s.sorted = make([]int32, 0, len(s.v.nodes))
		for i := range s.v.nodes {
			if s.v.nodes[i].present() {
				s.sorted = append(s.sorted, int32(i))
			}
		}
		slices.SortFunc(s.sorted, func(a, b int32) int { return strings.Compare(s.v.nodes[a].name, s.v.nodes[b].name) })
	}
	return s.sorted
}

// PlaceGang places every member of a gang, or none: each member in turn goes
// to the candidate node that scores best for it (ties to the earlier
// candidate), and is assumed on the snapshot, so later members see it. If a
// member fits nowhere, the members placed so far are forgotten and a
// *GangError says which member failed and why, with the InsufficientError of
// the candidate that came closest.
//
// candidateNodes nil means every node, in name order; the admitter can pass
// the nodes of one topology domain, best first. An empty placement means each
// member's own, else binpack. Members need distinct UIDs.
//
// Members that ask alike share one score per candidate, computed once;
// after each placement only the chosen node is scored again.
func (s *Snapshot) PlaceGang(reqs []*PodRequest, candidateNodes []string, placement Placement) ([]*PodAllocation, error) {
	return s.PlaceGangCapped(reqs, candidateNodes, nil, placement)
}

// PlaceGangCapped is PlaceGang with a cap on how many members each candidate
// node may take (maxPods[i] for candidateNodes[i]; nil means no cap): the
// admitter caps nodes by the CPU and memory room they have for the members,
// which the GPU ledger does not know about.
func (s *Snapshot) PlaceGangCapped(reqs []*PodRequest, candidateNodes []string, maxPods []int, placement Placement) ([]*PodAllocation, error) {
	var slots []int32
	var room []int
	if candidateNodes == nil {
		slots = s.sortedSlots()
	} else {
		slots = make([]int32, 0, len(candidateNodes))
		for i, name := range candidateNodes {
			if n, ok := s.v.slot(name); ok && s.v.nodes[n].present() {
				if maxPods != nil {
					if maxPods[i] <= 0 {
						continue
					}
					room = append(room, maxPods[i])
				}
				slots = append(slots, n)
			}
		}
	}
	type group struct {
		req    *PodRequest
		pl     Placement
		scores []int64 // per candidate; -1 when the member does not fit
	}
	var groups []*group
	var sc scratch
	rescore := func(g *group, i int) {
		if room != nil && room[i] <= 0 {
			g.scores[i] = -1
			return
		}
		if v, ok := s.v.fineScore(slots[i], g.req, g.pl, &sc); ok {
			g.scores[i] = v
		} else {
			g.scores[i] = -1
		}
	}
	placed := make([]*PodAllocation, 0, len(reqs))
	fail := func(member int, uid types.UID, cause error) error {
		for _, a := range placed {
			s.Forget(a.UID)
		}
		return &GangError{Total: len(reqs), Member: member, UID: uid, Cause: cause}
	}
	for m, req := range reqs {
		if err := validRequest(req); err != nil {
			var uid types.UID
			if req != nil {
				uid = req.UID
			}
			return nil, fail(m, uid, err)
		}
		pl := effectivePlacement(placement, req)
		var g *group
		for _, h := range groups {
			if h.pl == pl && sameShape(h.req, req) {
				g = h
				break
			}
		}
		if g == nil {
			g = &group{req: req, pl: pl, scores: make([]int64, len(slots))}
			for i := range slots {
				rescore(g, i)
			}
			groups = append(groups, g)
		}
		best := -1
		for i, v := range g.scores {
			if v >= 0 && (best < 0 || v > g.scores[best]) {
				best = i
			}
		}
		if best < 0 {
			return nil, fail(m, req.UID, s.closest(slots, req, pl))
		}
		node := s.v.nodes[slots[best]].name
		a, err := s.v.choose(node, req, pl)
		if err == nil {
			err = s.Assume(a)
		}
		if err != nil {
			return nil, fail(m, req.UID, err)
		}
		placed = append(placed, a)
		if room != nil {
			room[best]--
		}
		for _, h := range groups {
			rescore(h, best)
		}
	}
	return placed, nil
}

// closest returns the InsufficientError of the candidate that came closest
// to fitting req: the most devices with room, then the most free share, then
// the most free memory.
func (s *Snapshot) closest(slots []int32, req *PodRequest, pl Placement) error {
	if len(slots) == 0 {
		return fmt.Errorf("no candidate node has a GPU inventory")
	}
	var best *InsufficientError
	var silent, silentFits, foreign error
	var sc scratch
	for _, slot := range slots {
		n := &s.v.nodes[slot]
		if drivers := n.inv.DRAManaged(); drivers != nil {
			// Another driver's GPUs: the reason to name when no node of
			// Partita's came closer.
			if foreign == nil {
				foreign = &DRAManagedError{Node: n.name, Drivers: drivers}
			}
			continue
		}
		tenant := s.v.tenantKey(n, req.Namespace)
		_, f, ok := place(s.v.devs(n), req, pl, tenant, &sc)
		if n.silent != nil {
			// A node whose agent is silent is the reason to name when it
			// would take the pod if its agent reported.
			if silent == nil {
				silent = n.silentError()
			}
			if ok && silentFits == nil {
				silentFits = n.silentError()
			}
			continue
		}
		if ok {
			continue
		}
		if best != nil && f.withRoom < best.DevicesWithRoom {
			continue
		}
		e := explain(n, s.v.devs(n), req, pl, tenant, f)
		if best == nil || e.CloserThan(best) {
			best = e
		}
	}
	switch {
	case silentFits != nil:
		return silentFits
	case best == nil && silent != nil:
		return silent
	case best == nil && foreign != nil:
		return foreign
	case best == nil:
		return fmt.Errorf("no candidate node fits %s", describe(req))
	}
	return best
}

// CloserThan reports whether e came closer to fitting than b: a node where
// the pod could fit once others leave beats one where it never can, then
// the node with more devices with room, then the most free share on one
// device, then the most free memory, then the smaller node name.
func (e *InsufficientError) CloserThan(b *InsufficientError) bool {
	if e.Unresolvable != b.Unresolvable {
		return !e.Unresolvable
	}
	if e.DevicesWithRoom != b.DevicesWithRoom {
		return e.DevicesWithRoom > b.DevicesWithRoom
	}
	if e.BestFreeMilli != b.BestFreeMilli {
		return e.BestFreeMilli > b.BestFreeMilli
	}
	if e.BestFreeMemoryMiB != b.BestFreeMemoryMiB {
		return e.BestFreeMemoryMiB > b.BestFreeMemoryMiB
	}
	return e.Node < b.Node
}

// CapacityMilli is the GPU capacity of the snapshot's healthy devices, in
// milli-GPUs: what fair share divides. Devices another DRA driver
// allocates count too: the pods holding them through claims are charged to
// queues like any other. Nodes whose agent is silent count:
// their devices are still there and their pods still run, and a brief
// silence (an agent restart) must not shrink every queue's fair share.
func (s *Snapshot) CapacityMilli() int64 {
	var total int64
	for i := range s.v.nodes {
		n := &s.v.nodes[i]
		if !n.present() {
			continue
		}
		for _, d := range s.v.devs(n) {
			if d.healthy || d.foreign {
				total += MilliPerGPU
			}
		}
	}
	return total
}

// FreeMilli is the free share of node's healthy devices, in milli-GPUs; 0
// for a node without an inventory or whose agent is silent.
func (s *Snapshot) FreeMilli(node string) int64 {
	slot, ok := s.v.slot(node)
	if !ok || !s.v.nodes[slot].present() || s.v.nodes[slot].silent != nil {
		return 0
	}
	var free int64
	for _, d := range s.v.devs(&s.v.nodes[slot]) {
		if d.healthy && d.whole == 0 && d.milli < MilliPerGPU {
			free += MilliPerGPU - d.milli
		}
	}
	return free
}
