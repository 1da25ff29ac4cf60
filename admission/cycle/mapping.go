package cycle

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Mapping is what the workload map (data.partita.workload) says of one GPU
// pod that names no pod group of its own.
type Mapping struct {
	// Gang is the name of the pod's gang in its namespace; empty leaves the
	// pod a single pod.
	Gang string
	// Waiting, when set, says why the pod cannot be grouped yet (an owner
	// is not read yet, the rule failed): the pod waits, with this message.
	Waiting string
	// MinMember is how many of the gang's GPU pods must fit before any
	// starts.
	MinMember int32
	// Elastic: the pod may run as a member beyond MinMember, admitted as
	// room allows and evicted first.
	Elastic bool
	// Queue and PriorityClassName are what the rule names, empty when none.
	Queue, PriorityClassName string
	// Owner is the workload's top owner: the PodGroup the admission loop
	// keeps for the gang is owned by it.
	Owner Owner
	// Kind and Name name the workload for people: "JobSet", "llama-ft".
	Kind, Name string
	// Topology is what the workload asks of the network topology (the
	// rule's topology, e.g. from the top owner's annotations); zero for
	// nothing. The pod's own annotations count when it is zero.
	Topology v1alpha1.TopologyRequest
	// SubGroups are the gang's parts, and SubGroup the one this pod joins
	// ("" for none; the pod's own partita.dev/sub-group label counts then).
	SubGroups []v1alpha1.SubGroup
	SubGroup  string
}

// Equal reports whether m and o say the same.
func (m Mapping) Equal(o Mapping) bool {
	return m.Gang == o.Gang && m.Waiting == o.Waiting && m.MinMember == o.MinMember && m.Elastic == o.Elastic &&
		m.Queue == o.Queue && m.PriorityClassName == o.PriorityClassName && m.Owner == o.Owner &&
		m.Kind == o.Kind && m.Name == o.Name && m.Topology == o.Topology && m.SubGroup == o.SubGroup &&
		slices.Equal(m.SubGroups, o.SubGroups)
}

// Owner is an object an ownerReference can name.
type Owner struct {
	APIVersion, Kind, Name string
	UID                    types.UID
}

// Mapper maps GPU pods to workloads (package admission/workloadmap). Map is
// called for every pod change and must be cheap when nothing it reads
// changed; Forget when a pod is gone.
type Mapper interface {
	Map(pod *corev1.Pod) Mapping
	Forget(uid types.UID)
}

// WithMapper groups the GPU pods that name no pod group by m's answer.
func WithMapper(m Mapper) CacheOption { return func(c *Cache) { c.mapper = m } }
