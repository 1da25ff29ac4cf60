package claims

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/admission/cycle"
	"github.com/partita-dev/partita/dra"
)

// The admission loop simulates the allocation of a claim gang's
// ResourceClaims with kube-scheduler's own structured allocator
// (k8s.io/dynamic-resource-allocation/structured), over the cluster's
// ResourceSlices, DeviceClasses and allocated claims as the informers have
// them: the gang is admitted, each member pinned to the node found for it,
// only when every member's claims can be allocated at once.

// allocatorFeatures are the DRA features of Kubernetes 1.37 that are on by
// default and change what an allocation may be (consumable capacity and
// partitionable devices are beta, device taints and prioritized lists GA).
var allocatorFeatures = structured.Features{
	AdminAccess: true, ConsumableCapacity: true, DeviceTaints: true, PartitionableDevices: true, PrioritizedList: true,
}

// Session starts the simulation of one admission cycle: what is allocated
// now, and what the gangs the cycle admits take on top
// (cycle.ClaimAllocator).
func (c *Cache) Session(ctx context.Context) (cycle.ClaimSession, error) {
	var slices resourceapi.ResourceSliceList
	if err := c.reader.List(ctx, &slices); err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	var claims resourceapi.ResourceClaimList
	if err := c.reader.List(ctx, &claims); err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	s := &claimSession{cache: c, celCache: cel.NewCache(100, cel.Features{EnableConsumableCapacity: true}),
		held: map[string]*heldClaim{}, released: sets.New[types.UID](), dirty: true}
	for i := range slices.Items {
		s.slices = append(s.slices, &slices.Items[i])
	}
	for i := range claims.Items {
		cl := &claims.Items[i]
		if cl.Status.Allocation == nil {
			continue
		}
		h := &heldClaim{allocation: cl.Status.Allocation, holders: sets.New[types.UID]()}
		for _, r := range cl.Status.ReservedFor {
			if r.Resource == "pods" && r.APIGroup == "" {
				h.holders.Insert(r.UID)
			}
		}
		h.reserved = h.holders.Clone()
		s.held[cl.Namespace+"/"+cl.Name] = h
	}
	return s, nil
}

// claimSession holds, per claim, what is allocated (by kube-scheduler, or
// by the session's own placements) and the pods that hold it; the
// allocator's state is derived from those that are not released.
type claimSession struct {
	cache    *Cache
	celCache *cel.Cache
	slices   []*resourceapi.ResourceSlice
	// held is every allocated claim by claimKey; released the pods whose
	// devices the simulation has freed (Release).
	held     map[string]*heldClaim
	released sets.Set[types.UID]
	state    structured.AllocatedState
	// dirty says state must be derived again from held.
	dirty bool
}

// heldClaim is one claim's allocation and the pods holding it.
type heldClaim struct {
	allocation *resourceapi.AllocationResult
	holders    sets.Set[types.UID]
	// reserved are the holders the claim's status.reservedFor names; the
	// others joined in the session's placements.
	reserved sets.Set[types.UID]
	// simulated is set for an allocation the session made (Place).
	simulated bool
}

// inEffect reports whether the claim's devices count as taken: it has no
// known holder (allocated, not reserved yet), or one not released.
func (h *heldClaim) inEffect(released sets.Set[types.UID]) bool {
	if h.holders.Len() == 0 {
		return !h.simulated
	}
	for uid := range h.holders {
		if !released.Has(uid) {
			return true
		}
	}
	return false
}

// allocated is the allocator's state: the devices, shares and consumed
// capacity of every claim in effect, as kube-scheduler's DRA plugin
// gathers them (admin access takes nothing).
func (s *claimSession) allocated() structured.AllocatedState {
	if s.dirty {
		s.state = structured.AllocatedState{
			AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity: structured.NewConsumedCapacityCollection(),
		}
		for _, h := range s.held {
			if h.inEffect(s.released) {
				addAllocation(&s.state, h.allocation)
			}
		}
		s.dirty = false
	}
	return s.state
}

