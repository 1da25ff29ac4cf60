//go:build cgo

package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// NVML is the backend for real GPUs, on NVIDIA's management library. It
// loads the library on first use; while that fails (no driver, no library
// in the container) every Snapshot returns an *UnavailableError that says
// what to check, and the agent retries with backoff rather than exiting.
//
// Health is sticky: a device that reported a critical XID or was lost stays
// Unhealthy, across agent restarts too (the marks are kept in the state
// directory), until the node reboots or an operator says the device was
// reset (ResetHealth, through the GPUNode annotation
// partita.dev/reset-health), as such devices need a reset.
//
// A device NVML counts but cannot open, or whose UUID it cannot read, is
// reported Unhealthy with the reason and no UUID (the agent fills in the
// one it last published for that index); it is tried again on every
// snapshot.
type NVML struct {
	lib     nvml.Interface
	cfg     NVMLConfig
	ignored map[uint64]bool
	// selfProcRoot is the agent's own /proc, where Kill checks a process
	// before signalling it in the agent's PID namespace.
	selfProcRoot string

	// lock guards the fields below; NVML calls themselves are thread safe.
	lock        sync.Mutex
	initialized bool
	devices     []nvmlDevice
	// unhealthy are the health marks by UUID, loaded from the state
	// directory at the first initialisation.
	unhealthy   map[string]healthMark
	marksLoaded bool
	// events is the XID event set while WatchHealth runs, so that a device
	// opened late is registered too.
	events nvml.EventSet
}

// nvmlDevice is a device found at initialisation. A device NVML could not
// open or describe has no usable handle (open is false) and only its index
// and the reason in info.
type nvmlDevice struct {
	handle nvml.Device
	open   bool
	info   v1alpha1.GPUDevice
}

// NewNVML returns the NVML backend; it loads nothing until first used.
func NewNVML(cfg NVMLConfig) *NVML {
	var opts []nvml.LibraryOption
	if cfg.LibraryPath != "" {
		opts = append(opts, nvml.WithLibraryPath(cfg.LibraryPath))
	}
	return newNVMLWithLibrary(nvml.New(opts...), cfg)
}

// newNVMLWithLibrary returns the backend on a given NVML implementation
// (tests pass go-nvml's mock servers).
func newNVMLWithLibrary(lib nvml.Interface, cfg NVMLConfig) *NVML {
	cfg.defaults()
	ignored := make(map[uint64]bool, len(cfg.IgnoredXIDs))
	for _, x := range cfg.IgnoredXIDs {
		ignored[x] = true
	}
	return &NVML{lib: lib, cfg: cfg, ignored: ignored, selfProcRoot: "/proc", unhealthy: map[string]healthMark{}}
}

// initHint says what to check when NVML does not initialise.
func initHint(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 was not found: install the NVIDIA driver on the node and run the agent with the NVIDIA container runtime (runtimeClassName: nvidia)"
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded on this node"
	case nvml.ERROR_NO_PERMISSION:
		return "no permission to open /dev/nvidia*: run the agent privileged or with the NVIDIA runtime"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "the NVML library and the kernel driver differ in version: reload the driver or reboot the node"
	default:
		return "check that nvidia-smi works on the node"
	}
}

// ensureInit loads NVML and discovers the devices once. Callers hold lock.
func (b *NVML) ensureInit(ctx context.Context) error {
	if b.initialized {
		return nil
	}
	if ret := b.lib.Init(); ret != nvml.SUCCESS {
		b.cfg.OnError("Init")
		return &UnavailableError{Backend: "nvml", Err: fmt.Errorf("initialize NVML: %w", ret), Hint: initHint(ret)}
	}
	count, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		b.cfg.OnError("DeviceGetCount")
		_ = b.lib.Shutdown()
		return &UnavailableError{Backend: "nvml", Err: fmt.Errorf("count devices: %w", ret), Hint: initHint(ret)}
	}
	log := logr.FromContextOrDiscard(ctx)
	if !b.marksLoaded {
		b.loadMarks(log)
	}
	devices := make([]nvmlDevice, 0, count)
	for i := range count {
		d := b.open(int32(i))
		if !d.open {
			// The ledger must see the device as unhealthy rather than not at
			// all: a pod may hold it, and nothing new may land on it.
			log.Error(errors.New(d.info.HealthReason), "Reporting a device NVML cannot open as unhealthy", "index", i)
		}
		devices = append(devices, d)
	}
	b.devices = devices
	b.initialized = true
	log.V(1).Info("Initialized NVML", "devices", len(devices))
	return nil
}

