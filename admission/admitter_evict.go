package admission

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/api/v1alpha1"
)

// EvictionRetry is how long a workload whose eviction was refused is spared
// before the loop may choose it as a victim again: a PodDisruptionBudget
// changes as pods become ready or go.
const EvictionRetry = 30 * time.Second

// refusal is why a victim's eviction was refused, and until when it is
// spared.
type refusal struct {
	why   string
	until time.Time
}

// finishing is a victim some of whose members were evicted before an
// eviction failed: the loop evicts the rest before anything else.
type finishing struct {
	forKey  cycle.WorkloadKey
	why     string
	kind    string
	message string
}

// evictAll carries out the cycle's evictions, all or none for each
// workload they make room for, so that no gang is left partly evicted:
//
//  1. Every victim pod must be evictable now: the PodDisruptionBudgets
//     over them must allow as many disruptions as the victims take of
//     them together (the Eviction API checks one pod at a time, so two
//     pods under a budget of one both pass alone), and a dry-run eviction
//     (DeleteOptions dryRun All) of each that a budget selects must pass
//     (one no budget selects the Eviction API would not refuse: its dry
//     run would cost an eviction request for nothing). Otherwise nothing is
//     evicted, the victim is spared for EvictionRetry (the next cycles
//     look for other victims), and the preemptor waits with reason
//     EvictionRefused, saying why on its pods and its PodGroup.
//  2. Then the victims of every preemptor that passed are evicted in one
//     pool, patchWorkers at a time (a gang's reclaim may take thousands
//     of them, a reclaim of single pods hundreds of preemptors' one each),
//     each victim's pods one after the other. Should an eviction still
//     fail (a budget changed in between), no further victim is started
//     for that preemptor, and a victim already partly evicted is finished
//     first in the next cycles (finishEvictions), through the Eviction API
//     still, before the loop evicts anything else.
//
// The budgets of a namespace are read once per call (budgetBook), and
// what this call's evictions take of them is counted against them.
func (a *Admitter) evictAll(ctx context.Context, res *cycle.Result, now time.Time) {
	budgets := &budgetBook{c: a.client, spent: map[types.NamespacedName]int32{}, byNamespace: map[string][]policyv1.PodDisruptionBudget{}}
	var order []cycle.WorkloadKey
	groups := map[cycle.WorkloadKey][]*cycle.Eviction{}
	for i := range res.Evictions {
		e := &res.Evictions[i]
		if _, ok := groups[e.For.Key]; !ok {
			order = append(order, e.For.Key)
		}
		groups[e.For.Key] = append(groups[e.For.Key], e)
	}
	// Each preemptor's victims are checked in the cycle's order (the
	// budgets they take are counted against the next ones), then the
	// victims of all that passed are evicted in one pool: a reclaim of
	// single pods evicts hundreds a cycle, one victim each, and one after
	// the other they took seconds.
	var ready []cycle.WorkloadKey
	var all []*cycle.Eviction
	for _, key := range order {
		g := groups[key]
		if len(a.finishing) > 0 {
			// A victim is partly evicted: nothing else goes until it is
			// gone whole.
			a.rewriteMessage(res, key, a.waitForFinishing())
			continue
		}
		if v, why := a.preflight(ctx, g, budgets); v != nil {
			a.refuse(ctx, res, g[0].For, v, why, now)
			continue
		}
		ready = append(ready, key)
		all = append(all, g...)
	}
	evicted, errs := a.evictVictims(ctx, all)
	for _, key := range ready {
		g := groups[key]
		n := len(g)
		ev, er := evicted[:n], errs[:n]
		evicted, errs = evicted[n:], errs[n:]
		// Victims never started need nothing; one refused before its
		// first pod is spared; one stopped part-way is finished first
		// later (its wait is written last: it says more).
		for j, e := range g {
			if er[j] != nil && ev[j] == 0 {
				a.refuse(ctx, res, e.For, e.Victim, er[j].Error(), now)
			}
		}
		for j, e := range g {
			if er[j] == nil || ev[j] == 0 {
				continue
			}
			why := er[j].Error()
			a.finishing[e.Victim.Key] = finishing{forKey: e.For.Key, why: why, kind: evictionKind(e), message: e.Message}
			a.rewriteWait(res, e.For.Key, v1alpha1.ReasonEvictionRefused, fmt.Sprintf(
				"evicting %s to make room stopped after %d of its pods: %s; the rest of %s is evicted as soon as that is allowed, before anything else",
				e.Victim.Key, ev[j], why, e.Victim.Key))
			a.refusedFor[e.For.Key] = now.Add(EvictionRetry)
		}
	}
}

