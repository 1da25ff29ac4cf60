package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Topology request keys (docs/guide/topology.md). The webhook writes Partita's
// from any dialect a pod speaks; the admission loop reads them on a
// workload's PodGroup, else on its pods, in any dialect (TopologyRequestOf).
const (
	// AnnotationTopology names the Topology whose levels the workload's
	// required and preferred levels are.
	AnnotationTopology = "partita.dev/topology"
	// AnnotationTopologyRequired is a level (node label) within one domain
	// of which all the workload's members must run, or wait.
	AnnotationTopologyRequired = "partita.dev/topology-required"
	// AnnotationTopologyPreferred is a level whose domains the workload's
	// members should span as few of as possible.
	AnnotationTopologyPreferred = "partita.dev/topology-preferred"
	// LabelSubGroup on a gang's pod names the sub-group (PodGroup
	// spec.subGroups) it belongs to.
	LabelSubGroup = "partita.dev/sub-group"
	// AnnotationSubGroupTopologyRequired on a workload's top owner (a
	// JobSet, a TrainJob) asks the workload map to make each replica of
	// each replicated Job a sub-group, whose members must run within one
	// domain of this level (docs/workloads.md); the workload's own
	// partita.dev/topology* keys still hold the whole gang.
	AnnotationSubGroupTopologyRequired = "partita.dev/sub-group-topology-required"
	// AnnotationSubGroupTopologyPreferred on a workload's top owner makes
	// each replica a sub-group too, whose members should span as few
	// domains of this level as possible.
	AnnotationSubGroupTopologyPreferred = "partita.dev/sub-group-topology-preferred"

	// AnnotationKAITopology and the next two are KAI-Scheduler's keys.
	AnnotationKAITopology = "kai.scheduler/topology"
	// AnnotationKAITopologyRequired is KAI's required level.
	AnnotationKAITopologyRequired = "kai.scheduler/topology-required-placement"
	// AnnotationKAITopologyPreferred is KAI's preferred level.
	AnnotationKAITopologyPreferred = "kai.scheduler/topology-preferred-placement"
	// LabelKAISubGroup is KAI's sub-group label on pods.
	LabelKAISubGroup = "kai.scheduler/subgroup-name"
	// AnnotationKueueTopologyRequired is Kueue's required level of a pod
	// set (Topology Aware Scheduling).
	AnnotationKueueTopologyRequired = "kueue.x-k8s.io/podset-required-topology"
	// AnnotationKueueTopologyPreferred is Kueue's preferred level.
	AnnotationKueueTopologyPreferred = "kueue.x-k8s.io/podset-preferred-topology"
)

// TopologyLevel is one level of a Topology: the node label whose values
// are its domains.
type TopologyLevel struct {
	// NodeLabel is the label's key, e.g. topology.kubernetes.io/zone,
	// network.example.com/rack, nvidia.com/gpu.clique or
	// kubernetes.io/hostname.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=317
	// +required
	NodeLabel string `json:"nodeLabel"`
}

// TopologySpec lists a network's levels.
type TopologySpec struct {
	// Levels are ordered from the broadest (a zone, a block) to the
	// narrowest (a rack, an NVLink domain, a host). A domain of a level is
	// the nodes that share the values of its label and of every broader
	// level's.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	// +kubebuilder:validation:XValidation:rule="self.all(l, self.exists_one(m, m.nodeLabel == l.nodeLabel))",message="each level's nodeLabel must be different"
	// +required
	Levels []TopologyLevel `json:"levels"`
}

// Topology is a cluster's network as node labels, broadest first: what
// workloads name (partita.dev/topology) to be placed inside one domain of
// a level (partita.dev/topology-required) or across as few as possible
// (partita.dev/topology-preferred). Several may coexist.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=topo
// +kubebuilder:printcolumn:name="Levels",type=string,JSONPath=`.spec.levels[*].nodeLabel`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Topology struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TopologySpec `json:"spec"`
}

// +kubebuilder:object:root=true

// TopologyList is a list of Topologies.
type TopologyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Topology `json:"items"`
}

// LevelIndex is the position of label among t's levels, -1 when it is none.
func (t *Topology) LevelIndex(label string) int {
	for i, l := range t.Spec.Levels {
		if l.NodeLabel == label {
			return i
		}
	}
	return -1
}

// SubGroup is a part of a gang with its own minimum and topology: e.g.
// each replica of a JobSet within one rack, the whole job within one block.
type SubGroup struct {
	// Name is what the members' partita.dev/sub-group label says.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9A-Z]([-a-z0-9A-Z_.]*[a-z0-9A-Z])?$`
	// +required
	Name string `json:"name"`
	// MinMember is how many of the sub-group's pods must be placed before
	// the gang starts; they count towards the gang's minMember.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +required
	MinMember int32 `json:"minMember"`
	// TopologyRequired is a level of the gang's Topology (or, when it names
	// none, any node label) within one domain of which the sub-group's
	// members must run.
	// +kubebuilder:validation:MaxLength=317
	// +optional
	TopologyRequired string `json:"topologyRequired,omitempty"`
	// TopologyPreferred is a level whose domains the sub-group should span
	// as few of as possible.
	// +kubebuilder:validation:MaxLength=317
	// +optional
	TopologyPreferred string `json:"topologyPreferred,omitempty"`
}

// TopologyRequest is what a workload asks of the topology, in Partita's
// terms, from any dialect.
type TopologyRequest struct {
	// Topology names a Topology; empty takes Required and Preferred as
	// plain node labels.
	Topology string
	// Required and Preferred are levels (node labels); empty for none.
	Required, Preferred string
}

// IsZero reports whether r asks for nothing.
func (r TopologyRequest) IsZero() bool { return r == TopologyRequest{} }

// TopologyRequestOf reads a topology request from annotations in any
// dialect: Partita's keys first, then KAI's, then Kueue's (which name no
// Topology).
func TopologyRequestOf(annotations map[string]string) TopologyRequest {
	first := func(keys ...string) string {
		for _, k := range keys {
			if v := annotations[k]; v != "" {
				return v
			}
		}
		return ""
	}
	return TopologyRequest{
		Topology:  first(AnnotationTopology, AnnotationKAITopology),
		Required:  first(AnnotationTopologyRequired, AnnotationKAITopologyRequired, AnnotationKueueTopologyRequired),
		Preferred: first(AnnotationTopologyPreferred, AnnotationKAITopologyPreferred, AnnotationKueueTopologyPreferred),
	}
}

// SubGroupOf is the sub-group a pod's labels name, in Partita's or KAI's
// key; empty for none.
func SubGroupOf(labels map[string]string) string {
	if v := labels[LabelSubGroup]; v != "" {
		return v
	}
	return labels[LabelKAISubGroup]
}
