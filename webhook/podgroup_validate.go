package webhook

import (
	"context"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/policy"
)

// PodGroupPolicy decides PodGroups (policy.Engine).
type PodGroupPolicy interface {
	PodGroupAdmission(ctx context.Context, in *policy.PodGroupAdmissionInput) (*policy.AdmissionDecision, error)
}

// ObjectReader reads one object by key (References, or any client).
type ObjectReader interface {
	Get(ctx context.Context, key client.ObjectKey, obj client.Object) error
}

// PodGroupAdmission validates PodGroups, which move their members' queue
// and priority, so that a tenant cannot reach through a gang what it could
// not reach through a pod:
//
//   - spec.queue goes through the same admission policy as a pod's queue
//     (data.partita.admission with a PodGroup input): it exists, is a leaf,
//     and the PodGroup's namespace may use it;
//   - spec.priorityClassName names a PriorityClass that exists (the
//     admission loop never lets a gang's priority exceed its members' own,
//     so the class can only lower it);
//   - spec.queue is fixed once a member is admitted: the PodGroup's status
//     says so (admitted or running members, or a phase past Pending);
//   - its topology request and spec.subGroups are well formed and fit the
//     named Topology's levels (podgroup_topology.go).
//
// The status is written by the admission loop a moment after it ungates
// the members, and only the loop may write it; within that moment a queue
// change would pass here. It moves nothing even then: members carry their
// queue as a label, fixed at creation (the pod webhook writes the
// PodGroup's queue onto members that name none and refuses members that
// name another), and the loop charges each member to its own label, holding
// a gang whose PodGroup disagrees.
//
// An update that leaves the spec and the topology keys as they were
// (labels, finalizers, a deletion in progress) is always allowed, so that a
// PodGroup whose queue was deleted can still be cleaned up.
type PodGroupAdmission struct {
	policy  PodGroupPolicy
	objects ObjectReader
}

// NewPodGroupAdmission returns the PodGroup handler: p decides, objects
// reads PriorityClasses and Topologies.
func NewPodGroupAdmission(p PodGroupPolicy, objects ObjectReader) *PodGroupAdmission {
	return &PodGroupAdmission{policy: p, objects: objects}
}

// isPodGroup reports whether the request is about a PodGroup itself (not
// its status).
func isPodGroup(ar *admissionv1.AdmissionRequest) bool {
	return ar.Kind.Group == v1alpha1.GroupVersion.Group && ar.Kind.Kind == "PodGroup" && ar.SubResource == ""
}

// Validate answers the PodGroup webhook: CREATE and UPDATE.
func (a *PodGroupAdmission) Validate(ctx context.Context, ar *admissionv1.AdmissionRequest) Result {
	if !isPodGroup(ar) || (ar.Operation != admissionv1.Create && ar.Operation != admissionv1.Update) {
		return Result{}
	}
	pg := &v1alpha1.PodGroup{}
	if err := decodeInto(ar.Object, "PodGroup", pg); err != nil {
		return Result{Err: err}
	}
	if pg.Namespace == "" {
		pg.Namespace = ar.Namespace
	}
	var old *v1alpha1.PodGroup
	if ar.Operation == admissionv1.Update {
		old = &v1alpha1.PodGroup{}
		if err := decodeInto(ar.OldObject, "old PodGroup", old); err != nil {
			return Result{Err: err}
		}
		// A change of the topology keys is asked about like one of the
		// spec: a policy that wants large gangs held to a topology must
		// not be passed by removing it later.
		if equality.Semantic.DeepEqual(old.Spec, pg.Spec) && sameTopologyAnnotations(old, pg) {
			return Result{}
		}
		if old.Spec.Queue != pg.Spec.Queue && memberAdmitted(old) {
			return Result{Err: &DenialError{Reason: ReasonImmutable, Errs: field.ErrorList{field.Forbidden(field.NewPath("spec", "queue"), fmt.Sprintf(
				"the queue of PodGroup %s is fixed once a member is admitted (was %q, now %q; status: phase %s, %d admitted, %d running): "+
					"its members are charged to %q; to move the gang, delete the PodGroup and its pods and create them again with the new queue",
				pg.Name, old.Spec.Queue, pg.Spec.Queue, phaseOf(old), old.Status.Admitted, old.Status.Running, old.Spec.Queue))}}}
		}
	}
	topo, err := a.checkTopology(ctx, pg, old)
	if err != nil {
		return Result{Err: err}
	}
	priority, err := a.priorityOf(ctx, pg, old)
	if err != nil {
		return Result{Err: err}
	}
	d, err := a.policy.PodGroupAdmission(ctx, podGroupInput(ar, pg, priority, topo))
	if err != nil {
		return Result{Err: &DenialError{Reason: ReasonPolicyError, Err: err}}
	}
	if len(d.Deny) > 0 {
		return Result{Err: &DenialError{Reason: ReasonPolicy, Messages: d.Deny}}
	}
	return Result{}
}

