package cycle

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"math"
	"slices"
	"strings"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Topology-aware placement (docs/guide/topology.md). A workload that names a
// required level is placed inside one domain of it: among the domains with
// room, the one with the least (best fit), so that large domains stay
// whole for large gangs. Inside it, a preferred level's domains are used
// as few as possible: the smallest single one that takes every member,
// else the roomiest first. Sub-groups are placed one after another, the
// largest first, each inside a domain of its own level within the gang's.

// maxPreferredTries bounds the single domains tried for a preference: it
// is a preference, and every try is a placement.
const maxPreferredTries = 8

// topoPlan is what a workload asks of the topology, resolved against the
// cycle's Topologies.
type topoPlan struct {
	// levels are the named Topology's, broadest first; nil when the
	// workload names none and its levels are plain node labels.
	levels              []string
	levelsSig           string
	required, preferred string
	subGroups           map[string]v1alpha1.SubGroup
}

// topologyError says why a workload cannot be placed as its topology
// asks: a Topology or level that does not exist, or no domain with room.
type topologyError struct {
	// msg follows "it" or "its sub-group NAME": "needs 16 GPUs in one ...".
	msg string
	// sub is the sub-group concerned, "" for the whole workload.
	sub string
}

func (e *topologyError) Error() string {
	if e.sub != "" {
		return "its sub-group " + e.sub + " " + e.msg
	}
	return "it " + e.msg
}

