package gpu

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// ContainerAllocation is the devices one container got and its limits on
// each of them.
type ContainerAllocation struct {
	// Container is the container's name.
	Container string
	// DeviceUUIDs are the devices' UUIDs, in the order chosen.
	DeviceUUIDs []string
	// DeviceIndexes are the same devices' indexes on the node.
	DeviceIndexes []int32
	// Milli is the share of each device in milli-GPUs (1000 for whole
	// devices; for a memory-based request, the memory's share of the device).
	Milli int64
	// MemoryMiB is the memory limit on each device, 0 for none (whole
	// devices). For a memory-based request it is the request; for a fraction,
	// floor(Milli × device memory / 1000).
	MemoryMiB int64
	// SMPercent is the compute limit in percent, 0 for none.
	SMPercent int32
}

// Whole reports whether the container holds its devices whole.
func (c ContainerAllocation) Whole() bool {
	return c.Milli == MilliPerGPU && c.MemoryMiB == 0
}

// PodAllocation is a bind decision: the node and, per GPU container, its
// devices. It travels as pod annotations (AllocationAnnotations), written
// with the Binding.
type PodAllocation struct {
	// Namespace is the pod's namespace.
	Namespace string
	// Name is the pod's name.
	Name string
	// UID is the pod's UID, the key under which ledgers hold allocations.
	UID types.UID
	// Node is the node the pod is bound to.
	Node string
	// Containers are the GPU containers' allocations, in spec order.
	Containers []ContainerAllocation
}

// Clone returns a deep copy of a.
func (a *PodAllocation) Clone() *PodAllocation {
	if a == nil {
		return nil
	}
	out := *a
	out.Containers = make([]ContainerAllocation, len(a.Containers))
	for i, c := range a.Containers {
		c.DeviceUUIDs = slices.Clone(c.DeviceUUIDs)
		c.DeviceIndexes = slices.Clone(c.DeviceIndexes)
		out.Containers[i] = c
	}
	return &out
}

// Milli is what the allocation holds, in milli-GPUs: each container's
// share of each of its devices (ContainerAllocation.Milli, 1000 for a whole
// device, the memory's share of the device for a memory request), summed.
// For an allocation Choose made it equals what the ledger charges its
// devices, and what the admission loop charges the pod's queue.
func (a *PodAllocation) Milli() int64 {
	var sum int64
	for _, c := range a.Containers {
		sum += int64(len(c.DeviceUUIDs)) * c.Milli
	}
	return sum
}

// ErrNotAllocated says a pod carries no allocation annotations.
var ErrNotAllocated = errors.New("pod has no GPU allocation")

// AllocationAnnotations are the annotations that carry a on the pod:
// partita.dev/node, and per container partita.dev/devices.<container> (the
// comma-separated UUIDs), partita.dev/mem-limit.<container> ("<MiB>M", when
// there is a memory limit) and partita.dev/sm-limit.<container> (percent,
// when there is a compute limit).
func AllocationAnnotations(a *PodAllocation) map[string]string {
	out := map[string]string{v1alpha1.AnnotationNode: a.Node}
	for _, c := range a.Containers {
		out[v1alpha1.AnnotationDevicesPrefix+c.Container] = strings.Join(c.DeviceUUIDs, ",")
		if c.MemoryMiB > 0 {
			out[v1alpha1.AnnotationMemLimitPrefix+c.Container] = strconv.FormatInt(c.MemoryMiB, 10) + "M"
		}
		if c.SMPercent > 0 {
			out[v1alpha1.AnnotationSMLimitPrefix+c.Container] = strconv.Itoa(int(c.SMPercent))
		}
	}
	return out
}

