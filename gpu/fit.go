package gpu

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// deviceState is the accounting of one device. It holds no pointers, so the
// flat slice of all devices copies in one memmove and the garbage collector
// never scans it.
type deviceState struct {
	// memoryMiB is the device's memory.
	memoryMiB int64
	// milli and memMiB are what its allocations hold.
	milli  int64
	memMiB int64
	index  int32
	// users counts allocations (one per container and device), whole the
	// whole-device ones among them.
	users   int32
	whole   int32
	healthy bool
	// foreign: a healthy device another DRA driver publishes; healthy is
	// false for it, so nothing is placed there, but it counts in the
	// capacity fair share divides.
	foreign bool
	// withheld keeps new allocations off the device on a snapshot (see
	// Snapshot.Withhold); what it holds stays. Never set in a ledger.
	withheld bool
	// oneTenant is set on the devices of an MPS node: every client of a
	// device's MPS daemon can command it (quit, set limits), so all the
	// slices on one device belong to one namespace.
	oneTenant bool
	// tenants is the sum (mod 2^64) of the tenant keys (view.tenantKey) of
	// the slices on the device, one per allocation. They all belong to the
	// namespace with key k exactly when tenants == slices×k, up to a
	// collision of the ledger's keyed hash (its seed is random), which an
	// attacker cannot aim for. A sum, unlike a single owner, can be undone
	// when any one slice leaves.
	tenants uint64
}

// slices counts the fractional allocations on d.
func (d *deviceState) slices() int32 { return d.users - d.whole }

// otherTenant reports whether d serves slices of another namespace than the
// one with key tenant on a node where a device serves one namespace only.
func (d *deviceState) otherTenant(tenant uint64) bool {
	n := d.slices()
	return d.oneTenant && n > 0 && d.tenants != uint64(n)*tenant
}

// nodeState is one node: its inventory, its device range in the flat slice
// and the pods bound to it.
type nodeState struct {
	name string
	// inv is nil while the node has no GPUNode (not yet seen, or deleted);
	// its pods are kept and counted once it appears. Immutable.
	inv *NodeInventory
	// pods are the pods bound to the node (also while inv is nil). The slice
	// is never changed in place, only replaced, so snapshots share it.
	pods []*podEntry
	// devices[first : first+n] are the node's devices in inventory order;
	// the range can hold capacity devices.
	first, n, capacity int32
	// heartbeat is the latest heartbeat of the node's agent.
	heartbeat time.Time
	// silent, when set, says the node's agent stopped reporting: the node
	// takes no new pods until a newer heartbeat comes (SetAgentSilent).
	// Immutable.
	silent *AgentSilentError
}

func (n *nodeState) present() bool { return n.inv != nil }

// silentError is a copy of the node's silence, for callers to keep.
func (n *nodeState) silentError() error {
	e := *n.silent
	return &e
}

// podEntry is one pod's allocation as the ledger holds it. Immutable once
// added.
type podEntry struct {
	namespace string
	name      string
	uid       types.UID
	node      string
	// assumed is set for a decision recorded by Assume and not yet seen on
	// the pod.
	assumed bool
	// expires is set for a reservation read from an unbound pod: it holds
	// until then (Ledger.ExpireReservations).
	expires time.Time
	// untilTried: the reservation is a single pod's hold that
	// kube-scheduler has not tried yet; it outlives expires until the pod
	// binds or kube-scheduler refuses it (see reservedEntry).
	untilTried bool
	// problem says why the pod's annotations could not be read fully; the
	// entry counts what could be read.
	problem    string
	containers []entryContainer
}

func (e *podEntry) key() string { return e.namespace + "/" + e.name }

// entryContainer is one container's devices and the amounts it holds on each.
type entryContainer struct {
	name  string
	uuids []string
	// wantCount is the number of devices the container asked for, -1 when
	// unknown.
	wantCount int
	// milli is the share per device; 0 means derived per device from
	// reqMemMiB (a memory-based request read from a pod).
	milli     int64
	reqMemMiB int64
	// memMiB is the memory limit per device; 0 means derived.
	memMiB    int64
	smPercent int32
}

