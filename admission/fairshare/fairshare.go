package fairshare

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// Resource names a resource that is divided on its own. Amounts of GPU are in
// GPUs (0.5 is half a GPU), of CPU in cores and of memory in bytes.
type Resource string

// The resources KAI divides. Divide accepts other names too; their whole unit is 1.
const (
	GPU    Resource = "gpu"
	CPU    Resource = "cpu"
	Memory Resource = "memory"
)

// Unlimited as a Quota means the whole capacity of the queue's level; as a
// Limit it means no limit.
const Unlimited = -1

// DefaultPriority is the priority of a queue that sets none, as in api/v1alpha1.
const DefaultPriority = 100

// unit returns the whole unit of step 2 and 3 in the resource's natural unit.
// KAI keeps CPU in millicores and memory in bytes and floors those, so a
// "whole unit" of CPU is a millicore, not a core; dividing in the same units
// is what makes our numbers equal to KAI's.
func (r Resource) unit() *big.Rat {
	if r == CPU {
		return big.NewRat(1, 1000)
	}
	return big.NewRat(1, 1)
}

// rank orders resources for output: gpu, cpu, memory, then the rest by name.
func (r Resource) rank() int {
	switch r {
	case GPU:
		return 0
	case CPU:
		return 1
	case Memory:
		return 2
	}
	return 3
}

// Settings are a queue's quota, limit and over-quota weight for one resource.
// A resource missing from Queue.Resources gets DefaultSettings.
type Settings struct {
	// Quota is the deserved amount, given before anything over quota and
	// regardless of priority. Unlimited (-1) means the whole capacity of the level.
	Quota float64
	// Limit caps what the queue may get. Unlimited (-1) means no limit; 0 means nothing.
	Limit float64
	// OverQuotaWeight is the queue's weight among its tier when capacity beyond
	// the quotas is divided. 0 means it gets nothing over quota.
	OverQuotaWeight float64
}

// DefaultSettings returns the settings of a resource a queue does not configure:
// no quota, no limit, weight 1.
func DefaultSettings() Settings {
	return Settings{Quota: 0, Limit: Unlimited, OverQuotaWeight: 1}
}

// Queue is one node of the queue tree.
type Queue struct {
	// Name identifies the queue; unique.
	Name string
	// Parent is the parent queue's name; empty for a top-level queue.
	Parent string
	// Priority orders the over-quota tiers, higher first. Callers that have
	// no priority use DefaultPriority; only the order between siblings matters.
	Priority int32
	// CreationOrder breaks ties between equal fractions in step 3: lower
	// (earlier created) first, then the smaller name. Callers usually pass the
	// queue's index in creation order.
	CreationOrder int
	// Resources holds the settings per resource; see DefaultSettings.
	Resources map[Resource]Settings
	// Usage is the queue's historical usage per resource, as a share of the
	// cluster's capacity over the usage window (KAI's normalized usage: 0.25
	// is a quarter of all it could have used); its whole subtree's for a
	// parent. A parent that omits a resource gets the sum of its children's.
	// It counts only when Options.UsageWeight is above 0.
	Usage map[Resource]float64
}

// Options tune a division.
type Options struct {
	// UsageWeight is how much historical usage counts in the division over
	// quota (KAI's kValue): each sibling's over-quota weight, as a share of
	// its tier's, w, becomes max(0, w + UsageWeight×(w − usage)). 0, the
	// default, leaves usage out: the division is plain DRF over demand.
	UsageWeight float64
}

// settings returns the queue's settings for r, defaults if it sets none.
func (q Queue) settings(r Resource) Settings {
	if s, ok := q.Resources[r]; ok {
		return s
	}
	return DefaultSettings()
}

// Division is the outcome of Divide.
type Division struct {
	// Capacity is the capacity divided, per resource.
	Capacity map[Resource]float64
	// Queues holds one entry per input queue, in input order.
	Queues []QueueShare
	// UsageWeight is the Options.UsageWeight the division weighed usage with.
	UsageWeight float64
}

// Resources returns the divided resources: gpu, cpu, memory, then others by name.
func (d Division) Resources() []Resource {
	rs := make([]Resource, 0, len(d.Capacity))
	for r := range d.Capacity {
		rs = append(rs, r)
	}
	slices.SortFunc(rs, func(a, b Resource) int {
		return cmp.Or(cmp.Compare(a.rank(), b.rank()), strings.Compare(string(a), string(b)))
	})
	return rs
}