// AllocationFromPod reads a bound pod's allocation back from its annotations,
// resolving the devices against node, the inventory of the pod's node. It
// returns ErrNotAllocated (wrapped) when the pod has no allocation
// annotations, and an error when the pod is not bound to node, its request
// does not parse, or the annotations do not match the request or the
// inventory.
func AllocationFromPod(pod *corev1.Pod, node *NodeInventory) (*PodAllocation, error) {
	key := pod.Namespace + "/" + pod.Name
	anns, err := readAllocationAnnotations(pod.Annotations)
	if err != nil {
		return nil, fmt.Errorf("read allocation of pod %s: %w", key, err)
	}
	if len(anns) == 0 {
		return nil, fmt.Errorf("read allocation of pod %s: %w", key, ErrNotAllocated)
	}
	switch {
	case pod.Spec.NodeName == "":
		return nil, fmt.Errorf("read allocation of pod %s: pod is not bound", key)
	case node == nil:
		return nil, fmt.Errorf("read allocation of pod %s: no inventory for node %q", key, pod.Spec.NodeName)
	case node.Name != pod.Spec.NodeName:
		return nil, fmt.Errorf("read allocation of pod %s: pod is bound to %q, not %q", key, pod.Spec.NodeName, node.Name)
	}
	if n, ok := pod.Annotations[v1alpha1.AnnotationNode]; ok && n != pod.Spec.NodeName {
		return nil, fmt.Errorf("read allocation of pod %s: %s is %q but the pod is bound to %q", key, v1alpha1.AnnotationNode, n, pod.Spec.NodeName)
	}
	req, errs := ParsePod(pod)
	if len(errs) > 0 {
		return nil, fmt.Errorf("read allocation of pod %s: %w", key, errs.ToAggregate())
	}
	if req == nil {
		return nil, fmt.Errorf("read allocation of pod %s: pod has devices but asks for no GPU", key)
	}
	out := &PodAllocation{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, Node: node.Name}
	for _, rc := range req.Containers {
		i := slices.IndexFunc(anns, func(a annotatedContainer) bool { return a.name == rc.Name })
		if i < 0 {
			return nil, fmt.Errorf("read allocation of pod %s: container %q asks for GPUs but has no %s annotation", key, rc.Name, v1alpha1.AnnotationDevicesPrefix+rc.Name)
		}
		a := anns[i]
		anns = slices.Delete(anns, i, i+1)
		if len(a.uuids) != rc.Count {
			return nil, fmt.Errorf("read allocation of pod %s: container %q has %d devices but asks for %d", key, rc.Name, len(a.uuids), rc.Count)
		}
		ca := ContainerAllocation{Container: rc.Name, DeviceUUIDs: a.uuids, MemoryMiB: a.memLimitMiB, SMPercent: a.smPercent}
		minMem := int64(-1)
		for _, u := range a.uuids {
			d, ok := node.DeviceByUUID(u)
			if !ok {
				return nil, fmt.Errorf("read allocation of pod %s: container %q names device %q, which node %q does not have", key, rc.Name, u, node.Name)
			}
			ca.DeviceIndexes = append(ca.DeviceIndexes, d.Index)
			if minMem < 0 || d.MemoryMiB < minMem {
				minMem = d.MemoryMiB
			}
		}
		// Devices of different sizes: the smallest gives the largest share,
		// which keeps the accounting on the safe side.
		ca.Milli = rc.MilliOn(minMem)
		if ca.MemoryMiB == 0 && !rc.Whole() {
			ca.MemoryMiB = rc.MemoryMiB
			if ca.MemoryMiB == 0 {
				ca.MemoryMiB = rc.Milli * minMem / MilliPerGPU
			}
		}
		out.Containers = append(out.Containers, ca)
	}
	if len(anns) > 0 {
		return nil, fmt.Errorf("read allocation of pod %s: container %q has devices but asks for no GPU", key, anns[0].name)
	}
	return out, nil
}

// annotatedContainer is one container's allocation annotations.
type annotatedContainer struct {
	name        string
	uuids       []string
	memLimitMiB int64
	smPercent   int32
}

// readAllocationAnnotations reads every partita.dev/devices.<container>
// annotation with its limits, sorted by container name. It reads all it can
// and returns the first problem with the rest.
func readAllocationAnnotations(ann map[string]string) ([]annotatedContainer, error) {
	var out []annotatedContainer
	var errs []error
	for k, v := range ann {
		name, ok := strings.CutPrefix(k, v1alpha1.AnnotationDevicesPrefix)
		if !ok {
			continue
		}
		a := annotatedContainer{name: name}
		if v != "" {
			a.uuids = strings.Split(v, ",")
		}
		if s, ok := ann[v1alpha1.AnnotationMemLimitPrefix+name]; ok {
			n, ok := strings.CutSuffix(s, "M")
			mib, err := strconv.ParseInt(n, 10, 64)
			if !ok || err != nil || mib <= 0 {
				errs = append(errs, fmt.Errorf("%s%s is %q, not <MiB>M", v1alpha1.AnnotationMemLimitPrefix, name, s))
			} else {
				a.memLimitMiB = mib
			}
		}
		if s, ok := ann[v1alpha1.AnnotationSMLimitPrefix+name]; ok {
			pct, err := strconv.ParseInt(s, 10, 32)
			if err != nil || pct < 1 || pct > 100 {
				errs = append(errs, fmt.Errorf("%s%s is %q, not a percentage", v1alpha1.AnnotationSMLimitPrefix, name, s))
			} else {
				a.smPercent = int32(pct)
			}
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b annotatedContainer) int { return strings.Compare(a.name, b.name) })
	slices.SortFunc(errs, func(a, b error) int { return strings.Compare(a.Error(), b.Error()) })
	return out, errors.Join(errs...)
}