// charge is what the container holds on a device of deviceMemoryMiB.
func (c *entryContainer) charge(deviceMemoryMiB int64) (milli, memMiB int64, whole bool) {
	milli = c.milli
	if milli == 0 {
		milli = milliForMemory(c.reqMemMiB, deviceMemoryMiB)
	}
	if milli == MilliPerGPU && c.reqMemMiB == 0 && c.memMiB == 0 {
		return milli, deviceMemoryMiB, true
	}
	memMiB = c.memMiB
	if memMiB == 0 {
		memMiB = c.reqMemMiB
	}
	if memMiB == 0 {
		memMiB = milli * deviceMemoryMiB / MilliPerGPU
	}
	return milli, memMiB, false
}

func (e *podEntry) sameDevices(o *podEntry) bool {
	if e.node != o.node || len(e.containers) != len(o.containers) {
		return false
	}
	for i := range e.containers {
		if e.containers[i].name != o.containers[i].name || !slices.Equal(e.containers[i].uuids, o.containers[i].uuids) {
			return false
		}
	}
	return true
}

func (e *podEntry) equal(o *podEntry) bool {
	if e.namespace != o.namespace || e.name != o.name || e.uid != o.uid || e.node != o.node ||
		e.assumed != o.assumed || !e.expires.Equal(o.expires) || e.problem != o.problem || len(e.containers) != len(o.containers) {
		return false
	}
	for i := range e.containers {
		a, b := &e.containers[i], &o.containers[i]
		if a.name != b.name || a.wantCount != b.wantCount || a.milli != b.milli || a.reqMemMiB != b.reqMemMiB ||
			a.memMiB != b.memMiB || a.smPercent != b.smPercent || !slices.Equal(a.uuids, b.uuids) {
			return false
		}
	}
	return true
}

// allocation is e as a PodAllocation, resolved against inv when known.
func (e *podEntry) allocation(inv *NodeInventory) *PodAllocation {
	out := &PodAllocation{Namespace: e.namespace, Name: e.name, UID: e.uid, Node: e.node}
	for i := range e.containers {
		c := &e.containers[i]
		ca := ContainerAllocation{Container: c.name, DeviceUUIDs: slices.Clone(c.uuids), Milli: c.milli, MemoryMiB: c.memMiB, SMPercent: c.smPercent}
		minMem := int64(-1)
		if inv != nil {
			for _, u := range c.uuids {
				if d, ok := inv.DeviceByUUID(u); ok {
					ca.DeviceIndexes = append(ca.DeviceIndexes, d.Index)
					if minMem < 0 || d.MemoryMiB < minMem {
						minMem = d.MemoryMiB
					}
				}
			}
		}
		if minMem >= 0 {
			milli, mem, whole := c.charge(minMem)
			ca.Milli = milli
			if ca.MemoryMiB == 0 && !whole {
				ca.MemoryMiB = mem
			}
		} else if ca.MemoryMiB == 0 {
			ca.MemoryMiB = c.reqMemMiB
		}
		out.Containers = append(out.Containers, ca)
	}
	return out
}

// view is the state Fit, Choose, Score and Assume work on: the ledger's own,
// or a snapshot's copy.
type view struct {
	nodes   []nodeState
	devices []deviceState
	// nodeIdx maps node names to positions in nodes. It may be shared with
	// snapshots: whoever writes it must own it (see Ledger.ownNodeIdx).
	nodeIdx map[string]int32
	// inventoryEpoch counts the changes of any node's inventory (see
	// Snapshot.InventoryEpoch).
	inventoryEpoch uint64
	// tenantSeed keys tenantKey; made once per ledger and shared by its
	// snapshots.
	tenantSeed maphash.Seed
}

// tenantKey is a namespace's key in deviceState.tenants on node n: 0 off
// mps nodes, whose devices do not count tenants (a change of mode counts the
// node's pods again), which keeps the hash out of the common path.
func (v *view) tenantKey(n *nodeState, namespace string) uint64 {
	if n.inv == nil || n.inv.Isolation != v1alpha1.IsolationMPS {
		return 0
	}
	return maphash.String(v.tenantSeed, namespace)
}

func (v *view) slot(name string) (int32, bool) {
	i, ok := v.nodeIdx[name]
	return i, ok
}

func (v *view) presentNode(name string) (*nodeState, bool) {
	i, ok := v.nodeIdx[name]
	if !ok || !v.nodes[i].present() {
		return nil, false
	}
	return &v.nodes[i], true
}

