package cycle

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// maxVictims bounds the workloads one search may evict for a workload of
// up to 32 GPUs (a larger one may take twice its GPUs' worth: victimCap),
// and the placements one search simulates after the victims released
// could hold the workload (the gang is placed again each time).
const maxVictims = 64

// spared is a workload that would be a victim but for Options.Unevictable.
type spared struct {
	w   *Workload
	q   string
	why string
}

// victim is a workload the search may evict, or (elastic) some of its
// elastic members beyond its minimum.
type victim struct {
	w *Workload
	q *queueState
	// members are what evicting the victim evicts: all of w.Active, or
	// elastic members.
	members []*Member
	reclaim bool
	elastic bool
}

// preempt looks for whole workloads whose eviction lets members of w fit
// (DESIGN §6): from queues over their fair share while w's queue stays
// within its own (reclaim), or of lower priority in w's queue (preemption).
// Workloads admitted less than PreemptMinRuntime ago, and those already
// being evicted, are spared. It evicts only for a placement it has
// simulated, and it reports whether w now waits for evictions (its wait is
// recorded); false means nothing can be evicted for it.
func (c *cycle) preempt(q *queueState, w *Workload, members []*Member) bool {
	if c.opts.DisablePreemption || q == nil || len(members) == 0 {
		return false
	}
	return c.evictFor(c.newSearch(q, w, members, nil))
}

// reclaimUnderLimit is preempt for w of queue q, which the quota policy
// turned away when it asked for asks, milli milli-GPUs: typically because
// an ancestor is at its limit, where a queue below its fair share is kept
// from it by a sibling above its own. It evicts the same victims as
// preempt would (reclaim, and preemption in w's queue), but only from the
// subtree of the lowest of w's queues whose limit w goes over (the
// victims' charge must come off that limit), and only for a set that the
// policy, asked again with the victims' charges taken off their queues and
// ancestors, allows, and after whose release members of w fit. It reports
// whether w now waits for evictions (its wait is recorded).
func (c *cycle) reclaimUnderLimit(q *queueState, w *Workload, asks []*Member, milli int64, members []*Member) bool {
	if c.opts.DisablePreemption || q == nil || c.quota == nil || len(members) == 0 {
		return false
	}
	at, scope := c.limitScope(q, asks, milli)
	return c.evictFor(c.newSearch(q, w, members, &underLimit{asks: asks, milli: milli, at: at, scope: scope}))
}

// underLimit is what a search for a workload the quota policy turned away
// must also satisfy: the policy allows asks, milli with the victims gone.
type underLimit struct {
	asks  []*Member
	milli int64
	// at is the lowest of the workload's queues whose limit it goes over
	// (limitScope), nil if none does by the numbers the cycle reads;
	// victims come from scope's subtree.
	at, scope *queueState
}

// limitScope returns the lowest of q and its ancestors whose GPU, CPU or
// memory limit q taking asks would go over now, as the default policy
// reads them, and the queue whose subtree victims must come from: that
// one, or, when the policy turned the workload away for a reason of its
// own, the top of q's tree. Evicting outside it frees nothing under the
// limit.
func (c *cycle) limitScope(q *queueState, asks []*Member, milli int64) (at, scope *queueState) {
	var cpu, memory int64
	for _, m := range asks {
		cpu, memory = cpu+m.CPUMilli, memory+m.Memory
	}
	for a := q; a != nil; a = a.parent {
		if over(a.LimitMilli, a.allocated+milli) || over(a.CPU.Limit, a.cpu.alloc+cpu) || over(a.Memory.Limit, a.memory.alloc+memory) {
			return a, a
		}
		scope = a
	}
	return nil, scope
}

// inSubtree reports whether q is root or below it.
func inSubtree(q, root *queueState) bool {
	for a := q; a != nil; a = a.parent {
		if a == root {
			return true
		}
	}
	return false
}

// where is " under queue org's limit", for the wait.
func (l *underLimit) where() string {
	if l.at == nil {
		return " under the quota policy (data.partita.quota)"
	}
	return fmt.Sprintf(" under queue %s's limit", l.at.Name)
}

