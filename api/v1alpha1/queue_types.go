package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Queue resource names used in QueueResources and in Queue status.
const (
	ResourceGPU    corev1.ResourceName = "gpu"
	ResourceCPU    corev1.ResourceName = "cpu"
	ResourceMemory corev1.ResourceName = "memory"
)

// DefaultQueuePriority is the priority of a queue that sets none.
const DefaultQueuePriority int32 = 100

// DefaultQueueName is the queue of GPU pods that name none and whose
// namespace has no default queue (the webhook's and the extender's
// --default-queue), unless the operator requires a queue. The chart and
// `partita dev up` create it: priority 0, quota 0 for every resource, no
// limit, over-quota weight 1, so it only borrows and reclaim takes back
// what it holds.
const DefaultQueueName = "default"

// ResourceQuota is a queue's share of one resource.
//
// +kubebuilder:validation:XValidation:rule="!has(self.quota) || quantity(string(self.quota)).compareTo(quantity('-1')) >= 0",message="quota must be -1 (the whole capacity) or at least 0"
// +kubebuilder:validation:XValidation:rule="!has(self.limit) || quantity(string(self.limit)).compareTo(quantity('-1')) >= 0",message="limit must be -1 (no limit) or at least 0"
// +kubebuilder:validation:XValidation:rule="!has(self.limit) || !has(self.quota) || quantity(string(self.limit)).compareTo(quantity('-1')) == 0 || quantity(string(self.quota)).compareTo(quantity('-1')) != 0 && quantity(string(self.limit)).compareTo(quantity(string(self.quota))) >= 0",message="limit must be at least quota, or -1 for no limit"
type ResourceQuota struct {
	// Quota is the deserved amount, given regardless of priority. -1 means the
	// whole capacity of the parent's level. Defaults to 0.
	// +optional
	Quota *resource.Quantity `json:"quota,omitempty"`
	// Limit is a hard cap on what the queue may hold. -1 means no limit, the
	// default.
	// +optional
	Limit *resource.Quantity `json:"limit,omitempty"`
	// OverQuotaWeight is the queue's weight when capacity beyond quotas is
	// divided; 0 means it gets nothing over quota. Defaults to 1.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	OverQuotaWeight *int32 `json:"overQuotaWeight,omitempty"`
}

// QueueResources holds a queue's quota for each resource it accounts.
type QueueResources struct {
	// GPU is counted in devices; fractions are decimals ("0.5").
	// +optional
	GPU *ResourceQuota `json:"gpu,omitempty"`
	// CPU is counted in cores.
	// +optional
	CPU *ResourceQuota `json:"cpu,omitempty"`
	// Memory is counted in bytes.
	// +optional
	Memory *ResourceQuota `json:"memory,omitempty"`
}

// QueueSpec describes a queue's place in the tree, its priority and quotas.
type QueueSpec struct {
	// Parent is the name of the parent queue; empty for a top-level queue.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Parent string `json:"parent,omitempty"`
	// Priority orders queues when capacity over quota is divided and when
	// workloads are admitted; higher first. Defaults to 100.
	// +optional
	Priority *int32 `json:"priority,omitempty"`
	// Namespaces lists the namespaces whose pods may submit to this queue.
	// +kubebuilder:validation:MaxItems=256
	// +listType=set
	// +optional
	Namespaces []string `json:"namespaces,omitempty"`
	// NamespaceSelector also admits pods from namespaces whose labels match.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// Resources holds the quota, limit and over-quota weight per resource.
	// +optional
	Resources QueueResources `json:"resources,omitempty"`
}

// QueueStatus is what the admission loop observes of a queue.
type QueueStatus struct {
	// Allocated is what the queue's admitted workloads hold, per resource
	// (gpu, cpu, memory).
	// +optional
	Allocated corev1.ResourceList `json:"allocated,omitempty"`
	// Requested is allocated plus pending demand, per resource.
	// +optional
	Requested corev1.ResourceList `json:"requested,omitempty"`
	// FairShare is the queue's fair share per resource (DESIGN §6).
	// +optional
	FairShare corev1.ResourceList `json:"fairShare,omitempty"`
	// PendingWorkloads counts workloads waiting for admission.
	// +optional
	PendingWorkloads int32 `json:"pendingWorkloads,omitempty"`
	// ChildQueues lists the names of the queues whose parent this is.
	// +listType=set
	// +optional
	ChildQueues []string `json:"childQueues,omitempty"`
	// Conditions describe the queue's state.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Queue is a node in the tree of queues that divides the cluster's capacity.
// Only leaf queues take work.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=pq
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Parent",type=string,JSONPath=`.spec.parent`
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="GPU Quota",type=string,JSONPath=`.spec.resources.gpu.quota`
// +kubebuilder:printcolumn:name="GPU Limit",type=string,JSONPath=`.spec.resources.gpu.limit`
// +kubebuilder:printcolumn:name="Allocated",type=string,JSONPath=`.status.allocated.gpu`
// +kubebuilder:printcolumn:name="Fair Share",type=string,JSONPath=`.status.fairShare.gpu`
// +kubebuilder:printcolumn:name="Pending",type=integer,JSONPath=`.status.pendingWorkloads`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="!has(self.spec.parent) || self.spec.parent != self.metadata.name",message="spec.parent: a queue cannot be its own parent"
type Queue struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec QueueSpec `json:"spec,omitempty"`
	// +optional
	Status QueueStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// QueueList is a list of Queues.
type QueueList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Queue `json:"items"`
}
