package cycle

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// errNoCandidate is the answer for a member no node can take, whatever its
// devices and room: node selector, affinity, taints. A member that passes
// them on some node but finds no room there gets a *roomError.
var errNoCandidate = errors.New("no GPU node passes the pod's node selector, affinity and tolerations")

// failure is a placement that failed in this cycle, with its message for
// users, made once.
type failure struct {
	err error
	msg string
}

// message is the wait message for w.
func (f *failure) message(w *Workload, members []*Member) string {
	if f == nil {
		return capacityMessage(w, members, errors.New("no node has room now"))
	}
	if f.msg == "" {
		f.msg = capacityMessage(w, members, f.err)
	}
	return f.msg
}

// place simulates members on the snapshot, all or none; placed members are
// assumed there. memo lets a failure be remembered for alike members for the
// rest of the cycle (room only shrinks within a cycle).
//
// Members that ask for their GPUs through ResourceClaims (Member.Claims)
// are not placed on the ledger: kube-scheduler's DRA plugin allocates their
// devices from the drivers' ResourceSlices, which the ledger does not hold.
// They are admitted with an allocation that names no node or device.
func (c *cycle) place(w *Workload, members []*Member, memo bool) ([]MemberAdmission, error) {
	if len(members) == 0 {
		return nil, nil
	}
	if slices.ContainsFunc(members, func(m *Member) bool { return m.Claims != nil }) {
		var rest, claims []*Member
		for _, m := range members {
			if m.Claims != nil {
				claims = append(claims, m)
			} else {
				rest = append(rest, m)
			}
		}
		placed, err := c.placeOnLedger(w, rest, memo)
		if err != nil {
			return nil, err
		}
		nodes := make([]string, len(claims))
		if c.opts.Claims != nil {
			// A single pod is simulated too, so that what it takes counts
			// for the gangs after it in the cycle (and it waits, rather than
			// holding its queue's quota, when its claims fit nowhere); only
			// gangs are pinned (commit).
			if nodes, err = c.placeClaims(claims); err != nil {
				return nil, c.unplace(w, members, placed, memo, err)
			}
		}
		for i, m := range claims {
			placed = append(placed, MemberAdmission{Member: m, Allocation: &gpu.PodAllocation{Namespace: m.Pod.Namespace, Name: m.Pod.Name, UID: m.Pod.UID, Node: nodes[i]}})
		}
		return placed, nil
	}
	placed, err := c.placeOnLedger(w, members, memo)
	if err != nil || !c.verifiesClaims(w, members) {
		return placed, err
	}
	if err := c.allocateOnPlacedNodes(placed); err != nil {
		return nil, c.unplace(w, members, placed, memo, err)
	}
	return placed, nil
}

// unplace takes back what place put on the ledger before its claim
// simulation failed with err, which it remembers for alike members when
// memo is set, and returns.
func (c *cycle) unplace(w *Workload, members []*Member, placed []MemberAdmission, memo bool, err error) error {
	for _, p := range placed {
		c.snap.Forget(p.Member.Pod.UID)
	}
	if memo {
		key, _ := c.placeQuestion(w, members)
		c.failedShapes[c.liftKey+key] = &failure{err: err}
	}
	return err
}

// verifiesClaims reports whether a gang's ledger placement must also hold
// in the claim simulation: its members carry pod claims of their own
// (Partita's dra backend gives each GPU container one), which kube-scheduler's
// DRA plugin allocates from the ResourceSlices. The ledger learns those
// allocations from the agents' GPUNode status, a moment late; the
// simulation reads the claims themselves, so a gang pinned to its nodes is
// sure to find its devices there. Single pods are not pinned: kube-scheduler
// picks their node.
func (c *cycle) verifiesClaims(w *Workload, members []*Member) bool {
	if c.opts.Claims == nil || (len(members) < 2 && w.MinMember < 2) {
		return false
	}
	return slices.ContainsFunc(members, func(m *Member) bool { return len(m.Pod.Spec.ResourceClaims) > 0 })
}

