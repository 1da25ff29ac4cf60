package nodeagent

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/nodeagent/dmem"
)

// SimSpec describes the identical devices of a simulated node.
type SimSpec struct {
	// Count is the number of devices.
	Count int
	// Product is the product name the devices report.
	Product string
	// MemoryMiB is each device's memory.
	MemoryMiB int64
	// ComputeCapability is the CUDA compute capability, when known.
	ComputeCapability string
}

// String writes the spec as ParseSimSpec reads it.
func (s SimSpec) String() string {
	return fmt.Sprintf("%dx%s:%dMiB", s.Count, s.Product, s.MemoryMiB)
}

// simModels are the device models --simulate knows by name; the names match
// `partita dev up --gpu-model`. Products are as NVML reports them.
func simModels() map[string]SimSpec {
	return map[string]SimSpec{
		"H100-80GB":  {Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, ComputeCapability: "9.0"},
		"H200-141GB": {Product: "NVIDIA H200", MemoryMiB: 143771, ComputeCapability: "9.0"},
		"A100-40GB":  {Product: "NVIDIA A100-SXM4-40GB", MemoryMiB: 40960, ComputeCapability: "8.0"},
		"A100-80GB":  {Product: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, ComputeCapability: "8.0"},
		"L40S":       {Product: "NVIDIA L40S", MemoryMiB: 46068, ComputeCapability: "8.9"},
		"L4":         {Product: "NVIDIA L4", MemoryMiB: 23034, ComputeCapability: "8.9"},
		"T4":         {Product: "Tesla T4", MemoryMiB: 15360, ComputeCapability: "7.5"},
	}
}

// ParseSimSpec reads a --simulate value: "<count>x<model>", where model is a
// known name (H100-80GB, H200-141GB, A100-40GB, A100-80GB, L40S, L4, T4),
// or any product name followed by ":<MiB>" ("2xMyGPU:24576"), or a name
// ending in "-<n>GB" ("4xRTX-24GB").
func ParseSimSpec(s string) (SimSpec, error) {
	n, model, ok := strings.Cut(strings.TrimSpace(s), "x")
	count, err := strconv.Atoi(n)
	if !ok || err != nil || count < 1 || count > 64 {
		return SimSpec{}, fmt.Errorf("parse simulated devices %q: want <count>x<model> with a count from 1 to 64, e.g. 8xH100-80GB", s)
	}
	if spec, known := simModels()[model]; known {
		spec.Count = count
		return spec, nil
	}
	if product, mem, ok := strings.Cut(model, ":"); ok {
		mem = strings.TrimSuffix(mem, "MiB")
		m, err := strconv.ParseInt(mem, 10, 64)
		if err != nil || m < 1 || product == "" {
			return SimSpec{}, fmt.Errorf("parse simulated devices %q: want <count>x<product>:<MiB>", s)
		}
		return SimSpec{Count: count, Product: product, MemoryMiB: m}, nil
	}
	if i := strings.LastIndex(model, "-"); i > 0 && strings.HasSuffix(model, "GB") {
		gb, err := strconv.ParseInt(strings.TrimSuffix(model[i+1:], "GB"), 10, 64)
		if err == nil && gb > 0 {
			return SimSpec{Count: count, Product: model, MemoryMiB: gb * 1024}, nil
		}
	}
	names := slices.Sorted(maps.Keys(simModels()))
	return SimSpec{}, fmt.Errorf("parse simulated devices %q: unknown model %q; use one of %s, <product>:<MiB>, or a name ending in -<n>GB", s, model, strings.Join(names, ", "))
}

