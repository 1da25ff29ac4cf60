package admission

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
)

// A pinned member can bind on its node alone: its required node affinity
// is fixed once it is ungated, and a scheduling gate cannot be put back. If
// kube-scheduler refuses that node for a reason the cycle does not model,
// the member would wait out the gang's schedule timeout while the members
// that bound run beside it. The loop gives such a pin up sooner: it evicts
// the refused members, whose controller makes new ones that wait behind the
// gate and are placed again, or requeues the gang when none of it runs.

// refusedMember is a gang member kube-scheduler refuses at its pinned node.
type refusedMember struct {
	member *cycle.Member
	node   string
	// message is kube-scheduler's reason.
	message string
}

// refusedPinned are w's unbound members, pinned by the loop to a node, that
// kube-scheduler refuses (PodScheduled False, Unschedulable), admitted at
// least RefusedPinTimeout ago (limit, the gang's schedule timeout, when
// that is sooner) and not handled yet; nil while RefusedPinTimeout is 0.
func (a *Admitter) refusedPinned(w *cycle.Workload, limit time.Duration, now time.Time) []refusedMember {
	if a.opts.RefusedPinTimeout <= 0 {
		return nil
	}
	bound := min(a.opts.RefusedPinTimeout, limit)
	var out []refusedMember
	for _, m := range w.Active {
		if m.Bound || m.Pod.DeletionTimestamp != nil || m.Admitted.IsZero() || now.Sub(m.Admitted) < bound {
			continue
		}
		if _, done := a.refusedPins[m.Pod.UID]; done {
			continue
		}
		node := pinnedNode(m.Pod)
		if node == "" {
			continue
		}
		if msg, refused := unschedulable(m.Pod); refused {
			out = append(out, refusedMember{member: m, node: node, message: msg})
		}
	}
	return out
}

// releaseRefusedPins gives up the pins kube-scheduler refuses. A gang none
// of whose members runs is requeued whole at once, as its schedule timeout
// would later. Otherwise the refused members that have a controller are
// evicted so that their replacements are placed again beside the members
// that run; bare ones are left as they are, under the schedule timeout.
//
// That is done once per admission (the members that run keep its start):
// a replacement refused again is refused for a reason the loop cannot
// weigh, and evicting it every time would churn pods (and count against
// a Job's backoffLimit). Then a gang short of its minimum is requeued
// whole, and one that runs at its minimum keeps the member pinned.
func (a *Admitter) releaseRefusedPins(ctx context.Context, w *cycle.Workload, bound int, refused []refusedMember, now time.Time) {
	log := logr.FromContextOrDiscard(ctx)
	first := refused[0]
	age := now.Sub(first.member.Admitted).Round(time.Second)
	why := fmt.Sprintf("kube-scheduler refuses member %s at node %s, where it is pinned, %s after its admission (%s); ",
		first.member.Pod.Name, first.node, age, truncate(first.message, 300))
	if len(refused) > 1 {
		why = fmt.Sprintf("kube-scheduler refuses %d members at the nodes they are pinned to, %s at node %s %s after its admission (%s); ",
			len(refused), first.member.Pod.Name, first.node, age, truncate(first.message, 300))
	}
	again := a.repinned[w.Key].Equal(w.Started())
	if again {
		why = "again after the loop placed refused members anew, " + why
	}
	short := bound < int(w.MinMember)
	if short && (again || bound-int(w.Succeeded) == 0) {
		a.timeOut(ctx, w, bound, v1alpha1.ReasonPinRefused, why, now)
		return
	}
	var evicted, left []string
	for _, r := range refused {
		pod := r.member.Pod
		if again || metav1.GetControllerOf(pod) == nil {
			a.refusedPins[pod.UID] = struct{}{}
			left = append(left, pod.Name)
			continue
		}
		if err := a.evictPod(ctx, pod, false); err != nil {
			// Tried again next cycle.
			log.Error(err, "Failed to evict a gang member refused at its pinned node", "pod", klog.KObj(pod), "node", r.node)
			continue
		}
		a.refusedPins[pod.UID] = struct{}{}
		a.ledger.Forget(pod.UID)
		delete(a.reserved, pod.UID)
		evicted = append(evicted, pod.Name)
	}
	if len(evicted) == 0 && len(left) == 0 {
		return
	}
	msg := why
	if len(evicted) > 0 {
		a.repinned[w.Key] = w.Started()
		msg += fmt.Sprintf("evicted %s so that the loop places %s again; the %d bound members keep running",
			strings.Join(evicted, ", "), pronoun(len(evicted)), bound-int(w.Succeeded))
		a.metrics.evicted("refused")
	}
	if len(left) > 0 {
		if len(evicted) > 0 {
			msg += "; "
		}
		switch {
		case again:
			// The gang runs at its minimum (else it was requeued above).
			msg += fmt.Sprintf("%s %s left pinned while the gang runs at its minimum", strings.Join(left, ", "), isAre(len(left)))
		case short:
			msg += fmt.Sprintf("%s %s no controller, so %s left pinned until the gang's schedule timeout (%s)",
				strings.Join(left, ", "), has(len(left)), itThey(len(left)), a.scheduleTimeout(w))
		default:
			msg += fmt.Sprintf("%s %s no controller, so %s left pinned", strings.Join(left, ", "), has(len(left)), itThey(len(left)))
		}
	}
	for _, r := range refused {
		a.event(r.member.Pod, corev1.EventTypeWarning, v1alpha1.ReasonPinRefused, "Evict", msg)
	}
	if w.HasPodGroup {
		pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: w.Key.Namespace, Name: w.Key.GangName()}}
		a.event(pg, corev1.EventTypeWarning, v1alpha1.ReasonPinRefused, "Evict", msg)
	}
	log.Info("Gave up gang members' pins that kube-scheduler refused", "workload", w.Key.String(), "node", first.node,
		"evicted", len(evicted), "left", len(left), "bound", bound)
}

func pronoun(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}

func has(n int) string {
	if n == 1 {
		return "has"
	}
	return "have"
}

func isAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

func itThey(n int) string {
	if n == 1 {
		return "it is"
	}
	return "they are"
}

// pinnedNode is the node the loop pinned pod to: its partita.dev/node while
// unbound (written with the pin), else the one node its required node
// affinity names by metadata.name (a claim member, pinned without the
// annotation); "" for a pod not pinned.
func pinnedNode(pod *corev1.Pod) string {
	if n := pod.Annotations[v1alpha1.AnnotationNode]; n != "" {
		return n
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 {
		return ""
	}
	// pinToNode adds the same requirement to every term.
	for _, r := range terms[0].MatchFields {
		if r.Key == metav1.ObjectNameField && r.Operator == corev1.NodeSelectorOpIn && len(r.Values) == 1 {
			return r.Values[0]
		}
	}
	return ""
}

// unschedulable reports whether kube-scheduler's last word on pod is that
// no node it may go to takes it, with its message.
func unschedulable(pod *corev1.Pod) (string, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Message, c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
		}
	}
	return "", false
}