// addAllocation records an allocation in state.
func addAllocation(state *structured.AllocatedState, a *resourceapi.AllocationResult) {
	for _, r := range a.Devices.Results {
		if ptr.Deref(r.AdminAccess, false) {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			state.AllocatedDevices.Insert(id)
			continue
		}
		state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

// Place implements cycle.ClaimSession: for each pod in turn, the first
// of its candidate nodes where all its claims that are not allocated yet
// can be allocated, given what the pods before it took. A claim already
// allocated (or placed for another pod this session) is not allocated
// again: the pod joins its holders, on a node its allocation admits.
func (s *claimSession) Place(ctx context.Context, pods []*corev1.Pod, candidates [][]*corev1.Node) ([]string, error) {
	var undo []func()
	rollback := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		s.dirty = true
	}
	out := make([]string, len(pods))
	for i, pod := range pods {
		claims, allocated, err := s.claimsOf(pod)
		if err != nil {
			rollback()
			return nil, err
		}
		for _, key := range allocated {
			if h := s.held[key]; !h.holders.Has(pod.UID) {
				h.holders.Insert(pod.UID)
				undo = append(undo, func() { h.holders.Delete(pod.UID) })
			}
		}
		if len(claims) == 0 && len(allocated) == 0 {
			continue // nothing to allocate: any candidate node
		}
		nodes, err := s.admitting(candidates[i], allocated)
		if err != nil {
			rollback()
			return nil, fmt.Errorf("simulate the claims of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		if len(claims) == 0 {
			// Held claims only: the pod goes where they are.
			if len(nodes) == 0 {
				rollback()
				return nil, &cycle.ClaimsUnplaceableError{Member: i, Total: len(pods)}
			}
			if len(nodes) < len(candidates[i]) {
				out[i] = nodes[0].Name
			}
			continue
		}
		alloc, err := structured.NewAllocator(ctx, allocatorFeatures, s.snapshot(), classLister{s.cache.reader}, s.slices, s.celCache)
		if err != nil {
			rollback()
			return nil, fmt.Errorf("simulate the claims of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		toAllocate := make([]*resourceapi.ResourceClaim, len(claims))
		for j := range claims {
			toAllocate[j] = claims[j].ResourceClaim
		}
		for _, node := range nodes {
			results, err := alloc.Allocate(ctx, node, toAllocate)
			if err != nil {
				rollback()
				return nil, fmt.Errorf("simulate the claims of pod %s/%s on node %s: %w", pod.Namespace, pod.Name, node.Name, err)
			}
			if results == nil {
				continue
			}
			for j := range results {
				key := claims[j].key
				s.held[key] = &heldClaim{allocation: &results[j], holders: sets.New(pod.UID), simulated: true}
				undo = append(undo, func() { delete(s.held, key) })
			}
			s.dirty = true
			out[i] = node.Name
			break
		}
		if out[i] == "" {
			rollback()
			return nil, &cycle.ClaimsUnplaceableError{Member: i, Total: len(pods)}
		}
	}
	return out, nil
}

// admitting are the candidates every allocated claim's node selector
// admits.
func (s *claimSession) admitting(candidates []*corev1.Node, allocated []string) ([]*corev1.Node, error) {
	out := candidates
	for _, key := range allocated {
		sel := s.held[key].allocation.NodeSelector
		if sel == nil {
			continue
		}
		ns, err := nodeaffinity.NewNodeSelector(sel)
		if err != nil {
			return nil, fmt.Errorf("node selector of an allocated claim: %w", err)
		}
		var kept []*corev1.Node
		for _, n := range out {
			if ns.Match(n) {
				kept = append(kept, n)
			}
		}
		out = kept
	}
	return out, nil
}

// Forget implements cycle.ClaimSession: pod no longer holds what the
// session placed for it (claims it allocated or joined), and a placed claim
// no pod holds any more is freed.
func (s *claimSession) Forget(pod *corev1.Pod) {
	for key, h := range s.held {
		if !h.holders.Has(pod.UID) || h.reserved.Has(pod.UID) {
			continue
		}
		h.holders.Delete(pod.UID)
		if h.simulated && h.holders.Len() == 0 {
			delete(s.held, key)
		}
		s.dirty = true
	}
}

// Release implements cycle.ClaimSession.
func (s *claimSession) Release(pod *corev1.Pod) {
	if !s.released.Has(pod.UID) {
		s.released.Insert(pod.UID)
		s.dirty = true
	}
}

// Restore implements cycle.ClaimSession.
func (s *claimSession) Restore(pod *corev1.Pod) {
	if s.released.Has(pod.UID) {
		s.released.Delete(pod.UID)
		s.dirty = true
	}
}

// snapshot is a copy of the session's state, for an allocator, which may
// keep it.
func (s *claimSession) snapshot() structured.AllocatedState {
	st := s.allocated()
	agg := structured.NewConsumedCapacityCollection()
	for id, c := range st.AggregatedCapacity {
		agg[id] = c.Clone()
	}
	return structured.AllocatedState{AllocatedDevices: st.AllocatedDevices.Clone(), AllocatedSharedDeviceIDs: st.AllocatedSharedDeviceIDs.Clone(), AggregatedCapacity: agg}
}

// podClaim is a claim of a pod and its key in the session: namespace/name,
// or for a template's claim not made yet, one no real claim has.
type podClaim struct {
	*resourceapi.ResourceClaim
	key string
}

// claimsOf are the pod's claims that kube-scheduler would still have to
// allocate (its own claims not allocated yet, and for a template the claim
// made from it or, before kube-controller-manager made it, one with the
// template's spec, and the claim for its extended resources), and the
// keys of those already allocated, by kube-scheduler or by the session.
func (s *claimSession) claimsOf(pod *corev1.Pod) (toAllocate []podClaim, allocated []string, err error) {
	for _, pc := range pod.Spec.ResourceClaims {
		var claim podClaim
		switch {
		case pc.ResourceClaimName != nil:
			c, ok := s.cache.Claim(pod.Namespace, *pc.ResourceClaimName)
			if !ok {
				return nil, nil, fmt.Errorf("ResourceClaim %s/%s does not exist", pod.Namespace, *pc.ResourceClaimName)
			}
			claim = podClaim{c, c.Namespace + "/" + c.Name}
		case pc.ResourceClaimTemplateName != nil:
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name && st.ResourceClaimName != nil {
					if c, ok := s.cache.Claim(pod.Namespace, *st.ResourceClaimName); ok {
						claim = podClaim{c, c.Namespace + "/" + c.Name}
					}
				}
			}
			if claim.ResourceClaim == nil {
				t, ok := s.cache.Template(pod.Namespace, *pc.ResourceClaimTemplateName)
				if !ok {
					return nil, nil, fmt.Errorf("ResourceClaimTemplate %s/%s does not exist", pod.Namespace, *pc.ResourceClaimTemplateName)
				}
				c := &resourceapi.ResourceClaim{Spec: *t.Spec.Spec.DeepCopy()}
				c.Namespace, c.Name = pod.Namespace, pod.Name+"-"+pc.Name
				c.UID = types.UID(string(pod.UID) + "-" + pc.Name)
				claim = podClaim{c, "template claim " + string(pod.UID) + "/" + pc.Name}
			}
		default:
			continue
		}
		if _, ok := s.held[claim.key]; ok {
			allocated = append(allocated, claim.key)
		} else if claim.Status.Allocation == nil {
			toAllocate = append(toAllocate, claim)
		}
	}
	if claim := s.extendedClaim(pod); claim.ResourceClaim != nil {
		if _, ok := s.held[claim.key]; ok {
			allocated = append(allocated, claim.key)
		} else if claim.Status.Allocation == nil {
			toAllocate = append(toAllocate, claim)
		}
	}
	return toAllocate, allocated, nil
}

// extendedClaim is the claim kube-scheduler makes for the pod's extended
// resources that a GPU DeviceClass backs: the one it made
// (status.extendedResourceClaimStatus) or, before, one with a request of
// that many whole devices per container and resource, as it would make.
// Nil when the pod asks for none.
func (s *claimSession) extendedClaim(pod *corev1.Pod) podClaim {
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil && st.ResourceClaimName != "" {
		if c, ok := s.cache.Claim(pod.Namespace, st.ResourceClaimName); ok {
			return podClaim{c, c.Namespace + "/" + c.Name}
		}
	}
	reqs := dra.ExtendedGPURequests(pod, s.cache, s.cache.classes)
	if len(reqs) == 0 {
		return podClaim{}
	}
	c := &resourceapi.ResourceClaim{}
	c.Namespace, c.Name = pod.Namespace, pod.Name+"-extended-resources"
	c.UID = types.UID(string(pod.UID) + "-extended-resources")
	for i, r := range reqs {
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{
			Name: fmt.Sprintf("container-%s-request-%d", r.Container, i),
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: r.Class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: r.Count,
			},
		})
	}
	return podClaim{c, "extended resources claim " + string(pod.UID)}
}

// classLister lists DeviceClasses for the allocator.
type classLister struct{ reader client.Reader }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var list resourceapi.DeviceClassList
	if err := l.reader.List(context.Background(), &list); err != nil {
		return nil, fmt.Errorf("list DeviceClasses: %w", err)
	}
	out := make([]*resourceapi.DeviceClass, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	dc := &resourceapi.DeviceClass{}
	if err := l.reader.Get(context.Background(), client.ObjectKey{Name: name}, dc); err != nil {
		return nil, fmt.Errorf("get DeviceClass %s: %w", name, err)
	}
	return dc, nil
}
