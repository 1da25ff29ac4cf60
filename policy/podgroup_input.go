package policy

import (
	"context"

	"github.com/open-policy-agent/opa/v1/ast"
)

// KindPodGroup is input.kind of a PodGroup's admission input. A pod's input
// has no kind (it predates PodGroups in the policy), so rules that read
// input.pod should say so: `input.pod` as a condition, or `not
// input.kind` for "pods only".
const KindPodGroup = "PodGroup"

// PodGroupAdmissionInput is the input document of data.partita.admission for
// a PodGroup, created or with its spec changed: the same decision point as
// pods, so that a queue a namespace may not use is refused for its gangs as
// for its pods. docs/policy.md specifies it with examples; keep the two in
// step.
//
// It carries request.queue, request.podGroup, request.minMember and
// request.topology where a pod's input has them, so the default policy's
// queue rules (the queue exists, is a leaf, and the namespace may use it)
// and a rule on a gang's topology apply to both unchanged; it has
// no request.gpuMilli or containers (a PodGroup asks for no GPUs itself, its
// members do, and each member is asked about on its own).
type PodGroupAdmissionInput struct {
	// Operation is CREATE or UPDATE.
	Operation string
	// User is who sent the request.
	User UserInfo
	// Namespace is the PodGroup's namespace.
	Namespace string
	// PodGroup is the PodGroup's metadata and spec.
	PodGroup PodGroupInfo
}

// PodGroupInfo is what the policy sees of a PodGroup.
type PodGroupInfo struct {
	// Name is the PodGroup's name.
	Name string
	// Labels are its labels.
	Labels map[string]string
	// Annotations are its annotations, without
	// kubectl.kubernetes.io/last-applied-configuration and without values
	// longer than MaxAnnotationValueLen.
	Annotations map[string]string
	// Queue is spec.queue, empty when it names none.
	Queue string
	// MinMember is spec.minMember.
	MinMember int64
	// PriorityClassName is spec.priorityClassName.
	PriorityClassName string
	// Priority is the value of that PriorityClass, 0 when it names none.
	// The webhook refuses a class that does not exist before it asks.
	Priority int64
	// ScheduleTimeoutSeconds is spec.scheduleTimeoutSeconds, 0 when unset.
	ScheduleTimeoutSeconds int64
	// TopologyKey is spec.topologyKey.
	TopologyKey string
	// Topology is the topology request of its annotations, in any dialect
	// (partita.dev/topology*, KAI's, Kueue's).
	Topology TopologyRequest
	// SubGroups are spec.subGroups.
	SubGroups []SubGroup
}

// SubGroup is one of a PodGroup's spec.subGroups.
type SubGroup struct {
	// Name is what its members' partita.dev/sub-group label says.
	Name string
	// MinMember is its own minimum, part of the gang's.
	MinMember int64
	// TopologyRequired and TopologyPreferred are its levels, empty for
	// none.
	TopologyRequired, TopologyPreferred string
}

// PodGroupAdmission evaluates data.partita.admission for a PodGroup. As for
// pods, a failed evaluation returns an *EvaluationError and a denial is a
// decision with Deny set; a patch is not applied to PodGroups (the webhook
// that asks only validates), so the default policy writes none for them.
func (e *Engine) PodGroupAdmission(ctx context.Context, in *PodGroupAdmissionInput) (*AdmissionDecision, error) {
	return decide(ctx, e, pointAdmission, in, readAdmission)
}

// value builds the Rego input as AST terms, as AdmissionInput does.
func (in *PodGroupAdmissionInput) value(inputOptions) (ast.Value, error) {
	groups := make([]*ast.Term, 0, len(in.User.Groups))
	for _, g := range in.User.Groups {
		groups = append(groups, ast.StringTerm(g))
	}
	pg := &in.PodGroup
	subGroups := make([]*ast.Term, 0, len(pg.SubGroups))
	for _, sg := range pg.SubGroups {
		subGroups = append(subGroups, ast.ObjectTerm(
			ast.Item(ast.InternedTerm("name"), ast.StringTerm(sg.Name)),
			ast.Item(ast.InternedTerm("minMember"), intTerm(sg.MinMember)),
			ast.Item(ast.InternedTerm("topologyRequired"), ast.StringTerm(sg.TopologyRequired)),
			ast.Item(ast.InternedTerm("topologyPreferred"), ast.StringTerm(sg.TopologyPreferred)),
		))
	}
	return ast.NewObject(
		ast.Item(ast.InternedTerm("kind"), ast.StringTerm(KindPodGroup)),
		ast.Item(ast.InternedTerm("operation"), ast.StringTerm(in.Operation)),
		ast.Item(ast.InternedTerm("user"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("username"), ast.StringTerm(in.User.Username)),
			ast.Item(ast.InternedTerm("groups"), ast.ArrayTerm(groups...)),
		)),
		ast.Item(ast.InternedTerm("namespace"), ast.StringTerm(in.Namespace)),
		ast.Item(ast.InternedTerm("podGroup"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("name"), ast.StringTerm(pg.Name)),
			ast.Item(ast.InternedTerm("labels"), stringMapTerm(pg.Labels, false)),
			ast.Item(ast.InternedTerm("annotations"), stringMapTerm(pg.Annotations, true)),
			ast.Item(ast.InternedTerm("queue"), ast.StringTerm(pg.Queue)),
			ast.Item(ast.InternedTerm("minMember"), intTerm(pg.MinMember)),
			ast.Item(ast.InternedTerm("priorityClassName"), ast.StringTerm(pg.PriorityClassName)),
			ast.Item(ast.InternedTerm("priority"), intTerm(pg.Priority)),
			ast.Item(ast.InternedTerm("scheduleTimeoutSeconds"), intTerm(pg.ScheduleTimeoutSeconds)),
			ast.Item(ast.InternedTerm("topologyKey"), ast.StringTerm(pg.TopologyKey)),
			ast.Item(ast.InternedTerm("topology"), pg.Topology.term()),
			ast.Item(ast.InternedTerm("subGroups"), ast.ArrayTerm(subGroups...)),
		)),
		ast.Item(ast.InternedTerm("request"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("queue"), ast.StringTerm(pg.Queue)),
			ast.Item(ast.InternedTerm("podGroup"), ast.StringTerm(pg.Name)),
			ast.Item(ast.InternedTerm("minMember"), intTerm(pg.MinMember)),
			ast.Item(ast.InternedTerm("topology"), pg.Topology.term()),
		)),
	), nil
}

// stringMapTerm is m as an object; annotations drop kubectl's last applied
// configuration and long values, as a pod's input does.
func stringMapTerm(m map[string]string, annotations bool) *ast.Term {
	items := make([][2]*ast.Term, 0, len(m))
	for k, v := range m {
		if annotations && (k == lastAppliedAnnotation || len(v) > MaxAnnotationValueLen) {
			continue
		}
		items = append(items, ast.Item(ast.StringTerm(k), ast.StringTerm(v)))
	}
	return ast.ObjectTerm(items...)
}