func (v *view) devs(n *nodeState) []deviceState {
	return v.devices[n.first : n.first+n.n]
}

// charge adds (sign 1) or removes (sign -1) e's holdings on n's devices.
// Devices n does not have are skipped (see Stranded).
func (v *view) charge(n *nodeState, e *podEntry, sign int64) {
	if !n.present() {
		return
	}
	devs := v.devs(n)
	tenant := v.tenantKey(n, e.namespace)
	for i := range e.containers {
		c := &e.containers[i]
		for _, u := range c.uuids {
			j := n.inv.position(u)
			if j < 0 {
				continue
			}
			d := &devs[j]
			milli, mem, whole := c.charge(d.memoryMiB)
			d.milli += sign * milli
			d.memMiB += sign * mem
			d.users += int32(sign)
			if whole {
				d.whole += int32(sign)
			} else {
				d.tenants += uint64(sign) * tenant
			}
		}
	}
}

// held is what e holds on n's devices, in milli-GPUs, as charge counts it.
func (v *view) held(n *nodeState, e *podEntry) int64 {
	devs := v.devs(n)
	var sum int64
	for i := range e.containers {
		c := &e.containers[i]
		for _, u := range c.uuids {
			if j := n.inv.position(u); j >= 0 {
				milli, _, _ := c.charge(devs[j].memoryMiB)
				sum += milli
			}
		}
	}
	return sum
}

// scratchDevices sizes the scratch buffers of a placement: enough for the
// usual 8- or 16-GPU node without touching the heap. Bigger nodes (the CRD
// allows 64 devices) get heap buffers.
const scratchDevices = 16

// scratch holds the buffers one placement works in, so that Fit and Score
// allocate nothing. Kept small: it is zeroed on every use.
type scratch struct {
	work  [scratchDevices]deviceState
	cand  [scratchDevices]int32
	picks [2 * scratchDevices]int32
}

// failure is why a container did not fit, before it becomes an
// InsufficientError.
type failure struct {
	// container is the position of the container that did not fit.
	container int
	// withRoom counts the devices that could take one slice of it.
	withRoom int
}

// plan is a placement on one node: work is the node's devices after it,
// picks the chosen device positions, container after container.
type plan struct {
	work  []deviceState
	picks []int32
}

// effectivePlacement resolves the placement to use: the caller's, else the
// pod's own, else binpack.
func effectivePlacement(pl Placement, req *PodRequest) Placement {
	if pl == "" {
		pl = req.Placement
	}
	if pl != PlacementSpread {
		pl = PlacementBinpack
	}
	return pl
}

// place places every GPU container of req on the devices devs, each after
// the ones before it: a container's devices are the best ones by pl that
// still fit it (binpack: the fullest, spread: the emptiest; ties to the lower
// index), all of one memory size unless it asks for whole devices. tenant
// is the key of the pod's namespace (view.tenantKey).
func place(devs []deviceState, req *PodRequest, pl Placement, tenant uint64, sc *scratch) (plan, failure, bool) {
	work := sc.work[:0]
	if len(devs) > len(sc.work) {
		work = make([]deviceState, 0, len(devs))
	}
	work = append(work, devs...)
	cand := sc.cand[:0]
	if len(devs) > len(sc.cand) {
		cand = make([]int32, 0, len(devs))
	}
	total := 0
	for i := range req.Containers {
		total += req.Containers[i].Count
	}
	picks := sc.picks[:0]
	if total > len(sc.picks) {
		picks = make([]int32, 0, total)
	}
	for k := range req.Containers {
		c := &req.Containers[k]
		cand = cand[:0]
		for j := range work {
			if fits(&work[j], c, tenant) {
				cand = append(cand, int32(j))
			}
		}
		if len(cand) < c.Count {
			return plan{}, failure{container: k, withRoom: len(cand)}, false
		}
		sortCandidates(work, cand, pl)
		chosen := cand[:c.Count]
		if c.Count > 1 && !c.Whole() {
			var ok bool
			if chosen, ok = sameSizeClass(work, cand, c.Count); !ok {
				return plan{}, failure{container: k, withRoom: len(cand)}, false
			}
		}
		for _, j := range chosen {
			apply(&work[j], c, tenant)
		}
		picks = append(picks, chosen...)
	}
	return plan{work: work, picks: picks}, failure{}, true
}