// QueueShare is one queue's result. Every map has an entry for every resource
// of Division.Capacity.
type QueueShare struct {
	Queue
	// Depth is 0 for a top-level queue, 1 for its children, and so on.
	Depth int
	// Request is the queue's demand for a leaf, the sum of its children's
	// requests otherwise.
	Request map[Resource]float64
	// FairShare is the queue's fair share.
	FairShare map[Resource]float64
	// Allocatable is the most the queue may hold now, whatever the others
	// want: its own limit, its parent's allocatable and the cluster capacity,
	// whichever is smallest. It is the cap that requestable is cut to, and it
	// is always a finite number.
	Allocatable map[Resource]float64
	// EffectiveUsage is the usage the division weighed: the queue's own, or
	// the sum of its children's where it gave none. Nil when usage is off.
	EffectiveUsage map[Resource]float64
}

// InvalidError says what is wrong with the input of Divide or Load.
type InvalidError struct {
	// Field locates the bad value, such as `queue "team-a" gpu limit`.
	Field string
	// Reason says what is wrong and what would be right.
	Reason string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Reason }

// IsInvalid reports whether err comes from input that Divide or Load rejects.
func IsInvalid(err error) bool {
	var ie *InvalidError
	return errors.As(err, &ie)
}

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Divide computes every queue's fair share of capacity for the given demand,
// per resource of capacity. queues may come in any order (parents need not come
// first); the result keeps it. demand maps leaf queue names to what their
// workloads hold and wait for (allocated + pending); a queue it omits wants
// nothing. Divide rejects unknown or cyclic parents, duplicate names, demand for
// queues that are not leaves, resources missing from capacity, and negative,
// NaN or infinite amounts (only Quota and Limit may be Unlimited).
func Divide(capacity map[Resource]float64, queues []Queue, demand map[string]map[Resource]float64) (Division, error) {
	return DivideWith(capacity, queues, demand, Options{})
}

// DivideWith is Divide with options; see Options for how usage counts.
func DivideWith(capacity map[Resource]float64, queues []Queue, demand map[string]map[Resource]float64, opts Options) (Division, error) {
	t, err := newTree(capacity, queues, demand)
	if err != nil {
		return Division{}, fmt.Errorf("divide fair share: %w", err)
	}
	if err := checkAmount(opts.UsageWeight, false); err != nil {
		return Division{}, fmt.Errorf("divide fair share: %w", invalid("usage weight", "%s", err))
	}
	if opts.UsageWeight > 0 {
		t.usageWeight = ratOf(opts.UsageWeight)
	}
	d := Division{Capacity: make(map[Resource]float64, len(capacity)), Queues: make([]QueueShare, len(queues)), UsageWeight: opts.UsageWeight}
	for i, n := range t.nodes {
		d.Queues[i] = QueueShare{
			Queue:       queues[i],
			Depth:       n.depth,
			Request:     make(map[Resource]float64, len(capacity)),
			FairShare:   make(map[Resource]float64, len(capacity)),
			Allocatable: make(map[Resource]float64, len(capacity)),
		}
		if t.usageWeight != nil {
			d.Queues[i].EffectiveUsage = make(map[Resource]float64, len(capacity))
		}
	}
	for r, c := range capacity {
		d.Capacity[r] = c
		capRat := ratOf(c)
		t.divide(r, capRat, demand)
		for i, n := range t.nodes {
			d.Queues[i].Request[r] = floatOf(n.request)
			d.Queues[i].FairShare[r] = floatOf(n.share)
			d.Queues[i].Allocatable[r] = floatOf(n.allocatable)
			if n.usage != nil {
				d.Queues[i].EffectiveUsage[r] = floatOf(n.usage)
			}
		}
	}
	return d, nil
}

// node is a queue in the tree, with its state for the resource being divided.
type node struct {
	q        Queue
	depth    int
	children []*node

	quota       *big.Rat // nil for Unlimited
	weight      *big.Rat
	request     *big.Rat // demand, or the children's sum
	requestable *big.Rat // request capped by limit
	allocatable *big.Rat
	share       *big.Rat
	// usage is the subtree's normalized usage, a share of the cluster's
	// capacity; levelUsage the same as a share of what its level divides
	// (setLevelUsage). Nil when usage is off.
	usage, levelUsage *big.Rat
}

type tree struct {
	nodes []*node // input order
	roots []*node // input order
	// usageWeight is Options.UsageWeight; nil when usage is off.
	usageWeight *big.Rat
}