// waitForFinishing is the wait of a preemptor held back while a victim is
// evicted whole.
func (a *Admitter) waitForFinishing() string {
	for k := range a.finishing {
		// The cycle's reason stays: room or a limit's headroom.
		return fmt.Sprintf("waiting until %s is evicted whole before evicting anything more", k)
	}
	return ""
}

// evictVictims evicts the victims of evs, patchWorkers at a time, and
// returns for each how many of its pods it evicted and the error that
// stopped it. After a failure no further victim is started for the same
// preemptor; the others' go on.
func (a *Admitter) evictVictims(ctx context.Context, evs []*cycle.Eviction) ([]int, []error) {
	evicted := make([]int, len(evs))
	errs := make([]error, len(evs))
	failed := map[cycle.WorkloadKey]*atomic.Bool{}
	for _, e := range evs {
		if failed[e.For.Key] == nil {
			failed[e.For.Key] = &atomic.Bool{}
		}
	}
	jobs := make([]func() error, len(evs))
	for i, e := range evs {
		stop := failed[e.For.Key]
		jobs[i] = func() error {
			if stop.Load() {
				return nil
			}
			if evicted[i], errs[i] = a.evictWhole(ctx, e); errs[i] != nil {
				stop.Store(true)
			}
			return nil
		}
	}
	parallel(patchWorkers, jobs)
	return evicted, errs
}

// budgetBook is what one evictAll knows of PodDisruptionBudgets: those of
// each namespace, read once, and the disruptions its evictions took of
// each since (the Eviction API takes them off the budget's status, which
// the list read before does not show).
type budgetBook struct {
	c           client.Client
	byNamespace map[string][]policyv1.PodDisruptionBudget
	spent       map[types.NamespacedName]int32
}

// in returns the budgets of namespace ns.
func (b *budgetBook) in(ctx context.Context, ns string) ([]policyv1.PodDisruptionBudget, error) {
	if pdbs, ok := b.byNamespace[ns]; ok {
		return pdbs, nil
	}
	var list policyv1.PodDisruptionBudgetList
	if err := b.c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	b.byNamespace[ns] = list.Items
	return list.Items, nil
}

// allowed is how many more disruptions pdb allows now.
func (b *budgetBook) allowed(pdb *policyv1.PodDisruptionBudget) int32 {
	return pdb.Status.DisruptionsAllowed - b.spent[types.NamespacedName{Namespace: pdb.Namespace, Name: pdb.Name}]
}

// evictionMembers are the pods an eviction takes: the members it names
// (elastic members of a gang beyond its minimum), else every running one.
func evictionMembers(e *cycle.Eviction) []*cycle.Member {
	if len(e.Members) > 0 {
		return e.Members
	}
	return e.Victim.Active
}

func evictionKind(e *cycle.Eviction) string {
	if e.Reclaim {
		return "reclaim"
	}
	return "preempt"
}

