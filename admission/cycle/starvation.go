package cycle

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/gpu"
)

// Backfill admits, behind a head of line that does not fit, the smaller
// and younger workloads that do; on its own it lets a stream of small
// workloads keep a large one waiting for ever. So, as Slurm's backfill and
// KAI do, once a queue's head has waited StarvationBound the cycle holds
// room for it: it finds where the head would run once the fewest running
// pods end (nodes with the most free room first, on each the pods holding
// least first), and withholds those devices from everything else, so that
// behind the head only what cannot delay it is admitted. As the pods in
// the room end nobody takes their place, and the head starts there (or
// anywhere else it fits first). Partita does not know how long pods run,
// so the room is where the head runs soonest by how little must end, not
// by when.
//
// A room holds against every workload but its head, except that a queue
// below its fair share is never held back for the head of a queue at or
// above its own: fair share comes before the order within a queue.
// Rooms are kept from cycle to cycle (Rooms), so that a room stays where
// it is while its occupants leave. The head's quota headroom is held too
// (headroom.go).
const (
	// maxRooms bounds the rooms held at once, given to the heads that
	// waited longest.
	maxRooms = 8
	// maxRoomSearches bounds the rooms found anew in one cycle (each costs
	// a few gang placements); the others keep theirs or wait a cycle.
	maxRoomSearches = 2
)

// Rooms carries the rooms held for heads of line from cycle to cycle.
type Rooms struct {
	byKey map[WorkloadKey]heldRoom
}

// heldRoom is a room as carried between cycles: the head's placement
// question, and the devices.
type heldRoom struct {
	shape   string
	devices []roomDevices
}

// roomDevices are the devices of a room on one node, by UUID and index.
type roomDevices struct {
	node    string
	uuids   []string
	indexes []int32
}

// room is capacity held in this cycle for a head of line.
type room struct {
	head    *Workload
	q       *queueState
	devices []roomDevices
	// lifted: the room is open for the workload being tried now;
	// consumed: its head was admitted, the room is gone.
	lifted, consumed bool
}

// RoomReport is a room held in a cycle, for logs and metrics.
type RoomReport struct {
	// Head is the workload the room is held for.
	Head WorkloadKey
	// Devices are the room's devices by node.
	Devices map[string][]string
}

// holdRooms finds the heads of line that have waited StarvationBound and
// withholds room for them (see the package comment above maxRooms).
func (c *cycle) holdRooms() {
	bound := c.opts.StarvationBound
	if bound <= 0 {
		return
	}
	var heads []*Workload
	queueOf := map[*Workload]*queueState{}
	for _, q := range c.queues {
		if len(q.workloads) == 0 || len(q.Children) > 0 {
			continue
		}
		for _, w := range q.workloads {
			if !c.mayRun(w) || c.overLimits(q, w) {
				continue
			}
			// The first workload that could run is the head; if it has
			// not waited long, no room is held in this queue.
			if c.opts.Now.Sub(w.Created) >= bound {
				heads = append(heads, w)
				queueOf[w] = q
			}
			break
		}
	}
	slices.SortFunc(heads, func(a, b *Workload) int { return cmp.Or(a.Created.Compare(b.Created), compareKeys(a.Key, b.Key)) })
	if len(heads) > maxRooms {
		heads = heads[:maxRooms]
	}
	kept := map[WorkloadKey]heldRoom{}
	searches := 0
	for rank, w := range heads {
		q := queueOf[w]
		members := c.required(w)
		asks, milli, _, _ := c.quotaAsk(w)
		v, err := c.checkQuota(q, w, asks, milli)
		if err != nil {
			continue
		}
		c.holdHeadroom(q, w, asks, milli, rank, v.Allowed)
		if !v.Allowed {
			continue // waits for quota, not room
		}
		shape, _ := c.placeQuestion(w, members)
		var devs []roomDevices
		if c.opts.Rooms != nil {
			if h, ok := c.opts.Rooms.byKey[w.Key]; ok && h.shape == shape && c.withhold(h.devices) {
				devs = h.devices
			}
		}
		if devs == nil {
			if searches >= maxRoomSearches {
				continue
			}
			searches++
			devs = c.findRoom(w, members)
			if devs == nil || !c.withhold(devs) {
				continue
			}
		}
		r := &room{head: w, q: q, devices: devs}
		c.rooms = append(c.rooms, r)
		if c.roomOf == nil {
			c.roomOf = map[*Workload]*room{}
		}
		c.roomOf[w] = r
		kept[w.Key] = heldRoom{shape: shape, devices: devs}
	}
	if c.opts.Rooms != nil {
		c.opts.Rooms.byKey = kept
	}
	// Rooms only fill up within a cycle: one that has nothing free now
	// holds nobody back for the rest of it.
	for _, r := range c.rooms {
		c.roomsFree = c.roomsFree || c.roomFree(r)
	}
}