// memberAdmitted reports whether the PodGroup's status shows an admission:
// members admitted or running, or a phase past Pending (Failed too: bare
// members of a gang that timed out keep running).
func memberAdmitted(pg *v1alpha1.PodGroup) bool {
	return pg.Status.Admitted > 0 || pg.Status.Running > 0 || (pg.Status.Phase != "" && pg.Status.Phase != v1alpha1.PodGroupPending)
}

func phaseOf(pg *v1alpha1.PodGroup) v1alpha1.PodGroupPhase {
	if pg.Status.Phase == "" {
		return v1alpha1.PodGroupPending
	}
	return pg.Status.Phase
}

// priorityOf is the value of the PodGroup's PriorityClass, 0 for none. A
// class that does not exist is refused when the PodGroup is created or
// names a new one; one deleted since is tolerated (0), so that the
// PodGroup can still change.
func (a *PodGroupAdmission) priorityOf(ctx context.Context, pg, old *v1alpha1.PodGroup) (int64, error) {
	name := pg.Spec.PriorityClassName
	if name == "" {
		return 0, nil
	}
	pc := &schedulingv1.PriorityClass{}
	err := a.objects.Get(ctx, client.ObjectKey{Name: name}, pc)
	switch {
	case err == nil:
		return int64(pc.Value), nil
	case !apierrors.IsNotFound(err):
		return 0, fmt.Errorf("read PriorityClass %s: %w", name, err)
	case old != nil && old.Spec.PriorityClassName == name:
		return 0, nil
	}
	return 0, &DenialError{Reason: ReasonNotFound, Errs: field.ErrorList{field.NotFound(field.NewPath("spec", "priorityClassName"), name)},
		Messages: []string{fmt.Sprintf("PriorityClass %q does not exist; name one of `kubectl get priorityclasses`, or leave spec.priorityClassName empty to keep the members' own priority", name)}}
}

func podGroupInput(ar *admissionv1.AdmissionRequest, pg *v1alpha1.PodGroup, priority int64, topo v1alpha1.TopologyRequest) *policy.PodGroupAdmissionInput {
	in := &policy.PodGroupAdmissionInput{
		Operation: string(ar.Operation),
		User:      policy.UserInfo{Username: ar.UserInfo.Username, Groups: ar.UserInfo.Groups},
		Namespace: pg.Namespace,
		PodGroup: policy.PodGroupInfo{
			Name: pg.Name, Labels: pg.Labels, Annotations: pg.Annotations,
			Queue: pg.Spec.Queue, MinMember: int64(pg.Spec.MinMember),
			PriorityClassName: pg.Spec.PriorityClassName, Priority: priority,
			TopologyKey: pg.Spec.TopologyKey,
			Topology:    policy.TopologyRequest{Name: topo.Topology, Required: topo.Required, Preferred: topo.Preferred},
		},
	}
	for _, sg := range pg.Spec.SubGroups {
		in.PodGroup.SubGroups = append(in.PodGroup.SubGroups, policy.SubGroup{
			Name: sg.Name, MinMember: int64(sg.MinMember), TopologyRequired: sg.TopologyRequired, TopologyPreferred: sg.TopologyPreferred,
		})
	}
	if s := pg.Spec.ScheduleTimeoutSeconds; s != nil {
		in.PodGroup.ScheduleTimeoutSeconds = int64(*s)
	}
	return in
}