// preflight returns the first victim of g that cannot be evicted now, and
// why; nil when every victim pod may go, and then the disruptions they
// take are counted spent in budgets. A pod no budget selects is not asked
// about by a dry run: the Eviction API would refuse it only for a budget.
func (a *Admitter) preflight(ctx context.Context, g []*cycle.Eviction, budgets *budgetBook) (*cycle.Workload, string) {
	type victimPod struct {
		pod *corev1.Pod
		w   *cycle.Workload
		// budgeted: a budget selects the pod (or one could not be read
		// for it): the dry run asks the Eviction API.
		budgeted bool
	}
	var pods []*victimPod
	byNamespace := map[string][]*victimPod{}
	for _, e := range g {
		for _, m := range evictionMembers(e) {
			if m.Pod.DeletionTimestamp != nil {
				continue
			}
			vp := &victimPod{pod: m.Pod, w: e.Victim}
			pods = append(pods, vp)
			byNamespace[m.Pod.Namespace] = append(byNamespace[m.Pod.Namespace], vp)
		}
	}
	namespaces := make([]string, 0, len(byNamespace))
	for ns := range byNamespace {
		namespaces = append(namespaces, ns)
	}
	slices.Sort(namespaces)
	takes := map[types.NamespacedName]int32{}
	for _, ns := range namespaces {
		pdbs, err := budgets.in(ctx, ns)
		if err != nil {
			return byNamespace[ns][0].w, fmt.Sprintf("the PodDisruptionBudgets of namespace %s could not be read: %v", ns, err)
		}
		for i := range pdbs {
			pdb := &pdbs[i]
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			if err != nil {
				// The dry runs ask the Eviction API what it makes of it.
				for _, vp := range byNamespace[ns] {
					vp.budgeted = true
				}
				continue
			}
			var under []*victimPod
			for _, vp := range byNamespace[ns] {
				if !sel.Matches(labels.Set(vp.pod.Labels)) {
					continue
				}
				vp.budgeted = true
				// Only ready pods take from a budget; the dry run below
				// checks the others.
				if podReady(vp.pod) {
					under = append(under, vp)
				}
			}
			if allowed := budgets.allowed(pdb); int32(len(under)) > allowed {
				return under[0].w, fmt.Sprintf("PodDisruptionBudget %s/%s allows %d disruption(s) now and the eviction takes %d of its pods",
					pdb.Namespace, pdb.Name, max(allowed, 0), len(under))
			}
			if len(under) > 0 {
				takes[types.NamespacedName{Namespace: pdb.Namespace, Name: pdb.Name}] = int32(len(under))
			}
		}
	}
	var jobs []func() error
	errs := make([]error, len(pods))
	for i, vp := range pods {
		if vp.budgeted {
			jobs = append(jobs, func() error {
				errs[i] = a.evictPod(ctx, vp.pod, true)
				return nil
			})
		}
	}
	parallel(patchWorkers, jobs)
	for i, err := range errs {
		if err != nil {
			return pods[i].w, fmt.Sprintf("the eviction of pod %s/%s is refused: %v", pods[i].pod.Namespace, pods[i].pod.Name, err)
		}
	}
	for k, n := range takes {
		budgets.spent[k] += n
	}
	return nil, ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// refuse spares victim for EvictionRetry and tells preemptor why nothing
// was evicted for it.
func (a *Admitter) refuse(ctx context.Context, res *cycle.Result, preemptor, victim *cycle.Workload, why string, now time.Time) {
	until := now.Add(EvictionRetry)
	a.refused[victim.Key] = refusal{why: fmt.Sprintf("its eviction was refused (%s); it may be chosen again after %s", why, until.UTC().Format(time.TimeOnly)), until: until}
	a.refusedFor[preemptor.Key] = until
	msg := fmt.Sprintf("could not evict %s to make room, so nothing was evicted: %s; the loop looks for other victims, and may choose %s again after %s",
		victim.Key, why, victim.Key, until.UTC().Format(time.TimeOnly))
	a.rewriteWait(res, preemptor.Key, v1alpha1.ReasonEvictionRefused, msg)
	if preemptor.HasPodGroup {
		pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: preemptor.Key.Namespace, Name: preemptor.Key.PodGroup}}
		a.event(pg, corev1.EventTypeWarning, v1alpha1.ReasonEvictionRefused, "Evict", msg)
	}
	logr.FromContextOrDiscard(ctx).V(2).Info("Refused to evict a workload", "workload", victim.Key.String(), "for", preemptor.Key.String(), "why", why)
}

// rewriteMessage sets the message of key's wait in res, keeping its reason.
func (a *Admitter) rewriteMessage(res *cycle.Result, key cycle.WorkloadKey, msg string) {
	for i := range res.Waiting {
		if res.Waiting[i].Workload.Key == key {
			res.Waiting[i].Message = msg
		}
	}
}

// rewriteWait replaces the cycle's wait of key ("evicting ...").
func (a *Admitter) rewriteWait(res *cycle.Result, key cycle.WorkloadKey, reason, msg string) {
	for i := range res.Waiting {
		if res.Waiting[i].Workload.Key == key {
			res.Waiting[i].Reason, res.Waiting[i].Message = reason, msg
		}
	}
}