// evictFor runs search s for its workload: it waits for pods already
// terminating if they make enough room, else evicts the victims s chooses.
// It reports whether the workload now waits (its wait is recorded).
func (c *cycle) evictFor(s *search) bool {
	q, w := s.q, s.w
	// Each search places the workload again, so a cycle bounds them, and
	// apart the looks at pods already terminating: preemptors waiting for
	// their victims to go must not use up the searches of those behind
	// them (the reclaim would go at the pace of pods terminating).
	maySearch := c.searches < c.opts.MaxPreemptionSearches || c.searchedMembers+len(s.members) <= c.opts.MaxSearchedMembers
	mayWait := c.terminatingLooks < maxTerminatingLooks*max(c.opts.MaxPreemptionSearches, c.opts.MaxSearchedMembers)
	if !maySearch && !mayWait {
		return false
	}
	// Elastic members beyond their gang's minimum go first, one by one.
	// Under a limit, only what is charged within it makes room there.
	var scope *queueState
	reason, where := v1alpha1.ReasonWaitingForCapacity, ""
	if s.lim != nil {
		scope = s.lim.scope
		reason, where = v1alpha1.ReasonWaitingForQuota, s.lim.where()
	}
	// The candidates go in a buffer the cycle's searches share: each lists
	// thousands at 500 nodes, and none keeps them past its search.
	cands := c.victimBuf[:0]
	defer func() { c.victimBuf = cands[:0] }()
	if maySearch {
		cands = append(cands, c.elasticVictims(q, w)...)
		if scope != nil {
			cands = slices.DeleteFunc(cands, func(v victim) bool { return !inSubtree(v.q, scope) })
		}
		cands = c.victims(cands, q, w, s.members, scope)
	}
	terminating := c.terminatingVictims()
	// waitFor counts the terminating members whose room w waits for.
	waitFor := 0
	for _, v := range terminating {
		if scope == nil || inSubtree(v.q, scope) {
			waitFor += len(v.members)
		}
	}
	// Without a look at the terminating room, a search could evict for
	// room that is already on its way.
	if (len(cands) == 0 && waitFor == 0) || (waitFor > 0 && !mayWait) {
		return false
	}
	// Pods already terminating free their room soon: if that is enough,
	// wait for them rather than evict more.
	for _, v := range terminating {
		s.release(v)
	}
	restoreTerminating := func() {
		for _, v := range terminating {
			s.restore(v)
		}
	}
	if waitFor > 0 {
		c.terminatingLooks++
		if s.mayFit() && s.fits() {
			restoreTerminating()
			c.move(q, s.need(), 1)
			c.holdFor(w, s.room)
			c.wait(w, reason, fmt.Sprintf("waiting for %d evicted or deleted pods to terminate to make room%s", waitFor, where))
			c.waiting[len(c.waiting)-1].Terminating = true
			return true
		}
	}
	if len(cands) == 0 {
		restoreTerminating()
		return false
	}
	c.searches++
	c.searchedMembers += len(s.members)
	chosen := s.choose(cands)
	if chosen == nil {
		restoreTerminating()
		return false
	}
	names := c.evict(s, chosen)
	restoreTerminating()
	c.holdFor(w, s.room)
	c.wait(w, reason, fmt.Sprintf("evicting %d workload(s) to make room%s: %s", len(chosen), where, strings.Join(names, ", ")))
	c.waiting[len(c.waiting)-1].Evicting = true
	return true
}

// maxTerminatingLooks bounds, as a multiple of the cycle's searches, the
// workloads a cycle places with the room of pods already terminating.
const maxTerminatingLooks = 8

// search simulates evictions for w of queue q: victims' members are taken
// off the snapshot (release) and put back (restore), and fits tells
// whether w's members are placed then (and, under a limit, whether the
// quota policy allows w).
type search struct {
	c       *cycle
	q       *queueState
	w       *Workload
	members []*Member
	saved   map[types.UID]*gpu.PodAllocation
	// claims: victims holding GPUs through ResourceClaims free them in the
	// claim simulation too, which places w's members when they carry
	// claims.
	claims ClaimSession
	// room keeps the devices of the last placement that fitted, which
	// every search leaves the snapshot in: what w waits for (holdFor).
	room []roomDevices
	// lim is set for a workload the quota policy turned away; off are the
	// charges of the released victims then, by the queue charged.
	lim *underLimit
	off map[*queueState][3]int64
	// needMilli is the least room w's members need, in milli-GPUs: what
	// those asking for fractions or whole devices ask (what a memory
	// request or a claim holds depends on the device: they count 0).
	// freed is what the released victims hold; freeMilli the free room of
	// the snapshot when mayFit first looked (withheld devices included: an
	// upper bound), freed being freedThen. Placing w is tried only once
	// the room free and released reaches needMilli, which it must to fit.
	needMilli, freed     int64
	freeMilli, freedThen int64
	freeKnown            bool
	heldMilli            map[types.UID]int64
}

