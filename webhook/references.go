package webhook

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// References reads the objects a pod or a PodGroup names, to check them:
// a pod's PodGroup (its queue and sub-groups) and Models, a PodGroup's
// PriorityClass and Topology. It reads the
// informer cache first and, when the cache does not have the object, the
// API server: `kubectl apply` of a PodGroup and its pods in one file sends
// the pods within milliseconds of the PodGroup, before any informer has it,
// and a pod must not miss its PodGroup's queue for that. Only a miss costs
// an API call, so gangs whose PodGroup exists never do.
type References struct {
	cache client.Reader
	live  client.Reader
	// synced reports whether the informers have their first lists.
	synced []func() bool
	// noTopologies: the API server does not serve Topologies.
	noTopologies bool
}

// ServesTopologies reports whether Topologies can be read.
func (r *References) ServesTopologies() bool { return !r.noTopologies }

// NewReferences reads through cache (the manager's informer cache) and,
// on a miss, live (the manager's API reader); live may be nil.
func NewReferences(cache, live client.Reader) *References {
	return &References{cache: cache, live: live}
}

// Watch starts the PodGroup, PriorityClass and Topology informers at once,
// so that the first requests need no API call.
//
// Topologies are optional: on an API server without their CRD (a chart
// upgraded without its new CRDs: Helm never upgrades CRDs) the webhook
// still serves, and a PodGroup's levels are checked by their syntax alone
// (the admission loop says when its Topology cannot be read).
func (r *References) Watch(ctx context.Context, informers cache.Informers) error {
	for _, obj := range []client.Object{&v1alpha1.PodGroup{}, &schedulingv1.PriorityClass{}} {
		inf, err := informers.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("get %T informer: %w", obj, err)
		}
		r.synced = append(r.synced, inf.HasSynced)
	}
	// Models, like Topologies, may be missing from an older install: a pod
	// that asks for one is then refused as naming a Model that is not there.
	if inf, err := informers.GetInformer(ctx, &v1alpha1.Model{}); err != nil {
		logr.FromContextOrDiscard(ctx).Info("Models are not read: pods that ask for one (partita.dev/model) are refused; apply the chart's CRDs (crds/)", "error", err.Error())
	} else {
		r.synced = append(r.synced, inf.HasSynced)
	}
	inf, err := informers.GetInformer(ctx, &v1alpha1.Topology{})
	if err != nil {
		logr.FromContextOrDiscard(ctx).Info("Topologies are not read: a PodGroup's topology levels are checked by their syntax alone; apply the chart's CRDs (crds/)", "error", err.Error())
		r.noTopologies = true
		return nil
	}
	r.synced = append(r.synced, inf.HasSynced)
	return nil
}

// Synced reports whether the informers Watch started have their first
// lists (true when Watch was not called: every read then asks live).
func (r *References) Synced() bool {
	for _, s := range r.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Get reads key into obj: from the cache, else from the API server. A
// NotFound error means neither has it.
func (r *References) Get(ctx context.Context, key client.ObjectKey, obj client.Object) error {
	err := r.cache.Get(ctx, key, obj)
	if !apierrors.IsNotFound(err) || r.live == nil {
		return err
	}
	return r.live.Get(ctx, key, obj)
}