// fits reports whether one device can take one more slice of c for the
// namespace with key tenant.
func fits(d *deviceState, c *ContainerRequest, tenant uint64) bool {
	return hasRoom(d, c) && (c.Whole() || !d.otherTenant(tenant))
}

// hasRoom reports whether one device has room for one more slice of c,
// whoever asks.
func hasRoom(d *deviceState, c *ContainerRequest) bool {
	if !d.healthy || d.withheld {
		return false
	}
	if c.Whole() {
		return d.users == 0
	}
	if d.whole > 0 {
		return false
	}
	milli, mem := sliceOn(c, d.memoryMiB)
	return d.milli+milli <= MilliPerGPU && d.memMiB+mem <= d.memoryMiB
}

// sliceOn is the share and memory one slice of c takes on a device of
// deviceMemoryMiB; the same numbers Choose writes into the allocation.
func sliceOn(c *ContainerRequest, deviceMemoryMiB int64) (milli, memMiB int64) {
	if c.MemoryMiB > 0 {
		return c.MilliOn(deviceMemoryMiB), c.MemoryMiB
	}
	return c.Milli, c.Milli * deviceMemoryMiB / MilliPerGPU
}

func apply(d *deviceState, c *ContainerRequest, tenant uint64) {
	d.users++
	if c.Whole() {
		d.whole++
		d.milli += MilliPerGPU
		d.memMiB += d.memoryMiB
		return
	}
	d.tenants += tenant
	milli, mem := sliceOn(c, d.memoryMiB)
	d.milli += milli
	d.memMiB += mem
}

// sortCandidates orders candidate positions, best first. Insertion sort:
// there are at most a few dozen, and it allocates nothing.
func sortCandidates(work []deviceState, cand []int32, pl Placement) {
	better := func(a, b int32) bool {
		da, db := &work[a], &work[b]
		if da.milli != db.milli {
			if pl == PlacementSpread {
				return da.milli < db.milli
			}
			return da.milli > db.milli
		}
		return da.index < db.index
	}
	for i := 1; i < len(cand); i++ {
		for j := i; j > 0 && better(cand[j], cand[j-1]); j-- {
			cand[j], cand[j-1] = cand[j-1], cand[j]
		}
	}
}

// sameSizeClass picks, in order, the first count candidates of the first
// memory size (in candidate order) that has count of them, so that the
// container's per-device share and limit are one number. It reorders cand.
func sameSizeClass(work []deviceState, cand []int32, count int) ([]int32, bool) {
	for i := range cand {
		mem := work[cand[i]].memoryMiB
		n := 0
		for _, j := range cand[i:] {
			if work[j].memoryMiB == mem {
				n++
			}
		}
		if n < count {
			continue
		}
		// Move the class's first count candidates to cand[i:], keeping order.
		w := i
		for r := i; r < len(cand) && w-i < count; r++ {
			if work[cand[r]].memoryMiB == mem {
				x := cand[r]
				copy(cand[w+1:r+1], cand[w:r])
				cand[w] = x
				w++
			}
		}
		return cand[i:w], true
	}
	return nil, false
}

// explain completes a failure into an InsufficientError for node n.
func explain(n *nodeState, devs []deviceState, req *PodRequest, pl Placement, tenant uint64, f failure) *InsufficientError {
	c := &req.Containers[f.container]
	// The state the failing container met: the containers before it placed.
	work := devs
	if f.container > 0 {
		head := *req
		head.Containers = req.Containers[:f.container]
		var sc scratch
		if p, _, ok := place(devs, &head, pl, tenant, &sc); ok {
			work = slices.Clone(p.work)
		}
	}
	e := &InsufficientError{
		Node:            n.name,
		Container:       c.Name,
		WantMilli:       c.Milli,
		WantMemoryMiB:   c.MemoryMiB,
		Count:           c.Count,
		DevicesWithRoom: f.withRoom,
		BestDevice:      -1,
	}
	best := -1
	for j := range work {
		d := &work[j]
		if !d.healthy || d.withheld || d.whole > 0 {
			continue
		}
		if !c.Whole() && d.otherTenant(tenant) {
			if hasRoom(d, c) {
				e.OtherTenantDevices++
			}
			continue
		}
		if best < 0 {
			best = j
			continue
		}
		b := &work[best]
		if c.MemoryMiB > 0 {
			if d.memoryMiB-d.memMiB > b.memoryMiB-b.memMiB {
				best = j
			}
		} else if d.milli < b.milli {
			best = j
		}
	}
	if best >= 0 {
		d := &work[best]
		e.BestDevice = d.index
		e.BestFreeMilli = max(0, MilliPerGPU-d.milli)
		e.BestFreeMemoryMiB = max(0, d.memoryMiB-d.memMiB)
	}
	e.Unresolvable = unresolvable(devs, req, f.container)
	return e
}

