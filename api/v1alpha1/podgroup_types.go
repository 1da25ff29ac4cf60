package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodGroupPhase is the lifecycle phase of a gang.
//
// +kubebuilder:validation:Enum=Pending;Admitted;Running;Failed
type PodGroupPhase string

// PodGroup phases.
const (
	// PodGroupPending: the gang waits for members, quota or room.
	PodGroupPending PodGroupPhase = "Pending"
	// PodGroupAdmitted: the gang has a reservation and its gates are removed.
	PodGroupAdmitted PodGroupPhase = "Admitted"
	// PodGroupRunning: at least minMember pods are bound.
	PodGroupRunning PodGroupPhase = "Running"
	// PodGroupFailed: the gang did not start within its schedule timeout.
	PodGroupFailed PodGroupPhase = "Failed"
)

// PodGroup condition types and reasons.
const (
	// PodGroupConditionAdmitted is true while the gang holds an admission.
	PodGroupConditionAdmitted = "Admitted"
	// PodConditionAdmitted is the pod condition the admission loop keeps on
	// GPU pods: False with a Reason* and the numbers while the pod waits,
	// True once its workload is admitted.
	PodConditionAdmitted = "partita.dev/Admitted"
	// ReasonWaitingForQuota: the queue cannot take the gang now.
	ReasonWaitingForQuota = "WaitingForQuota"
	// ReasonWaitingForMembers: fewer than minMember pods exist.
	ReasonWaitingForMembers = "WaitingForMembers"
	// ReasonWaitingForCapacity: the gang does not fit the cluster now.
	ReasonWaitingForCapacity = "WaitingForCapacity"
	// ReasonAdmitted: the gang was admitted.
	ReasonAdmitted = "Admitted"
	// ReasonScheduleTimeout: the gang did not bind within its timeout.
	ReasonScheduleTimeout = "ScheduleTimeout"
	// ReasonPinRefused: kube-scheduler kept refusing gang members at the
	// nodes the admission loop pinned them to, while others of the gang
	// ran; the loop evicted those members so that it places them again.
	ReasonPinRefused = "PinRefused"
	// ReasonPreempted: the gang was evicted for another workload.
	ReasonPreempted = "Preempted"
	// ReasonWaitingForWorkload: the workload map cannot group the pod yet:
	// its owners are not read yet, the workload rule failed, or the
	// PodGroup that carries the workload's queue does not exist yet.
	ReasonWaitingForWorkload = "WaitingForWorkload"
	// ReasonEvictionRefused: the workloads that would make room for the
	// gang may not be evicted now (a PodDisruptionBudget, or an eviction
	// that failed), so none was evicted; the message says which and why.
	ReasonEvictionRefused = "EvictionRefused"
	// ReasonQueueConflict: the gang's pods name different queues, or
	// another queue than their PodGroup; it is not admitted until they
	// agree.
	ReasonQueueConflict = "QueueConflict"
)

// PodGroupSpec describes a gang: pods that start all together or not at all.
type PodGroupSpec struct {
	// MinMember is how many pods must be placeable before any starts.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	// +required
	MinMember int32 `json:"minMember"`
	// Queue is the leaf queue of the gang, checked like a pod's (the
	// namespace may use it) and fixed once a member is admitted. Members
	// that name no queue take it; members that name another are refused.
	// Empty means the members' queue label or the namespace's default queue.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Queue string `json:"queue,omitempty"`
	// PriorityClassName names an existing PriorityClass that can lower the
	// gang's priority within its queue, never raise it above its members'
	// own (the lowest of their pod priorities).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	PriorityClassName string `json:"priorityClassName,omitempty"`
	// ScheduleTimeoutSeconds is how long an admitted gang may take to bind fully
	// before it is released and requeued.
	// +kubebuilder:validation:Minimum=1
	// +optional
	ScheduleTimeoutSeconds *int32 `json:"scheduleTimeoutSeconds,omitempty"`
	// TopologyKey is a node label; the gang prefers nodes that share its value.
	// +kubebuilder:validation:MaxLength=317
	// +optional
	TopologyKey string `json:"topologyKey,omitempty"`
	// SubGroups are parts of the gang, each with its own minimum and
	// topology levels; pods join one with the label partita.dev/sub-group.
	// The gang's own topology (the PodGroup's partita.dev/topology*
	// annotations) holds all of them together.
	// +kubebuilder:validation:MaxItems=64
	// +listType=map
	// +listMapKey=name
	// +optional
	SubGroups []SubGroup `json:"subGroups,omitempty"`
}

// PodGroupStatus is what the admission loop observes of a gang.
type PodGroupStatus struct {
	// Phase summarises the conditions: Pending, Admitted, Running or Failed.
	// +optional
	Phase PodGroupPhase `json:"phase,omitempty"`
	// Admitted counts the members admitted in the current admission.
	// +optional
	Admitted int32 `json:"admitted,omitempty"`
	// Running counts the members bound to nodes.
	// +optional
	Running int32 `json:"running,omitempty"`
	// Reason is the last reason the gang waits or failed, in words.
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	Reason string `json:"reason,omitempty"`
	// Conditions describe the gang's state.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PodGroup is a gang of pods admitted all-or-nothing.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=pg
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Admitted",type=integer,JSONPath=`.status.admitted`
// +kubebuilder:printcolumn:name="MinMember",type=integer,JSONPath=`.spec.minMember`
// +kubebuilder:printcolumn:name="Queue",type=string,JSONPath=`.spec.queue`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PodGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec PodGroupSpec `json:"spec"`
	// +optional
	Status PodGroupStatus `json:"status,omitempty"`
}

// +kubebuilder:object:root=true

// PodGroupList is a list of PodGroups.
type PodGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodGroup `json:"items"`
}