// allocateOnPlacedNodes simulates the allocation of the claims of placed
// members on the node the ledger chose for each, all at once.
func (c *cycle) allocateOnPlacedNodes(placed []MemberAdmission) error {
	if c.claimSimulation() == nil {
		return fmt.Errorf("simulate the gang's ResourceClaims: %w", c.claimErr)
	}
	var pods []*corev1.Pod
	var cands [][]*corev1.Node
	for _, p := range placed {
		if len(p.Member.Pod.Spec.ResourceClaims) == 0 {
			continue
		}
		var node []*corev1.Node
		if n := c.st.Nodes[p.Allocation.Node]; n != nil && n.Node != nil {
			node = []*corev1.Node{n.Node}
		}
		pods = append(pods, p.Member.Pod)
		cands = append(cands, node)
	}
	_, err := c.claimSession.Place(c.ctx, pods, cands)
	return err
}

// placeClaims simulates the allocation of the claim members' ResourceClaims
// with the scheduler's allocator (Options.Claims), all at once, on the
// nodes each may run on with CPU and memory to spare; it returns each
// member's node. What it places stays allocated for the rest of the cycle.
func (c *cycle) placeClaims(members []*Member) ([]string, error) {
	if c.claimSimulation() == nil {
		return nil, fmt.Errorf("simulate the gang's ResourceClaims: %w", c.claimErr)
	}
	pods := make([]*corev1.Pod, len(members))
	cands := make([][]*corev1.Node, len(members))
	for i, m := range members {
		pods[i] = m.Pod
		for _, n := range c.claimNodes(m) {
			if c.room(n.Name, m) > 0 {
				cands[i] = append(cands[i], n)
			}
		}
	}
	// (A node's CPU and memory room is judged for each member alone: the
	// allocator, not the loop, chooses among the candidates.)
	return c.claimSession.Place(c.ctx, pods, cands)
}

// claimSimulation is the cycle's simulation of ResourceClaims, started on
// first use with what admitted pods hold; nil without Options.Claims or
// when it could not start (c.claimErr says why).
func (c *cycle) claimSimulation() ClaimSession {
	if c.opts.Claims == nil {
		return nil
	}
	if c.claimSession == nil && c.claimErr == nil {
		c.claimSession, c.claimErr = c.opts.Claims.Session(c.ctx)
		if c.claimErr == nil {
			c.holdAdmittedClaims()
		}
	}
	return c.claimSession
}

// holdAdmittedClaims allocates, on the session, the claims of members
// already admitted whose claims kube-scheduler has not allocated yet, so
// that a gang simulated now does not count their devices as free. Each is
// simulated on the nodes it may run on (its pin, if pinned); one that fits
// nowhere holds nothing.
func (c *cycle) holdAdmittedClaims() {
	for _, ws := range c.st.Active {
		for _, w := range ws {
			for _, m := range w.Active {
				// Partita's own dra-backend pods are held on the ledger,
				// which a gang of them is placed on first
				// (verifiesClaims): simulating each admitted one here too
				// would cost an allocator run per pod and cycle.
				if m.Claims == nil || m.Claims.Allocated {
					continue
				}
				cands := c.claimNodes(m)
				if m.Bound {
					cands = nil
					if n := c.st.Nodes[m.Pod.Spec.NodeName]; n != nil && n.Node != nil {
						cands = []*corev1.Node{n.Node}
					}
				}
				_, _ = c.claimSession.Place(c.ctx, []*corev1.Pod{m.Pod}, [][]*corev1.Node{cands})
			}
		}
	}
}

// claimNodes are every node, in name order, whose selector, affinity,
// taints and schedulability admit m: a claim member may run on nodes
// Partita's agent does not serve (another driver's GPUs there).
func (c *cycle) claimNodes(m *Member) []*corev1.Node {
	sig := constraintSig(m)
	if out, ok := c.claimCandidates[sig]; ok {
		return out
	}
	if c.claimCandidates == nil {
		c.claimCandidates = map[string][]*corev1.Node{}
	}
	names := make([]string, 0, len(c.st.Nodes))
	for name := range c.st.Nodes {
		names = append(names, name)
	}
	slices.Sort(names)
	aff := nodeaffinity.GetRequiredNodeAffinity(m.Pod)
	out := []*corev1.Node{}
	for _, name := range names {
		n := c.st.Nodes[name]
		if n == nil || n.Node == nil || n.Node.Spec.Unschedulable {
			continue
		}
		if ok, err := aff.Match(n.Node); err != nil || !ok {
			continue
		}
		if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), n.Node.Spec.Taints, m.Pod.Spec.Tolerations, schedulingTaint, false); untolerated {
			continue
		}
		out = append(out, n.Node)
	}
	c.claimCandidates[sig] = out
	return out
}