// topoPlanOf resolves what w asks of the topology; nil when it asks
// nothing (spec.topologyKey alone is a preferred level).
func (c *cycle) topoPlanOf(w *Workload) (*topoPlan, error) {
	r := w.Topology
	if r.IsZero() && len(w.SubGroups) == 0 && w.TopologyKey == "" {
		return nil, nil
	}
	p := &topoPlan{required: r.Required, preferred: cmp.Or(r.Preferred, w.TopologyKey)}
	if len(w.SubGroups) > 0 {
		p.subGroups = make(map[string]v1alpha1.SubGroup, len(w.SubGroups))
		for _, sg := range w.SubGroups {
			p.subGroups[sg.Name] = sg
		}
	}
	if r.Topology == "" {
		// Levels named without a Topology (Kueue's keys name none) are
		// read in the first Topology, by name, that has them all, so that
		// a rack is told apart by its block as there; else as plain
		// labels.
		r.Topology = c.topologyWith(p.required, p.preferred)
		if r.Topology == "" {
			return p, nil
		}
	}
	levels, ok := c.st.Topologies[r.Topology]
	if !ok {
		return nil, &topologyError{msg: fmt.Sprintf("names topology %s, which does not exist: create it (kubectl get topologies lists those that do), or name another in %s", r.Topology, v1alpha1.AnnotationTopology)}
	}
	p.levels, p.levelsSig = levels, strings.Join(levels, ",")
	check := func(level, what string) error {
		if level != "" && !slices.Contains(levels, level) {
			return &topologyError{msg: fmt.Sprintf("asks for %s level %s, which is not a level of topology %s (its levels: %s)", what, level, r.Topology, strings.Join(levels, ", "))}
		}
		return nil
	}
	if err := check(p.required, "required"); err != nil {
		return nil, err
	}
	if err := check(r.Preferred, "preferred"); err != nil {
		return nil, err
	}
	for _, sg := range w.SubGroups {
		if err := check(sg.TopologyRequired, "sub-group "+sg.Name+"'s required"); err != nil {
			return nil, err
		}
		if err := check(sg.TopologyPreferred, "sub-group "+sg.Name+"'s preferred"); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// topologyWith is the first Topology, by name, whose levels include every
// non-empty one of levels; "" when none does.
func (c *cycle) topologyWith(levels ...string) string {
	names := make([]string, 0, len(c.st.Topologies))
	for name := range c.st.Topologies {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !slices.ContainsFunc(levels, func(l string) bool { return l != "" && !slices.Contains(c.st.Topologies[name], l) }) {
			return name
		}
	}
	return ""
}

// sig is the plan in a placement question's key.
func (p *topoPlan) sig() string {
	if p == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "topo[%s|%s|%s", strings.Join(p.levels, ","), p.required, p.preferred)
	names := make([]string, 0, len(p.subGroups))
	for n := range p.subGroups {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		sg := p.subGroups[n]
		fmt.Fprintf(&b, "|%s:%d:%s:%s", n, sg.MinMember, sg.TopologyRequired, sg.TopologyPreferred)
	}
	b.WriteString("]")
	return b.String()
}

// domainKey is the domain of level a node with labels is in: the values of
// level and, in a Topology, of every broader level (rack r1 of block b1 is
// not rack r1 of block b2). ok is false when a label is missing.
func (p *topoPlan) domainKey(labels map[string]string, level string) (string, bool) {
	if p.levels == nil {
		v, ok := labels[level]
		return v, ok
	}
	var b strings.Builder
	for _, l := range p.levels {
		v, ok := labels[l]
		if !ok {
			return "", false
		}
		b.WriteString(v)
		if l == level {
			return b.String(), true
		}
		b.WriteString("\x00")
	}
	return "", false
}

// domainLabels are the labels (and values, read from labels) that keep a
// pod inside its domain of level: the level's and every broader one's.
func (p *topoPlan) domainLabels(labels map[string]string, level string, into map[string]string) {
	if level == "" {
		return
	}
	if p.levels == nil {
		if v, ok := labels[level]; ok {
			into[level] = v
		}
		return
	}
	for _, l := range p.levels {
		if v, ok := labels[l]; ok {
			into[l] = v
		}
		if l == level {
			return
		}
	}
}

// topoDomain is the candidate nodes of one domain. Domains are built for
// each set of nodes and level (partition) and kept while the nodes'
// labels, taints and schedulability stay the same (Domains); their free
// room is read again the first time a cycle uses them and kept up to date
// from the snapshot's changes. They are shared, and never changed by their
// users.
type topoDomain struct {
	key   string
	value string
	nodes []string
	free  int64
	// stamp is the cycle free was read in (topoState.stamp).
	stamp uint64
	// set names the domain's nodes as a set, for partitions within it.
	set string
}

// topoState is the cache of domains: the cycle's own, or Domains'.
type topoState struct {
	// stamp counts the cycles that used the state; mark is how far the
	// snapshot's changes were read (gpu.Snapshot.Changes) in this one.
	stamp uint64
	mark  int
	// free is what each node in a domain had free when last read this
	// cycle; a node not in it is in no domain whose free is current.
	free map[string]int64
	// indexes are the domains by plan levels, level and set of nodes, with
	// the cycle each was last used in; nodeDoms the domains each node is in.
	indexes  map[string]*topoIndex
	nodeDoms map[string][]*topoDomain
	// cands are topoCandidates by the members' constraint signatures.
	cands map[string][]string
}

// topoIndex is one partition: a set of nodes grouped by one level.
type topoIndex struct {
	doms []*topoDomain
	used uint64
}

func newTopoState() *topoState {
	return &topoState{free: map[string]int64{}, indexes: map[string]*topoIndex{}, nodeDoms: map[string][]*topoDomain{}, cands: map[string][]string{}}
}

// Domains carries topology domains from cycle to cycle: grouping thousands
// of nodes by their labels is most of what a topology placement costs,
// and the groups change only when nodes do: their labels, taints or
// schedulability (State.NodeEpoch) or their GPUs (the snapshot's inventory
// epoch: a node whose agent publishes its GPUNode late joins then). The
// zero value is ready; the loop keeps one.
type Domains struct {
	// epoch is the State.NodeEpoch and the snapshot's inventory epoch (a
	// GPUNode added, removed or changed) the domains were grouped at.
	epoch [2]uint64
	state *topoState
}

// domainsIdle is how many cycles a partition is kept without being used.
const domainsIdle = 64

// begin hands a cycle the kept domains, grouped again from nothing when
// the nodes changed, with their free room to be read from snap.
func (d *Domains) begin(st *State, snap *gpu.Snapshot) *topoState {
	epoch := [2]uint64{st.NodeEpoch, snap.InventoryEpoch()}
	if d.state == nil || d.epoch != epoch {
		d.state, d.epoch = newTopoState(), epoch
	}
	t := d.state
	t.stamp++
	clear(t.free)
	_, t.mark = snap.Changes(math.MaxInt)
	if t.stamp%domainsIdle == 0 {
		t.prune()
	}
	return t
}

// prune forgets the partitions no cycle used for domainsIdle cycles (the
// node sets of workloads that are gone), so that the state stays the size
// of what is pending.
func (t *topoState) prune() {
	stale := false
	for key, idx := range t.indexes {
		if t.stamp-idx.used >= domainsIdle {
			delete(t.indexes, key)
			stale = true
		}
	}
	if !stale {
		return
	}
	clear(t.nodeDoms)
	clear(t.cands)
	for _, idx := range t.indexes {
		for _, d := range idx.doms {
			for _, n := range d.nodes {
				t.nodeDoms[n] = append(t.nodeDoms[n], d)
			}
		}
	}
}

func (c *cycle) topoCache() *topoState {
	if c.topo == nil {
		if c.opts.Domains != nil {
			c.topo = c.opts.Domains.begin(c.st, c.snap)
		} else {
			c.topo = newTopoState()
			c.topo.stamp = 1
		}
	}
	return c.topo
}

// syncFree brings the current domains' free room up to date with what
// changed on the snapshot since it last did.
func (c *cycle) syncFree() {
	t := c.topoCache()
	nodes, next := c.snap.Changes(t.mark)
	t.mark = next
	for _, n := range nodes {
		old, read := t.free[n]
		if !read {
			// Every domain it is in still has to be read this cycle.
			continue
		}
		f := c.snap.FreeMilli(n)
		if f == old {
			continue
		}
		t.free[n] = f
		for _, d := range t.nodeDoms[n] {
			d.free += f - old
		}
	}
}

// freeOf is what node has free, read once a cycle.
func (c *cycle) freeOf(t *topoState, node string) int64 {
	f, ok := t.free[node]
	if !ok {
		f = c.snap.FreeMilli(node)
		t.free[node] = f
	}
	return f
}

// partition groups nodes (in name order; set names them) by their domain
// of level; nodes without it belong to none. The slice and the domains
// are shared: callers read them only.
func (c *cycle) partition(p *topoPlan, set string, nodes []string, level string) []*topoDomain {
	t := c.topoCache()
	c.syncFree()
	key := p.levelsSig + "\x01" + level + "\x01" + set
	idx := t.indexes[key]
	if idx == nil {
		idx = &topoIndex{doms: c.group(p, key, nodes, level)}
		t.indexes[key] = idx
	}
	idx.used = t.stamp
	for _, d := range idx.doms {
		if d.stamp == t.stamp {
			continue
		}
		d.free, d.stamp = 0, t.stamp
		for _, n := range d.nodes {
			d.free += c.freeOf(t, n)
		}
	}
	return idx.doms
}

// group builds the domains of level among nodes, without their free room.
func (c *cycle) group(p *topoPlan, key string, nodes []string, level string) []*topoDomain {
	t := c.topo
	byKey := map[string]*topoDomain{}
	var out []*topoDomain
	for _, name := range nodes {
		n := c.st.Nodes[name]
		if n == nil || n.Node == nil {
			continue
		}
		dk, ok := p.domainKey(n.Node.Labels, level)
		if !ok {
			continue
		}
		d := byKey[dk]
		if d == nil {
			d = &topoDomain{key: dk, value: n.Node.Labels[level], set: key + "\x02" + dk}
			byKey[dk] = d
			out = append(out, d)
		}
		d.nodes = append(d.nodes, name)
		t.nodeDoms[name] = append(t.nodeDoms[name], d)
	}
	return out
}

// topoCandidates are the nodes, in name order, any of members may run on,
// and a name for them as a set.
func (c *cycle) topoCandidates(members []*Member) (string, []string) {
	groups := c.groupByConstraints(members)
	sigs := make([]string, len(groups))
	for i, g := range groups {
		sigs[i] = g.sig
	}
	slices.Sort(sigs)
	set := "cands:" + strings.Join(slices.Compact(sigs), "\x03")
	t := c.topoCache()
	if out, ok := t.cands[set]; ok {
		return set, out
	}
	var out []string
	for _, g := range groups {
		out = append(out, c.staticCandidates(g.sig, g.members[0])...)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	t.cands[set] = out
	return set, out
}

// anchorOf is the domain of level that w's members already hold (its
// active members', or those placed earlier in this cycle): its other
// members must join them there. "" when none does.
func (c *cycle) anchorOf(w *Workload, p *topoPlan, level string) string {
	if level == "" {
		return ""
	}
	nodes := c.anchors[w]
	for _, m := range w.Active {
		if m.node != "" && m.Pod.DeletionTimestamp == nil {
			nodes = append(nodes, m.node)
		}
	}
	for _, name := range nodes {
		if n := c.st.Nodes[name]; n != nil && n.Node != nil {
			if key, ok := p.domainKey(n.Node.Labels, level); ok {
				return key
			}
		}
	}
	return ""
}

// placeTopology places members of w as its plan asks, all or none.
func (c *cycle) placeTopology(w *Workload, members []*Member, p *topoPlan) ([]MemberAdmission, error) {
	set, nodes := c.topoCandidates(members)
	if len(nodes) == 0 {
		return nil, &gpu.GangError{Total: len(members), Cause: errNoCandidate}
	}
	return c.placeRequired(w, members, p, p.required, p.preferred, set, nodes, c.anchorOf(w, p, p.required), true)
}

// placeRequired places members inside one domain of level required among
// nodes (any node when required is ""), best fit first; inside it, by the
// preferred level and, at the top (subs), the sub-groups.
func (c *cycle) placeRequired(w *Workload, members []*Member, p *topoPlan, required, preferred, set string, nodes []string, anchor string, subs bool) ([]MemberAdmission, error) {
	if required == "" {
		return c.placeWithin(w, members, p, preferred, set, nodes, subs)
	}
	doms := c.partition(p, set, nodes, required)
	var need int64
	for _, m := range members {
		need += m.GPUMilli
	}
	keep := func(d *topoDomain) bool { return anchor == "" || d.key == anchor }
	var lastErr error
	for d := range bestFit(doms, need, c.opts.firstFit, keep) {
		placed, err := c.placeWithin(w, members, p, preferred, d.set, d.nodes, subs)
		if err == nil {
			return placed, nil
		}
		lastErr = err
	}
	if anchor != "" {
		doms = slices.DeleteFunc(slices.Clone(doms), func(d *topoDomain) bool { return !keep(d) })
	}
	return nil, noDomain(required, doms, need, anchor, lastErr)
}

// bestFit yields the domains of doms with need free that keep takes, the
// one with the least room first (by key with byKey), ties by key. The
// first domain usually takes the members, so it is found by a scan, and
// the rest are sorted only after a few have refused: sorting hundreds of
// domains for every workload cost more than placing it.
func bestFit(doms []*topoDomain, need int64, byKey bool, keep func(*topoDomain) bool) iter.Seq[*topoDomain] {
	before := func(a, b *topoDomain) int {
		if byKey {
			return strings.Compare(a.key, b.key)
		}
		return cmp.Or(cmp.Compare(a.free, b.free), strings.Compare(a.key, b.key))
	}
	fits := func(d *topoDomain) bool { return d.free >= need && (keep == nil || keep(d)) }
	const scans = 4
	return func(yield func(*topoDomain) bool) {
		var tried []*topoDomain
		for range scans {
			var best *topoDomain
			for _, d := range doms {
				if fits(d) && !slices.Contains(tried, d) && (best == nil || before(d, best) < 0) {
					best = d
				}
			}
			if best == nil {
				return
			}
			if !yield(best) {
				return
			}
			tried = append(tried, best)
		}
		var rest []*topoDomain
		for _, d := range doms {
			if fits(d) && !slices.Contains(tried, d) {
				rest = append(rest, d)
			}
		}
		slices.SortFunc(rest, before)
		for _, d := range rest {
			if !yield(d) {
				return
			}
		}
	}
}

// noDomain says that no domain of level takes members: "needs 16 GPUs in
// one network.example.com/rack; the roomiest, rack-3, has 12 free".
func noDomain(level string, doms []*topoDomain, need int64, anchor string, lastErr error) error {
	what := gpu.FormatMilli(need) + " GPUs"
	if need == gpu.MilliPerGPU {
		what = "1 GPU"
	}
	if len(doms) == 0 {
		if anchor != "" {
			return &topologyError{msg: fmt.Sprintf("needs %s in the %s its admitted members run in, which has no node with room left for them", what, level)}
		}
		return &topologyError{msg: fmt.Sprintf("needs %s in one %s; no node it may run on has that label", what, level)}
	}
	roomiest := slices.MaxFunc(doms, func(a, b *topoDomain) int { return cmp.Or(cmp.Compare(a.free, b.free), strings.Compare(b.key, a.key)) })
	msg := fmt.Sprintf("needs %s in one %s; the roomiest, %s, has %s free", what, level, roomiest.value, gpu.FormatMilli(roomiest.free))
	if anchor != "" {
		msg = fmt.Sprintf("needs %s in %s %s, where its admitted members run; it has %s free", what, level, roomiest.value, gpu.FormatMilli(roomiest.free))
	}
	if roomiest.free >= need && lastErr != nil {
		msg += fmt.Sprintf(", but not in a shape the members fit (%v)", lastErr)
	}
	return &topologyError{msg: msg}
}

// placeWithin places members on nodes: the sub-groups first (subs), each
// inside a domain of its own required level, then the rest by the
// preferred level.
func (c *cycle) placeWithin(w *Workload, members []*Member, p *topoPlan, preferred, set string, nodes []string, subs bool) ([]MemberAdmission, error) {
	if !subs || len(p.subGroups) == 0 {
		return c.placePreferred(w, members, p, preferred, set, nodes)
	}
	bySub := map[string][]*Member{}
	var rest []*Member
	for _, m := range members {
		if _, ok := p.subGroups[m.SubGroup]; ok && m.SubGroup != "" {
			bySub[m.SubGroup] = append(bySub[m.SubGroup], m)
		} else {
			rest = append(rest, m)
		}
	}
	names := make([]string, 0, len(bySub))
	need := map[string]int64{}
	for n, ms := range bySub {
		names = append(names, n)
		for _, m := range ms {
			need[n] += m.GPUMilli
		}
	}
	// The largest first: they have the fewest domains to choose from.
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(need[b], need[a]), strings.Compare(a, b)) })
	var placed []MemberAdmission
	undo := func() {
		for _, pm := range placed {
			c.snap.Forget(pm.Member.Pod.UID)
		}
	}
	for _, n := range names {
		sg := p.subGroups[n]
		got, err := c.placeRequired(w, bySub[n], p, sg.TopologyRequired, sg.TopologyPreferred, set, nodes, c.subAnchor(w, p, n, sg.TopologyRequired), false)
		if err != nil {
			undo()
			return nil, subGroupError(n, err)
		}
		placed = append(placed, got...)
	}
	if len(rest) > 0 {
		got, err := c.placePreferred(w, rest, p, preferred, set, nodes)
		if err != nil {
			undo()
			return nil, err
		}
		placed = append(placed, got...)
	}
	return placed, nil
}

