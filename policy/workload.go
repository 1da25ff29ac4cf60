package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// WorkloadKind is a kind the workload map watches to resolve pods' owners
// (data.partita.workload.watch).
type WorkloadKind struct {
	// Group is the API group ("" for the core group).
	Group string `json:"group"`
	// Kind is the kind, as in ownerReferences.
	Kind string `json:"kind"`
	// Spec is true when the rules read the object's spec: the extender then
	// keeps the object (its pod templates pruned); otherwise its metadata
	// only.
	Spec bool `json:"spec"`
}

// String is group/kind, or kind for the core group.
func (k WorkloadKind) String() string {
	if k.Group == "" {
		return k.Kind
	}
	return k.Group + "/" + k.Kind
}

// Object is a Kubernetes object as the workload map hands it to the policy:
// apiVersion, kind, namespace, name, uid, labels, annotations and, for the
// kinds whose spec the rules read, spec. It is converted for Rego once, when
// it is made, and never changed after.
type Object struct {
	m map[string]any
	v ast.Value
}

// NewObject converts m (plain JSON values, as an unstructured object holds
// them) for the policy. m must not change afterwards.
func NewObject(m map[string]any) (*Object, error) {
	v, err := ast.InterfaceToValue(m)
	if err != nil {
		return nil, fmt.Errorf("convert object for the policy: %w", err)
	}
	return &Object{m: m, v: v}, nil
}

// Map returns the object's fields; callers must not change them.
func (o *Object) Map() map[string]any { return o.m }

// WorkloadInput is the input document of data.partita.workload: one GPU pod
// that names no pod group, with the owners the workload map resolved for it.
// docs/policy.md specifies it; keep the two in step.
type WorkloadInput struct {
	// Pod is the pod.
	Pod WorkloadPod
	// Chain are the pod's controllers, its own first, the top owner last
	// (input.owner).
	Chain []*Object
	// PodGroup is the native scheduling.k8s.io PodGroup the pod's
	// spec.schedulingGroup names, nil when none (or not read).
	PodGroup *Object
	// Workload is the native Workload that PodGroup's workloadRef names.
	Workload *Object
}

// WorkloadPod is what the workload map's rules see of the pod.
type WorkloadPod struct {
	Namespace, Name, UID string
	Labels, Annotations  map[string]string
	// SchedulingGroup is spec.schedulingGroup.podGroupName, empty when
	// none.
	SchedulingGroup string
}

// WorkloadGang is the gang data.partita.workload.gang answers for a pod.
type WorkloadGang struct {
	// Name is the gang's name in the pod's namespace (a DNS subdomain): the
	// name of the PodGroup Partita keeps its status in.
	Name string
	// MinMember is how many of the gang's GPU pods must fit before any
	// starts (1 to 100000).
	MinMember int32
	// Elastic: this pod may run as a member beyond the minimum, admitted
	// as room allows and reclaimed first.
	Elastic bool
	// Queue is the queue the rule gives the workload, empty when none.
	Queue string
	// PriorityClassName names a PriorityClass that can lower the gang's
	// priority, empty when none.
	PriorityClassName string
	// Kind and OwnerName name the workload for people ("JobSet",
	// "llama-ft").
	Kind, OwnerName string
	// Topology is what the workload asks of the network topology (the
	// built-in rules read it from the top owner's annotations); zero for
	// nothing.
	Topology v1alpha1.TopologyRequest
	// SubGroups are the gang's parts, in the rule's order, and SubGroup
	// the one this pod joins ("" for none). Each sub-group's minimum counts
	// towards MinMember.
	SubGroups []v1alpha1.SubGroup
	SubGroup  string
}

// WorkloadDecision is data.partita.workload's answer for one pod.
type WorkloadDecision struct {
	// Gang is the pod's gang; nil leaves it a single pod.
	Gang *WorkloadGang
	// Errors are the policy's own complaints (data.partita.workload.errors),
	// sorted: the pod waits while there are any.
	Errors []string
	// Version is the policy version that decided.
	Version string
}

// Workload evaluates data.partita.workload for one pod. A failed evaluation
// or an answer of the wrong shape returns an *EvaluationError, and the
// caller should keep the pod waiting (fail closed).
func (e *Engine) Workload(ctx context.Context, in *WorkloadInput) (*WorkloadDecision, error) {
	return decide(ctx, e, pointWorkload, in, readWorkload)
}

// WorkloadKinds returns the kinds the policy in force watches, sorted.
func (e *Engine) WorkloadKinds() []WorkloadKind {
	return slices.Clone(e.current.Load().kinds)
}