// placeOnLedger is place for members the ledger places.
func (c *cycle) placeOnLedger(w *Workload, members []*Member, memo bool) ([]MemberAdmission, error) {
	if len(members) == 0 {
		return nil, nil
	}
	key, groups := c.placeQuestion(w, members)
	key = c.liftKey + key
	if memo {
		if f, ok := c.failedShapes[key]; ok {
			return nil, f.err
		}
	}
	defer c.openLifted()()
	if plan, err := c.topoPlanOf(w); err != nil || plan != nil {
		var placed []MemberAdmission
		if err == nil {
			placed, err = c.placeTopology(w, members, plan)
		}
		if err != nil && memo {
			c.failedShapes[key] = &failure{err: err}
		}
		return placed, err
	}
	var placed []MemberAdmission
	for _, g := range groups {
		allocs, err := c.placeGroup(w, g)
		if err != nil {
			for _, p := range placed {
				c.snap.Forget(p.Member.Pod.UID)
			}
			if memo {
				c.failedShapes[key] = &failure{err: err}
			}
			return nil, err
		}
		for i, a := range allocs {
			placed = append(placed, MemberAdmission{Member: g.members[i], Allocation: a})
		}
	}
	return placed, nil
}

// placeQuestion is the shape key and constraint groups of members; for the
// workload's leading pending members it is memoised in the workload.
func (c *cycle) placeQuestion(w *Workload, members []*Member) (string, []constraintGroup) {
	lead := len(members) <= len(w.Pending) && len(members) > 0 && &members[0] == &w.Pending[0]
	topo := !w.Topology.IsZero() || len(w.SubGroups) > 0
	if topo {
		// What the question is depends on the cycle's Topologies and on
		// where the workload's members already run: asked once a cycle,
		// and again once members of it were placed (anchors).
		if q, ok := c.topoQuestions[w]; ok && lead && countMembers(q.groups) == len(members) {
			return q.key, q.groups
		}
	} else if lead && w.placeKey != "" && len(w.placeGroups) > 0 && countMembers(w.placeGroups) == len(members) {
		return w.placeKey, w.placeGroups
	}
	groups := c.groupByConstraints(members)
	prefix := w.TopologyKey
	if topo {
		prefix = c.topoQuestion(w, members)
	}
	key := shapeKey(prefix, groups)
	switch {
	case lead && topo:
		if c.topoQuestions == nil {
			c.topoQuestions = map[*Workload]askedPlacement{}
		}
		c.topoQuestions[w] = askedPlacement{key: key, groups: groups}
	case lead:
		w.placeKey, w.placeGroups = key, groups
	}
	return key, groups
}

// askedPlacement is a workload's leading members' placement question.
type askedPlacement struct {
	key    string
	groups []constraintGroup
}

func countMembers(groups []constraintGroup) int {
	n := 0
	for _, g := range groups {
		n += len(g.members)
	}
	return n
}

// knownFailure returns an earlier failed placement of the same shape in
// this cycle, if one failed.
func (c *cycle) knownFailure(w *Workload, members []*Member) (*failure, bool) {
	if len(members) == 0 {
		return nil, false
	}
	key, _ := c.placeQuestion(w, members)
	f, ok := c.failedShapes[c.liftKey+key]
	return f, ok
}

// constraintGroup is members that share their node constraints.
type constraintGroup struct {
	sig     string
	members []*Member
}