// open opens and describes the device at index. A device that does not
// open comes back with open false, Unhealthy, and the reason.
func (b *NVML) open(index int32) nvmlDevice {
	broken := func(reason string) nvmlDevice {
		return nvmlDevice{info: v1alpha1.GPUDevice{
			Index: index, Health: v1alpha1.DeviceUnhealthy, HealthReason: reason, MIGMode: v1alpha1.MIGUnsupported,
		}}
	}
	h, ret := b.lib.DeviceGetHandleByIndex(int(index))
	if ret != nvml.SUCCESS {
		b.cfg.OnError("DeviceGetHandleByIndex")
		return broken(fmt.Sprintf("NVML cannot open device %d: %v", index, ret))
	}
	info, err := b.describe(h, index)
	if err != nil {
		return broken(fmt.Sprintf("NVML cannot describe device %d: %v", index, err))
	}
	return nvmlDevice{handle: h, open: true, info: info}
}

// describe reads a device's inventory entry. Only the UUID is required;
// fields NVML cannot give are left empty.
func (b *NVML) describe(h nvml.Device, index int32) (v1alpha1.GPUDevice, error) {
	d := v1alpha1.GPUDevice{Index: index, Health: v1alpha1.DeviceHealthy, MIGMode: v1alpha1.MIGUnsupported}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		b.cfg.OnError("GetUUID")
		return d, fmt.Errorf("read UUID of device %d: %w", index, ret)
	}
	d.UUID = uuid
	if name, ret := h.GetName(); ret == nvml.SUCCESS {
		d.Product = name
	} else {
		b.cfg.OnError("GetName")
	}
	if mem, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		d.MemoryMiB = int64(mem.Total / mib)
	} else {
		b.cfg.OnError("GetMemoryInfo")
	}
	switch current, _, ret := h.GetMigMode(); {
	case ret == nvml.ERROR_NOT_SUPPORTED:
	case ret != nvml.SUCCESS:
		b.cfg.OnError("GetMigMode")
	case current == nvml.DEVICE_MIG_ENABLE:
		d.MIGMode = v1alpha1.MIGEnabled
	default:
		d.MIGMode = v1alpha1.MIGDisabled
	}
	if major, minor, ret := h.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		d.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	} else {
		b.cfg.OnError("GetCudaComputeCapability")
	}
	if pci, ret := h.GetPciInfo(); ret == nvml.SUCCESS {
		d.NUMANode = numaNode(b.cfg.SysRoot, busIDString(pci.BusId))
	} else {
		b.cfg.OnError("GetPciInfo")
	}
	return d, nil
}