// value builds the Rego input.
func (in *WorkloadInput) value(inputOptions) (ast.Value, error) {
	chain := make([]*ast.Term, len(in.Chain))
	for i, o := range in.Chain {
		chain[i] = ast.NewTerm(o.v)
	}
	items := [][2]*ast.Term{
		ast.Item(ast.StringTerm("pod"), ast.NewTerm(in.Pod.value())),
		ast.Item(ast.StringTerm("chain"), ast.ArrayTerm(chain...)),
	}
	if len(chain) > 0 {
		items = append(items, ast.Item(ast.StringTerm("owner"), chain[len(chain)-1]))
	}
	if in.PodGroup != nil {
		items = append(items, ast.Item(ast.StringTerm("podGroup"), ast.NewTerm(in.PodGroup.v)))
	}
	if in.Workload != nil {
		items = append(items, ast.Item(ast.StringTerm("workload"), ast.NewTerm(in.Workload.v)))
	}
	return ast.NewObject(items...), nil
}

func (p *WorkloadPod) value() ast.Value {
	strs := func(m map[string]string) *ast.Term {
		items := make([][2]*ast.Term, 0, len(m))
		for k, v := range m {
			items = append(items, ast.Item(ast.StringTerm(k), ast.StringTerm(v)))
		}
		return ast.ObjectTerm(items...)
	}
	items := [][2]*ast.Term{
		ast.Item(ast.StringTerm("namespace"), ast.StringTerm(p.Namespace)),
		ast.Item(ast.StringTerm("name"), ast.StringTerm(p.Name)),
		ast.Item(ast.StringTerm("uid"), ast.StringTerm(p.UID)),
		ast.Item(ast.StringTerm("labels"), strs(p.Labels)),
		ast.Item(ast.StringTerm("annotations"), strs(p.Annotations)),
	}
	if p.SchedulingGroup != "" {
		items = append(items, ast.Item(ast.StringTerm("schedulingGroup"),
			ast.ObjectTerm(ast.Item(ast.StringTerm("podGroupName"), ast.StringTerm(p.SchedulingGroup)))))
	}
	return ast.NewObject(items...)
}