// mayRun reports whether w would be placed if there were room: it has its
// members, no queue conflict, and no backoff.
func (c *cycle) mayRun(w *Workload) bool {
	if w.QueueConflict != "" || c.backoff(w.Key).After(c.opts.Now) {
		return false
	}
	if w.Key.IsGang() && (w.MinMember == 0 || len(w.Pending)+len(w.Active) < int(w.MinMember)) {
		return false
	}
	return len(c.required(w)) > 0
}

// overLimits reports whether w asks for more than a limit of q or of an
// ancestor, which it would go over with nothing else running there: it
// never runs as it is, so it is nobody's head of line, and the workload
// behind it may be. The limits are read, not the quota policy asked: every
// queue's first workload is looked at in every cycle.
func (c *cycle) overLimits(q *queueState, w *Workload) bool {
	_, milli, cpu, memory := c.quotaAsk(w)
	for a := q; a != nil; a = a.parent {
		if over(a.LimitMilli, milli) || over(a.CPU.Limit, cpu) || over(a.Memory.Limit, memory) {
			return true
		}
	}
	return false
}

// quotaAsk is what the quota policy is asked about when w is tried
// (tryAdmit): its pending members, or an elastic gang's minimum, and the
// milli-GPUs, milli-CPUs and bytes of memory they ask for.
func (c *cycle) quotaAsk(w *Workload) (members []*Member, milli, cpu, memory int64) {
	if !w.Elastic {
		return w.Pending, w.pendingMilli, w.pendingCPU, w.pendingMemory
	}
	members = c.required(w)
	for _, m := range members {
		milli, cpu, memory = milli+m.GPUMilli, cpu+m.CPUMilli, memory+m.Memory
	}
	return members, milli, cpu, memory
}

// required are the pending members that must be placed together.
func (c *cycle) required(w *Workload) []*Member {
	n := len(w.Pending)
	if w.Key.IsGang() {
		n = min(n, max(0, int(w.MinMember)-len(w.Active)))
	}
	return w.Pending[:n]
}

// withhold withholds every device of devs, or none.
func (c *cycle) withhold(devs []roomDevices) bool {
	for i, d := range devs {
		if !c.snap.Withhold(d.node, d.uuids) {
			for _, done := range devs[:i] {
				c.snap.Unwithhold(done.node, done.uuids)
			}
			return false
		}
	}
	return true
}

func (c *cycle) unwithhold(devs []roomDevices) {
	for _, d := range devs {
		c.snap.Unwithhold(d.node, d.uuids)
	}
}

