package report

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// usesPartitaClaims reports whether the pod holds its GPUs through
// Partita's claims (the dra GPU backend): kube-scheduler's DRA plugin,
// not the extender, places it, and the extender's ledger does not see it.
func usesPartitaClaims(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.ResourceClaims, func(c corev1.PodResourceClaim) bool {
		return strings.HasPrefix(c.Name, v1alpha1.PodClaimPrefix)
	})
}

// claimFit is fit for a pod of the dra backend: what its claims say, what
// kube-scheduler said when it could not place it, and the room on the
// candidate nodes' devices counted from the ResourceClaims' allocations
// alone.
func (w *why) claimFit() {
	names, pending := dra.PodClaimNames(w.pod)
	var claims []*resourceapi.ResourceClaim
	for _, n := range names {
		if c := w.claim(n); c != nil {
			claims = append(claims, c)
		}
	}
	nums := map[string]float64{"claims": float64(len(names)), "pendingClaims": float64(pending)}
	if pending > 0 || len(claims) < len(names) {
		w.add(CheckFit, StatusInfo, nums, "%d of the pod's ResourceClaims are not made yet (kube-controller-manager makes them from Partita's claim templates)", pending+len(names)-len(claims))
	}
	if c := scheduledCondition(w.pod); c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
		free := w.bestFree()
		nums["bestFreeGPUs"] = gpus(free.milli)
		w.add(CheckFit, StatusBlocking, nums, "kube-scheduler's DRA plugin found no device for its claims: %s; counted from the ResourceClaims' allocations, the emptiest %s device on the %d candidate nodes has %s GPU and %dMi free, and the pod asks for %s",
			strings.TrimSpace(c.Message), dra.DriverName, free.nodes, gpu.FormatMilli(free.milli), free.memMiB, describeRequest(w.req))
		return
	}
	w.add(CheckFit, StatusInfo, nums, "its GPUs are ResourceClaims on %s devices: kube-scheduler's DRA plugin places it once it is ungated", dra.DriverName)
}

// otherClaimsFit is fit for a pod that asks for GPUs through ResourceClaims
// of another driver (NVIDIA's): kube-scheduler's DRA plugin places it from
// that driver's ResourceSlices, which Partita does not book; what
// kube-scheduler said when it could not is the answer.
func (w *why) otherClaimsFit() {
	nums := map[string]float64{"gpus": gpus(w.claims.Milli)}
	if len(w.claims.Missing) > 0 {
		w.add(CheckFit, StatusBlocking, nums, "the pod names %s, which does not exist yet: create it (the admission loop cannot tell what the pod asks for until then)", strings.Join(w.claims.Missing, " and "))
		return
	}
	if c := scheduledCondition(w.pod); c != nil && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
		w.add(CheckFit, StatusBlocking, nums, "kube-scheduler's DRA plugin found no device for its claims: %s", strings.TrimSpace(c.Message))
		return
	}
	w.add(CheckFit, StatusInfo, nums, "its GPUs are ResourceClaims (%s): kube-scheduler's DRA plugin allocates them from the driver's ResourceSlices once it is ungated; Partita charges them to its queue", w.claims.Describe())
}

func (w *why) claim(name string) *resourceapi.ResourceClaim {
	for i := range w.c.ResourceClaims {
		c := &w.c.ResourceClaims[i]
		if c.Namespace == w.pod.Namespace && c.Name == name {
			return c
		}
	}
	return nil
}

func scheduledCondition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == corev1.PodScheduled {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

type freeRoom struct {
	milli, memMiB int64
	nodes         int
}

// bestFree is the most free compute (then memory) of a healthy Partita
// device on the pod's candidate nodes, by the claims' allocations.
func (w *why) bestFree() freeRoom {
	var shares []dra.Share
	for i := range w.c.ResourceClaims {
		shares = append(shares, dra.ClaimShares(&w.c.ResourceClaims[i], dra.GPUDrivers{dra.DriverName}, nil)...)
	}
	used := dra.PerDevice(shares)
	usedMem := map[dra.DeviceID]int64{}
	for _, s := range shares {
		usedMem[s.ID()] += s.MemoryMiB
	}
	var names []string
	for _, n := range w.c.GPUNodes {
		names = append(names, n.Name)
	}
	candidates := w.candidateNodes(names)
	best := freeRoom{nodes: len(candidates)}
	for _, n := range w.c.GPUNodes {
		if !slices.Contains(candidates, n.Name) {
			continue
		}
		for _, d := range n.Status.Devices {
			if d.Health != v1alpha1.DeviceHealthy {
				continue
			}
			id := dra.DeviceID{Driver: dra.DriverName, Pool: n.Name, Device: dra.DeviceName(d.Index)}
			f := freeRoom{milli: max(0, gpu.MilliPerGPU-used[id]), memMiB: max(0, d.MemoryMiB-usedMem[id])}
			if f.milli > best.milli || (f.milli == best.milli && f.memMiB > best.memMiB) {
				best.milli, best.memMiB = f.milli, f.memMiB
			}
		}
	}
	return best
}

// claimsOf are the pod's allocated Partita shares, for bound().
func (w *why) claimsOf() []dra.Share {
	get := func(ns, name string) (*resourceapi.ResourceClaim, bool) {
		c := w.claim(name)
		return c, c != nil
	}
	return dra.PodShares(w.pod, get, dra.GPUDrivers{dra.DriverName}, nil)
}

// describeShares is what a pod holds through its claims, in words.
func describeShares(shares []dra.Share) string {
	parts := make([]string, 0, len(shares))
	for _, s := range shares {
		parts = append(parts, fmt.Sprintf("%s %s (%s GPU)", s.Pool, s.Device, gpu.FormatMilli(s.Milli)))
	}
	return strings.Join(parts, ", ")
}