func (c *cycle) newSearch(q *queueState, w *Workload, members []*Member, lim *underLimit) *search {
	s := &search{c: c, q: q, w: w, members: members, lim: lim, saved: map[types.UID]*gpu.PodAllocation{}}
	if slices.ContainsFunc(members, func(m *Member) bool { return len(m.Pod.Spec.ResourceClaims) > 0 }) {
		s.claims = c.claimSimulation()
	}
	if lim != nil {
		s.off = map[*queueState][3]int64{}
	}
	for _, m := range members {
		if !m.memory && m.Claims == nil {
			s.needMilli += m.GPUMilli
		}
	}
	if s.needMilli > 0 {
		s.heldMilli = map[types.UID]int64{}
	}
	return s
}

// mayFit reports whether the room free and released could hold w's
// members at all: fits is not worth its placement otherwise. The free
// room is summed once a search, when first needed: most searches of a
// cycle with thousands of waiting workloads end before.
func (s *search) mayFit() bool {
	if s.needMilli == 0 {
		return true
	}
	if !s.freeKnown {
		for _, n := range s.c.nodeNamesOnce() {
			s.freeMilli += s.c.snap.FreeMilli(n)
		}
		s.freedThen, s.freeKnown = s.freed, true
	}
	return s.freeMilli+s.freed-s.freedThen >= s.needMilli
}

// victimCap bounds the victims of one search: maxVictims, or twice the
// GPUs the workload needs (a 2,000-GPU gang reclaims 2,000 single-GPU
// workloads).
func (s *search) victimCap() int {
	return max(maxVictims, int(2*s.needMilli/gpu.MilliPerGPU))
}

func (s *search) release(v victim) {
	for _, m := range v.members {
		if a, ok := s.c.snap.Allocation(m.Pod.UID); ok {
			if s.heldMilli != nil {
				held, _ := s.c.snap.HeldMilli(m.Pod.UID, a.Node)
				s.heldMilli[m.Pod.UID] = held
				s.freed += held
			}
			s.saved[m.Pod.UID] = a
			s.c.snap.Forget(m.Pod.UID)
		}
		if s.claims != nil && len(m.Pod.Spec.ResourceClaims) > 0 {
			s.claims.Release(m.Pod)
		}
	}
	s.take(v, 1)
}

func (s *search) restore(v victim) {
	for _, m := range v.members {
		if a := s.saved[m.Pod.UID]; a != nil {
			_ = s.c.snap.Restore(a)
			delete(s.saved, m.Pod.UID)
			s.freed -= s.heldMilli[m.Pod.UID]
			delete(s.heldMilli, m.Pod.UID)
		}
		if s.claims != nil && len(m.Pod.Spec.ResourceClaims) > 0 {
			s.claims.Restore(m.Pod)
		}
	}
	s.take(v, -1)
}

// take records, under a limit, that v's charge is off its queue (sign 1)
// or back on it (-1).
func (s *search) take(v victim, sign int64) {
	if s.lim == nil || v.q == nil {
		return
	}
	ch := s.c.victimCharge(v)
	o := s.off[v.q]
	for i := range o {
		o[i] += sign * ch[i]
	}
	s.off[v.q] = o
}

// allowed asks the quota policy again about w, with the released
// victims' charges (take) off their queues and ancestors, and with the
// headroom held for heads of line still held: reclaim makes no room that
// a head is owed.
func (s *search) allowed() bool {
	apply := func(sign int64) {
		for vq, o := range s.off {
			for a := vq; a != nil; a = a.parent {
				a.allocated -= sign * o[0]
				a.cpu.alloc -= sign * o[1]
				a.memory.alloc -= sign * o[2]
			}
		}
	}
	apply(1)
	v, _, err := s.c.quotaVerdict(s.q, s.w, s.lim.asks, s.lim.milli)
	apply(-1)
	return err == nil && v.Allowed
}