// readWorkload reads data.partita_engine.workload: {"gang": [] or [gang],
// "errors": set of strings}.
func readWorkload(version string, v any, defined bool) (*WorkloadDecision, error) {
	if !defined {
		return nil, errors.New("decision is undefined")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("decision is %T, not an object", v)
	}
	d := &WorkloadDecision{Version: version}
	var err error
	if d.Errors, err = denyMessages("data.partita.workload.errors", obj["errors"]); err != nil {
		return nil, err
	}
	gangs, _ := obj["gang"].([]any)
	if len(gangs) == 1 {
		if d.Gang, err = gangOf(gangs[0]); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// gangOf checks and reads a gang object.
func gangOf(v any) (*WorkloadGang, error) {
	const ref = "data.partita.workload.gang"
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s is %T, want an object", ref, v)
	}
	g := &WorkloadGang{}
	str := func(key string, dst *string) error {
		x, present := obj[key]
		if !present {
			return nil
		}
		s, ok := x.(string)
		if !ok {
			return fmt.Errorf("%s.%s is %s, want a string", ref, key, jsonType(x))
		}
		*dst = s
		return nil
	}
	for _, k := range sortedKeys(obj) {
		var err error
		switch k {
		case "name":
			err = str(k, &g.Name)
		case "queue":
			err = str(k, &g.Queue)
		case "priorityClassName":
			err = str(k, &g.PriorityClassName)
		case "kind":
			err = str(k, &g.Kind)
		case "ownerName":
			err = str(k, &g.OwnerName)
		case "elastic":
			b, ok := obj[k].(bool)
			if !ok {
				err = fmt.Errorf("%s.elastic is %s, want true or false", ref, jsonType(obj[k]))
			}
			g.Elastic = b
		case "minMember":
			n, ok := wholeNumber(obj[k])
			if !ok || n < 1 || n > 100000 {
				err = fmt.Errorf("%s.minMember is %v, want a whole number from 1 to 100000", ref, obj[k])
			}
			g.MinMember = int32(n)
		case "topology":
			g.Topology, err = topologyOf(ref+".topology", obj[k])
		case "subGroups":
			g.SubGroups, err = subGroupsOf(ref+".subGroups", obj[k])
		case "subGroup":
			err = str(k, &g.SubGroup)
		default:
			err = fmt.Errorf("%s has %q; it may set name, minMember, elastic, queue, priorityClassName, kind, ownerName, topology, subGroups and subGroup", ref, k)
		}
		if err != nil {
			return nil, err
		}
	}
	if g.Name == "" {
		return nil, fmt.Errorf("%s has no name", ref)
	}
	if errs := validation.IsDNS1123Subdomain(g.Name); len(errs) > 0 {
		return nil, fmt.Errorf("%s.name %q is not a valid PodGroup name: %s", ref, g.Name, strings.Join(errs, "; "))
	}
	if g.MinMember == 0 {
		return nil, fmt.Errorf("%s has no minMember", ref)
	}
	if err := checkSubGroups(ref, g); err != nil {
		return nil, err
	}
	return g, nil
}

// maxSubGroups is the most sub-groups a PodGroup holds (spec.subGroups).
const maxSubGroups = 64

// topologyOf reads {"topology", "required", "preferred"}: a Topology's
// name and two of its levels (node label keys), each optional.
func topologyOf(ref string, v any) (v1alpha1.TopologyRequest, error) {
	var r v1alpha1.TopologyRequest
	obj, ok := v.(map[string]any)
	if !ok {
		return r, fmt.Errorf("%s is %s, want an object {\"topology\", \"required\", \"preferred\"}", ref, jsonType(v))
	}
	for _, k := range sortedKeys(obj) {
		var dst *string
		switch k {
		case "topology":
			dst = &r.Topology
		case "required":
			dst = &r.Required
		case "preferred":
			dst = &r.Preferred
		default:
			return r, fmt.Errorf("%s has %q; it may set topology, required and preferred", ref, k)
		}
		s, ok := obj[k].(string)
		if !ok {
			return r, fmt.Errorf("%s.%s is %s, want a string", ref, k, jsonType(obj[k]))
		}
		*dst = s
	}
	if r.Topology != "" {
		if errs := validation.IsDNS1123Subdomain(r.Topology); len(errs) > 0 {
			return r, fmt.Errorf("%s.topology %q is not a valid Topology name: %s", ref, r.Topology, strings.Join(errs, "; "))
		}
	}
	if err := checkLevel(ref+".required", r.Required); err != nil {
		return r, err
	}
	if err := checkLevel(ref+".preferred", r.Preferred); err != nil {
		return r, err
	}
	return r, nil
}

// checkLevel checks that a level, when set, is a node label key.
func checkLevel(ref, level string) error {
	if level == "" {
		return nil
	}
	if errs := validation.IsQualifiedName(level); len(errs) > 0 {
		return fmt.Errorf("%s %q is not a node label key: %s", ref, level, strings.Join(errs, "; "))
	}
	return nil
}

// subGroupsOf reads a list of {"name", "minMember", "topologyRequired",
// "topologyPreferred"}.
func subGroupsOf(ref string, v any) ([]v1alpha1.SubGroup, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s is %s, want a list of objects {\"name\", \"minMember\", \"topologyRequired\", \"topologyPreferred\"}", ref, jsonType(v))
	}
	if len(arr) > maxSubGroups {
		return nil, fmt.Errorf("%s has %d sub-groups; a PodGroup holds at most %d", ref, len(arr), maxSubGroups)
	}
	out := make([]v1alpha1.SubGroup, 0, len(arr))
	seen := map[string]bool{}
	for i, x := range arr {
		at := fmt.Sprintf("%s[%d]", ref, i)
		obj, ok := x.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s is %s, want an object", at, jsonType(x))
		}
		var sg v1alpha1.SubGroup
		for _, k := range sortedKeys(obj) {
			var dst *string
			switch k {
			case "name":
				dst = &sg.Name
			case "topologyRequired":
				dst = &sg.TopologyRequired
			case "topologyPreferred":
				dst = &sg.TopologyPreferred
			case "minMember":
				n, ok := wholeNumber(obj[k])
				if !ok || n < 1 || n > 100000 {
					return nil, fmt.Errorf("%s.minMember is %v, want a whole number from 1 to 100000", at, obj[k])
				}
				sg.MinMember = int32(n)
				continue
			default:
				return nil, fmt.Errorf("%s has %q; it may set name, minMember, topologyRequired and topologyPreferred", at, k)
			}
			s, ok := obj[k].(string)
			if !ok {
				return nil, fmt.Errorf("%s.%s is %s, want a string", at, k, jsonType(obj[k]))
			}
			*dst = s
		}
		if sg.Name == "" {
			return nil, fmt.Errorf("%s has no name", at)
		}
		// What the label partita.dev/sub-group can say, as the PodGroup's
		// spec.subGroups[].name allows.
		if errs := validation.IsValidLabelValue(sg.Name); len(errs) > 0 {
			return nil, fmt.Errorf("%s.name %q is not a valid sub-group name: %s", at, sg.Name, strings.Join(errs, "; "))
		}
		if seen[sg.Name] {
			return nil, fmt.Errorf("%s.name %q names a sub-group listed before", at, sg.Name)
		}
		seen[sg.Name] = true
		if sg.MinMember == 0 {
			return nil, fmt.Errorf("%s has no minMember", at)
		}
		if err := checkLevel(at+".topologyRequired", sg.TopologyRequired); err != nil {
			return nil, err
		}
		if err := checkLevel(at+".topologyPreferred", sg.TopologyPreferred); err != nil {
			return nil, err
		}
		out = append(out, sg)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// checkSubGroups checks a gang's sub-groups against the gang: their
// minimums count towards its minMember, and the pod's sub-group is one of
// them.
func checkSubGroups(ref string, g *WorkloadGang) error {
	var sum int64
	for _, sg := range g.SubGroups {
		sum += int64(sg.MinMember)
	}
	if sum > int64(g.MinMember) {
		return fmt.Errorf("%s.subGroups ask for %d members in all, more than the gang's minMember %d", ref, sum, g.MinMember)
	}
	if g.SubGroup != "" && !slices.ContainsFunc(g.SubGroups, func(sg v1alpha1.SubGroup) bool { return sg.Name == g.SubGroup }) {
		return fmt.Errorf("%s.subGroup %q is none of the gang's subGroups", ref, g.SubGroup)
	}
	return nil
}

// jsonType names the JSON type of v for messages to policy authors.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case json.Number, float64, int64, int:
		return "a number"
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	}
	return fmt.Sprintf("%T", v)
}