// SimSpecForNode reads a simulated node's devices from its GPU Feature
// Discovery labels (nvidia.com/gpu.count, .product, .memory in MiB); a label
// that is missing is taken from fallback. A node without the count label gets
// fallback; ok is false when there is no count either way.
func SimSpecForNode(node *corev1.Node, fallback *SimSpec) (spec SimSpec, ok bool, err error) {
	if fallback != nil {
		spec = *fallback
	}
	countLabel, hasCount := node.Labels[v1alpha1.LabelNVIDIAGPUCount]
	if !hasCount {
		return spec, fallback != nil, nil
	}
	n, err := strconv.Atoi(countLabel)
	if err != nil || n < 0 || n > 64 {
		return spec, false, fmt.Errorf("node %s: label %s is %q, not a count from 0 to 64", node.Name, v1alpha1.LabelNVIDIAGPUCount, countLabel)
	}
	spec.Count = n
	if p := node.Labels[v1alpha1.LabelNVIDIAGPUProduct]; p != "" {
		spec.Product = p
		spec.ComputeCapability = ""
	}
	if m := node.Labels[v1alpha1.LabelNVIDIAGPUMemory]; m != "" {
		mem, err := strconv.ParseInt(m, 10, 64)
		if err != nil || mem < 1 {
			return spec, false, fmt.Errorf("node %s: label %s is %q, not MiB", node.Name, v1alpha1.LabelNVIDIAGPUMemory, m)
		}
		spec.MemoryMiB = mem
	}
	if spec.MemoryMiB == 0 {
		return spec, false, fmt.Errorf("node %s: no device memory: set label %s or --simulate", node.Name, v1alpha1.LabelNVIDIAGPUMemory)
	}
	return spec, true, nil
}

// simNamespace is the UUID namespace of simulated devices, so a node's
// simulated UUIDs are the same in every run of the agent.
var simNamespace = uuid.MustParse("5d4c6e53-9a3b-4f61-8d8e-7c1c2f0b9a41")

// SimulatedUUID is the UUID of a simulated node's device.
func SimulatedUUID(node string, index int) string {
	return "GPU-" + uuid.NewSHA1(simNamespace, []byte(node+"/"+strconv.Itoa(index))).String()
}

// Simulated is a backend with invented devices. Its devices and their UUIDs
// depend only on the node's name and the spec, so a restarted agent reports
// exactly what the last one did. Tests and the dev cluster make devices
// unhealthy and add GPU processes through SetHealth and SetProcesses (or
// from annotations, see Simulate).
type Simulated struct {
	node string
	spec SimSpec

	lock      sync.Mutex
	unhealthy map[int32]string
	processes []Process
	killed    map[int32]bool
	// driver and dmemCapacity stand in for the driver version and the
	// kernel's dmem.capacity (SetDmem); none by default.
	driver       string
	dmemCapacity []byte
	// computeModes are the modes set, by index; Default when absent.
	computeModes map[int32]ComputeMode
}

var (
	_ Backend       = (*Simulated)(nil)
	_ ProcessKiller = (*Simulated)(nil)
	_ DriverReader  = (*Simulated)(nil)
	_ DmemReader    = (*Simulated)(nil)
)

// SimulatedBusID is the PCI address of a simulated node's device i, as
// NVML writes it: device i sits at bus i+1.
func SimulatedBusID(i int) string { return fmt.Sprintf("00000000:%02X:00.0", i+1) }

// SetDmem makes the backend report an NVIDIA driver of version driver and
// a dmem controller whose regions are capacity (dmem.capacity's form); a
// nil capacity means the kernel has no dmem controller.
func (s *Simulated) SetDmem(driver string, capacity []byte) {
	s.lock.Lock()
	defer s.lock.Unlock()
	s.driver, s.dmemCapacity = driver, slices.Clone(capacity)
}

// DriverInfo returns the simulated driver version and bus IDs; simulated
// devices have no device nodes.
func (s *Simulated) DriverInfo(context.Context) (DriverInfo, error) {
	s.lock.Lock()
	defer s.lock.Unlock()
	out := DriverInfo{Version: s.driver, Devices: map[string]DeviceAddress{}}
	for i := range s.spec.Count {
		out.Devices[SimulatedUUID(s.node, i)] = DeviceAddress{BusID: SimulatedBusID(i), Minor: -1}
	}
	return out, nil
}