func (c *cycle) groupByConstraints(members []*Member) []constraintGroup {
	var out []constraintGroup
	for _, m := range members {
		sig := constraintSig(m)
		i := slices.IndexFunc(out, func(g constraintGroup) bool { return g.sig == sig })
		if i < 0 {
			out = append(out, constraintGroup{sig: sig})
			i = len(out) - 1
		}
		out[i].members = append(out[i].members, m)
	}
	return out
}

// constraintSig identifies what restricts a member's nodes: selector,
// required affinity, tolerations, and its CPU and memory requests. It is
// computed once per member: members are immutable and outlive cycles.
func constraintSig(m *Member) string {
	if m.sig == "" {
		m.sig = computeConstraintSig(m)
	}
	return m.sig
}

func computeConstraintSig(m *Member) string {
	type sig struct {
		Selector    map[string]string    `json:"s,omitempty"`
		Affinity    *corev1.NodeSelector `json:"a,omitempty"`
		Tolerations []corev1.Toleration  `json:"t,omitempty"`
		CPU         int64                `json:"c"`
		Memory      int64                `json:"m"`
	}
	s := sig{Selector: m.Pod.Spec.NodeSelector, Tolerations: m.Pod.Spec.Tolerations, CPU: m.CPUMilli, Memory: m.Memory}
	if a := m.Pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		s.Affinity = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Sprintf("unreadable:%s", m.Pod.UID)
	}
	return string(b)
}

// shapeKey identifies a placement question: alike questions have alike
// answers within a cycle.
func shapeKey(topologyKey string, groups []constraintGroup) string {
	var b strings.Builder
	b.WriteString(topologyKey)
	for _, g := range groups {
		b.WriteString("|")
		b.WriteString(g.sig)
		// Members mostly ask alike: a run of one shape is written once.
		for i := 0; i < len(g.members); {
			shape := requestShape(g.members[i])
			j := i + 1
			for j < len(g.members) && requestShape(g.members[j]) == shape {
				j++
			}
			b.WriteString(";")
			b.WriteString(shape)
			if j-i > 1 {
				b.WriteString("\x04")
				b.WriteString(strconv.Itoa(j - i))
			}
			i = j
		}
	}
	return b.String()
}

// placeGroup places members that share constraints (a workload that asks
// nothing of the topology: placeTopology places the others).
func (c *cycle) placeGroup(w *Workload, g constraintGroup) ([]*gpu.PodAllocation, error) {
	return c.placeGroupOn(w, g, nil, false)
}

// placeGroupOn is placeGroup on nodes only (sorted; nil for any). With
// topo, the topology placement chose nodes, and members that need a node
// each get one.
func (c *cycle) placeGroupOn(w *Workload, g constraintGroup, nodes []string, topo bool) ([]*gpu.PodAllocation, error) {
	cands := c.staticCandidates(g.sig, g.members[0])
	own := topo && ownNode(g.members[0])
	if nodes != nil {
		// A domain's nodes are few: walk them, not every candidate.
		in := make([]string, 0, len(nodes))
		for _, name := range nodes {
			if _, ok := slices.BinarySearch(cands, name); ok {
				in = append(in, name)
			}
		}
		cands = in
	}
	names := make([]string, 0, len(cands))
	caps := make([]int, 0, len(cands))
	capped := false
	for _, name := range cands {
		n := c.room(name, g.members[0])
		capped = capped || n < len(g.members)
		if n > 0 {
			if own {
				n = 1
			}
			names = append(names, name)
			caps = append(caps, n)
		}
	}
	if len(cands) == 0 {
		return nil, &gpu.GangError{Total: len(g.members), Cause: errNoCandidate}
	}
	if len(names) == 0 {
		return nil, &gpu.GangError{Total: len(g.members), Cause: c.roomShortNodes(cands, g.members[0], false, 0, len(g.members), 1)}
	}
	reqs := make([]*gpu.PodRequest, len(g.members))
	for i, m := range g.members {
		reqs[i] = m.Request
	}
	placement := gpu.Placement("")
	if reqs[0].Placement == "" {
		placement = c.opts.Placement
	}
	if !topo {
		if allocs, ok := c.placeWhereModelsAre(g, reqs, names, caps, placement); ok {
			return allocs, nil
		}
	}
	allocs, err := c.snap.PlaceGangCapped(reqs, names, caps, placement)
	var ge *gpu.GangError
	if err == nil || !capped || topo || !errors.As(err, &ge) {
		return allocs, err
	}
	// The nodes' room held some members back. If the GPUs alone would
	// take them all, room is why they wait, and the wait says so.
	if all, uncapped := c.snap.PlaceGang(reqs, cands, placement); uncapped == nil {
		for _, a := range all {
			c.snap.Forget(a.UID)
		}
		return nil, &gpu.GangError{Total: ge.Total, Member: ge.Member, UID: ge.UID,
			Cause: c.roomShortNodes(cands, g.members[0], true, ge.Member, len(g.members), len(g.members))}
	}
	return nil, err
}

