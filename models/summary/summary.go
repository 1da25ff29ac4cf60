// Package summary keeps a Model's status.phase and its Ready condition true
// to the nodes' entries (status.nodes), which each node's model cache
// writes for itself. It runs on the extender's leader.
package summary

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models"
	"github.com/partita-dev/partita/models/prefetch"
)

// FieldManager owns status.phase and the Ready condition.
const FieldManager = "partita-model-summary"

// Summary is what status.phase and the Ready condition say of nodes.
type Summary struct {
	Phase   v1alpha1.ModelPhase
	Status  metav1.ConditionStatus
	Reason  string
	Message string
}

// Summarize reads the nodes' entries.
func Summarize(nodes []v1alpha1.ModelNodeStatus) Summary {
	by := map[v1alpha1.ModelPhase][]v1alpha1.ModelNodeStatus{}
	for _, n := range nodes {
		by[n.Phase] = append(by[n.Phase], n)
	}
	names := func(ns []v1alpha1.ModelNodeStatus) string {
		out := make([]string, 0, len(ns))
		for _, n := range ns {
			out = append(out, n.Name)
		}
		sort.Strings(out)
		if len(out) > 5 {
			out = append(out[:5], fmt.Sprintf("and %d more", len(out)-5))
		}
		return strings.Join(out, ", ")
	}
	first := func(ns []v1alpha1.ModelNodeStatus) v1alpha1.ModelNodeStatus {
		sort.Slice(ns, func(i, j int) bool { return ns[i].Name < ns[j].Name })
		return ns[0]
	}
	switch {
	case len(by[v1alpha1.ModelReady]) > 0:
		return Summary{Phase: v1alpha1.ModelReady, Status: metav1.ConditionTrue, Reason: v1alpha1.ModelReasonReady,
			Message: fmt.Sprintf("held on %d node(s): %s", len(by[v1alpha1.ModelReady]), names(by[v1alpha1.ModelReady]))}
	case len(by[v1alpha1.ModelFetching]) > 0:
		f := first(by[v1alpha1.ModelFetching])
		return Summary{Phase: v1alpha1.ModelFetching, Status: metav1.ConditionFalse, Reason: v1alpha1.ModelReasonFetching,
			Message: fmt.Sprintf("fetching on %s: %s", names(by[v1alpha1.ModelFetching]), f.Message)}
	case len(by[v1alpha1.ModelFailed]) > 0:
		f := first(by[v1alpha1.ModelFailed])
		return Summary{Phase: v1alpha1.ModelFailed, Status: metav1.ConditionFalse, Reason: v1alpha1.ModelReasonFetchFailed,
			Message: fmt.Sprintf("failed on %s: %s", names(by[v1alpha1.ModelFailed]), f.Message)}
	}
	return Summary{Phase: v1alpha1.ModelPending, Status: metav1.ConditionFalse, Reason: v1alpha1.ModelReasonNotFetched,
		Message: "no node holds it yet: a node fetches it when a pod that asks for it (partita.dev/model) starts there"}
}

// Reconciler applies the summary of each Model, and asks nodes to warm it
// as its spec.prefetch says.
type Reconciler struct {
	Client client.Client
	Clock  clock.PassiveClock
	// Prefetch writes prefetch requests (models/prefetch); nil ignores
	// spec.prefetch.
	Prefetch func(ctx context.Context, namespace string, models, nodes []string, why string) error
}

// prefetchRecheck is how often a Model short of its prefetch count looks
// for nodes again (new nodes, nodes that became Ready).
const prefetchRecheck = 5 * time.Minute

// Reconcile writes status.phase and the Ready condition when they differ
// from the nodes' summary (server-side apply, its own field manager).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	m := &v1alpha1.Model{}
	if err := r.Client.Get(ctx, req.NamespacedName, m); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	var res ctrl.Result
	if m.Spec.Prefetch != nil && r.Prefetch != nil {
		short, err := r.warm(ctx, m)
		if err != nil {
			return ctrl.Result{}, err
		}
		if short {
			res.RequeueAfter = prefetchRecheck
		}
	}
	s := Summarize(m.Status.Nodes)
	cur := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ModelConditionReady)
	if m.Status.Phase == s.Phase && cur != nil && cur.Status == s.Status && cur.Reason == s.Reason && cur.Message == s.Message && cur.ObservedGeneration == m.Generation {
		return res, nil
	}
	ltt := metav1.NewTime(r.Clock.Now().Truncate(time.Second))
	if cur != nil && cur.Status == s.Status {
		ltt = cur.LastTransitionTime
	}
	status := map[string]any{
		"phase": string(s.Phase),
		"conditions": []any{map[string]any{
			"type": v1alpha1.ModelConditionReady, "status": string(s.Status), "reason": s.Reason,
			"message": truncate(s.Message, 32768), "observedGeneration": m.Generation,
			"lastTransitionTime": ltt.UTC().Format(time.RFC3339),
		}},
	}
	if err := models.ApplyStatus(ctx, r.Client, req.NamespacedName, FieldManager, status, true); err != nil {
		return ctrl.Result{}, fmt.Errorf("apply the summary of Model %s: %w", req.NamespacedName, err)
	}
	return res, nil
}

// warm asks as many Ready, schedulable nodes that spec.prefetch selects
// as it is short of its count (by name; nodes that failed the model are
// not asked again). short says it found too few.
func (r *Reconciler) warm(ctx context.Context, m *v1alpha1.Model) (short bool, err error) {
	sel := labels.Everything()
	if m.Spec.Prefetch.NodeSelector != nil {
		if sel, err = metav1.LabelSelectorAsSelector(m.Spec.Prefetch.NodeSelector); err != nil {
			return false, nil //nolint:nilerr // a bad selector cannot be fixed by a retry; the CRD's schema admits it
		}
	}
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.MatchingLabelsSelector{Selector: sel}); err != nil {
		return false, fmt.Errorf("list nodes for the prefetch of Model %s/%s: %w", m.Namespace, m.Name, err)
	}
	have := 0
	var free []string
	for _, n := range nodes.Items {
		e := m.Status.ModelNode(n.Name)
		switch {
		case e != nil && e.Phase != v1alpha1.ModelFailed:
			have++
		case e == nil && !n.Spec.Unschedulable && nodeReady(&n):
			free = append(free, n.Name)
		}
	}
	need := int(m.Spec.Prefetch.Count) - have
	if need <= 0 {
		return false, nil
	}
	sort.Strings(free)
	ask := free[:min(need, len(free))]
	if len(ask) > 0 {
		if err := r.Prefetch(ctx, m.Namespace, []string{m.Name}, ask, prefetch.WhySpecPrefetch); err != nil {
			return true, err
		}
	}
	return len(ask) < need, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// Setup adds the reconciler to mgr (it runs on the leader only); prefetch
// writes spec.prefetch's requests.
func Setup(mgr ctrl.Manager, clk clock.PassiveClock, prefetch func(ctx context.Context, namespace string, models, nodes []string, why string) error) error {
	return builder.ControllerManagedBy(mgr).
		Named("model-summary").
		For(&v1alpha1.Model{}, builder.WithPredicates(predicate.ResourceVersionChangedPredicate{})).
		Complete(&Reconciler{Client: mgr.GetClient(), Clock: clk, Prefetch: prefetch})
}