// fits places w's members and takes them off again; under a limit the
// quota policy must allow w first.
func (s *search) fits() bool {
	if s.lim != nil && !s.allowed() {
		return false
	}
	placed, err := s.c.place(s.w, s.members, false)
	if err == nil {
		s.room = roomOf(placed)
	}
	for _, p := range placed {
		s.c.snap.Forget(p.Member.Pod.UID)
		if s.claims != nil && len(p.Member.Pod.Spec.ResourceClaims) > 0 {
			s.claims.Forget(p.Member.Pod)
		}
	}
	return err == nil
}

// keeps reports whether reclaim must leave v to its queue: the queue
// would drop below its fair share without it and the victims already
// chosen from it, in this search (taken) and earlier ones of the cycle;
// the next cycle would reclaim back. Elastic members hold only room no
// minimum wanted.
func (c *cycle) keeps(v victim, charge int64, taken map[*queueState]int64) bool {
	return v.reclaim && !v.elastic && v.q.allocated+c.moving[v.q][0]-taken[v.q]-charge < v.q.fairShare
}

// choose releases candidates in order until w fits, then spares every one
// that the placement does not need, the most important first. It returns
// the victims, released, or nil (nothing released) when none fit.
func (s *search) choose(cands []victim) []victim {
	if s.lim != nil && !s.enough(cands) {
		return nil
	}
	// A workload that needs one domain of a level gets room inside one:
	// the victims of each domain are tried apart, so that evictions spread
	// over every domain never free room that no domain has whole.
	if groups := s.c.victimsByDomain(s.w, cands); groups != nil {
		for _, g := range groups {
			if chosen := s.chooseAmong(g); chosen != nil {
				return chosen
			}
		}
		return nil
	}
	return s.chooseAmong(cands)
}

// chooseAmong takes victims from cands in their order (chooseFrom), or,
// when that frees room only spread over many nodes, node by node
// (chooseByNode).
func (s *search) chooseAmong(cands []victim) []victim {
	if chosen := s.chooseFrom(cands); chosen != nil {
		return chosen
	}
	if len(cands) < 2 {
		return nil
	}
	return s.chooseByNode(cands)
}

// chooseFrom is choose among cands, taken one by one in their order.
func (s *search) chooseFrom(cands []victim) []victim {
	groups := make([][]int, len(cands))
	for i := range cands {
		groups[i] = []int{i}
	}
	return s.takeGroups(cands, groups)
}

// spare restores every chosen victim the placement does not need, the
// most important (the last taken) first, as long as w still fits: least
// disruption. It simulates at most maxVictims placements.
func (s *search) spare(chosen []victim) []victim {
	tries := 0
	for i := len(chosen) - 2; i >= 0 && tries < maxVictims; i-- {
		s.restore(chosen[i])
		if s.mayFit() {
			if tries++; s.fits() {
				chosen = slices.Delete(chosen, i, i+1)
				continue
			}
		}
		s.release(chosen[i])
	}
	return chosen
}

// chooseByNode takes the victims of whole nodes together, the nodes that
// cost least first: lowest priority of the most important victim, then
// most room once their victims are gone, then fewest victims, then the
// least work lost. Victims
// taken one by one in order of importance free a device here and there;
// a gang of whole-node members (KAI's 250 × 8-GPU job reclaiming from
// 4,000 single-GPU pods) needs every victim of some nodes and none of the
// others. Nodes that the placement does not need are spared again, the
// costliest first.
func (s *search) chooseByNode(cands []victim) []victim {
	c := s.c
	type nodeVictims struct {
		node     string
		victims  []int // indexes into cands, least important first
		priority int32
		room     int64
		// oldest is when its longest-running victim started: the later,
		// the less work its evictions lose.
		oldest time.Time
	}
	byNode := map[string]*nodeVictims{}
	var nodes []*nodeVictims
	for i, v := range cands {
		for _, m := range v.members {
			if m.node == "" {
				continue
			}
			n := byNode[m.node]
			if n == nil {
				n = &nodeVictims{node: m.node, priority: v.w.Priority, room: c.snap.FreeMilli(m.node), oldest: v.w.Started()}
				byNode[m.node] = n
				nodes = append(nodes, n)
			}
			if k := len(n.victims); k == 0 || n.victims[k-1] != i {
				n.victims = append(n.victims, i)
			}
			n.priority = max(n.priority, v.w.Priority)
			if v.w.Started().Before(n.oldest) {
				n.oldest = v.w.Started()
			}
			if held, ok := c.snap.HeldMilli(m.Pod.UID, m.node); ok {
				n.room += held
			}
		}
	}
	if len(nodes) < 2 {
		return nil // chooseFrom tried these victims in this order
	}
	slices.SortFunc(nodes, func(a, b *nodeVictims) int {
		return cmp.Or(cmp.Compare(a.priority, b.priority), cmp.Compare(b.room, a.room),
			cmp.Compare(len(a.victims), len(b.victims)), b.oldest.Compare(a.oldest), strings.Compare(a.node, b.node))
	})
	groups := make([][]int, len(nodes))
	for k, n := range nodes {
		groups[k] = n.victims
	}
	return s.takeGroups(cands, groups)
}

