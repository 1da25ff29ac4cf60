package admission

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Watch feeds the loop's cache from the pod, node, PodGroup and Queue
// informers of informers, and asks for a cycle on every change. Call it
// before the cache starts; Synced reports when the first lists are in.
func (a *Admitter) Watch(ctx context.Context, informers cache.Informers) error {
	c := a.cache
	feeds := []struct {
		obj    client.Object
		upsert func(any)
		remove func(any)
	}{
		{&corev1.Pod{}, func(o any) {
			if p, ok := o.(*corev1.Pod); ok {
				c.UpsertPod(p)
			}
		}, func(o any) {
			if p, ok := o.(*corev1.Pod); ok {
				c.DeletePod(p.UID)
			}
		}},
		{&corev1.Node{}, func(o any) {
			if n, ok := o.(*corev1.Node); ok {
				c.UpsertNode(n)
			}
		}, func(o any) {
			if n, ok := o.(*corev1.Node); ok {
				c.DeleteNode(n.Name)
			}
		}},
		{&v1alpha1.PodGroup{}, func(o any) {
			if pg, ok := o.(*v1alpha1.PodGroup); ok {
				c.UpsertPodGroup(pg)
			}
		}, func(o any) {
			if pg, ok := o.(*v1alpha1.PodGroup); ok {
				c.DeletePodGroup(types.NamespacedName{Namespace: pg.Namespace, Name: pg.Name})
			}
		}},
		{&v1alpha1.Queue{}, func(o any) {
			if q, ok := o.(*v1alpha1.Queue); ok {
				c.UpsertQueue(q)
			}
		}, func(o any) {
			if q, ok := o.(*v1alpha1.Queue); ok {
				c.DeleteQueue(q.Name)
			}
		}},
	}
	feeds = append(feeds, struct {
		obj    client.Object
		upsert func(any)
		remove func(any)
	}{&schedulingv1.PriorityClass{}, func(o any) {
		if pc, ok := o.(*schedulingv1.PriorityClass); ok {
			c.UpsertPriorityClass(pc.Name, pc.Value)
		}
	}, func(o any) {
		if pc, ok := o.(*schedulingv1.PriorityClass); ok {
			c.DeletePriorityClass(pc.Name)
		}
	}})
	a.watchTopologies(ctx, informers)
	for _, f := range feeds {
		inf, err := informers.GetInformer(ctx, f.obj)
		if err != nil {
			return fmt.Errorf("get %T informer: %w", f.obj, err)
		}
		upsert, remove := f.upsert, f.remove
		reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { upsert(o); a.Notify() },
			UpdateFunc: func(_, o any) { upsert(o); a.Notify() },
			DeleteFunc: func(o any) {
				if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
					o = d.Obj
				}
				remove(o)
				a.Notify()
			},
		})
		if err != nil {
			return fmt.Errorf("watch %T: %w", f.obj, err)
		}
		a.regs = append(a.regs, reg)
	}
	return nil
}

// Synced reports whether the cache has taken in the informers' first lists.
func (a *Admitter) Synced() bool {
	if len(a.regs) == 0 {
		return false
	}
	for _, r := range a.regs {
		if !r.HasSynced() {
			return false
		}
	}
	return true
}

// watchTopologies feeds the cache the Topologies. They are optional: an
// API server without the Topology CRD (a chart upgraded without its new
// CRDs), or an extender that may not read them, admits everything else as
// before, and workloads that name a topology wait saying it does not
// exist. They do not count towards Synced.
func (a *Admitter) watchTopologies(ctx context.Context, informers cache.Informers) {
	log := logr.FromContextOrDiscard(ctx)
	inf, err := informers.GetInformer(ctx, &v1alpha1.Topology{}, cache.BlockUntilSynced(false))
	if err != nil {
		log.Info("Topologies are not read: workloads that name one wait; install the chart's CRDs (crds/) and let the extender read topologies", "error", err.Error())
		return
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if t, ok := o.(*v1alpha1.Topology); ok {
				a.cache.UpsertTopology(t)
				a.Notify()
			}
		},
		UpdateFunc: func(_, o any) {
			if t, ok := o.(*v1alpha1.Topology); ok {
				a.cache.UpsertTopology(t)
				a.Notify()
			}
		},
		DeleteFunc: func(o any) {
			if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if t, ok := o.(*v1alpha1.Topology); ok {
				a.cache.DeleteTopology(t.Name)
				a.Notify()
			}
		},
	})
	if err != nil {
		log.Info("Topologies are not read", "error", err.Error())
	}
}
