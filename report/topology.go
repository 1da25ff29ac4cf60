package report

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// ErrTopologyNotFound says the Topology asked for does not exist; the
// wrapping error lists those that do.
var ErrTopologyNotFound = errors.New("topology not found")

// FindTopology is the Topology named name among ts, or the error of
// TopologyNotFound.
func FindTopology(ts []v1alpha1.Topology, name string) (*v1alpha1.Topology, error) {
	names := make([]string, 0, len(ts))
	for i := range ts {
		if ts[i].Name == name {
			return &ts[i], nil
		}
		names = append(names, ts[i].Name)
	}
	return nil, TopologyNotFound(name, names)
}

// TopologyNotFound is the error for a Topology called name that is not
// among those called names: it wraps ErrTopologyNotFound and names those
// there are, or says how to make one when there are none.
func TopologyNotFound(name string, names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("read Topology %q: %w; the cluster has no Topologies: create one that lists node labels as levels, broadest first "+
			"(apiVersion: partita.dev/v1alpha1, kind: Topology, spec.levels: [{nodeLabel: topology.kubernetes.io/zone}, {nodeLabel: kubernetes.io/hostname}])",
			name, ErrTopologyNotFound)
	}
	names = slices.Sorted(slices.Values(names))
	return fmt.Errorf("read Topology %q: %w; the cluster has %s (kubectl get topologies)", name, ErrTopologyNotFound, strings.Join(names, ", "))
}

// Levels are t's level labels, broadest first.
func Levels(t *v1alpha1.Topology) []string {
	out := make([]string, len(t.Spec.Levels))
	for i, l := range t.Spec.Levels {
		out[i] = l.NodeLabel
	}
	return out
}

// Domain is one domain of a Topology's level: the nodes that share the
// values of its label and of every broader level's, so rack r1 of block b1
// is not rack r1 of block b2. It is the grouping both faces show (ctl's
// tree, the console's map), each with its own numbers.
type Domain struct {
	// Level is the level's node label.
	Level string
	// Value is the label's value on the domain's nodes; "" with Missing.
	Value string
	// Missing is set for the nodes that lack the label: they are grouped
	// too, so that no node is hidden.
	Missing bool
	// Nodes are the domain's nodes, in the order given to GroupByLevels.
	Nodes []string
	// Domains are the next level's domains within this one, nil at the
	// narrowest level.
	Domains []Domain
}

// GroupByLevels groups nodes by levels (node labels, broadest first):
// one Domain per value of the first level, each split by the next level,
// and so on. labels gives a node's labels, nil when they are unknown. A
// level's domains are sorted by value, the nodes without the label last.
func GroupByLevels(levels []string, nodes []string, labels func(node string) map[string]string) []Domain {
	if len(levels) == 0 || len(nodes) == 0 {
		return nil
	}
	level := levels[0]
	type key struct {
		value   string
		missing bool
	}
	byKey := map[key]*Domain{}
	var keys []key
	for _, n := range nodes {
		v, ok := labels(n)[level]
		k := key{value: v, missing: !ok}
		d := byKey[k]
		if d == nil {
			d = &Domain{Level: level, Value: v, Missing: !ok}
			byKey[k] = d
			keys = append(keys, k)
		}
		d.Nodes = append(d.Nodes, n)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].missing != keys[j].missing {
			return !keys[i].missing
		}
		return keys[i].value < keys[j].value
	})
	out := make([]Domain, 0, len(keys))
	for _, k := range keys {
		d := byKey[k]
		d.Domains = GroupByLevels(levels[1:], d.Nodes, labels)
		out = append(out, *d)
	}
	return out
}

// DomainName is how a domain reads: label=value, or "(no label)" for the
// nodes without it.
func DomainName(level, value string, missing bool) string {
	if missing {
		return "(no " + level + ")"
	}
	return level + "=" + value
}

// TopologyReport is the nodes of `ctl nodes --topology` grouped by the
// levels of a Topology.
type TopologyReport struct {
	// Name is the Topology's name.
	Name string `json:"name"`
	// Levels are its level labels, broadest first.
	Levels []string `json:"levels"`
	// Domains are the domains of its broadest level, each holding those of
	// the next.
	Domains []TopologyDomain `json:"domains"`
	// Note says why the grouping may be wrong, if it may.
	Note string `json:"note,omitempty"`
}

// TopologyDomain is one domain with the sums of its nodes' numbers.
type TopologyDomain struct {
	// Level is the level's node label.
	Level string `json:"level"`
	// Value is the label's value; "" with Missing.
	Value string `json:"value"`
	// Missing is set for the domain of the nodes without the label.
	Missing bool `json:"missing,omitempty"`
	// NodeCount counts the domain's nodes.
	NodeCount int `json:"nodeCount"`
	// NodeTotals sum the domain's nodes, as Total sums the cluster's.
	NodeTotals
	// Domains are the next level's domains within this one.
	Domains []TopologyDomain `json:"domains,omitempty"`
	// Nodes name the domain's nodes at the narrowest level (the report's
	// nodes have their devices).
	Nodes []string `json:"nodes,omitempty"`
}

// NodesByTopology is Nodes with the nodes grouped by the levels of the
// Topology called name (one of c.Topologies): every node is in the tree,
// those without a level's label in that level's "(no label)" domain.
func NodesByTopology(c *Cluster, name string) (NodesReport, error) {
	t, err := FindTopology(c.Topologies, name)
	if err != nil {
		return NodesReport{}, err
	}
	r := Nodes(c)
	labels := map[string]map[string]string{}
	for i := range c.Nodes {
		labels[c.Nodes[i].Name] = c.Nodes[i].Labels
	}
	totals := map[string]NodeTotals{}
	names := make([]string, 0, len(r.Nodes))
	for _, n := range r.Nodes {
		totals[n.Name] = n.NodeTotals
		names = append(names, n.Name)
	}
	levels := Levels(t)
	tr := &TopologyReport{Name: t.Name, Levels: levels,
		Domains: topologyDomains(GroupByLevels(levels, names, func(n string) map[string]string { return labels[n] }), totals)}
	if tr.Domains == nil {
		tr.Domains = []TopologyDomain{}
	}
	if c.NodesForbidden && len(names) > 0 {
		tr.Note = "you may not list Nodes, so their labels are unknown and every node shows without them"
	}
	r.Topology = tr
	return r, nil
}

func topologyDomains(ds []Domain, totals map[string]NodeTotals) []TopologyDomain {
	if ds == nil {
		return nil
	}
	out := make([]TopologyDomain, 0, len(ds))
	for _, d := range ds {
		td := TopologyDomain{Level: d.Level, Value: d.Value, Missing: d.Missing, NodeCount: len(d.Nodes),
			Domains: topologyDomains(d.Domains, totals)}
		for _, n := range d.Nodes {
			td.add(totals[n])
		}
		if d.Domains == nil {
			td.Nodes = d.Nodes
		}
		out = append(out, td)
	}
	return out
}