// findRoom returns where members of w would be placed once the fewest pods
// end: where they fit now if they do; else the pods of w's candidate nodes
// are taken off the snapshot in order (nodes with the most free room
// first, on each node the pods that hold least first), the shortest such
// prefix after which the members fit is found by doubling, then bisection,
// and the members' devices then are the room. The snapshot is left as it
// was. nil when the members would not fit even on empty nodes.
func (c *cycle) findRoom(w *Workload, members []*Member) []roomDevices {
	c.ignoreNodeUse = true
	defer func() { c.ignoreNodeUse = false }()
	try := func() []roomDevices {
		placed, err := c.place(w, members, false)
		if err != nil {
			return nil
		}
		devs := roomOf(placed)
		for _, p := range placed {
			c.snap.Forget(p.Member.Pod.UID)
		}
		return devs
	}
	if devs := try(); devs != nil {
		return devs
	}
	seen := map[string]bool{}
	var nodes []string
	for _, g := range c.groupByConstraints(members) {
		for _, n := range c.staticCandidates(g.sig, g.members[0]) {
			if !seen[n] {
				seen[n] = true
				nodes = append(nodes, n)
			}
		}
	}
	free := make(map[string]int64, len(nodes))
	for _, n := range nodes {
		free[n] = c.snap.FreeMilli(n)
	}
	slices.SortFunc(nodes, func(a, b string) int { return cmp.Or(cmp.Compare(free[b], free[a]), strings.Compare(a, b)) })

	type taken struct {
		uid   types.UID
		alloc *gpu.PodAllocation
	}
	var order []taken
	gone := 0 // order[:gone] are off the snapshot
	setGone := func(k int) {
		for ; gone < k; gone++ {
			c.snap.Forget(order[gone].uid)
		}
		for ; gone > k; gone-- {
			_ = c.snap.Restore(order[gone-1].alloc)
		}
	}
	defer setGone(0)
	fits := -1
	next := 0
	for m := 1; next < len(nodes); m *= 2 {
		for ; next < min(m, len(nodes)); next++ {
			for _, uid := range c.snap.PodsOn(nodes[next]) {
				if a, ok := c.snap.Allocation(uid); ok {
					order = append(order, taken{uid: uid, alloc: a})
				}
			}
		}
		setGone(len(order))
		if devs := try(); devs != nil {
			fits = len(order)
			break
		}
	}
	if fits < 0 {
		return nil
	}
	lo, hi := 0, fits // members do not fit with order[:lo] gone, do with order[:hi]
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		setGone(mid)
		if try() != nil {
			hi = mid
		} else {
			lo = mid
		}
	}
	setGone(hi)
	return try()
}

// roomOf are the devices of placed members, by node in the order met.
func roomOf(placed []MemberAdmission) []roomDevices {
	var out []roomDevices
	for _, p := range placed {
		i := slices.IndexFunc(out, func(d roomDevices) bool { return d.node == p.Allocation.Node })
		if i < 0 {
			out = append(out, roomDevices{node: p.Allocation.Node})
			i = len(out) - 1
		}
		for _, ca := range p.Allocation.Containers {
			for k, u := range ca.DeviceUUIDs {
				if !slices.Contains(out[i].uuids, u) {
					out[i].uuids = append(out[i].uuids, u)
					if k < len(ca.DeviceIndexes) {
						out[i].indexes = append(out[i].indexes, ca.DeviceIndexes[k])
					}
				}
			}
		}
	}
	return out
}

// lift marks the rooms that may not hold against w of queue q: its own,
// and, when q is below its fair share, those of heads whose queues are not.
// They are opened only while w is actually placed (openLifted, from place),
// which most attempts never get to (the cycle's memo of failed shapes
// answers them); lift only keys that memo by what is open. It returns
// them, for close.
func (c *cycle) lift(q *queueState, w *Workload) []*room {
	if len(c.rooms) == 0 {
		return nil
	}
	var out []*room
	var free []int
	for i, r := range c.rooms {
		if r.consumed {
			continue
		}
		if r.head == w || entitled(q, r.q) {
			r.lifted = true
			out = append(out, r)
			if c.roomFree(r) {
				free = append(free, i)
			}
		}
	}
	c.lifted = out
	if len(free) > 0 {
		// Failures with more room open are not failures with less. Rooms
		// with nothing free change no placement (only the simulations of
		// preemption, which the memo does not answer), so they do not
		// count.
		parts := make([]string, len(free))
		for i, f := range free {
			parts[i] = strconv.Itoa(f)
		}
		c.liftKey = "lift:" + strings.Join(parts, ",") + "|"
	}
	return out
}

// entitled reports whether q, below its fair share, goes before what is
// held for the head of hq, a queue at or above its own: fair share comes
// before the order within a queue.
func entitled(q, hq *queueState) bool {
	return q != nil && hq != q && q.allocated < q.fairShare && hq.allocated >= hq.fairShare
}