// wholeNumber reads a JSON number (json.Number, as OPA hands results back,
// or a float) that is a whole number.
func wholeNumber(v any) (int64, bool) {
	switch n := v.(type) {
	case interface{ Int64() (int64, error) }:
		i, err := n.Int64()
		return i, err == nil
	case float64:
		if n == math.Trunc(n) && math.Abs(n) < 1<<53 {
			return int64(n), true
		}
	case int64:
		return n, true
	case int:
		return int64(n), true
	}
	return 0, false
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// workloadKinds evaluates the kinds of a compiled policy: a set of objects
// {"group", "kind", "spec"}.
func workloadKinds(ctx context.Context, common []func(*rego.Rego), compiler *ast.Compiler) ([]WorkloadKind, error) {
	const ref = "data.partita.workload.watch"
	opts := append(slices.Clone(common), rego.Query("data.partita_engine.workload_kinds"), rego.Compiler(compiler))
	rs, err := rego.New(opts...).Eval(ctx)
	if err != nil {
		return nil, fmt.Errorf("evaluate %s: %w", ref, err)
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return nil, nil
	}
	arr, ok := rs[0].Expressions[0].Value.([]any)
	if !ok {
		return nil, fmt.Errorf("%s is %T, want a set of objects", ref, rs[0].Expressions[0].Value)
	}
	seen := map[WorkloadKind]bool{}
	out := make([]WorkloadKind, 0, len(arr))
	for _, x := range arr {
		o, ok := x.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s holds %T, want objects {\"group\", \"kind\", \"spec\"}", ref, x)
		}
		var k WorkloadKind
		k.Group, _ = o["group"].(string)
		k.Kind, _ = o["kind"].(string)
		k.Spec, _ = o["spec"].(bool)
		if k.Kind == "" {
			return nil, fmt.Errorf("%s holds %v, which names no kind", ref, o)
		}
		if k.Group == "" {
			return nil, fmt.Errorf("%s holds %v: the core group's kinds are not watched (a pod owned by a pod is followed through the pod informer)", ref, o)
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		out = append(out, k)
	}
	// The same kind asked with and without its spec is watched with it.
	slices.SortFunc(out, func(a, b WorkloadKind) int {
		return strings.Compare(a.String(), b.String())
	})
	merged := out[:0]
	for _, k := range out {
		if n := len(merged); n > 0 && merged[n-1].Group == k.Group && merged[n-1].Kind == k.Kind {
			merged[n-1].Spec = merged[n-1].Spec || k.Spec
			continue
		}
		merged = append(merged, k)
	}
	return merged, nil
}