// evictWhole evicts every member of e's victim through the Eviction API,
// so that PodDisruptionBudgets hold; it stops at the first failure and
// returns how many it evicted.
func (a *Admitter) evictWhole(ctx context.Context, e *cycle.Eviction) (int, error) {
	log := logr.FromContextOrDiscard(ctx)
	kind := evictionKind(e)
	evicted := 0
	for _, m := range evictionMembers(e) {
		if m.Pod.DeletionTimestamp != nil {
			continue
		}
		if err := a.evictPod(ctx, m.Pod, false); err != nil {
			log.Error(err, "Failed to evict pod", "pod", klog.KObj(m.Pod), "for", e.For.Key.String())
			return evicted, fmt.Errorf("the eviction of pod %s/%s failed: %w", m.Pod.Namespace, m.Pod.Name, err)
		}
		a.event(m.Pod, corev1.EventTypeWarning, v1alpha1.ReasonPreempted, "Evict", e.Message)
		evicted++
		log.V(2).Info("Evicted pod", "pod", klog.KObj(m.Pod), "for", e.For.Key.String(), "kind", kind)
	}
	a.metrics.evicted(kind)
	return evicted, nil
}

// finishEvictions evicts what is left of partly evicted victims, before
// the cycle decides anything; a victim is done when none of its members
// is left or every one is terminating. It returns the victims it finished
// now: the cycle's state still shows them running.
func (a *Admitter) finishEvictions(ctx context.Context, st *cycle.State, now time.Time) []cycle.WorkloadKey {
	if len(a.finishing) == 0 {
		return nil
	}
	var finished []cycle.WorkloadKey
	active := map[cycle.WorkloadKey]*cycle.Workload{}
	for _, ws := range st.Active {
		for _, w := range ws {
			if _, ok := a.finishing[w.Key]; ok {
				active[w.Key] = w
			}
		}
	}
	for key, f := range a.finishing {
		w := active[key]
		if w == nil {
			delete(a.finishing, key)
			continue
		}
		evicted, err := a.evictWhole(ctx, &cycle.Eviction{Victim: w, For: &cycle.Workload{Key: f.forKey}, Reclaim: f.kind == "reclaim", Message: f.message})
		if err == nil {
			delete(a.finishing, key)
			finished = append(finished, key)
			continue
		}
		f.why = err.Error()
		a.finishing[key] = f
		a.refusedFor[f.forKey] = now.Add(EvictionRetry)
		logr.FromContextOrDiscard(ctx).V(2).Info("Still finishing the eviction of a workload", "workload", key.String(), "evictedNow", evicted, "why", f.why)
	}
	return finished
}

// unevictable are the workloads the cycle may not choose as victims;
// finished are those whose eviction finishEvictions completed just now.
func (a *Admitter) unevictable(now time.Time, finished []cycle.WorkloadKey) map[cycle.WorkloadKey]string {
	for k, r := range a.refused {
		if !now.Before(r.until) {
			delete(a.refused, k)
		}
	}
	if len(a.refused) == 0 && len(a.finishing) == 0 && len(finished) == 0 {
		return nil
	}
	out := make(map[cycle.WorkloadKey]string, len(a.refused)+len(a.finishing)+len(finished))
	for _, k := range finished {
		out[k] = "it was just evicted"
	}
	for k, r := range a.refused {
		out[k] = r.why
	}
	for k, f := range a.finishing {
		out[k] = fmt.Sprintf("it is being evicted whole for %s (%s)", f.forKey, f.why)
	}
	return out
}

// noteRefusals keeps the reason EvictionRefused on the waits of
// preemptors whose evictions were refused lately: the cycle's message says
// which victims it spared and why.
func (a *Admitter) noteRefusals(res *cycle.Result, now time.Time) {
	for k, until := range a.refusedFor {
		if !now.Before(until) {
			delete(a.refusedFor, k)
		}
	}
	if len(a.refusedFor) == 0 {
		return
	}
	for i := range res.Waiting {
		wt := &res.Waiting[i]
		// Waits for room and for a limit's headroom both reclaim.
		waitsForEvictions := wt.Reason == v1alpha1.ReasonWaitingForCapacity || wt.Reason == v1alpha1.ReasonWaitingForQuota
		if _, ok := a.refusedFor[wt.Workload.Key]; ok && waitsForEvictions {
			wt.Reason = v1alpha1.ReasonEvictionRefused
		}
	}
}

// evictPod evicts pod through the Eviction API, or with dryRun only asks
// whether it would be evicted. A pod already gone counts as evicted.
func (a *Admitter) evictPod(ctx context.Context, pod *corev1.Pod, dryRun bool) error {
	opts := &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	err := a.cs.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
		DeleteOptions: opts,
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