// unresolvable reports whether container k of req could not fit node devs
// even with every device empty: too few healthy devices big enough (of one
// memory size for a multi-device slice), or, for whole devices, fewer
// healthy devices than all the pod's whole-device containers need together.
func unresolvable(devs []deviceState, req *PodRequest, k int) bool {
	c := &req.Containers[k]
	if c.Whole() {
		need := 0
		for i := range req.Containers {
			if req.Containers[i].Whole() {
				need += req.Containers[i].Count
			}
		}
		healthy := 0
		for j := range devs {
			if devs[j].healthy {
				healthy++
			}
		}
		return healthy < need
	}
	for i := range devs {
		if !devs[i].healthy {
			continue
		}
		empty := deviceState{memoryMiB: devs[i].memoryMiB, healthy: true}
		if !hasRoom(&empty, c) {
			continue
		}
		if c.Count == 1 {
			return false
		}
		n := 0
		for j := i; j < len(devs); j++ {
			if devs[j].healthy && devs[j].memoryMiB == devs[i].memoryMiB {
				n++
			}
		}
		if n >= c.Count {
			return false
		}
	}
	return true
}

// allocationFrom turns a plan into the PodAllocation Choose returns.
func allocationFrom(n *nodeState, req *PodRequest, p plan) *PodAllocation {
	out := &PodAllocation{Namespace: req.Namespace, Name: req.Name, UID: req.UID, Node: n.name}
	off := 0
	for k := range req.Containers {
		c := &req.Containers[k]
		ps := p.picks[off : off+c.Count]
		off += c.Count
		ca := ContainerAllocation{Container: c.Name}
		for _, j := range ps {
			ca.DeviceUUIDs = append(ca.DeviceUUIDs, n.inv.Devices[j].UUID)
			ca.DeviceIndexes = append(ca.DeviceIndexes, n.inv.Devices[j].Index)
		}
		if c.Whole() {
			ca.Milli = MilliPerGPU
		} else {
			ca.Milli, ca.MemoryMiB = sliceOn(c, n.inv.Devices[ps[0]].MemoryMiB)
		}
		ca.SMPercent = c.CoresPercent
		if ca.SMPercent == 0 && !c.Whole() {
			ca.SMPercent = int32((ca.Milli + 9) / 10)
		}
		out.Containers = append(out.Containers, ca)
	}
	return out
}

// fineScore rates a plan from 0 to 1000 (see scoreFrom).
func fineScore(p plan, pl Placement) int64 {
	var healthy, used, partly int64
	for i := range p.work {
		d := &p.work[i]
		if !d.healthy {
			continue
		}
		healthy++
		u := min(d.milli, MilliPerGPU)
		used += u
		if u > 0 && u < MilliPerGPU {
			partly++
		}
	}
	var devFull int64
	for _, j := range p.picks {
		devFull += min(p.work[j].milli, MilliPerGPU)
	}
	return scoreFrom(healthy, used, partly, devFull, int64(len(p.picks)), pl)
}

// scoreFrom rates a placement from 0 to 1000, given the node's healthy
// devices after it, their used share (each capped at 1000), how many are
// partly used, and the used share of the chosen devices. Binpack favours
// fuller chosen devices (weight 5), fuller nodes (3) and fewer partly used
// devices (2), fragments that whole-GPU requests cannot use; spread favours
// emptier chosen devices and nodes (5 and 5).
func scoreFrom(healthy, used, partly, pickedUsed, picks int64, pl Placement) int64 {
	if healthy == 0 || picks == 0 {
		return 0
	}
	devFull := pickedUsed / picks
	nodeFull := used / healthy
	frag := partly * MilliPerGPU / healthy
	if pl == PlacementSpread {
		return (5*(MilliPerGPU-devFull) + 5*(MilliPerGPU-nodeFull)) / 10
	}
	return (5*devFull + 3*nodeFull + 2*(MilliPerGPU-frag)) / 10
}

