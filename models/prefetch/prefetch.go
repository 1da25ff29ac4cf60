// Package prefetch asks nodes' model caches to fetch a Model before any pod
// needs it there: it adds a Pending entry for the node to the Model's
// status.nodes, which that node's cache (watching Models) takes up. The
// admission loop asks it for the nodes it admits a workload onto, so that
// the fetch starts as the workload is admitted, not when its pods bind.
package prefetch

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models"
)

// ManagerPrefix + node is the field manager of a request for that node: one
// manager per node, so that a request never removes another's.
const ManagerPrefix = "partita-prefetch/"

// The reasons of a request, and how its message starts.
const (
	// WhySpecPrefetch: the Model's spec.prefetch warms the node ahead of
	// demand.
	WhySpecPrefetch = "spec.prefetch"
	messagePrefix   = "prefetch requested: "
	admittedPrefix  = "admitted "
)

// WhyAdmitted is the reason of a request for the pods of an admitted
// workload (namespace/name).
func WhyAdmitted(workload string) string { return admittedPrefix + workload }

// ForAdmittedPods says whether a Pending entry's message is a request for
// admitted pods, whose node holds the model for them until they mount it;
// spec.prefetch's warming is not held (a tenant's Models must not pin
// other tenants' out of a node's cache).
func ForAdmittedPods(message string) bool {
	return strings.HasPrefix(message, messagePrefix+admittedPrefix)
}

// Requester writes prefetch requests.
type Requester struct {
	// Reader reads Models (an informer cache); Client applies their status.
	Reader client.Reader
	Client client.Client
	Clock  clock.PassiveClock
}

// Request asks each node to fetch each model (of namespace) it does not
// hold, fetch or already have a request for. why says who asked, for
// people. It returns the first error; the others are tried anyway.
func (r *Requester) Request(ctx context.Context, namespace string, models, nodes []string, why string) error {
	var first error
	for _, name := range models {
		m := &v1alpha1.Model{}
		if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, m); err != nil {
			if first == nil {
				first = client.IgnoreNotFound(err)
			}
			continue
		}
		for _, node := range nodes {
			if node == "" || m.Status.ModelNode(node) != nil {
				continue
			}
			if err := r.apply(ctx, m, node, why); err != nil && first == nil {
				first = err
			}
			m.Status.Nodes = append(m.Status.Nodes, v1alpha1.ModelNodeStatus{Name: node, Phase: v1alpha1.ModelPending})
		}
	}
	return first
}

func (r *Requester) apply(ctx context.Context, m *v1alpha1.Model, node, why string) error {
	status := map[string]any{"nodes": []any{map[string]any{
		"name": node, "phase": string(v1alpha1.ModelPending),
		"message":            messagePrefix + why,
		"lastTransitionTime": r.Clock.Now().UTC().Truncate(time.Second).Format(time.RFC3339),
	}}}
	// Not forced: a node's cache that already wrote this entry keeps it.
	if err := models.ApplyStatus(ctx, r.Client, types.NamespacedName{Namespace: m.Namespace, Name: m.Name}, ManagerPrefix+node, status, false); err != nil {
		return fmt.Errorf("request prefetch of Model %s/%s on %s: %w", m.Namespace, m.Name, node, err)
	}
	return nil
}