// busIDString turns NVML's C string into a Go string.
func busIDString(id [32]int8) string {
	out := make([]byte, 0, len(id))
	for _, c := range id {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

// Snapshot reads each device's health, memory, utilization and processes.
func (b *NVML) Snapshot(ctx context.Context) (*Snapshot, error) {
	b.lock.Lock()
	defer b.lock.Unlock()
	if err := b.ensureInit(ctx); err != nil {
		return nil, err
	}
	log := logr.FromContextOrDiscard(ctx)
	snap := &Snapshot{Devices: make([]DeviceState, 0, len(b.devices))}
	for i := range b.devices {
		if !b.devices[i].open {
			if d := b.open(b.devices[i].info.Index); d.open {
				log.Info("Opened a device NVML could not open before", "index", d.info.Index, "uuid", d.info.UUID)
				b.devices[i] = d
				b.registerDevice(ctx, d)
			}
		}
		d := b.devices[i]
		st := DeviceState{GPUDevice: d.info, UtilizationPercent: -1}
		if !d.open {
			snap.Devices = append(snap.Devices, st)
			continue
		}
		if mem, ret := d.handle.GetMemoryInfo(); b.ok(d, "GetMemoryInfo", ret) {
			st.MemoryUsedBytes = int64(mem.Used)
		}
		if u, ret := d.handle.GetUtilizationRates(); b.ok(d, "GetUtilizationRates", ret) {
			st.UtilizationPercent = int32(u.Gpu)
		}
		seen := map[uint32]bool{}
		for _, call := range []struct {
			name string
			get  func() ([]nvml.ProcessInfo, nvml.Return)
		}{
			{"GetComputeRunningProcesses", d.handle.GetComputeRunningProcesses},
			{"GetMPSComputeRunningProcesses", d.handle.GetMPSComputeRunningProcesses},
		} {
			procs, ret := call.get()
			if !b.ok(d, call.name, ret) {
				continue
			}
			for _, p := range procs {
				if seen[p.Pid] {
					continue
				}
				seen[p.Pid] = true
				proc := Process{PID: int32(p.Pid), DeviceIndex: d.info.Index, MemoryBytes: int64(p.UsedGpuMemory)}
				uid, cid, err := processPod(b.cfg.ProcRoot, proc.PID)
				if err != nil {
					log.V(4).Info("Could not map a GPU process to a pod", "pid", p.Pid, "err", err)
				}
				proc.PodUID, proc.ContainerID = uid, cid
				proc.StartTicks = processStartTicks(b.cfg.ProcRoot, proc.PID)
				snap.Processes = append(snap.Processes, proc)
			}
		}
		if m, bad := b.unhealthy[d.info.UUID]; bad {
			st.Health, st.HealthReason = v1alpha1.DeviceUnhealthy, m.Reason
		}
		snap.Devices = append(snap.Devices, st)
	}
	return snap, nil
}

// ok reports whether an NVML call on a device succeeded. A lost GPU turns
// the device unhealthy; an unsupported call is not an error. Callers hold
// lock.
func (b *NVML) ok(d nvmlDevice, call string, ret nvml.Return) bool {
	switch ret {
	case nvml.SUCCESS:
		return true
	case nvml.ERROR_NOT_SUPPORTED:
		return false
	case nvml.ERROR_GPU_IS_LOST:
		if _, marked := b.unhealthy[d.info.UUID]; !marked {
			b.mark(d, "GPU is lost (NVML "+call+": ERROR_GPU_IS_LOST)")
		}
	}
	b.cfg.OnError(call)
	return false
}

// markUnhealthy records reason for the devices with the given UUIDs (all
// devices when uuids is empty) and reports whether anything changed.
func (b *NVML) markUnhealthy(uuids []string, reason string) bool {
	b.lock.Lock()
	defer b.lock.Unlock()
	changed := false
	for _, d := range b.devices {
		if !d.open || (len(uuids) > 0 && !slices.Contains(uuids, d.info.UUID)) {
			continue
		}
		if _, bad := b.unhealthy[d.info.UUID]; !bad {
			b.mark(d, reason)
			changed = true
		}
	}
	return changed
}

// eventWaitMillis is how long one wait for NVML events blocks, which bounds
// how long WatchHealth takes to notice that its context ended.
const eventWaitMillis = 1000

// WatchHealth registers for critical XID events on every device and marks
// a device unhealthy on each XID that is not ignored. It waits (with
// backoff) for NVML to initialise, and returns when ctx ends.
func (b *NVML) WatchHealth(ctx context.Context, changed func()) error {
	log := logr.FromContextOrDiscard(ctx)
	var es nvml.EventSet
	backoff := time.Second
	for {
		var err error
		if es, err = b.registerEvents(ctx); err == nil {
			break
		}
		log.Error(err, "Could not watch GPU health; retrying", "retryIn", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-b.cfg.Clock.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Minute)
	}
	defer func() {
		b.lock.Lock()
		b.events = nil
		b.lock.Unlock()
		_ = es.Free()
	}()
	for ctx.Err() == nil {
		e, ret := es.Wait(eventWaitMillis)
		switch {
		case ret == nvml.ERROR_TIMEOUT:
			continue
		case ret != nvml.SUCCESS:
			b.cfg.OnError("EventSetWait")
			select {
			case <-ctx.Done():
			case <-b.cfg.Clock.After(time.Second):
			}
			continue
		case e.EventType != nvml.EventTypeXidCriticalError:
			continue
		case b.ignored[e.EventData]:
			log.V(2).Info("Ignored a benign XID", "xid", e.EventData)
			continue
		}
		var uuids []string
		if e.Device != nil {
			if u, ret := e.Device.GetUUID(); ret == nvml.SUCCESS {
				uuids = []string{u}
			}
		}
		// An XID NVML cannot tie to a device may come from any of them.
		reason := fmt.Sprintf("XID %d (critical error)", e.EventData)
		if b.markUnhealthy(uuids, reason) {
			log.Info("Marked GPU unhealthy", "xid", e.EventData, "devices", uuids)
			changed()
		}
	}
	return nil
}

// registerEvents initialises NVML and registers every device that supports
// it for critical XID events.
func (b *NVML) registerEvents(ctx context.Context) (nvml.EventSet, error) {
	b.lock.Lock()
	defer b.lock.Unlock()
	if err := b.ensureInit(ctx); err != nil {
		return nil, err
	}
	es, ret := b.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		b.cfg.OnError("EventSetCreate")
		return nil, fmt.Errorf("create NVML event set: %w", ret)
	}
	b.events = es
	for _, d := range b.devices {
		if d.open {
			b.registerDevice(ctx, d)
		}
	}
	return es, nil
}

// registerDevice registers d for critical XID events in the event set, if
// WatchHealth runs. Callers hold lock.
func (b *NVML) registerDevice(ctx context.Context, d nvmlDevice) {
	if b.events == nil {
		return
	}
	log := logr.FromContextOrDiscard(ctx)
	supported, ret := d.handle.GetSupportedEventTypes()
	if ret != nvml.SUCCESS || supported&nvml.EventTypeXidCriticalError == 0 {
		log.Info("Device does not report XID events; its health is read by polling only", "index", d.info.Index)
		return
	}
	if ret := d.handle.RegisterEvents(nvml.EventTypeXidCriticalError, b.events); ret != nvml.SUCCESS {
		b.cfg.OnError("RegisterEvents")
		if ret != nvml.ERROR_NOT_SUPPORTED {
			log.Error(ret, "Could not register for XID events", "index", d.info.Index)
		}
	}
}

// Close releases NVML if it was loaded.
func (b *NVML) Close() {
	b.lock.Lock()
	defer b.lock.Unlock()
	if b.initialized {
		_ = b.lib.Shutdown()
		b.initialized = false
	}
}

// Kill ends a process that uses a GPU, once the agent's own /proc confirms
// that its PID still names the process measured (see killHostProcess). The
// PIDs NVML reports are host PIDs: the agent must run with hostPID: true.
func (b *NVML) Kill(ctx context.Context, p Process) error {
	return killHostProcess(ctx, b.selfProcRoot, p)
}

// loadMarks takes in the health marks saved by an earlier run of the agent
// in the same boot. Callers hold lock.
func (b *NVML) loadMarks(log logr.Logger) {
	b.marksLoaded = true
	if b.cfg.StateDir == "" {
		return
	}
	marks, err := loadHealthMarks(b.cfg.StateDir, b.cfg.BootID)
	if err != nil {
		// A torn or foreign file must not keep the agent from serving; the
		// devices it named are checked afresh.
		log.Error(err, "Could not read the saved GPU health marks; starting without them")
		return
	}
	for uuid, m := range marks {
		if _, ok := b.unhealthy[uuid]; !ok {
			b.unhealthy[uuid] = m
		}
	}
	if len(marks) > 0 {
		log.Info("Kept GPUs unhealthy from before the restart", "devices", slices.Sorted(maps.Keys(marks)))
	}
}

// mark records reason for d and saves the marks. Callers hold lock.
func (b *NVML) mark(d nvmlDevice, reason string) {
	b.unhealthy[d.info.UUID] = healthMark{Index: d.info.Index, Reason: reason, Since: b.cfg.Clock.Now().UTC()}
	b.saveMarks()
}

// saveMarks writes the marks to the state directory. Callers hold lock. A
// failed write is counted and retried with the next mark or reset; the
// marks in memory stay right.
func (b *NVML) saveMarks() {
	if b.cfg.StateDir == "" {
		return
	}
	if err := saveHealthMarks(b.cfg.StateDir, b.cfg.BootID, b.unhealthy); err != nil {
		b.cfg.OnError("SaveHealthMarks")
	}
}

// ResetHealth forgets the faults of the devices sel selects (an operator
// reset them), in memory and in the state directory.
func (b *NVML) ResetHealth(sel DeviceSelector) ([]string, error) {
	b.lock.Lock()
	defer b.lock.Unlock()
	if !b.marksLoaded {
		b.loadMarks(logr.Discard())
	}
	var cleared []string
	for uuid, m := range b.unhealthy {
		index := m.Index
		for _, d := range b.devices {
			if d.open && d.info.UUID == uuid {
				index = d.info.Index
			}
		}
		if sel.Selects(index, uuid) {
			delete(b.unhealthy, uuid)
			cleared = append(cleared, uuid)
		}
	}
	if len(cleared) == 0 || b.cfg.StateDir == "" {
		slices.Sort(cleared)
		return cleared, nil
	}
	slices.Sort(cleared)
	if err := saveHealthMarks(b.cfg.StateDir, b.cfg.BootID, b.unhealthy); err != nil {
		return cleared, fmt.Errorf("reset GPU health: %w", err)
	}
	return cleared, nil
}
