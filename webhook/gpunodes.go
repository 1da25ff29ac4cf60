package webhook

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// ClusterView is what the webhook needs to know of the cluster's GPUs.
type ClusterView interface {
	// ReferenceDeviceMemoryMiB is the largest device memory in the cluster,
	// against which a memory request's partita.dev/gpu-milli is estimated
	// (gpu.ContainerRequest.MilliResource); 0 when unknown.
	ReferenceDeviceMemoryMiB() int64
	// IsolationModes are the modes GPU pods may meet, sorted; their env
	// goes into every GPU container.
	IsolationModes() []v1alpha1.IsolationMode
	// MemorySizesMiB are the distinct memory sizes of the healthy devices,
	// sorted: the dra backend's claims tell a slice's share of each size
	// (dra.Template).
	MemorySizesMiB() []int64
}

// StaticView is a ClusterView with fixed answers: for tests, and for
// operators who pin the isolation modes with a flag.
type StaticView struct {
	// MemoryMiB is ReferenceDeviceMemoryMiB.
	MemoryMiB int64
	// Modes is IsolationModes.
	Modes []v1alpha1.IsolationMode
	// Sizes is MemorySizesMiB.
	Sizes []int64
}

// ReferenceDeviceMemoryMiB implements ClusterView.
func (v StaticView) ReferenceDeviceMemoryMiB() int64 { return v.MemoryMiB }

// IsolationModes implements ClusterView.
func (v StaticView) IsolationModes() []v1alpha1.IsolationMode { return v.Modes }

// MemorySizesMiB implements ClusterView.
func (v StaticView) MemorySizesMiB() []int64 { return v.Sizes }

// GPUNodeView follows the GPUNodes through an informer and keeps, per node,
// its largest healthy device and its isolation mode; reads are lock-free.
type GPUNodeView struct {
	// lock guards nodes.
	lock  sync.Mutex
	nodes map[string]nodeSummary
	// fallbackMiB answers ReferenceDeviceMemoryMiB while no GPUNode is known.
	fallbackMiB int64
	// pinned, when set, replaces the modes seen on nodes.
	pinned  []v1alpha1.IsolationMode
	summary atomic.Pointer[StaticView]
}

type nodeSummary struct {
	maxMiB int64
	mode   v1alpha1.IsolationMode
	// sizes are the node's distinct healthy device sizes, as a comma
	// list (kept comparable).
	sizes string
}

// NewGPUNodeView returns a view that answers fallbackMiB and time-slicing
// until it sees GPUNodes. pinned, when not empty, fixes the isolation modes.
func NewGPUNodeView(fallbackMiB int64, pinned []v1alpha1.IsolationMode) *GPUNodeView {
	v := &GPUNodeView{nodes: map[string]nodeSummary{}, fallbackMiB: fallbackMiB, pinned: slices.Clone(pinned)}
	v.recompute()
	return v
}

// ReferenceDeviceMemoryMiB implements ClusterView.
func (v *GPUNodeView) ReferenceDeviceMemoryMiB() int64 { return v.summary.Load().MemoryMiB }

// IsolationModes implements ClusterView.
func (v *GPUNodeView) IsolationModes() []v1alpha1.IsolationMode { return v.summary.Load().Modes }

// MemorySizesMiB implements ClusterView.
func (v *GPUNodeView) MemorySizesMiB() []int64 { return v.summary.Load().Sizes }

// Set records a GPUNode.
func (v *GPUNodeView) Set(n *v1alpha1.GPUNode) {
	inv := gpu.InventoryFromGPUNode(n)
	s := nodeSummary{mode: inv.Isolation}
	for _, d := range inv.Devices {
		if d.Healthy {
			s.maxMiB = max(s.maxMiB, d.MemoryMiB)
		}
	}
	var sizes []string
	for _, m := range dra.SizesOf([]v1alpha1.GPUNode{*n}) {
		sizes = append(sizes, strconv.FormatInt(m, 10))
	}
	s.sizes = strings.Join(sizes, ",")
	v.lock.Lock()
	defer v.lock.Unlock()
	if old, ok := v.nodes[n.Name]; ok && old == s {
		return
	}
	v.nodes[n.Name] = s
	v.recomputeLocked()
}

// Delete forgets a GPUNode.
func (v *GPUNodeView) Delete(name string) {
	v.lock.Lock()
	defer v.lock.Unlock()
	if _, ok := v.nodes[name]; !ok {
		return
	}
	delete(v.nodes, name)
	v.recomputeLocked()
}

func (v *GPUNodeView) recompute() {
	v.lock.Lock()
	defer v.lock.Unlock()
	v.recomputeLocked()
}

func (v *GPUNodeView) recomputeLocked() {
	s := &StaticView{}
	modes := map[v1alpha1.IsolationMode]bool{}
	for _, n := range v.nodes {
		s.MemoryMiB = max(s.MemoryMiB, n.maxMiB)
		modes[n.mode] = true
		for _, f := range strings.Split(n.sizes, ",") {
			if m, err := strconv.ParseInt(f, 10, 64); err == nil && !slices.Contains(s.Sizes, m) {
				s.Sizes = append(s.Sizes, m)
			}
		}
	}
	slices.Sort(s.Sizes)
	if s.MemoryMiB == 0 {
		s.MemoryMiB = v.fallbackMiB
	}
	switch {
	case len(v.pinned) > 0:
		s.Modes = slices.Clone(v.pinned)
	case len(modes) == 0:
		s.Modes = []v1alpha1.IsolationMode{v1alpha1.IsolationTimeSlicing}
	default:
		for m := range modes {
			s.Modes = append(s.Modes, m)
		}
	}
	slices.Sort(s.Modes)
	v.summary.Store(s)
}

// Watch registers on the cache's GPUNode informer.
func (v *GPUNodeView) Watch(ctx context.Context, informers cache.Informers) error {
	inf, err := informers.GetInformer(ctx, &v1alpha1.GPUNode{})
	if err != nil {
		return fmt.Errorf("get GPUNode informer: %w", err)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if n, ok := obj.(*v1alpha1.GPUNode); ok {
				v.Set(n)
			}
		},
		UpdateFunc: func(_, obj any) {
			if n, ok := obj.(*v1alpha1.GPUNode); ok {
				v.Set(n)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if n, ok := obj.(*v1alpha1.GPUNode); ok {
				v.Delete(n.Name)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watch GPUNodes: %w", err)
	}
	return nil
}
