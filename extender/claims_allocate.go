package extender

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/extender/admission"
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
// (admission.ClaimAllocator).
func (c *ClaimCache) Session(ctx context.Context) (admission.ClaimSession, error) {
	var slices resourceapi.ResourceSliceList
	if err := c.reader.List(ctx, &slices); err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	var claims resourceapi.ResourceClaimList
	if err := c.reader.List(ctx, &claims); err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	s := &claimSession{cache: c, celCache: cel.NewCache(100, cel.Features{EnableConsumableCapacity: true}), state: structured.AllocatedState{
		AllocatedDevices: sets.New[structured.DeviceID](), AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity: structured.NewConsumedCapacityCollection(),
	}}
	for i := range slices.Items {
		s.slices = append(s.slices, &slices.Items[i])
	}
	for i := range claims.Items {
		if a := claims.Items[i].Status.Allocation; a != nil {
			s.add(a)
		}
	}
	return s, nil
}

type claimSession struct {
	cache    *ClaimCache
	celCache *cel.Cache
	slices   []*resourceapi.ResourceSlice
	state    structured.AllocatedState
}

// add records an allocation in the session's state, as kube-scheduler's
// DRA plugin gathers it: whole devices, shares and their consumed capacity.
func (s *claimSession) add(a *resourceapi.AllocationResult) {
	for _, r := range a.Devices.Results {
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			s.state.AllocatedDevices.Insert(id)
			continue
		}
		s.state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			s.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

// Place implements admission.ClaimSession: for each pod in turn, the first
// of its candidate nodes where all its claims that are not allocated yet
// can be allocated, given what the pods before it took.
func (s *claimSession) Place(ctx context.Context, pods []*corev1.Pod, candidates [][]*corev1.Node) ([]string, error) {
	saved := s.snapshot()
	out := make([]string, len(pods))
	for i, pod := range pods {
		claims, err := s.unallocated(pod)
		if err != nil {
			s.state = saved
			return nil, err
		}
		if len(claims) == 0 {
			continue // nothing to allocate: any candidate node
		}
		alloc, err := structured.NewAllocator(ctx, allocatorFeatures, s.snapshot(), classLister{s.cache.reader}, s.slices, s.celCache)
		if err != nil {
			s.state = saved
			return nil, fmt.Errorf("simulate the claims of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		for _, node := range candidates[i] {
			results, err := alloc.Allocate(ctx, node, claims)
			if err != nil {
				s.state = saved
				return nil, fmt.Errorf("simulate the claims of pod %s/%s on node %s: %w", pod.Namespace, pod.Name, node.Name, err)
			}
			if results != nil {
				for j := range results {
					s.add(&results[j])
				}
				out[i] = node.Name
				break
			}
		}
		if out[i] == "" {
			s.state = saved
			return nil, &admission.ClaimsUnplaceableError{Member: i, Total: len(pods)}
		}
	}
	return out, nil
}

// snapshot is a copy of the session's state, for an allocator (which may
// keep it) or to roll a failed gang back.
func (s *claimSession) snapshot() structured.AllocatedState {
	agg := structured.NewConsumedCapacityCollection()
	for id, c := range s.state.AggregatedCapacity {
		agg[id] = c.Clone()
	}
	return structured.AllocatedState{AllocatedDevices: s.state.AllocatedDevices.Clone(), AllocatedSharedDeviceIDs: s.state.AllocatedSharedDeviceIDs.Clone(), AggregatedCapacity: agg}
}

// unallocated are the pod's claims that kube-scheduler would still have to
// allocate: its own claims not allocated yet, and for a template the claim
// made from it, or, before kube-controller-manager made it, one with the
// template's spec. Claims for extended resources are not simulated.
func (s *claimSession) unallocated(pod *corev1.Pod) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for _, pc := range pod.Spec.ResourceClaims {
		var claim *resourceapi.ResourceClaim
		switch {
		case pc.ResourceClaimName != nil:
			c, ok := s.cache.Claim(pod.Namespace, *pc.ResourceClaimName)
			if !ok {
				return nil, fmt.Errorf("ResourceClaim %s/%s does not exist", pod.Namespace, *pc.ResourceClaimName)
			}
			claim = c
		case pc.ResourceClaimTemplateName != nil:
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name && st.ResourceClaimName != nil {
					if c, ok := s.cache.Claim(pod.Namespace, *st.ResourceClaimName); ok {
						claim = c
					}
				}
			}
			if claim == nil {
				t, ok := s.cache.Template(pod.Namespace, *pc.ResourceClaimTemplateName)
				if !ok {
					return nil, fmt.Errorf("ResourceClaimTemplate %s/%s does not exist", pod.Namespace, *pc.ResourceClaimTemplateName)
				}
				claim = &resourceapi.ResourceClaim{Spec: *t.Spec.Spec.DeepCopy()}
				claim.Namespace, claim.Name = pod.Namespace, pod.Name+"-"+pc.Name
				claim.UID = types.UID(string(pod.UID) + "-" + pc.Name)
			}
		default:
			continue
		}
		if claim.Status.Allocation == nil {
			out = append(out, claim)
		}
	}
	return out, nil
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