// subAnchor is the domain of level that the active members of sub-group
// name hold, "" when none.
func (c *cycle) subAnchor(w *Workload, p *topoPlan, name, level string) string {
	if level == "" {
		return ""
	}
	for _, m := range w.Active {
		if m.SubGroup != name || m.node == "" || m.Pod.DeletionTimestamp != nil {
			continue
		}
		if n := c.st.Nodes[m.node]; n != nil && n.Node != nil {
			if key, ok := p.domainKey(n.Node.Labels, level); ok {
				return key
			}
		}
	}
	return ""
}

// subGroupError names the sub-group in err.
func subGroupError(name string, err error) error {
	var te *topologyError
	if errors.As(err, &te) && te.sub == "" {
		return &topologyError{msg: te.msg, sub: name}
	}
	return err
}

// placePreferred places members on nodes using as few domains of level
// preferred as it can: the smallest single domain that takes them all,
// else the roomiest domains first, else anywhere among nodes.
func (c *cycle) placePreferred(w *Workload, members []*Member, p *topoPlan, preferred, set string, nodes []string) ([]MemberAdmission, error) {
	if preferred == "" {
		return c.placeOnNodes(w, members, nodes)
	}
	var need int64
	for _, m := range members {
		need += m.GPUMilli
	}
	doms := c.partition(p, set, nodes, preferred)
	tries := 0
	for d := range bestFit(doms, need, false, nil) {
		if placed, err := c.placeOnNodes(w, members, d.nodes); err == nil {
			return placed, nil
		}
		if tries++; tries >= maxPreferredTries {
			break
		}
	}
	if len(doms) > 1 {
		doms = slices.Clone(doms)
		slices.SortFunc(doms, func(a, b *topoDomain) int { return cmp.Or(cmp.Compare(b.free, a.free), strings.Compare(a.key, b.key)) })
		var union []string
		var free int64
		for i, d := range doms[:len(doms)-1] {
			union = append(union, d.nodes...)
			free += d.free
			if free < need || i == 0 {
				continue
			}
			slices.Sort(union)
			if placed, err := c.placeOnNodes(w, members, union); err == nil {
				return placed, nil
			}
		}
	}
	return c.placeOnNodes(w, members, nodes)
}