// single reports whether req is one container on one device, the common case
// that Fit and Score handle without copying the node's devices.
func single(req *PodRequest) bool {
	return len(req.Containers) == 1 && req.Containers[0].Count == 1
}

// bestSingle is the position of the device place would choose for one slice
// of c, or -1: fits and sortCandidates' order in one pass, with the checks
// specialised per kind of request because Fit runs it for every node.
func bestSingle(devs []deviceState, c *ContainerRequest, pl Placement, tenant uint64) int {
	whole, spread := c.Whole(), pl == PlacementSpread
	best := -1
	var bestMilli int64
	for j := range devs {
		d := &devs[j]
		if !d.healthy || d.withheld || (!whole && d.otherTenant(tenant)) {
			continue
		}
		switch {
		case whole:
			if d.users != 0 {
				continue
			}
		case d.whole > 0:
			continue
		case c.MemoryMiB > 0:
			if d.memMiB+c.MemoryMiB > d.memoryMiB || d.milli+milliForMemory(c.MemoryMiB, d.memoryMiB) > MilliPerGPU {
				continue
			}
		default:
			if d.milli+c.Milli > MilliPerGPU || d.memMiB+c.Milli*d.memoryMiB/MilliPerGPU > d.memoryMiB {
				continue
			}
		}
		if best < 0 || (spread && d.milli < bestMilli) || (!spread && d.milli > bestMilli) {
			best, bestMilli = j, d.milli
		}
	}
	return best
}

// scoreSingle is fineScore for one slice of c placed on devs[best].
func scoreSingle(devs []deviceState, best int, c *ContainerRequest, pl Placement) int64 {
	add := MilliPerGPU
	if !c.Whole() {
		add, _ = sliceOn(c, devs[best].memoryMiB)
	}
	var healthy, used, partly, picked int64
	for j := range devs {
		d := &devs[j]
		if !d.healthy {
			continue
		}
		healthy++
		u := d.milli
		if j == best {
			u += add
		}
		u = min(u, MilliPerGPU)
		if j == best {
			picked = u
		}
		used += u
		if u > 0 && u < MilliPerGPU {
			partly++
		}
	}
	return scoreFrom(healthy, used, partly, picked, 1, pl)
}

// MaxScore is the highest Score, the kube-scheduler extender's maximum
// priority.
const MaxScore = 10

// fit, choose and score are the pure algorithms behind the Ledger's and the
// Snapshot's methods of the same names.

func (v *view) fit(node string, req *PodRequest) error {
	n, ok := v.presentNode(node)
	if !ok {
		return &NodeNotFoundError{Node: node}
	}
	if n.silent != nil {
		return n.silentError()
	}
	if drivers := n.inv.DRAManaged(); drivers != nil {
		return &DRAManagedError{Node: n.name, Drivers: drivers}
	}
	if err := validRequest(req); err != nil {
		return err
	}
	pl := effectivePlacement("", req)
	devs := v.devs(n)
	tenant := v.tenantKey(n, req.Namespace)
	if single(req) {
		if bestSingle(devs, &req.Containers[0], pl, tenant) >= 0 {
			return nil
		}
		return explain(n, devs, req, pl, tenant, failure{})
	}
	var sc scratch
	_, f, ok := place(devs, req, pl, tenant, &sc)
	if !ok {
		return explain(n, devs, req, pl, tenant, f)
	}
	return nil
}

func (v *view) choose(node string, req *PodRequest, pl Placement) (*PodAllocation, error) {
	n, ok := v.presentNode(node)
	if !ok {
		return nil, &NodeNotFoundError{Node: node}
	}
	if n.silent != nil {
		return nil, n.silentError()
	}
	if drivers := n.inv.DRAManaged(); drivers != nil {
		return nil, &DRAManagedError{Node: n.name, Drivers: drivers}
	}
	if err := validRequest(req); err != nil {
		return nil, err
	}
	pl = effectivePlacement(pl, req)
	tenant := v.tenantKey(n, req.Namespace)
	var sc scratch
	p, f, ok := place(v.devs(n), req, pl, tenant, &sc)
	if !ok {
		return nil, explain(n, v.devs(n), req, pl, tenant, f)
	}
	return allocationFrom(n, req, p), nil
}