// DmemCapacity returns what SetDmem set, or dmem.ErrNoController.
func (s *Simulated) DmemCapacity() ([]byte, error) {
	s.lock.Lock()
	defer s.lock.Unlock()
	if s.dmemCapacity == nil {
		return nil, dmem.ErrNoController
	}
	return slices.Clone(s.dmemCapacity), nil
}

// NewSimulated returns a simulated backend for node.
func NewSimulated(node string, spec SimSpec) *Simulated {
	return &Simulated{node: node, spec: spec, unhealthy: map[int32]string{}, killed: map[int32]bool{}}
}

// Spec returns the devices the backend simulates.
func (s *Simulated) Spec() SimSpec { return s.spec }

// SetHealth makes the given devices unhealthy with the given reasons, and
// every other device healthy.
func (s *Simulated) SetHealth(unhealthy map[int32]string) {
	s.lock.Lock()
	defer s.lock.Unlock()
	s.unhealthy = maps.Clone(unhealthy)
}

// SetProcesses replaces the simulated GPU processes. A process killed
// before stays gone while its PID is listed.
func (s *Simulated) SetProcesses(procs []Process) {
	s.lock.Lock()
	defer s.lock.Unlock()
	s.processes = slices.Clone(procs)
	live := map[int32]bool{}
	for _, p := range procs {
		live[p.PID] = true
	}
	maps.DeleteFunc(s.killed, func(pid int32, _ bool) bool { return !live[pid] })
}

// Kill ends a simulated process.
func (s *Simulated) Kill(_ context.Context, p Process) error {
	pid := p.PID
	s.lock.Lock()
	defer s.lock.Unlock()
	if !slices.ContainsFunc(s.processes, func(p Process) bool { return p.PID == pid }) || s.killed[pid] {
		return fmt.Errorf("kill simulated process %d: %w", pid, ErrProcessNotFound)
	}
	s.killed[pid] = true
	return nil
}

// Snapshot returns the simulated devices. A device's memory use is the sum
// of its processes', and its utilization grows with the memory in use.
func (s *Simulated) Snapshot(context.Context) (*Snapshot, error) {
	s.lock.Lock()
	defer s.lock.Unlock()
	snap := &Snapshot{Devices: make([]DeviceState, s.spec.Count)}
	for i := range s.spec.Count {
		numa := int32(0)
		if i >= (s.spec.Count+1)/2 {
			numa = 1
		}
		d := DeviceState{GPUDevice: v1alpha1.GPUDevice{
			Index:             int32(i),
			UUID:              SimulatedUUID(s.node, i),
			Product:           s.spec.Product,
			MemoryMiB:         s.spec.MemoryMiB,
			NUMANode:          &numa,
			MIGMode:           v1alpha1.MIGDisabled,
			ComputeCapability: s.spec.ComputeCapability,
			Health:            v1alpha1.DeviceHealthy,
		}}
		if reason, bad := s.unhealthy[int32(i)]; bad {
			d.Health, d.HealthReason = v1alpha1.DeviceUnhealthy, reason
		}
		snap.Devices[i] = d
	}
	for _, p := range s.processes {
		if s.killed[p.PID] || p.DeviceIndex < 0 || int(p.DeviceIndex) >= s.spec.Count {
			continue
		}
		snap.Processes = append(snap.Processes, p)
		snap.Devices[p.DeviceIndex].MemoryUsedBytes += p.MemoryBytes
	}
	for i := range snap.Devices {
		d := &snap.Devices[i]
		if total := d.MemoryMiB * mib; total > 0 {
			d.UtilizationPercent = int32(min(100, 100*d.MemoryUsedBytes/total))
		}
	}
	return snap, nil
}

// simulatedPID gives a simulated process a stable PID from what it stands
// for, so that a process killed stays killed across syncs.
func simulatedPID(uid types.UID, container string, device int32) int32 {
	h := fnv.New32a()
	_, _ = fmt.Fprintf(h, "%s/%s/%d", uid, container, device)
	return int32(h.Sum32()%(1<<22)) + 1000
}