// newTree validates the input and links the queues into a tree.
func newTree(capacity map[Resource]float64, queues []Queue, demand map[string]map[Resource]float64) (*tree, error) {
	for r, c := range capacity {
		if err := checkAmount(c, false); err != nil {
			return nil, invalid(fmt.Sprintf("capacity %s", r), "%s", err)
		}
	}
	t := &tree{nodes: make([]*node, len(queues))}
	byName := make(map[string]*node, len(queues))
	for i, q := range queues {
		if q.Name == "" {
			return nil, invalid(fmt.Sprintf("queue #%d", i+1), "has no name")
		}
		if _, dup := byName[q.Name]; dup {
			return nil, invalid(fmt.Sprintf("queue %q", q.Name), "is defined twice; queue names must be unique")
		}
		for r, s := range q.Resources {
			field := func(suffix string) string { return fmt.Sprintf("queue %q %s%s", q.Name, r, suffix) }
			if _, ok := capacity[r]; !ok {
				return nil, invalid(field(""), "is not in the capacity; add it there (0 if the cluster has none)")
			}
			if err := checkAmount(s.Quota, true); err != nil {
				return nil, invalid(field(" quota"), "%s", err)
			}
			if err := checkAmount(s.Limit, true); err != nil {
				return nil, invalid(field(" limit"), "%s", err)
			}
			if err := checkAmount(s.OverQuotaWeight, false); err != nil {
				return nil, invalid(field(" overQuotaWeight"), "%s", err)
			}
		}
		for r, u := range q.Usage {
			if _, ok := capacity[r]; !ok {
				return nil, invalid(fmt.Sprintf("queue %q usage %s", q.Name, r), "is not in the capacity; add it there (0 if the cluster has none)")
			}
			if err := checkAmount(u, false); err != nil {
				return nil, invalid(fmt.Sprintf("queue %q usage %s", q.Name, r), "%s", err)
			}
		}
		n := &node{q: q}
		t.nodes[i] = n
		byName[q.Name] = n
	}
	for _, n := range t.nodes {
		if n.q.Parent == "" {
			t.roots = append(t.roots, n)
			continue
		}
		p, ok := byName[n.q.Parent]
		if !ok {
			return nil, invalid(fmt.Sprintf("queue %q", n.q.Name), "has unknown parent %q", n.q.Parent)
		}
		p.children = append(p.children, n)
	}
	// A queue that no walk down from the roots reaches has a parent cycle above it.
	reached := 0
	var walk func(n *node, depth int)
	walk = func(n *node, depth int) {
		n.depth = depth
		reached++
		for _, c := range n.children {
			walk(c, depth+1)
		}
	}
	for _, r := range t.roots {
		walk(r, 0)
	}
	if reached != len(t.nodes) {
		for _, n := range t.nodes {
			if n.depth == 0 && n.q.Parent != "" {
				return nil, invalid(fmt.Sprintf("queue %q", n.q.Name), "is in a parent cycle: %s", cycleFrom(n, byName))
			}
		}
	}
	for name, amounts := range demand {
		n, ok := byName[name]
		if !ok {
			return nil, invalid(fmt.Sprintf("demand %q", name), "names no queue")
		}
		if len(n.children) > 0 {
			return nil, invalid(fmt.Sprintf("demand %q", name), "names a queue with children; only leaf queues have workloads, so give the demand to its leaves")
		}
		for r, a := range amounts {
			if _, ok := capacity[r]; !ok {
				return nil, invalid(fmt.Sprintf("demand %q %s", name, r), "is not in the capacity; add it there (0 if the cluster has none)")
			}
			if err := checkAmount(a, false); err != nil {
				return nil, invalid(fmt.Sprintf("demand %q %s", name, r), "%s", err)
			}
		}
	}
	return t, nil
}

// cycleFrom follows parents from n until a queue repeats and spells the loop.
func cycleFrom(n *node, byName map[string]*node) string {
	seen := map[string]int{}
	var path []string
	for cur := n; ; cur = byName[cur.q.Parent] {
		if i, ok := seen[cur.q.Name]; ok {
			return strings.Join(append(path[i:], cur.q.Name), " -> ")
		}
		seen[cur.q.Name] = len(path)
		path = append(path, cur.q.Name)
	}
}

// checkAmount rejects NaN, infinities and negatives; with unlimitedOK, -1 passes.
// The caller names the field only on error: Divide runs every admission cycle.
func checkAmount(v float64, unlimitedOK bool) error {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fmt.Errorf("must be a number, got %v", v)
	case unlimitedOK && v < 0 && v != Unlimited:
		return fmt.Errorf("must be -1 or at least 0, got %v", v)
	case !unlimitedOK && v < 0:
		return fmt.Errorf("must be at least 0, got %v", v)
	}
	return nil
}

