// Package claims reads the GPUs that pods ask for through ResourceClaims,
// for the admission loop (Cache.Demand, and Cache.Session, which simulates
// claim allocation with DRA's structured allocator) and the webhook (the
// queue's quota check). It imports dra and admission/cycle, never the loop
// itself.
package claims

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/dra"
)

// Cache reads, from informers, what the admission loop needs of pods
// that ask for GPUs through ResourceClaims (docs/queues.md, "Pods with
// ResourceClaims"): their claims, claim templates, the DeviceClasses that
// back extended resources, and the published devices whose capacity
// allocations consume. It is the dra.ClaimSource of dra.PodDemand.
type Cache struct {
	reader  client.Reader
	classes dra.GPUClasses
	drivers dra.GPUDrivers
	regs    []toolscache.ResourceEventHandlerRegistration
}

// NewCache reads through reader (the manager's cache); classes are
// the GPU DeviceClasses, drivers the drivers whose devices are GPUs.
func NewCache(reader client.Reader, classes dra.GPUClasses, drivers dra.GPUDrivers) *Cache {
	return &Cache{reader: reader, classes: classes, drivers: drivers}
}

// ServesDRA reports whether the API server serves the resource.k8s.io/v1
// kinds the Cache watches.
func ServesDRA(cfg *rest.Config) (bool, error) {
	return dra.Served(cfg, "resourceclaims", "resourceclaimtemplates", "deviceclasses", "resourceslices")
}

// Claim implements dra.ClaimSource.
func (c *Cache) Claim(namespace, name string) (*resourceapi.ResourceClaim, bool) {
	out := &resourceapi.ResourceClaim{}
	if err := c.reader.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, out); err != nil {
		return nil, false
	}
	return out, true
}

// Template implements dra.ClaimSource.
func (c *Cache) Template(namespace, name string) (*resourceapi.ResourceClaimTemplate, bool) {
	out := &resourceapi.ResourceClaimTemplate{}
	if err := c.reader.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, out); err != nil {
		return nil, false
	}
	return out, true
}

// ExtendedResourceClass implements dra.ClaimSource.
func (c *Cache) ExtendedResourceClass(name corev1.ResourceName) (string, bool) {
	var list resourceapi.DeviceClassList
	if err := c.reader.List(context.Background(), &list); err != nil {
		return "", false
	}
	for _, dc := range list.Items {
		if dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName == string(name) {
			return dc.Name, true
		}
	}
	return "", false
}

// device finds a published device, for the consumed capacity of another
// driver's allocation.
func (c *Cache) device(id dra.DeviceID) (*resourceapi.Device, bool) {
	var list resourceapi.ResourceSliceList
	if err := c.reader.List(context.Background(), &list); err != nil {
		return nil, false
	}
	for i := range list.Items {
		s := &list.Items[i]
		if s.Spec.Driver != id.Driver || s.Spec.Pool.Name != id.Pool {
			continue
		}
		for j := range s.Spec.Devices {
			if s.Spec.Devices[j].Name == id.Device {
				return &s.Spec.Devices[j], true
			}
		}
	}
	return nil, false
}

// MostGPUsOnANode implements dra.GPUCounter: the most devices the GPU
// drivers publish for one node.
func (c *Cache) MostGPUsOnANode() int {
	var list resourceapi.ResourceSliceList
	if err := c.reader.List(context.Background(), &list); err != nil {
		return 0
	}
	perNode := map[string]int{}
	most := 0
	for i := range list.Items {
		s := &list.Items[i]
		if s.Spec.NodeName == nil || !c.drivers.Has(s.Spec.Driver) {
			continue
		}
		perNode[*s.Spec.NodeName] += len(s.Spec.Devices)
		most = max(most, perNode[*s.Spec.NodeName])
	}
	return most
}

// Demand is what pod asks for or holds of GPUs through its claims
// (dra.PodDemand), the admission cache's ClaimReader.
func (c *Cache) Demand(pod *corev1.Pod) dra.Demand {
	return dra.PodDemand(pod, c, c.classes, c.device)
}

// Watch calls changed with a namespace ("" for every one) whenever a
// claim, a claim template or a DeviceClass changes, so that the loop reads
// the pods that use them again. Call it before the informers start.
func (c *Cache) Watch(ctx context.Context, informers cache.Informers, changed func(namespace string)) error {
	for _, obj := range []client.Object{&resourceapi.ResourceClaim{}, &resourceapi.ResourceClaimTemplate{}, &resourceapi.DeviceClass{}, &resourceapi.ResourceSlice{}} {
		inf, err := informers.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("get %T informer: %w", obj, err)
		}
		notify := func(o any) {
			if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			switch v := o.(type) {
			case *resourceapi.ResourceClaim:
				changed(v.Namespace)
			case *resourceapi.ResourceClaimTemplate:
				changed(v.Namespace)
			case *resourceapi.DeviceClass:
				changed("")
			}
			// ResourceSlices are only read (device); their informer
			// keeps the cache warm.
		}
		reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    notify,
			UpdateFunc: func(_, o any) { notify(o) },
			DeleteFunc: notify,
		})
		if err != nil {
			return fmt.Errorf("watch %T: %w", obj, err)
		}
		c.regs = append(c.regs, reg)
	}
	return nil
}

// Synced reports whether the informers have delivered their first lists.
func (c *Cache) Synced() bool {
	for _, r := range c.regs {
		if !r.HasSynced() {
			return false
		}
	}
	return true
}
