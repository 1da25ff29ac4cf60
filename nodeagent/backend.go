package nodeagent

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// mib is one MiB in bytes.
const mib = 1 << 20

// Backend reads one node's GPUs: which devices exist, their health and
// usage, and the processes that use them. NVML reads the hardware;
// Simulated invents devices for dev clusters and tests.
type Backend interface {
	// Snapshot returns the node's devices and GPU processes now. It returns an
	// *UnavailableError when the backend cannot read the devices at all.
	Snapshot(ctx context.Context) (*Snapshot, error)
}

// HealthWatcher is a Backend that learns of health changes between
// snapshots (NVML XID events), so that an unhealthy device leaves the
// node's capacity at once rather than at the next sync.
type HealthWatcher interface {
	// WatchHealth blocks until ctx ends, calling changed after a device's
	// health changed.
	WatchHealth(ctx context.Context, changed func()) error
}

// ProcessKiller ends a process that uses a GPU (the watchdog's kill mode).
type ProcessKiller interface {
	// Kill ends the process p names, as the snapshot saw it. It must refuse,
	// with an error wrapping ErrProcessChanged or ErrProcessNotFound, when
	// p.PID no longer names that process: the PID was reused (another start
	// time) or the process left p's pod and container.
	Kill(ctx context.Context, p Process) error
}

// Snapshot is what a Backend saw at one moment.
type Snapshot struct {
	// Devices are the node's GPUs, sorted by index.
	Devices []DeviceState
	// Processes are the processes that hold GPU memory.
	Processes []Process
}

// DeviceState is one device: its inventory entry and its current usage.
type DeviceState struct {
	v1alpha1.GPUDevice
	// MemoryUsedBytes is the device memory in use.
	MemoryUsedBytes int64
	// UtilizationPercent is the share of time a kernel ran over the last
	// sample period, 0 to 100, or -1 when unknown.
	UtilizationPercent int32
}

// Process is one process's use of one device.
type Process struct {
	// PID is the process's PID in the host's PID namespace.
	PID int32 `json:"pid"`
	// DeviceIndex is the device the memory is on.
	DeviceIndex int32 `json:"deviceIndex"`
	// MemoryBytes is the device memory the process holds.
	MemoryBytes int64 `json:"memoryBytes"`
	// StartTicks is when the process started, in clock ticks since boot,
	// when known (NVML backend): with the PID it names the process, so that
	// a PID reused by a later process is never taken for it.
	StartTicks uint64 `json:"startTicks,omitempty"`
	// PodUID is the pod the process belongs to, when known.
	PodUID types.UID `json:"podUID,omitempty"`
	// ContainerID is the runtime's container ID, when known (NVML backend).
	ContainerID string `json:"containerID,omitempty"`
	// Container is the container's name, when known (simulated backend).
	Container string `json:"container,omitempty"`
}

// UnavailableError says that a backend cannot read the node's GPUs at all
// (NVML missing, the driver not loaded). The agent then treats every known
// device as unhealthy and retries with backoff.
type UnavailableError struct {
	// Backend names the backend ("nvml").
	Backend string
	// Hint says what to check, for a person.
	Hint string
	// Err is the cause.
	Err error
}

func (e *UnavailableError) Error() string {
	msg := fmt.Sprintf("%s backend unavailable: %v", e.Backend, e.Err)
	if e.Hint != "" {
		msg += " (" + e.Hint + ")"
	}
	return msg
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// IsUnavailable reports whether err says a backend cannot read the GPUs.
func IsUnavailable(err error) bool {
	var u *UnavailableError
	return errors.As(err, &u)
}

// DriverReader is a Backend that also reads the driver's version and where
// each device sits, for the node's enforcement facts (dmem regions are
// matched by PCI bus ID, device nodes by minor number).
type DriverReader interface {
	DriverInfo(ctx context.Context) (DriverInfo, error)
}

// DriverInfo is the driver and its devices' addresses.
type DriverInfo struct {
	// Version is the NVIDIA driver version ("615.20").
	Version string
	// Devices are the devices' addresses by UUID.
	Devices map[string]DeviceAddress
}

// DeviceAddress is where a device sits on the host.
type DeviceAddress struct {
	// BusID is the PCI address as NVML writes it ("00000000:3B:00.0").
	BusID string
	// Minor is the minor number of /dev/nvidia<minor>, -1 when unknown.
	Minor int32
}

// DmemReader is a Backend that stands in for the kernel's dmem controller
// (the simulated backend), instead of <cgroup root>/dmem.capacity.
type DmemReader interface {
	DmemCapacity() ([]byte, error)
}