func (v *view) fineScore(slot int32, req *PodRequest, pl Placement, sc *scratch) (int64, bool) {
	n := &v.nodes[slot]
	if !n.present() || n.silent != nil {
		return 0, false
	}
	devs := v.devs(n)
	tenant := v.tenantKey(n, req.Namespace)
	if single(req) {
		c := &req.Containers[0]
		best := bestSingle(devs, c, pl, tenant)
		if best < 0 {
			return 0, false
		}
		return scoreSingle(devs, best, c, pl), true
	}
	p, _, ok := place(devs, req, pl, tenant, sc)
	if !ok {
		return 0, false
	}
	return fineScore(p, pl), true
}

func (v *view) score(node string, req *PodRequest, pl Placement) int64 {
	slot, ok := v.slot(node)
	if !ok || validRequest(req) != nil {
		return 0
	}
	var s int64
	if single(req) {
		s, ok = v.fineScore(slot, req, effectivePlacement(pl, req), nil)
	} else {
		var sc scratch
		s, ok = v.fineScore(slot, req, effectivePlacement(pl, req), &sc)
	}
	if !ok {
		return 0
	}
	return (s*MaxScore + MilliPerGPU/2) / MilliPerGPU
}

// validRequest refuses requests that ParsePod would never return, so that
// the placement code can trust its input.
func validRequest(req *PodRequest) error {
	if req == nil || len(req.Containers) == 0 {
		return fmt.Errorf("place pod: no GPU request")
	}
	for _, c := range req.Containers {
		switch {
		case c.Count < 1 || c.Count > MaxCount:
			return fmt.Errorf("place pod %s/%s: container %s asks for %d devices", req.Namespace, req.Name, c.Name, c.Count)
		case c.MemoryMiB == 0 && (c.Milli < 1 || c.Milli > MilliPerGPU):
			return fmt.Errorf("place pod %s/%s: container %s asks for %d milli-GPUs per device", req.Namespace, req.Name, c.Name, c.Milli)
		case c.MemoryMiB < 0 || c.MemoryMiB > MaxMemoryMiB || (c.MemoryMiB > 0 && c.Milli != 0):
			return fmt.Errorf("place pod %s/%s: container %s asks for %dMiB and %d milli-GPUs per device", req.Namespace, req.Name, c.Name, c.MemoryMiB, c.Milli)
		}
	}
	return nil
}