// takeGroups releases the victims of groups (indexes into cands), group
// after group, until w fits, skipping those whose queue keeps them; then
// spares every group the placement does not need, the last taken (the
// costliest) first, and, among at most maxVictims victims left, every
// victim. It returns the victims, released, or nil (nothing released)
// when none fit. Placements are simulated only when the released room
// could hold w, at most maxVictims times while taking and as many while
// sparing.
func (s *search) takeGroups(cands []victim, groups [][]int) []victim {
	c := s.c
	taken := map[*queueState]int64{}
	released := make([]bool, len(cands))
	var chosen []victim
	// spans[k] are the victims chosen for the k-th group taken: chosen[spans[k][0]:spans[k][1]].
	var spans [][2]int
	found, tries, singles := false, 0, true
	for _, g := range groups {
		start := len(chosen)
		for _, i := range g {
			v := cands[i]
			charge := c.victimCharge(v)[0]
			if released[i] || c.keeps(v, charge, taken) {
				continue
			}
			s.release(v)
			released[i] = true
			taken[v.q] += charge
			chosen = append(chosen, v)
		}
		if len(chosen) == start {
			continue
		}
		spans = append(spans, [2]int{start, len(chosen)})
		singles = singles && len(chosen)-start == 1
		if s.mayFit() {
			if tries++; s.fits() {
				found = true
				break
			}
		}
		if len(chosen) >= s.victimCap() || tries >= maxVictims {
			break
		}
	}
	if !found {
		for _, v := range chosen {
			s.restore(v)
		}
		return nil
	}
	keep := make([]bool, len(spans))
	keep[len(spans)-1] = true
	tries = 0
	for k := len(spans) - 2; k >= 0; k-- {
		vs := chosen[spans[k][0]:spans[k][1]]
		for _, v := range vs {
			s.restore(v)
		}
		if tries < maxVictims && s.mayFit() {
			if tries++; s.fits() {
				continue
			}
		}
		for _, v := range vs {
			s.release(v)
		}
		keep[k] = true
	}
	var out []victim
	for k, sp := range spans {
		if keep[k] {
			out = append(out, chosen[sp[0]:sp[1]]...)
		}
	}
	// Groups of one were spared one by one already.
	if !singles && len(out) <= maxVictims {
		out = s.spare(out)
	}
	return out
}

// enough reports whether the quota policy allows w with every candidate
// that choose could take gone: if not, no choice of them will do, and
// nothing need be placed to find that out.
func (s *search) enough(cands []victim) bool {
	taken := map[*queueState]int64{}
	var took []victim
	for _, v := range cands {
		charge := s.c.victimCharge(v)[0]
		if s.c.keeps(v, charge, taken) {
			continue
		}
		s.take(v, 1)
		taken[v.q] += charge
		took = append(took, v)
		if len(took) >= s.victimCap() {
			break
		}
	}
	ok := s.allowed()
	for _, v := range took {
		s.take(v, -1)
	}
	return ok
}

// evict puts the chosen victims back on the snapshot and records their
// evictions for w, and what they will move between queues (moving); it
// returns their names, for w's wait.
func (c *cycle) evict(s *search, chosen []victim) []string {
	names := make([]string, len(chosen))
	c.move(s.q, s.need(), 1)
	for i, v := range chosen {
		s.restore(v)
		c.markEvicting(v)
		c.move(v.q, c.victimCharge(v), -1)
		names[i] = v.w.Name()
		if v.elastic {
			names[i] = fmt.Sprintf("%s (elastic member %s)", v.w.Name(), v.members[0].Pod.Name)
		}
		c.evictions = append(c.evictions, Eviction{Victim: v.w, Members: v.members, For: s.w, Reclaim: v.reclaim, Message: c.evictionMessage(v, s.q, s.w)})
	}
	return names
}

