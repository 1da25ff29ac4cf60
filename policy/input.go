package policy

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/open-policy-agent/opa/v1/ast"
	corev1 "k8s.io/api/core/v1"
)

// AdmissionInput is the input document of data.partita.admission: one pod
// that asks for GPUs, as the webhook read it. docs/policy.md specifies it
// with examples; keep the two in step.
type AdmissionInput struct {
	// Operation is the admission operation: CREATE.
	Operation string
	// User is who sent the request.
	User UserInfo
	// Namespace is the pod's namespace.
	Namespace string
	// Pod is the pod's metadata, a few spec fields, and its spec as
	// written.
	Pod PodInfo
	// Request is the pod's GPU request in canonical form.
	Request Request
}

// UserInfo is the requester.
type UserInfo struct {
	// Username is the authenticated user name.
	Username string
	// Groups are the user's groups.
	Groups []string
}

// PodInfo is what the policy sees of the pod itself.
type PodInfo struct {
	// Name is the pod's name, empty for a generateName pod.
	Name string
	// GenerateName is the pod's name prefix, if any.
	GenerateName string
	// Labels are the pod's labels.
	Labels map[string]string
	// Annotations are the pod's annotations, without
	// kubectl.kubernetes.io/last-applied-configuration and without values
	// longer than MaxAnnotationValueLen (see docs/policy.md).
	Annotations map[string]string
	// PriorityClassName is spec.priorityClassName.
	PriorityClassName string
	// ServiceAccountName is spec.serviceAccountName.
	ServiceAccountName string
	// Spec is the pod's spec as its author wrote it (before Partita's
	// mutation), in the JSON shape of the Kubernetes API: input.pod.spec.
	// Nil leaves input.pod.spec out; so does a policy that never reads it.
	Spec *corev1.PodSpec
}

// MaxAnnotationValueLen is the longest annotation value the policy input
// carries; longer values are left out so that a policy never pays for a
// large annotation it does not read.
const MaxAnnotationValueLen = 1024

// Request is a pod's GPU request (gpu.PodRequest, flattened for Rego).
type Request struct {
	// Dialect is how the pod asked: partita, runai, hami or nvidia.com/gpu.
	Dialect string
	// Queue is the queue the pod names, empty when none.
	Queue string
	// PodGroup is the gang the pod names, empty when none.
	PodGroup string
	// Placement is the pod's placement preference, empty for the default.
	Placement string
	// GPUMilli is the pod's partita.dev/gpu-milli: the sum over its GPU
	// containers (a lower bound for memory-based requests).
	GPUMilli int64
	// MinMember is the gang size from partita.dev/min-member, 0 when unset.
	MinMember int64
	// Topology is the pod's topology request in any dialect, empty fields
	// for none.
	Topology TopologyRequest
	// SubGroup is the pod's sub-group in any dialect, empty when none.
	SubGroup string
	// Containers are the GPU containers.
	Containers []ContainerRequest
}

// TopologyRequest is what a pod or PodGroup asks of the network's topology
// (v1alpha1.TopologyRequest), in Partita's terms whatever its dialect.
type TopologyRequest struct {
	// Name is the Topology it names, empty when its levels are plain node
	// labels.
	Name string
	// Required is the level within one domain of which all members must
	// run, empty for none.
	Required string
	// Preferred is the level whose domains the members should span as few
	// of as possible, empty for none.
	Preferred string
}

// term is r as Rego reads it: {"name", "required", "preferred"}.
func (r TopologyRequest) term() *ast.Term {
	return ast.ObjectTerm(
		ast.Item(ast.InternedTerm("name"), ast.StringTerm(r.Name)),
		ast.Item(ast.InternedTerm("required"), ast.StringTerm(r.Required)),
		ast.Item(ast.InternedTerm("preferred"), ast.StringTerm(r.Preferred)),
	)
}

// ContainerRequest is one GPU container's request.
type ContainerRequest struct {
	// Name is the container's name.
	Name string
	// Count is the number of devices.
	Count int64
	// Milli is the share of each device for a fraction or whole devices, 0
	// for a memory-based request.
	Milli int64
	// MemoryMiB is the GPU memory per device for a memory-based request.
	MemoryMiB int64
	// CoresPercent is the compute limit in percent, 0 for none.
	CoresPercent int64
	// MilliPerDevice is the share of each device: Milli, or for a memory
	// request its share of the cluster's largest device.
	MilliPerDevice int64
	// GPUMilli is the container's partita.dev/gpu-milli.
	GPUMilli int64
}