// placeWhereModelsAre places the group on the nodes that hold its models
// (partita.dev/model of its first member; the group shares its pod spec),
// if it fits there whole: replicas start where their weights are. ok is
// false when the members ask for no model, no candidate holds any, or they
// do not fit there; the caller then places them anywhere.
func (c *cycle) placeWhereModelsAre(g constraintGroup, reqs []*gpu.PodRequest, names []string, caps []int, placement gpu.Placement) ([]*gpu.PodAllocation, bool) {
	if c.opts.ModelsHeld == nil {
		return nil, false
	}
	pod := g.members[0].Pod
	models := v1alpha1.ModelNamesOf(pod.Annotations)
	if len(models) == 0 {
		return nil, false
	}
	held := c.opts.ModelsHeld(pod.Namespace, models)
	if len(held) == 0 {
		return nil, false
	}
	var hn []string
	var hc []int
	for i, n := range names {
		if held[n] > 0 {
			hn, hc = append(hn, n), append(hc, caps[i])
		}
	}
	if len(hn) == 0 {
		return nil, false
	}
	allocs, err := c.snap.PlaceGangCapped(reqs, hn, hc, placement)
	return allocs, err == nil
}

// staticCandidates are the GPU nodes, in name order, whose selector,
// affinity, taints and schedulability admit the member: what cannot change
// within a cycle, computed once per constraint signature.
func (c *cycle) staticCandidates(sig string, m *Member) []string {
	if c.candidates == nil {
		c.candidates = map[string][]string{}
	}
	if out, ok := c.candidates[sig]; ok {
		return out
	}
	aff := nodeaffinity.GetRequiredNodeAffinity(m.Pod)
	out := []string{}
	for _, name := range c.nodeNamesOnce() {
		n := c.st.Nodes[name]
		if n == nil || n.Node == nil || n.Node.Spec.Unschedulable {
			continue
		}
		if ok, err := aff.Match(n.Node); err != nil || !ok {
			continue
		}
		if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), n.Node.Spec.Taints, m.Pod.Spec.Tolerations, schedulingTaint, false); untolerated {
			continue
		}
		out = append(out, name)
	}
	c.candidates[sig] = out
	return out
}

// placedAsScheduled reports whether the cycle's placement of pod weighs
// all that kube-scheduler would: its required node affinity, taints, GPUs
// and CPU and memory room, and nothing that depends on other pods, on
// volumes, on other resources or on preferences. Pod affinity and
// anti-affinity, topology spread constraints, host ports, persistent and
// ephemeral volumes (a volume's node affinity), other extended resources
// and preferred node affinity are left to kube-scheduler (a required one
// could refuse the node the cycle chose; a preferred one would be ignored
// once the pod has one node to go to).
func placedAsScheduled(pod *corev1.Pod) bool {
	spec := &pod.Spec
	if len(spec.TopologySpreadConstraints) > 0 {
		return false
	}
	for i := range spec.Volumes {
		if spec.Volumes[i].PersistentVolumeClaim != nil || spec.Volumes[i].Ephemeral != nil {
			return false
		}
	}
	if a := spec.Affinity; a != nil {
		if a.PodAffinity != nil || a.PodAntiAffinity != nil {
			return false
		}
		if a.NodeAffinity != nil && len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0 {
			return false
		}
	}
	if hasHostPort(spec) {
		return false
	}
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			for name := range cs[i].Resources.Requests {
				if !weighedResource(name) {
					return false
				}
			}
			for name := range cs[i].Resources.Limits {
				if !weighedResource(name) {
					return false
				}
			}
		}
	}
	return true
}