// need is what the search's members ask for: milli-GPUs, milli-CPUs, bytes.
func (s *search) need() [3]int64 {
	var need [3]int64
	for _, m := range s.members {
		need[0], need[1], need[2] = need[0]+m.GPUMilli, need[1]+m.CPUMilli, need[2]+m.Memory
	}
	return need
}

// move records that the evictions chosen in the cycle will change what q
// holds by sign × d (milli-GPUs, milli-CPUs, bytes), once the victims are
// gone and the workloads they make room for are admitted. Until then the
// queues' allocation still counts the victims and not their preemptors:
// the next search must not take from a queue what earlier ones already
// took, nor give a queue what it is already getting.
func (c *cycle) move(q *queueState, d [3]int64, sign int64) {
	if q == nil {
		return
	}
	if c.moving == nil {
		c.moving = map[*queueState][3]int64{}
	}
	m := c.moving[q]
	for i := range m {
		m[i] += sign * d[i]
	}
	c.moving[q] = m
}

// victimCharge is what evicting v frees: milli-GPUs, milli-CPUs, bytes.
func (c *cycle) victimCharge(v victim) [3]int64 {
	if len(v.members) == len(v.w.Active) {
		return [3]int64{c.activeCharge(v.w), v.w.activeCPU, v.w.activeMemory}
	}
	var out [3]int64
	for _, m := range v.members {
		mc, _ := c.memberCharge(m)
		out[0], out[1], out[2] = out[0]+mc, out[1]+m.CPUMilli, out[2]+m.Memory
	}
	return out
}

// holdFor withholds, for the rest of the cycle, the devices a workload
// waits to be freed for (by its evictions, or by pods already
// terminating): what is free of them now, and what frees while the victims
// go, is not taken by a workload tried later in the cycle, which would
// then have to be evicted in turn (an elastic member admitted into the
// room an eviction freed for a minimum, as pods went one at a time).
// Devices already withheld (a head of line's room) stay as they are.
func (c *cycle) holdFor(w *Workload, devs []roomDevices) {
	h := hold{w: w}
	for _, d := range devs {
		kept := roomDevices{node: d.node}
		for i, u := range d.uuids {
			if c.snap.Withhold(d.node, []string{u}) {
				kept.uuids = append(kept.uuids, u)
				if i < len(d.indexes) {
					kept.indexes = append(kept.indexes, d.indexes[i])
				}
			}
		}
		if len(kept.uuids) > 0 {
			h.devices = append(h.devices, kept)
		}
	}
	if len(h.devices) > 0 {
		c.holds = append(c.holds, h)
		c.holdLines = nil
	}
}

// hold is what holdFor withheld for w.
type hold struct {
	w       *Workload
	devices []roomDevices
}

// holdNote tells a workload waiting for capacity which of the devices its
// first member could use are held for another workload waiting for
// evictions; "" when none is. The lines are worked out once per
// constraint signature and set of holds: thousands of workloads may wait.
func (c *cycle) holdNote(w *Workload) string {
	if len(w.Pending) == 0 {
		return ""
	}
	m := w.Pending[0]
	sig := constraintSig(m)
	lines, ok := c.holdLines[sig]
	if !ok {
		cands := c.staticCandidates(sig, m)
		for _, h := range c.holds {
			var on []roomDevices
			for _, d := range h.devices {
				if _, found := slices.BinarySearch(cands, d.node); found && c.snap.RoomMilli(d.node, d.uuids) > 0 {
					on = append(on, d)
				}
			}
			if len(on) > 0 {
				lines = append(lines, holdLine{w: h.w, text: fmt.Sprintf("%s kept for %s, which waits for pods being evicted or deleted to make room", describeRoom(on), h.w.Key)})
			}
		}
		if c.holdLines == nil {
			c.holdLines = map[string][]holdLine{}
		}
		c.holdLines[sig] = lines
	}
	var b strings.Builder
	for _, l := range lines {
		if l.w != w {
			b.WriteString("; ")
			b.WriteString(l.text)
		}
	}
	return b.String()
}

// holdLine is one hold as holdNote words it.
type holdLine struct {
	w    *Workload
	text string
}