// placeOnNodes places members on nodes alone, all or none.
func (c *cycle) placeOnNodes(w *Workload, members []*Member, nodes []string) ([]MemberAdmission, error) {
	var placed []MemberAdmission
	for _, g := range c.groupByConstraints(members) {
		allocs, err := c.placeGroupOn(w, g, nodes, true)
		if err != nil {
			for _, pm := range placed {
				c.snap.Forget(pm.Member.Pod.UID)
			}
			return nil, err
		}
		for i, a := range allocs {
			placed = append(placed, MemberAdmission{Member: g.members[i], Allocation: a})
		}
	}
	return placed, nil
}

// ownNode reports whether a member must have a node to itself among its
// gang's: it asks for a host port, or a required pod anti-affinity by
// host. The cycle then places at most one such member a node, so that the
// domain it chooses has a node for each.
func ownNode(m *Member) bool {
	spec := &m.Pod.Spec
	if hasHostPort(spec) {
		return true
	}
	if a := spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		for _, t := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			if t.TopologyKey == "kubernetes.io/hostname" {
				return true
			}
		}
	}
	return false
}

// memberDomain is the node labels that keep a placed member inside the
// domains its plan requires: the gang's level and its sub-group's.
func (c *cycle) memberDomain(p *topoPlan, m *Member, node string) map[string]string {
	if p == nil || node == "" {
		return nil
	}
	n := c.st.Nodes[node]
	if n == nil || n.Node == nil {
		return nil
	}
	out := map[string]string{}
	p.domainLabels(n.Node.Labels, p.required, out)
	if sg, ok := p.subGroups[m.SubGroup]; ok && m.SubGroup != "" {
		p.domainLabels(n.Node.Labels, sg.TopologyRequired, out)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// topoQuestion is the topology part of a placement question's key: the
// plan, where the workload already runs, and each member's sub-group.
func (c *cycle) topoQuestion(w *Workload, members []*Member) string {
	plan, err := c.topoPlanOf(w)
	if err != nil {
		return "topo-error:" + err.Error()
	}
	var b strings.Builder
	b.WriteString(plan.sig())
	if plan != nil {
		b.WriteString("@")
		b.WriteString(c.anchorOf(w, plan, plan.required))
		for _, m := range members {
			if m.SubGroup != "" {
				b.WriteString(";")
				b.WriteString(m.SubGroup)
				if sg, ok := plan.subGroups[m.SubGroup]; ok {
					b.WriteString("@")
					b.WriteString(c.subAnchor(w, plan, m.SubGroup, sg.TopologyRequired))
				}
			}
		}
	}
	return b.String()
}

// victimsByDomain splits cands by the domain of w's required level their
// members run in, the domains with the most free room first (the fewest
// evictions): nil when w requires no level. A victim with members in
// several domains is in each; one in none of them is in none. With
// members of w already running, only their domain is tried.
func (c *cycle) victimsByDomain(w *Workload, cands []victim) [][]victim {
	plan, err := c.topoPlanOf(w)
	if err != nil || plan == nil || plan.required == "" {
		return nil
	}
	anchor := c.anchorOf(w, plan, plan.required)
	type group struct {
		key     string
		free    int64
		victims []victim
	}
	byKey := map[string]*group{}
	var groups []*group
	for _, v := range cands {
		seen := map[string]bool{}
		for _, m := range v.members {
			n := c.st.Nodes[m.node]
			if m.node == "" || n == nil || n.Node == nil {
				continue
			}
			key, ok := plan.domainKey(n.Node.Labels, plan.required)
			if !ok || seen[key] || (anchor != "" && key != anchor) {
				continue
			}
			seen[key] = true
			g := byKey[key]
			if g == nil {
				g = &group{key: key}
				byKey[key] = g
				groups = append(groups, g)
			}
			g.victims = append(g.victims, v)
		}
	}
	for _, d := range c.partition(plan, "all", c.nodeNamesOnce(), plan.required) {
		if g := byKey[d.key]; g != nil {
			g.free = d.free
		}
	}
	slices.SortFunc(groups, func(a, b *group) int { return cmp.Or(cmp.Compare(b.free, a.free), strings.Compare(a.key, b.key)) })
	out := make([][]victim, len(groups))
	for i, g := range groups {
		out[i] = g.victims
	}
	return out
}

// nodeNamesOnce are the snapshot's nodes in name order.
func (c *cycle) nodeNamesOnce() []string {
	if c.nodeNames == nil {
		c.nodeNames = c.snap.Nodes()
	}
	return c.nodeNames
}
