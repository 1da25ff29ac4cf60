package nodeagent

import (
	"github.com/partita-dev/partita/api/v1alpha1"
)

// mpsPlan is what mps mode runs on a node: the devices that get a daemon,
// and the devices it leaves without one because a slice spans them.
type mpsPlan struct {
	targets []mpsTarget
	// spanned are devices held by a fractional slice of several devices. A
	// client has one pipe directory, so one device's daemon cannot serve
	// it, and in EXCLUSIVE_PROCESS the device's MPS server would lock it
	// out: such devices run without MPS and in DEFAULT compute mode, their
	// slices capped by the watchdog alone.
	spanned []int32
}

// planMPS lists the devices that can be shared (healthy, not held whole, no
// slice spanning them) with the limits their daemon holds each client to:
// the largest slice on the device, so that no client can take more than
// the largest slice by dropping its env, and no Partita pod is held below
// its own slice.
func planMPS(devices []v1alpha1.GPUDevice, held []boundPod) mpsPlan {
	whole, spanned := map[int32]bool{}, map[int32]bool{}
	maxMiB := map[int32]int64{}
	// uncapped: a slice on the device has no compute limit, so its
	// clients need every SM; maxSM is the largest compute limit otherwise.
	uncapped, maxSM := map[int32]bool{}, map[int32]int32{}
	for _, h := range held {
		for _, c := range h.alloc.Containers {
			for _, dev := range c.DeviceIndexes {
				switch {
				case c.Whole():
					whole[dev] = true
				case len(c.DeviceIndexes) > 1:
					spanned[dev] = true
				default:
					maxMiB[dev] = max(maxMiB[dev], c.MemoryMiB)
					if c.SMPercent <= 0 {
						uncapped[dev] = true
					}
					maxSM[dev] = max(maxSM[dev], c.SMPercent)
				}
			}
		}
	}
	var p mpsPlan
	for _, d := range devices {
		if !offered(d) || whole[d.Index] {
			continue
		}
		if spanned[d.Index] {
			p.spanned = append(p.spanned, d.Index)
			continue
		}
		threads := int32(100)
		if maxSM[d.Index] > 0 && !uncapped[d.Index] {
			threads = min(maxSM[d.Index], 100)
		}
		// No slice yet: no client is due, and one that connects before the
		// agent raises the limit for its slice is held to 1 MiB rather than
		// let loose (docs/guide/isolation.md).
		mem := max(maxMiB[d.Index], 1)
		if d.MemoryMiB > 0 {
			mem = min(mem, d.MemoryMiB)
		}
		p.targets = append(p.targets, mpsTarget{Index: d.Index, UUID: d.UUID, MemLimitMiB: mem, ThreadPercent: threads})
	}
	return p
}