// assumeEntry checks that a can be added to v and returns it as an entry;
// restore lets it onto withheld devices (what was there goes back).
func (v *view) assumeEntry(a *PodAllocation, restore bool) (*podEntry, error) {
	key := a.Namespace + "/" + a.Name
	if a.UID == "" {
		return nil, &InvalidAllocationError{Pod: key, Reason: "no pod UID"}
	}
	n, ok := v.presentNode(a.Node)
	if !ok {
		return nil, &NodeNotFoundError{Node: a.Node}
	}
	if n.silent != nil {
		return nil, n.silentError()
	}
	if len(a.Containers) == 0 {
		return nil, &InvalidAllocationError{Pod: key, Reason: "no container"}
	}
	devs := v.devs(n)
	var sc scratch
	work := append(sc.work[:0], devs...)
	tenant := v.tenantKey(n, a.Namespace)
	e := &podEntry{namespace: a.Namespace, name: a.Name, uid: a.UID, node: a.Node, assumed: true}
	for _, ca := range a.Containers {
		bad := func(format string, args ...any) error {
			return &InvalidAllocationError{Pod: key, Container: ca.Container, Reason: fmt.Sprintf(format, args...)}
		}
		switch {
		case ca.Milli < 1 || ca.Milli > MilliPerGPU:
			return nil, bad("share %d is outside 1..1000 milli-GPUs", ca.Milli)
		case ca.MemoryMiB < 0:
			return nil, bad("memory limit %dMiB is negative", ca.MemoryMiB)
		case len(ca.DeviceUUIDs) == 0 && len(ca.DeviceIndexes) == 0:
			return nil, bad("no device")
		case len(ca.DeviceUUIDs) > 0 && len(ca.DeviceIndexes) > 0 && len(ca.DeviceUUIDs) != len(ca.DeviceIndexes):
			return nil, bad("%d UUIDs but %d indexes", len(ca.DeviceUUIDs), len(ca.DeviceIndexes))
		}
		if slices.ContainsFunc(e.containers, func(c entryContainer) bool { return c.name == ca.Container }) {
			return nil, bad("container named twice")
		}
		ec := entryContainer{name: ca.Container, milli: ca.Milli, memMiB: ca.MemoryMiB, smPercent: ca.SMPercent}
		count := max(len(ca.DeviceUUIDs), len(ca.DeviceIndexes))
		for i := range count {
			var j int
			if len(ca.DeviceUUIDs) > 0 {
				j = n.inv.position(ca.DeviceUUIDs[i])
				if j < 0 {
					return nil, bad("node %s has no device %s", n.name, ca.DeviceUUIDs[i])
				}
				if len(ca.DeviceIndexes) > 0 && n.inv.Devices[j].Index != ca.DeviceIndexes[i] {
					return nil, bad("device %s has index %d, not %d", ca.DeviceUUIDs[i], n.inv.Devices[j].Index, ca.DeviceIndexes[i])
				}
			} else {
				j = slices.IndexFunc(n.inv.Devices, func(d Device) bool { return d.Index == ca.DeviceIndexes[i] })
				if j < 0 {
					return nil, bad("node %s has no device with index %d", n.name, ca.DeviceIndexes[i])
				}
			}
			uuid := n.inv.Devices[j].UUID
			if slices.Contains(ec.uuids, uuid) {
				return nil, bad("device %s named twice", uuid)
			}
			d := &work[j]
			if drv := n.inv.Devices[j].DRADriver; drv != "" {
				return nil, bad("device %d (%s) is allocated by DRA driver %s, not by Partita", d.index, uuid, drv)
			}
			if !d.healthy {
				return nil, bad("device %d (%s) is unhealthy", d.index, uuid)
			}
			if d.withheld && !restore {
				return nil, bad("device %d (%s) is held for another workload", d.index, uuid)
			}
			milli, mem, whole := ec.charge(d.memoryMiB)
			if (whole && d.users > 0) || (!whole && d.whole > 0) || d.milli+milli > MilliPerGPU || d.memMiB+mem > d.memoryMiB {
				return nil, &InsufficientError{
					Node: n.name, Container: ca.Container, WantMilli: milli, Count: count,
					BestDevice: d.index, BestFreeMilli: freeMilli(d), BestFreeMemoryMiB: max(0, d.memoryMiB-d.memMiB),
				}
			}
			if !whole && d.otherTenant(tenant) {
				return nil, &InsufficientError{
					Node: n.name, Container: ca.Container, WantMilli: milli, Count: count,
					BestDevice: -1, OtherTenantDevices: 1,
				}
			}
			d.milli += milli
			d.memMiB += mem
			d.users++
			if whole {
				d.whole++
			} else {
				d.tenants += tenant
			}
			ec.uuids = append(ec.uuids, uuid)
		}
		ec.wantCount = len(ec.uuids)
		e.containers = append(e.containers, ec)
	}
	return e, nil
}

func freeMilli(d *deviceState) int64 {
	if d.whole > 0 {
		return 0
	}
	return max(0, MilliPerGPU-d.milli)
}

// sortedNodeNames returns the names of the present nodes, sorted.
func (v *view) sortedNodeNames() []string {
	out := make([]string, 0, len(v.nodes))
	for i := range v.nodes {
		if v.nodes[i].present() {
			out = append(out, v.nodes[i].name)
		}
	}
	slices.Sort(out)
	return out
}

// sameShape reports whether two requests place alike: the same amounts per
// container, in the same order.
func sameShape(a, b *PodRequest) bool {
	if len(a.Containers) != len(b.Containers) || a.Placement != b.Placement {
		return false
	}
	for i := range a.Containers {
		x, y := a.Containers[i], b.Containers[i]
		if x.Count != y.Count || x.Milli != y.Milli || x.MemoryMiB != y.MemoryMiB {
			return false
		}
	}
	return true
}

// describe is a short form of a request for messages.
func describe(req *PodRequest) string {
	var parts []string
	for _, c := range req.Containers {
		amount := FormatMilli(c.Milli)
		if c.MemoryMiB > 0 {
			amount = fmt.Sprintf("%dMiB", c.MemoryMiB)
		}
		parts = append(parts, fmt.Sprintf("%s: %d × %s", c.Name, c.Count, amount))
	}
	return strings.Join(parts, ", ")
}