// value builds the Rego input as AST terms directly: this runs for every
// admission, and going through JSON or reflection costs more than the
// policy itself.
func (in *AdmissionInput) value(opts inputOptions) (ast.Value, error) {
	groups := make([]*ast.Term, 0, len(in.User.Groups))
	for _, g := range in.User.Groups {
		groups = append(groups, ast.StringTerm(g))
	}
	containers := make([]*ast.Term, 0, len(in.Request.Containers))
	for _, c := range in.Request.Containers {
		containers = append(containers, ast.ObjectTerm(
			ast.Item(ast.InternedTerm("name"), ast.StringTerm(c.Name)),
			ast.Item(ast.InternedTerm("count"), ast.InternedTerm(int(c.Count))),
			ast.Item(ast.InternedTerm("milli"), intTerm(c.Milli)),
			ast.Item(ast.InternedTerm("memoryMiB"), intTerm(c.MemoryMiB)),
			ast.Item(ast.InternedTerm("coresPercent"), intTerm(c.CoresPercent)),
			ast.Item(ast.InternedTerm("milliPerDevice"), intTerm(c.MilliPerDevice)),
			ast.Item(ast.InternedTerm("gpuMilli"), intTerm(c.GPUMilli)),
		))
	}
	annotations := make([][2]*ast.Term, 0, len(in.Pod.Annotations))
	for k, v := range in.Pod.Annotations {
		if k == lastAppliedAnnotation || len(v) > MaxAnnotationValueLen {
			continue
		}
		annotations = append(annotations, ast.Item(ast.StringTerm(k), ast.StringTerm(v)))
	}
	labels := make([][2]*ast.Term, 0, len(in.Pod.Labels))
	for k, v := range in.Pod.Labels {
		labels = append(labels, ast.Item(ast.StringTerm(k), ast.StringTerm(v)))
	}
	pod := []*ast.Term{
		ast.InternedTerm("name"), ast.StringTerm(in.Pod.Name),
		ast.InternedTerm("generateName"), ast.StringTerm(in.Pod.GenerateName),
		ast.InternedTerm("labels"), ast.ObjectTerm(labels...),
		ast.InternedTerm("annotations"), ast.ObjectTerm(annotations...),
		ast.InternedTerm("priorityClassName"), ast.StringTerm(in.Pod.PriorityClassName),
		ast.InternedTerm("serviceAccountName"), ast.StringTerm(in.Pod.ServiceAccountName),
	}
	if in.Pod.Spec != nil && opts.podSpec {
		spec, err := specValue(in.Pod.Spec)
		if err != nil {
			return nil, err
		}
		pod = append(pod, ast.InternedTerm("spec"), ast.NewTerm(spec))
	}
	podItems := make([][2]*ast.Term, 0, len(pod)/2)
	for i := 0; i < len(pod); i += 2 {
		podItems = append(podItems, ast.Item(pod[i], pod[i+1]))
	}
	return ast.NewObject(
		ast.Item(ast.InternedTerm("operation"), ast.StringTerm(in.Operation)),
		ast.Item(ast.InternedTerm("user"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("username"), ast.StringTerm(in.User.Username)),
			ast.Item(ast.InternedTerm("groups"), ast.ArrayTerm(groups...)),
		)),
		ast.Item(ast.InternedTerm("namespace"), ast.StringTerm(in.Namespace)),
		ast.Item(ast.InternedTerm("pod"), ast.ObjectTerm(podItems...)),
		ast.Item(ast.InternedTerm("request"), ast.ObjectTerm(
			ast.Item(ast.InternedTerm("dialect"), ast.StringTerm(in.Request.Dialect)),
			ast.Item(ast.InternedTerm("queue"), ast.StringTerm(in.Request.Queue)),
			ast.Item(ast.InternedTerm("podGroup"), ast.StringTerm(in.Request.PodGroup)),
			ast.Item(ast.InternedTerm("placement"), ast.StringTerm(in.Request.Placement)),
			ast.Item(ast.InternedTerm("gpuMilli"), intTerm(in.Request.GPUMilli)),
			ast.Item(ast.InternedTerm("minMember"), intTerm(in.Request.MinMember)),
			ast.Item(ast.InternedTerm("topology"), in.Request.Topology.term()),
			ast.Item(ast.InternedTerm("subGroup"), ast.StringTerm(in.Request.SubGroup)),
			ast.Item(ast.InternedTerm("containers"), ast.ArrayTerm(containers...)),
		)),
	), nil
}

func intTerm(v int64) *ast.Term { return ast.InternedTerm(int(v)) }

// lastAppliedAnnotation is kubectl's copy of the whole applied object.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// specValue is a pod spec as Rego sees it: its Kubernetes JSON.
func specValue(spec *corev1.PodSpec) (ast.Value, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode the pod spec: %w", err)
	}
	v, err := ast.ValueFromReader(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("read the pod spec: %w", err)
	}
	return v, nil
}