// openLifted opens the lifted rooms for a placement, and returns what
// closes them again; a no-op when none is lifted or they are open already.
func (c *cycle) openLifted() func() {
	if len(c.lifted) == 0 || c.liftOpen {
		return func() {}
	}
	c.liftOpen = true
	for _, r := range c.lifted {
		c.unwithhold(r.devices)
	}
	return func() {
		for _, r := range c.lifted {
			c.withhold(r.devices)
		}
		c.liftOpen = false
	}
}

func (c *cycle) roomFree(r *room) bool {
	for _, d := range r.devices {
		if c.snap.RoomMilli(d.node, d.uuids) > 0 {
			return true
		}
	}
	return false
}

// close ends an attempt with rooms lifted: a head just admitted gives its
// room up, and its devices are free for everyone again (those it did not
// take).
func (c *cycle) close(lifted []*room, w *Workload, admitted bool) {
	for _, r := range lifted {
		r.lifted = false
		if r.head == w && admitted {
			r.consumed = true
			c.roomNotes = nil
			c.unwithhold(r.devices)
			if c.opts.Rooms != nil {
				delete(c.opts.Rooms.byKey, w.Key)
			}
		}
	}
	c.lifted, c.liftKey = nil, ""
}

// roomNote is what a waiting workload is told about the rooms: for a head,
// where its room is; for another workload that needs capacity, the rooms
// with free room on its nodes that hold it back (a full room holds back
// nobody). The note for other workloads is the same for all whose first
// member shares constraints, and is computed once per cycle for them.
func (c *cycle) roomNote(w *Workload) string {
	if r := c.roomOf[w]; r != nil && !r.consumed {
		return fmt.Sprintf("; it has waited since %s, past the starvation bound of %s: %s held for it, and only workloads that do not need them are admitted meanwhile",
			w.Created.UTC().Format(time.DateTime), c.opts.StarvationBound, describeRoom(r.devices))
	}
	if len(w.Pending) == 0 || !c.roomsFree {
		return ""
	}
	m := w.Pending[0]
	sig := constraintSig(m)
	if note, ok := c.roomNotes[sig]; ok {
		return note
	}
	var notes []string
	anyLifted := false
	for _, r := range c.rooms {
		anyLifted = anyLifted || r.lifted
		if r.consumed || r.lifted || !c.roomFree(r) || !c.roomOnCandidates(r, m) {
			continue
		}
		notes = append(notes, fmt.Sprintf("%s held for %s, which has waited since %s", describeRoom(r.devices), r.head.Key, r.head.Created.UTC().Format(time.DateTime)))
	}
	note := ""
	if len(notes) > 0 {
		note = "; " + strings.Join(notes, "; ")
	}
	if anyLifted {
		return note
	}
	if c.roomNotes == nil {
		c.roomNotes = map[string]string{}
	}
	c.roomNotes[sig] = note
	return note
}

func (c *cycle) roomOnCandidates(r *room, m *Member) bool {
	cands := c.staticCandidates(constraintSig(m), m)
	for _, d := range r.devices {
		if _, found := slices.BinarySearch(cands, d.node); found {
			return true
		}
	}
	return false
}

// describeRoom is "GPUs 0, 1 of node n-1 are", by device index.
func describeRoom(devs []roomDevices) string {
	parts := make([]string, len(devs))
	n := 0
	for i, d := range devs {
		idx := make([]string, len(d.indexes))
		for k, x := range d.indexes {
			idx[k] = fmt.Sprint(x)
		}
		if len(d.indexes) != len(d.uuids) {
			idx = d.uuids
		}
		parts[i] = fmt.Sprintf("%s of node %s", strings.Join(idx, ", "), d.node)
		n += len(d.uuids)
	}
	if n == 1 {
		return "GPU " + strings.Join(parts, "; ") + " is"
	}
	return "GPUs " + strings.Join(parts, "; ") + " are"
}

// roomReports are the rooms held in the cycle.
func (c *cycle) roomReports() []RoomReport {
	var out []RoomReport
	for _, r := range c.rooms {
		if r.consumed {
			continue
		}
		rep := RoomReport{Head: r.head.Key, Devices: map[string][]string{}}
		for _, d := range r.devices {
			rep.Devices[d.node] = slices.Clone(d.uuids)
		}
		out = append(out, rep)
	}
	return out
}
