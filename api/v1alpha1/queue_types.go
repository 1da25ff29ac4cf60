package v1alpha1

import (
	"strings"
	"time"

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
	// Usage is the queue's historical usage, which time-based fair share
	// weighs; set only while the admission loop weighs usage
	// (--fair-share-usage-weight above 0).
	// +optional
	Usage *QueueUsage `json:"usage,omitempty"`
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

// Usage window types: a sliding window always covers the last window's
// length; a tumbling one starts afresh at every multiple of its length
// (counted from Monday 1970-01-05 00:00 UTC, so a 24h window starts at
// midnight UTC and a 168h one on Monday).
const (
	UsageWindowSliding  = "sliding"
	UsageWindowTumbling = "tumbling"
)

// DescribeUsageWindow says what usage counted with these settings covers,
// in the words of the admission loop's messages and of the reports:
// "sliding 168h window, half-life 24h" (zero minutes and seconds dropped).
func DescribeUsageWindow(windowType string, window, halfLife time.Duration) string {
	s := shortDuration(window) + " window, half-life " + shortDuration(halfLife)
	if windowType != "" {
		s = windowType + " " + s
	}
	return s
}

// shortDuration is time.Duration.String without zero minutes and seconds:
// 168h, 1h30m, 90s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if t, ok := strings.CutSuffix(s, "m0s"); ok && t != "" {
		s = t + "m"
	}
	if t, ok := strings.CutSuffix(s, "h0m"); ok && t != "" {
		s = t + "h"
	}
	return s
}

// QueueUsage is what a queue used over the usage window, decayed by the
// half-life (DESIGN §6, time-based fair share). A parent's includes its
// children's.
type QueueUsage struct {
	// Hours is the decayed usage in resource-hours: gpu in GPU-hours, cpu
	// in core-hours, memory in byte-hours.
	// +optional
	Hours corev1.ResourceList `json:"hours,omitempty"`
	// Share is that usage over what the cluster's whole capacity would have
	// given in the same window with the same decay, per resource (0 to 1):
	// the number fair share weighs.
	// +optional
	Share corev1.ResourceList `json:"share,omitempty"`
	// FairShareWithoutUsage is the fair share the queue would have if usage
	// did not count. Where it differs from status.fairShare, history
	// decided.
	// +optional
	FairShareWithoutUsage corev1.ResourceList `json:"fairShareWithoutUsage,omitempty"`
	// HalfLife, Window and WindowType are the settings the usage was
	// counted with.
	// +optional
	HalfLife metav1.Duration `json:"halfLife,omitempty"`
	// +optional
	Window metav1.Duration `json:"window,omitempty"`
	// +kubebuilder:validation:Enum=sliding;tumbling
	// +optional
	WindowType string `json:"windowType,omitempty"`
	// UpdateTime is when the usage was last counted up to.
	// +optional
	UpdateTime *metav1.Time `json:"updateTime,omitempty"`
	// Buckets are the queue's own usage over time, oldest first: what a new
	// leader of the admission loop carries on from.
	// +kubebuilder:validation:MaxItems=128
	// +listType=atomic
	// +optional
	Buckets []UsageBucket `json:"buckets,omitempty"`
}

// UsageBucket is what a queue's own workloads used in one stretch of time.
type UsageBucket struct {
	Start metav1.Time `json:"start"`
	End   metav1.Time `json:"end"`
	// Used is in resource-hours (gpu GPU-hours, cpu core-hours, memory
	// byte-hours), each moment's use decayed by the half-life to End.
	Used corev1.ResourceList `json:"used"`
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