// divide fills every node's request, share and allocatable for r.
func (t *tree) divide(r Resource, capacity *big.Rat, demand map[string]map[Resource]float64) {
	for _, n := range t.roots {
		n.fill(r, demand, t.usageWeight != nil)
		n.fillAllocatable(r, capacity)
	}
	t.setLevelUsage(capacity, capacity, t.roots)
	divideLevel(r.unit(), t.usageWeight, capacity, t.roots)
	var down func(n *node)
	down = func(n *node) {
		if len(n.children) == 0 {
			return
		}
		t.setLevelUsage(capacity, n.share, n.children)
		divideLevel(r.unit(), t.usageWeight, n.share, n.children)
		for _, c := range n.children {
			down(c)
		}
	}
	for _, n := range t.roots {
		down(n)
	}
}

// setLevelUsage rescales the usage of a level's queues from a share of the
// cluster's capacity to a share of what the level divides (its parent's
// fair share): usage × capacity / levelCapacity. At the top level the two
// are the same, which is KAI's normalization. Below it KAI keeps the
// cluster's, so a team in a department that holds a tenth of the cluster
// can show at most 0.1 against a weight share of 0.5 and history hardly
// moves shares between teams; against its parent's share, a team that used
// all its parent had counts 1. A level with nothing to divide has no usage.
func (t *tree) setLevelUsage(capacity, levelCapacity *big.Rat, level []*node) {
	if t.usageWeight == nil {
		return
	}
	for _, n := range level {
		n.levelUsage = new(big.Rat)
		if levelCapacity.Sign() > 0 {
			n.levelUsage.Mul(n.usage, capacity)
			n.levelUsage.Quo(n.levelUsage, levelCapacity)
		}
	}
}

// fill sets the settings, request, requestable and, withUsage, the usage of
// n and its subtree for r.
func (n *node) fill(r Resource, demand map[string]map[Resource]float64, withUsage bool) {
	s := n.q.settings(r)
	n.quota = nil
	if s.Quota != Unlimited {
		n.quota = ratOf(s.Quota)
	}
	n.weight = ratOf(s.OverQuotaWeight)
	n.request = new(big.Rat)
	if len(n.children) == 0 {
		n.request = ratOf(demand[n.q.Name][r])
	}
	for _, c := range n.children {
		c.fill(r, demand, withUsage)
		n.request.Add(n.request, c.request)
	}
	n.usage = nil
	if withUsage {
		if u, ok := n.q.Usage[r]; ok {
			n.usage = ratOf(u)
		} else {
			n.usage = new(big.Rat)
			for _, c := range n.children {
				n.usage.Add(n.usage, c.usage)
			}
		}
	}
	n.requestable = n.request
	if s.Limit != Unlimited {
		n.requestable = minRat(n.request, ratOf(s.Limit))
	}
}

func (n *node) fillAllocatable(r Resource, parent *big.Rat) {
	n.allocatable = parent
	if limit := n.q.settings(r).Limit; limit != Unlimited {
		n.allocatable = minRat(parent, ratOf(limit))
	}
	for _, c := range n.children {
		c.fillAllocatable(r, n.allocatable)
	}
}

// ratOf reads v as the shortest decimal that prints as v, so 0.4 is 2/5 and
// 5 − 0.4 − 0.6 is exactly 4, where float64 gives 3.9999999999999996 and step
// 2 would hand out 3 whole units instead of 4.
func ratOf(v float64) *big.Rat {
	// Fast paths for whole numbers and up to 3 decimals, most amounts. Below
	// 2^40 floats are far denser than 0.001, so n/1000 is the shortest
	// decimal that prints as v.
	if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
		return new(big.Rat).SetInt64(int64(v))
	}
	if math.Abs(v) < 1<<40 {
		if n := math.Round(v * 1000); n/1000 == v {
			return big.NewRat(int64(n), 1000)
		}
	}
	r, ok := new(big.Rat).SetString(strconv.FormatFloat(v, 'g', -1, 64))
	if !ok { // unreachable for the finite values newTree lets through
		return new(big.Rat)
	}
	return r
}

func floatOf(r *big.Rat) float64 {
	f, _ := r.Float64()
	return f
}

func minRat(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) <= 0 {
		return a
	}
	return b
}
