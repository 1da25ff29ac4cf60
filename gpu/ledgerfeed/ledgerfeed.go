// Package ledgerfeed keeps a gpu.Ledger in step with the API server: the
// one feed that the extender's verbs and the admission loop of a replica
// read the same ledger through. It imports gpu and api/v1alpha1 only.
package ledgerfeed

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// Feed keeps a gpu.Ledger in step with the GPUNodes and pods that a
// shared informer cache sees: the ledger is derived from the API objects
// alone (DESIGN §3), so a restarted replica rebuilds it from the informers'
// first list.
type Feed struct {
	ledger *gpu.Ledger
	regs   []toolscache.ResourceEventHandlerRegistration
}

// New returns a feed for ledger.
func New(ledger *gpu.Ledger) *Feed {
	return &Feed{ledger: ledger}
}

// Watch registers the feed's handlers on the GPUNode and pod informers of
// informers. Call it before the cache starts.
func (f *Feed) Watch(ctx context.Context, informers cache.Informers) error {
	nodes, err := informers.GetInformer(ctx, &v1alpha1.GPUNode{})
	if err != nil {
		return fmt.Errorf("get GPUNode informer: %w", err)
	}
	reg, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    f.upsertNode,
		UpdateFunc: func(_, obj any) { f.upsertNode(obj) },
		DeleteFunc: f.deleteNode,
	})
	if err != nil {
		return fmt.Errorf("watch GPUNodes: %w", err)
	}
	f.regs = append(f.regs, reg)
	pods, err := informers.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("get pod informer: %w", err)
	}
	reg, err = pods.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    f.upsertPod,
		UpdateFunc: func(_, obj any) { f.upsertPod(obj) },
		DeleteFunc: f.deletePod,
	})
	if err != nil {
		return fmt.Errorf("watch pods: %w", err)
	}
	f.regs = append(f.regs, reg)
	return nil
}

// Synced reports whether the ledger has taken in the informers' first list
// of GPUNodes and pods.
func (f *Feed) Synced() bool {
	if len(f.regs) == 0 {
		return false
	}
	for _, r := range f.regs {
		if !r.HasSynced() {
			return false
		}
	}
	return true
}

func (f *Feed) upsertNode(obj any) {
	if n, ok := obj.(*v1alpha1.GPUNode); ok {
		f.ledger.UpsertNode(n)
	}
}

func (f *Feed) deleteNode(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if n, ok := obj.(*v1alpha1.GPUNode); ok {
		f.ledger.DeleteNode(n.Name)
	}
}

func (f *Feed) upsertPod(obj any) {
	if p, ok := obj.(*corev1.Pod); ok {
		f.ledger.UpsertPod(p)
	}
}

func (f *Feed) deletePod(obj any) {
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if p, ok := obj.(*corev1.Pod); ok {
		f.ledger.DeletePod(p.UID)
	}
}