// pinnable reports whether a gang member may be pinned to the node the
// cycle chose: it has none of the constraints between pods that the cycle
// does not weigh and that can make kube-scheduler refuse that node, where
// the member would wait out the schedule timeout, be placed the same way
// again, and never run. Those are required pod affinity or anti-affinity,
// a DoNotSchedule topology spread and host ports: binpacking puts members
// side by side, which "one worker a node" forbids.
func pinnable(pod *corev1.Pod) bool {
	spec := &pod.Spec
	for _, c := range spec.TopologySpreadConstraints {
		if c.WhenUnsatisfiable != corev1.ScheduleAnyway {
			return false
		}
	}
	if a := spec.Affinity; a != nil {
		if a.PodAffinity != nil && len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			return false
		}
		if a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
			return false
		}
	}
	return !hasHostPort(spec)
}

// hasHostPort reports whether a container of spec asks for a host port.
func hasHostPort(spec *corev1.PodSpec) bool {
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			for _, p := range cs[i].Ports {
				if p.HostPort != 0 {
					return true
				}
			}
		}
	}
	return false
}

// weighedResource: the cycle places a pod by this resource (CPU and
// memory room, GPUs on the ledger).
func weighedResource(name corev1.ResourceName) bool {
	return name == corev1.ResourceCPU || name == corev1.ResourceMemory || slices.Contains(gpu.ResourceNames(), name)
}

// schedulingTaint selects the taints that keep pods off a node at
// scheduling, as kube-scheduler's TaintToleration filter does.
func schedulingTaint(t *corev1.Taint) bool {
	return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
}

// nodeRoom is what a node offers pods and what its pods take of it, as
// kube-scheduler's NodeResourcesFit counts them: allocatable pods, CPU
// (milli) and memory (bytes), and the pods bound or pinned to the node
// with the members the cycle placed there.
type nodeRoom struct {
	pods, cpu, memory             int64
	usedPods, usedCPU, usedMemory int64
}

// nodeRoom reads name's room; ok is false for a node the cycle does not
// know.
func (c *cycle) nodeRoom(name string) (nodeRoom, bool) {
	n := c.st.Nodes[name]
	if n == nil || n.Node == nil {
		return nodeRoom{}, false
	}
	alloc := n.allocatable()
	// A node without allocatable pods (a kwok node before it has a
	// status, a kubelet that has not reported) takes none: kube-scheduler
	// refuses it every pod ("Too many pods").
	r := nodeRoom{pods: alloc[0], cpu: alloc[1], memory: alloc[2]}
	if c.ignoreNodeUse {
		// findRoom asks what the node takes once its pods end.
		return r, true
	}
	r.usedPods, r.usedCPU, r.usedMemory = n.Pods, n.CPUMilli, n.Memory
	if e := c.extra[name]; e != nil {
		r.usedCPU += e[0]
		r.usedMemory += e[1]
		r.usedPods += e[2]
	}
	return r, true
}

// fit is how many more pods like m the room takes by each resource:
// pods, CPU and memory (math.MaxInt32 for a resource m does not ask for).
func (r nodeRoom) fit(m *Member) (pods, cpu, memory int) {
	pods, cpu, memory = clampInt(r.pods-r.usedPods), math.MaxInt32, math.MaxInt32
	if m.CPUMilli > 0 {
		cpu = clampInt((r.cpu - r.usedCPU) / m.CPUMilli)
	}
	if m.Memory > 0 {
		memory = clampInt((r.memory - r.usedMemory) / m.Memory)
	}
	return pods, cpu, memory
}

func clampInt(v int64) int { return int(max(min(v, math.MaxInt32), math.MinInt32)) }

// room is how many pods like m node can still take by pods, CPU and
// memory.
func (c *cycle) room(name string, m *Member) int {
	r, ok := c.nodeRoom(name)
	if !ok {
		return 0
	}
	pods, cpu, memory := r.fit(m)
	return min(pods, cpu, memory)
}