// victims appends to out the workloads that may be evicted for w, the
// first to go first: lowest priority, then the most recently started. A
// scope keeps reclaim to the queues of its subtree.
func (c *cycle) victims(out []victim, q *queueState, w *Workload, members []*Member, scope *queueState) []victim {
	var need, needCPU, needMemory int64
	for _, m := range members {
		need += m.GPUMilli
		needCPU += m.CPUMilli
		needMemory += m.Memory
	}
	// Reclaim takes back GPUs for a queue that stays within its fair
	// share of every resource it asks for, counting what the cycle's
	// evictions already make room for.
	moved := c.moving[q]
	within := func(alloc, fairShare, need int64) bool { return need == 0 || alloc+need <= fairShare }
	reclaim := q.allocated+moved[0]+need <= q.fairShare &&
		within(q.cpu.alloc+moved[1], q.cpu.fairShare, needCPU) && within(q.memory.alloc+moved[2], q.memory.fairShare, needMemory)
	var over []*queueState
	if reclaim {
		over = c.overFairShare()
	}
	for _, v := range c.victimOrder() {
		if v.w == w || c.evicting[v.w.Key] {
			continue
		}
		if v.q == q {
			if v.w.Priority < w.Priority {
				out = append(out, v)
			}
			continue
		}
		if reclaim && slices.Contains(over, v.q) && (scope == nil || inSubtree(v.q, scope)) {
			v.reclaim = true
			out = append(out, v)
		}
	}
	return out
}

// victimOrder is every workload that may be a victim this cycle, with its
// queue, in the order victims are taken: lowest priority first, then the
// latest started, the latest created. Sorted once a cycle, then filtered
// by each search: sorting each search's candidates took most of a cycle
// that reclaimed for hundreds of single pods.
func (c *cycle) victimOrder() []victim {
	if c.victimsSorted != nil {
		return c.victimsSorted
	}
	c.victimsSorted = []victim{}
	for _, name := range slices.Sorted(maps.Keys(c.st.Active)) {
		q := c.queues[name]
		if q == nil {
			continue
		}
		for _, v := range c.evictable(name) {
			c.victimsSorted = append(c.victimsSorted, victim{w: v, q: q, members: v.Active})
		}
	}
	slices.SortFunc(c.victimsSorted, func(a, b victim) int {
		return cmp.Or(cmp.Compare(a.w.Priority, b.w.Priority), b.w.Started().Compare(a.w.Started()),
			b.w.Created.Compare(a.w.Created), compareKeys(a.w.Key, b.w.Key))
	})
	return c.victimsSorted
}

// evictable are the workloads of queue that may ever be victims this
// cycle, lowest priority first: none of their pods is terminating, and they
// started PreemptMinRuntime ago or earlier. Built once per queue and cycle.
func (c *cycle) evictable(queue string) []*Workload {
	if c.evictableByQueue == nil {
		c.evictableByQueue = map[string][]*Workload{}
	}
	if vs, ok := c.evictableByQueue[queue]; ok {
		return vs
	}
	var vs []*Workload
	for _, v := range c.st.Active[queue] { // lowest priority first
		if v.Terminating() || c.opts.Now.Sub(v.Started()) < c.opts.PreemptMinRuntime {
			continue
		}
		if why, ok := c.opts.Unevictable[v.Key]; ok {
			c.spared = append(c.spared, spared{w: v, q: queue, why: why})
			continue
		}
		vs = append(vs, v)
	}
	c.evictableByQueue[queue] = vs
	return vs
}

// terminatingVictims are, for each workload, its active members that are
// being deleted, with its queue; computed once per cycle.
func (c *cycle) terminatingVictims() []victim {
	if c.terminating == nil {
		c.terminating = []victim{}
		for _, w := range c.st.Terminating {
			var ms []*Member
			for _, m := range w.Active {
				if m.Pod.DeletionTimestamp != nil {
					ms = append(ms, m)
				}
			}
			if len(ms) > 0 {
				c.terminating = append(c.terminating, victim{w: w, q: c.queues[w.Queue], members: ms})
			}
		}
	}
	return c.terminating
}

