package nodeagent

import (
	"k8s.io/utils/clock"
)

// DefaultIgnoredXIDs are the XID errors that do not make a device unhealthy
// by default, as NVIDIA's device plugin does: they are caused by the
// application (13 graphics engine exception, 31 GPU memory page fault, 43 GPU
// stopped processing, 45 preemptive cleanup, 68 video processor exception,
// 109 context switch timeout), not by the device.
func DefaultIgnoredXIDs() []uint64 { return []uint64{13, 31, 43, 45, 68, 109} }

// NVMLConfig configures the NVML backend.
type NVMLConfig struct {
	// LibraryPath is the NVML library to load; empty means
	// libnvidia-ml.so.1 from the loader's search path.
	LibraryPath string
	// IgnoredXIDs are XID errors that leave a device healthy.
	IgnoredXIDs []uint64
	// ProcRoot is where the host's /proc is visible ("/proc" with hostPID).
	ProcRoot string
	// SysRoot is where the host's /sys is visible.
	SysRoot string
	// Clock paces retries; the real clock when nil.
	Clock clock.Clock
	// StateDir keeps the health marks (XIDs, lost GPUs) across agent
	// restarts, in health.json; empty keeps them in memory only.
	StateDir string
	// BootID names the machine's current boot; marks saved under another
	// boot are dropped, as a reboot resets the GPUs. Read from
	// /proc/sys/kernel/random/boot_id when empty.
	BootID string
	// OnError, when set, is called with the NVML call's name each time a
	// call fails (for the partita_nvml_errors_total metric).
	OnError func(call string)
}

func (c *NVMLConfig) defaults() {
	if c.ProcRoot == "" {
		c.ProcRoot = "/proc"
	}
	if c.SysRoot == "" {
		c.SysRoot = "/sys"
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.BootID == "" {
		c.BootID = currentBootID()
	}
	if c.OnError == nil {
		c.OnError = func(string) {}
	}
}