// shortfall says why node name takes fewer than want more pods like m, in
// words with the numbers ("node n3 has no room for more pods (110 of
// 110)"); "" when it takes want.
func (c *cycle) shortfall(name string, m *Member, want int) string {
	r, ok := c.nodeRoom(name)
	if !ok {
		return ""
	}
	pods, cpu, memory := r.fit(m)
	fit := min(pods, cpu, memory)
	if fit >= want {
		return ""
	}
	var why []string
	switch {
	case pods > fit:
	case r.pods <= 0:
		why = append(why, "publishes no allocatable pods (no kubelet, or kwok, has reported its capacity)")
	case pods <= 0:
		why = append(why, fmt.Sprintf("has no room for more pods (%d of %d)", r.usedPods, r.pods))
	default:
		why = append(why, fmt.Sprintf("has room for %d more pods (%d of %d)", pods, r.usedPods, r.pods))
	}
	if cpu == fit {
		why = append(why, fmt.Sprintf("has %s of %s CPUs free and the pod asks for %s",
			milliCPU(r.cpu-r.usedCPU), milliCPU(r.cpu), milliCPU(m.CPUMilli)))
	}
	if memory == fit {
		why = append(why, fmt.Sprintf("has %s of %s of memory free and the pod asks for %s",
			bytesOf(r.memory-r.usedMemory), bytesOf(r.memory), bytesOf(m.Memory)))
	}
	return "node " + name + " " + strings.Join(why, " and ")
}

func milliCPU(v int64) string {
	q := resource.NewMilliQuantity(max(v, 0), resource.DecimalSI)
	return q.String()
}

func bytesOf(v int64) string {
	q := resource.NewQuantity(max(v, 0), resource.BinarySI)
	return q.String()
}

// roomError says that members find GPUs but not the room on the nodes
// that kube-scheduler's NodeResourcesFit checks: pods, CPU or memory.
// Pinned there, a member would wait for kube-scheduler beside members
// already running.
type roomError struct {
	// gpusFree: the GPUs would take every member if room did not count;
	// fit is then how many of the total members the nodes' room takes.
	gpusFree   bool
	fit, total int
	// candidates is how many nodes the members may run on.
	candidates int
	// nodes say why the first nodes short of room are; more counts the
	// others.
	nodes []string
	more  int
}

func (e *roomError) Error() string {
	list := strings.Join(e.nodes, "; ")
	if e.more > 0 {
		list += fmt.Sprintf("; and %d more", e.more)
	}
	switch {
	case e.gpusFree && e.fit > 0:
		return fmt.Sprintf("its GPUs are free, but the nodes' room for pods, CPU and memory takes only %d of the %d: %s", e.fit, e.total, list)
	case e.gpusFree:
		return "its GPUs are free, but not on a node with room for pods, CPU and memory: " + list
	case e.candidates == 1:
		return list
	}
	return fmt.Sprintf("none of the %d GPU nodes it may run on has room for pods, CPU and memory: %s", e.candidates, list)
}

// roomShortNodes is the roomError for total members like m on nodes,
// naming the nodes that take fewer than want of them. With gpusFree the
// GPUs would take them all, and fit of them fit by room.
func (c *cycle) roomShortNodes(nodes []string, m *Member, gpusFree bool, fit, total, want int) *roomError {
	e := &roomError{gpusFree: gpusFree, fit: fit, total: total, candidates: len(nodes)}
	for _, name := range nodes {
		why := c.shortfall(name, m, want)
		switch {
		case why == "":
		case len(e.nodes) < maxRoomNodes:
			e.nodes = append(e.nodes, why)
		default:
			e.more++
		}
	}
	return e
}

// maxRoomNodes is how many nodes short of room a wait names.
const maxRoomNodes = 3

// requestShape is the member's request and placement in words, computed
// once per member.
func requestShape(m *Member) string {
	if m.shape == "" {
		m.shape = describeMember(m) + "/" + string(m.Request.Placement)
	}
	return m.shape
}