func (c *cycle) evictionMessage(v victim, q *queueState, w *Workload) string {
	if v.elastic {
		return elasticEvictionMessage(v, q, w) + c.historyNote(q, v.q)
	}
	if v.reclaim {
		return fmt.Sprintf("reclaimed for %s: queue %s is below its fair share (%s of %s GPUs) and queue %s is above its own (%s of %s GPUs)",
			w.Name(), q.Name, gpu.FormatMilli(q.allocated), gpu.FormatMilli(q.fairShare), v.q.Name, gpu.FormatMilli(v.q.allocated), gpu.FormatMilli(v.q.fairShare)) +
			c.historyNote(q, v.q)
	}
	return fmt.Sprintf("preempted in queue %s by %s, of higher priority (%d > %d)", q.Name, w.Name(), w.Priority, v.w.Priority)
}

// historyNote says, when past usage changed the GPU fair share of the
// reclaiming queue q or of the victim's queue vq, what each used: "; history
// decided: queue team-a used 410 GPU-hours (sliding 168h window, half-life
// 24h) against 12 for queue team-b". "" when usage does not count or
// changed neither share.
func (c *cycle) historyNote(q, vq *queueState) string {
	u := c.opts.Usage
	if u == nil || q == nil || vq == nil || q == vq {
		return ""
	}
	if q.fairShare == q.baseShare[0] && vq.fairShare == vq.baseShare[0] {
		return ""
	}
	return fmt.Sprintf("; history decided: queue %s used %s GPU-hours (%s) against %s for queue %s",
		vq.Name, gpu.FormatHours(u.GPUHours[vq.Name]), u.Window, gpu.FormatHours(u.GPUHours[q.Name]), q.Name)
}

// sparedFor says which workloads that could have made room for w are not
// evicted, and why; "" when none. It lists those of w's queue with lower
// priority and, when w's queue may reclaim, those of queues over their
// fair share: within scope's subtree when scope is set (a limit's).
func (c *cycle) sparedFor(q *queueState, w *Workload, scope *queueState) string {
	if q == nil || len(c.opts.Unevictable) == 0 || c.opts.DisablePreemption {
		return ""
	}
	// Make sure every queue that could give victims was looked at.
	c.evictable(q.Name)
	for _, vq := range c.overFairShare() {
		c.evictable(vq.Name)
	}
	var parts []string
	for _, s := range c.spared {
		sameQueue := s.q == q.Name && s.w.Priority < w.Priority
		vq := c.queues[s.q]
		reclaim := s.q != q.Name && q.allocated+c.moving[q][0] < q.fairShare && vq != nil && vq.allocated+c.moving[vq][0] > vq.fairShare &&
			(scope == nil || inSubtree(vq, scope))
		if (sameQueue || reclaim) && s.w != w {
			parts = append(parts, fmt.Sprintf("%s is not evicted: %s", s.w.Key, s.why))
		}
		if len(parts) == 3 {
			break
		}
	}
	return strings.Join(parts, "; ")
}

// mayEvictFor reports whether some workload could be evicted for w at all,
// or pods already terminating free room w could wait for: a cheap check
// that lets a workload that cannot fit wait without a search.
func (c *cycle) mayEvictFor(q *queueState, w *Workload) bool {
	if c.opts.DisablePreemption || q == nil {
		return false
	}
	if len(c.st.Elastic) > 0 && len(c.elasticVictims(q, w)) > 0 {
		return true
	}
	// Room that pods being deleted free may be waited for.
	if len(c.terminatingVictims()) > 0 {
		return true
	}
	// Active lists are sorted by priority: the first says whether any is
	// lower, before the victims are filtered.
	if as := c.st.Active[q.Name]; len(as) > 0 && as[0].Priority < w.Priority {
		if vs := c.evictable(q.Name); len(vs) > 0 && vs[0].Priority < w.Priority {
			return true
		}
	}
	if q.allocated+c.moving[q][0] >= q.fairShare {
		return false
	}
	for _, vq := range c.overFairShare() {
		if vq != q && len(c.evictable(vq.Name)) > 0 {
			return true
		}
	}
	return false
}

// overFairShare are the leaf queues that hold more than their fair share
// at the start of the cycle (admissions only add to the queues below).
func (c *cycle) overFairShare() []*queueState {
	if c.over == nil {
		c.over = []*queueState{}
		for _, q := range c.queues {
			if len(q.Children) == 0 && q.allocated+c.moving[q][0] > q.fairShare {
				c.over = append(c.over, q)
			}
		}
		slices.SortFunc(c.over, func(a, b *queueState) int { return strings.Compare(a.Name, b.Name) })
	}
	return c.over
}
