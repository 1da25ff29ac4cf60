package console

import (
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// WorkloadKind is the kind of the object a person thinks of as the
// workload: the Job they submitted, the gang, or a bare pod.
type WorkloadKind string

// Workload kinds the console knows. A pod whose controller is of another
// kind (a ReplicaSet, a StatefulSet) is grouped under that owner, with the
// owner's kind, and offers no actions.
const (
	// KindPod is a pod on its own.
	KindPod WorkloadKind = "Pod"
	// KindPodGroup is a gang of pods that no controller owns.
	KindPodGroup WorkloadKind = "PodGroup"
	// KindJob is a batch/v1 Job, gang or not.
	KindJob WorkloadKind = "Job"
)

// WorkloadRef names one workload.
type WorkloadRef struct {
	// Kind is the workload's kind.
	Kind WorkloadKind `json:"kind"`
	// Namespace is its namespace.
	Namespace string `json:"namespace"`
	// Name is its name.
	Name string `json:"name"`
}

func (r WorkloadRef) String() string {
	return string(r.Kind) + "/" + r.Namespace + "/" + r.Name
}

// Workload actions, as the API names them.
const (
	ActionDelete  = "delete"
	ActionSuspend = "suspend"
	ActionResume  = "resume"
)

// kindSpec is what the console can do with a workload kind, and the
// resource whose verbs RBAC checks for it.
type kindSpec struct {
	// resource is the object deleted or patched for the kind's actions.
	resource schema.GroupResource
	// alsoDeletes are the other objects its deletion deletes as the
	// caller (a gang's pods), whose delete the caller needs too.
	alsoDeletes []schema.GroupResource
	// deletable: the console can delete the workload (the object, or for a
	// PodGroup its member pods and the PodGroup).
	deletable bool
	// suspendable: the object has spec.suspend.
	suspendable bool
}

// WorkloadKinds resolves pods to workloads. It is the one place that says
// which workload a pod belongs to, so that the map, the lists and the
// actions agree; a new kind (JobSet, RayCluster, ...) is a resolver and a
// kindSpec added here.
type WorkloadKinds struct {
	specs map[WorkloadKind]kindSpec
	// resolvers are tried in order; the first that claims a pod names its
	// workload.
	resolvers []resolver
}

// resolver names the workload of a pod, or returns false to pass it on.
type resolver func(p *corev1.Pod, req *gpu.PodRequest, objs *objectIndex) (WorkloadRef, bool)

// NewWorkloadKinds returns the kinds Partita knows today: Jobs, gangs
// (PodGroups) and pods.
func NewWorkloadKinds() *WorkloadKinds {
	return &WorkloadKinds{
		specs: map[WorkloadKind]kindSpec{
			KindPod: {resource: schema.GroupResource{Resource: "pods"}, deletable: true},
			KindPodGroup: {resource: schema.GroupResource{Group: v1alpha1.GroupVersion.Group, Resource: "podgroups"}, deletable: true,
				alsoDeletes: []schema.GroupResource{{Resource: "pods"}}},
			KindJob: {resource: schema.GroupResource{Group: batchv1.GroupName, Resource: "jobs"}, deletable: true, suspendable: true},
		},
		resolvers: []resolver{resolveJob, resolvePodGroup, resolveOwner},
	}
}

// Resolve names the workload of a pod; a pod no resolver claims is a
// workload of its own.
func (k *WorkloadKinds) Resolve(p *corev1.Pod, req *gpu.PodRequest, objs *objectIndex) WorkloadRef {
	for _, r := range k.resolvers {
		if ref, ok := r(p, req, objs); ok {
			return ref
		}
	}
	return WorkloadRef{Kind: KindPod, Namespace: p.Namespace, Name: p.Name}
}

func (k *WorkloadKinds) spec(kind WorkloadKind) (kindSpec, bool) {
	s, ok := k.specs[kind]
	return s, ok
}

// resolveJob: a pod a Job controls belongs to the Job, gang or not.
func resolveJob(p *corev1.Pod, _ *gpu.PodRequest, _ *objectIndex) (WorkloadRef, bool) {
	o := metav1.GetControllerOf(p)
	if o == nil || o.Kind != "Job" || !strings.HasPrefix(o.APIVersion, batchv1.GroupName+"/") {
		return WorkloadRef{}, false
	}
	return WorkloadRef{Kind: KindJob, Namespace: p.Namespace, Name: o.Name}, true
}

// resolvePodGroup: a pod of a gang no controller owns belongs to the gang.
func resolvePodGroup(p *corev1.Pod, req *gpu.PodRequest, _ *objectIndex) (WorkloadRef, bool) {
	if req == nil || req.PodGroup == "" || metav1.GetControllerOf(p) != nil {
		return WorkloadRef{}, false
	}
	return WorkloadRef{Kind: KindPodGroup, Namespace: p.Namespace, Name: req.PodGroup}, true
}

// resolveOwner: a pod of another controller belongs to that controller.
func resolveOwner(p *corev1.Pod, _ *gpu.PodRequest, _ *objectIndex) (WorkloadRef, bool) {
	o := metav1.GetControllerOf(p)
	if o == nil {
		return WorkloadRef{}, false
	}
	return WorkloadRef{Kind: WorkloadKind(o.Kind), Namespace: p.Namespace, Name: o.Name}, true
}

// WorkloadPhase is where a workload stands, from its pods.
type WorkloadPhase string

// Workload phases.
const (
	// PhaseWaiting: some pod waits for the admission loop or for a node.
	PhaseWaiting WorkloadPhase = "Waiting"
	// PhaseRunning: every pod that has not finished is bound to a node.
	PhaseRunning WorkloadPhase = "Running"
	// PhaseSucceeded: every pod succeeded.
	PhaseSucceeded WorkloadPhase = "Succeeded"
	// PhaseFailed: every pod finished, and some failed.
	PhaseFailed WorkloadPhase = "Failed"
	// PhaseSuspended: the workload is suspended and runs no pod.
	PhaseSuspended WorkloadPhase = "Suspended"
)

// Workload is one workload as the lists show it. GPU amounts are in
// milli-GPUs (1000 = one GPU), as in partita.dev/gpu-milli.
type Workload struct {
	WorkloadRef
	// Gang is the PodGroup its pods belong to, if any.
	Gang string `json:"gang,omitempty"`
	// MinMember is the gang's size, 0 when unknown or not a gang.
	MinMember int32 `json:"minMember,omitempty"`
	// Queue is the queue its pods (or its PodGroup) name.
	Queue string `json:"queue,omitempty"`
	// Phase is where it stands.
	Phase WorkloadPhase `json:"phase"`
	// RequestedMilli is what its unfinished pods ask for, a memory request
	// counted against the largest device, as partita.dev/gpu-milli does.
	RequestedMilli int64 `json:"requestedMilli"`
	// HeldMilli is what its pods' slices hold now, from the ledger.
	HeldMilli int64 `json:"heldMilli"`
	// Pods counts its GPU pods that have not finished.
	Pods int `json:"pods"`
	// Bound counts those bound to a node.
	Bound int `json:"bound"`
	// Finished counts its pods that succeeded or failed.
	Finished int `json:"finished"`
	// Created is when its first pod (or its object) was created.
	Created time.Time `json:"created"`
	// Suspended is set for a suspended Job.
	Suspended bool `json:"suspended,omitempty"`
	// Verdict is `kubectl partita why`'s summary for the first pod that
	// waits, when one does (from the same code).
	Verdict string `json:"verdict,omitempty"`
	// WaitingPod is that pod's name.
	WaitingPod string `json:"waitingPod,omitempty"`
	// Actions are what the caller may do with it: delete, suspend, resume.
	Actions []string `json:"actions"`

	// members are its GPU pods, in creation order.
	members []*corev1.Pod
}

// objectIndex finds the objects a workload's pods point to.
type objectIndex struct {
	jobs      map[nsName]*batchv1.Job
	podGroups map[nsName]*v1alpha1.PodGroup
}

type nsName struct{ namespace, name string }

func newObjectIndex(jobs []batchv1.Job, pgs []v1alpha1.PodGroup) *objectIndex {
	x := &objectIndex{jobs: make(map[nsName]*batchv1.Job, len(jobs)), podGroups: make(map[nsName]*v1alpha1.PodGroup, len(pgs))}
	for i := range jobs {
		x.jobs[nsName{jobs[i].Namespace, jobs[i].Name}] = &jobs[i]
	}
	for i := range pgs {
		x.podGroups[nsName{pgs[i].Namespace, pgs[i].Name}] = &pgs[i]
	}
	return x
}

// buildWorkloads groups the GPU pods into workloads, with what each holds
// in the ledger (held, by pod UID), sorted by namespace, kind and name.
func buildWorkloads(kinds *WorkloadKinds, pods []corev1.Pod, objs *objectIndex, held map[string]int64, maxDeviceMiB int64) ([]*Workload, map[WorkloadRef]*Workload, map[nsName]WorkloadRef) {
	byRef := map[WorkloadRef]*Workload{}
	podRef := map[nsName]WorkloadRef{}
	for i := range pods {
		p := &pods[i]
		req, _ := gpu.ParsePod(p)
		if req == nil {
			continue
		}
		ref := kinds.Resolve(p, req, objs)
		podRef[nsName{p.Namespace, p.Name}] = ref
		w := byRef[ref]
		if w == nil {
			w = &Workload{WorkloadRef: ref, Created: p.CreationTimestamp.Time, Actions: []string{}}
			byRef[ref] = w
		}
		w.members = append(w.members, p)
		if p.CreationTimestamp.Time.Before(w.Created) {
			w.Created = p.CreationTimestamp.Time
		}
		if w.Gang == "" {
			w.Gang = req.PodGroup
		}
		if w.Queue == "" {
			w.Queue = req.Queue
		}
		w.HeldMilli += held[string(p.UID)]
		if finished(p) {
			w.Finished++
			continue
		}
		w.Pods++
		if p.Spec.NodeName != "" {
			w.Bound++
		}
		for _, c := range req.Containers {
			q := c.MilliResource(maxDeviceMiB)
			w.RequestedMilli += q.Value()
		}
	}
	out := make([]*Workload, 0, len(byRef))
	for _, w := range byRef {
		slices.SortFunc(w.members, func(a, b *corev1.Pod) int {
			if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
				return c
			}
			return strings.Compare(a.Name, b.Name)
		})
		if w.Gang != "" {
			if pg := objs.podGroups[nsName{w.Namespace, w.Gang}]; pg != nil {
				w.MinMember = pg.Spec.MinMember
				if w.Queue == "" {
					w.Queue = pg.Spec.Queue
				}
			}
		}
		if w.Kind == KindJob {
			if j := objs.jobs[nsName{w.Namespace, w.Name}]; j != nil {
				w.Suspended = j.Spec.Suspend != nil && *j.Spec.Suspend
				if j.CreationTimestamp.Time.Before(w.Created) {
					w.Created = j.CreationTimestamp.Time
				}
			}
		}
		w.Phase = phaseOf(w)
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b *Workload) int {
		return strings.Compare(a.Namespace+"\x00"+string(a.Kind)+"\x00"+a.Name, b.Namespace+"\x00"+string(b.Kind)+"\x00"+b.Name)
	})
	return out, byRef, podRef
}

func phaseOf(w *Workload) WorkloadPhase {
	switch {
	case w.Pods > 0 && w.Bound < w.Pods:
		return PhaseWaiting
	case w.Pods > 0:
		return PhaseRunning
	case w.Suspended:
		return PhaseSuspended
	}
	for _, p := range w.members {
		if p.Status.Phase == corev1.PodFailed {
			return PhaseFailed
		}
	}
	return PhaseSucceeded
}

// waitingMember is the first pod of w that waits: not bound, not finished.
func (w *Workload) waitingMember() *corev1.Pod {
	for _, p := range w.members {
		if p.Spec.NodeName == "" && !finished(p) {
			return p
		}
	}
	return nil
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}
