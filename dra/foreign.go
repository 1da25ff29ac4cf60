package dra

import (
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Other DRA drivers on a node: which of the node's GPUs a driver other than
// Partita's publishes in its ResourceSlices, so that the agent neither
// offers them as partita.dev/gpu-milli nor publishes them as devices of its
// own (two bookkeepers of one GPU double-book it).
//
// The rule, in order:
//  1. A device of any other driver whose attribute uuid, or parentUUID (a
//     MIG device of NVIDIA's driver), equals a GPU's NVML UUID publishes
//     that GPU. The attribute may be qualified with any domain
//     ("gpu.nvidia.com/uuid").
//  2. A GPU driver (GPUDrivers: NVIDIA's by default) that publishes
//     devices on the node none of which carries a uuid attribute owns every
//     GPU of the node not matched by 1: Partita cannot tell its devices
//     apart, and offering a GPU twice is worse than offering it not at all.
//
// Only node-local slices count (spec.nodeName); a driver whose devices
// carry UUIDs that match none of the node's GPUs owns none of them.

// uuidAttributes are the attribute names, after any domain, that carry a
// GPU's UUID.
var uuidAttributes = []string{"uuid", "parentUUID"}

// ForeignGPUs maps the index of each of devices that another DRA driver
// publishes in published to that driver. published may hold any driver's slices
// of any node: those of Partita's driver and of other nodes are skipped.
// gpuDrivers are the drivers whose devices are GPUs (rule 2).
func ForeignGPUs(node string, devices []v1alpha1.GPUDevice, published []*resourceapi.ResourceSlice, gpuDrivers GPUDrivers) map[int32]string {
	byUUID := make(map[string]int32, len(devices))
	for _, d := range devices {
		if d.UUID != "" && !v1alpha1.IsUnknownDeviceUUID(d.UUID) {
			byUUID[d.UUID] = d.Index
		}
	}
	out := map[int32]string{}
	// anonymous are the GPU drivers with devices on the node but no UUIDs.
	anonymous := map[string]bool{}
	withUUID := map[string]bool{}
	for _, s := range sortedSlices(published) {
		drv := s.Spec.Driver
		if drv == DriverName || drv == "" || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			continue
		}
		for _, dev := range s.Spec.Devices {
			uuids := deviceUUIDs(dev)
			if len(uuids) > 0 {
				withUUID[drv] = true
			}
			for _, u := range uuids {
				if i, ok := byUUID[u]; ok {
					if _, taken := out[i]; !taken {
						out[i] = drv
					}
				}
			}
		}
		if gpuDrivers.Has(drv) && len(s.Spec.Devices) > 0 {
			anonymous[drv] = true
		}
	}
	var owners []string
	for drv := range anonymous {
		if !withUUID[drv] {
			owners = append(owners, drv)
		}
	}
	slices.Sort(owners)
	if len(owners) > 0 {
		for _, d := range devices {
			if _, ok := out[d.Index]; !ok {
				out[d.Index] = owners[0]
			}
		}
	}
	return out
}

// sortedSlices orders slices by driver and name, so that a GPU two drivers
// claim is given to the same one every time.
func sortedSlices(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b *resourceapi.ResourceSlice) int {
		if c := strings.Compare(a.Spec.Driver, b.Spec.Driver); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// deviceUUIDs are the string values of dev's uuid and parentUUID
// attributes, under any domain.
func deviceUUIDs(dev resourceapi.Device) []string {
	var out []string
	for name, a := range dev.Attributes {
		n := string(name)
		if i := strings.LastIndexByte(n, '/'); i >= 0 {
			n = n[i+1:]
		}
		if a.StringValue != nil && *a.StringValue != "" && slices.Contains(uuidAttributes, n) {
			out = append(out, *a.StringValue)
		}
	}
	return out
}

// MarkForeign returns devices with DRADriver set from foreign
// (ForeignGPUs), and the drivers named, sorted; devices is not changed.
func MarkForeign(devices []v1alpha1.GPUDevice, foreign map[int32]string) ([]v1alpha1.GPUDevice, []string) {
	out := slices.Clone(devices)
	var drivers []string
	for i := range out {
		out[i].DRADriver = foreign[out[i].Index]
		if d := out[i].DRADriver; d != "" && !slices.Contains(drivers, d) {
			drivers = append(drivers, d)
		}
	}
	slices.Sort(drivers)
	return out, drivers
}
