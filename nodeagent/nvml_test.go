//go:build cgo

package nodeagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// machine is go-nvml's DGX H100 mock plus what the mock leaves out and the
// agent calls: utilization, processes, PCI bus IDs and XID events.
type machine struct {
	server *server.Server
	events chan nvml.EventData
	// broken is for tests that break a device and repair it.
	broken atomic.Bool

	lock  sync.Mutex
	procs map[int][]nvml.ProcessInfo
}

// newMachine returns a DGX H100 mock whose device i sits at PCI bus i and
// runs at 10×i% utilization.
func newMachine(t *testing.T) *machine {
	t.Helper()
	m := &machine{server: dgxh100.New(), events: make(chan nvml.EventData, 8), procs: map[int][]nvml.ProcessInfo{}}
	for i, d := range m.server.Devices {
		dev := d.(*server.Device)
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 * i)}, nvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			m.lock.Lock()
			defer m.lock.Unlock()
			return m.procs[i], nvml.SUCCESS
		}
		dev.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range fmt.Sprintf("00000000:%02X:00.0", i) {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return nvml.EventTypeXidCriticalError, nvml.SUCCESS }
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	}
	m.server.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
				select {
				case e := <-m.events:
					return e, nvml.SUCCESS
				case <-time.After(time.Duration(ms) * time.Millisecond / 10):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	return m
}

func (m *machine) device(i int) *server.Device { return m.server.Devices[i].(*server.Device) }

func (m *machine) setProcs(i int, procs ...nvml.ProcessInfo) {
	m.lock.Lock()
	defer m.lock.Unlock()
	m.procs[i] = procs
}

// fakeSys writes a sysfs tree where bus i's device is on NUMA node i/4.
func fakeSys(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for i := range 8 {
		dir := filepath.Join(root, "bus", "pci", "devices", fmt.Sprintf("0000:%02x:00.0", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(fmt.Sprintf("%d\n", i/4)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestNVMLDiscovery(t *testing.T) {
	m := newMachine(t)
	b := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: fakeSys(t), ProcRoot: t.TempDir()})
	snap, err := b.Snapshot(t.Context())
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	var want []DeviceState
	for i := range 8 {
		want = append(want, DeviceState{
			GPUDevice: v1alpha1.GPUDevice{
				Index:             int32(i),
				UUID:              m.device(i).UUID,
				Product:           "NVIDIA H100 80GB HBM3",
				MemoryMiB:         81920,
				NUMANode:          ptr.To(int32(i / 4)),
				MIGMode:           v1alpha1.MIGDisabled,
				ComputeCapability: "9.0",
				Health:            v1alpha1.DeviceHealthy,
			},
			UtilizationPercent: int32(10 * i),
		})
	}
	if diff := cmp.Diff(want, snap.Devices); diff != "" {
		t.Errorf("devices (-want,+got):\n%s", diff)
	}
	inv, err := Discover(t.Context(), "n1", "nvml", b)
	if err != nil {
		t.Fatal(err)
	}
	if inv.CapacityMilli != 8000 {
		t.Errorf("capacity = %d, want 8000", inv.CapacityMilli)
	}
}

func TestNVMLMIGModes(t *testing.T) {
	cases := map[string]struct {
		current int
		ret     nvml.Return
		want    v1alpha1.MIGMode
	}{
		"enabled":       {current: nvml.DEVICE_MIG_ENABLE, ret: nvml.SUCCESS, want: v1alpha1.MIGEnabled},
		"disabled":      {current: nvml.DEVICE_MIG_DISABLE, ret: nvml.SUCCESS, want: v1alpha1.MIGDisabled},
		"not supported": {ret: nvml.ERROR_NOT_SUPPORTED, want: v1alpha1.MIGUnsupported},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := newMachine(t)
			m.device(0).GetMigModeFunc = func() (int, int, nvml.Return) { return tc.current, tc.current, tc.ret }
			snap, err := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: t.TempDir()}).Snapshot(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if got := snap.Devices[0].MIGMode; got != tc.want {
				t.Errorf("MIG mode = %s, want %s", got, tc.want)
			}
			if got, want := capacityMilli(devicesOf(snap)), map[bool]int64{true: 7000, false: 8000}[tc.want == v1alpha1.MIGEnabled]; got != want {
				t.Errorf("capacity = %d, want %d (a MIG-enabled device takes no slices)", got, want)
			}
		})
	}
}

func TestNVMLInitFailureIsRetried(t *testing.T) {
	cases := map[string]struct {
		ret      nvml.Return
		wantHint string
	}{
		"no library": {ret: nvml.ERROR_LIBRARY_NOT_FOUND, wantHint: "libnvidia-ml.so.1 was not found"},
		"no driver":  {ret: nvml.ERROR_DRIVER_NOT_LOADED, wantHint: "kernel driver is not loaded"},
		"mismatch":   {ret: nvml.ERROR_LIB_RM_VERSION_MISMATCH, wantHint: "differ in version"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := newMachine(t)
			fail := true
			m.server.InitFunc = func() nvml.Return {
				if fail {
					return tc.ret
				}
				return nvml.SUCCESS
			}
			var errCalls []string
			b := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: t.TempDir(), OnError: func(c string) { errCalls = append(errCalls, c) }})
			_, err := b.Snapshot(t.Context())
			if !IsUnavailable(err) {
				t.Fatalf("Snapshot error = %v, want an UnavailableError", err)
			}
			if !strings.Contains(err.Error(), tc.wantHint) || !strings.Contains(err.Error(), tc.ret.Error()) {
				t.Errorf("error %q does not name %s and hint %q", err, tc.ret, tc.wantHint)
			}
			if diff := cmp.Diff([]string{"Init"}, errCalls); diff != "" {
				t.Errorf("NVML errors counted (-want,+got):\n%s", diff)
			}
			fail = false
			snap, err := b.Snapshot(t.Context())
			if err != nil {
				t.Fatalf("Snapshot after NVML came back: %v", err)
			}
			if len(snap.Devices) != 8 {
				t.Errorf("got %d devices after retry, want 8", len(snap.Devices))
			}
		})
	}
}

func TestNVMLLostDevice(t *testing.T) {
	m := newMachine(t)
	b := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: t.TempDir()})
	if _, err := b.Snapshot(t.Context()); err != nil {
		t.Fatal(err)
	}
	m.device(3).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	snap, err := b.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range snap.Devices {
		wantHealthy := d.Index != 3
		if (d.Health == v1alpha1.DeviceHealthy) != wantHealthy {
			t.Errorf("device %d health = %s (%s), want healthy=%v", d.Index, d.Health, d.HealthReason, wantHealthy)
		}
	}
	if r := snap.Devices[3].HealthReason; !strings.Contains(r, "GPU is lost") {
		t.Errorf("reason = %q, want it to say the GPU is lost", r)
	}
	if got := capacityMilli(devicesOf(snap)); got != 7000 {
		t.Errorf("capacity = %d, want 7000", got)
	}
	// A lost device stays unhealthy even if a later call succeeds.
	m.device(3).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return m.device(3).MemoryInfo, nvml.SUCCESS }
	if snap, _ = b.Snapshot(t.Context()); snap.Devices[3].Health != v1alpha1.DeviceUnhealthy {
		t.Errorf("device 3 turned %s again; lost devices need a reset", snap.Devices[3].Health)
	}
}

func TestNVMLXIDEvents(t *testing.T) {
	cases := map[string]struct {
		xid           uint64
		device        int // -1: NVML names no device
		ignored       []uint64
		wantUnhealthy []int32
	}{
		"critical XID":         {xid: 79, device: 2, ignored: DefaultIgnoredXIDs(), wantUnhealthy: []int32{2}},
		"benign XID":           {xid: 31, device: 2, ignored: DefaultIgnoredXIDs()},
		"benign made critical": {xid: 31, device: 2, ignored: nil, wantUnhealthy: []int32{2}},
		"XID without device":   {xid: 48, device: -1, ignored: DefaultIgnoredXIDs(), wantUnhealthy: []int32{0, 1, 2, 3, 4, 5, 6, 7}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := newMachine(t)
			b := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: t.TempDir(), IgnoredXIDs: tc.ignored})
			ctx, cancel := context.WithCancel(t.Context())
			changed := make(chan struct{}, 1)
			done := make(chan error)
			go func() {
				done <- b.WatchHealth(ctx, func() {
					select {
					case changed <- struct{}{}:
					default:
					}
				})
			}()
			e := nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: tc.xid}
			if tc.device >= 0 {
				e.Device = m.server.Devices[tc.device]
			}
			m.events <- e
			// A second event, of a type the agent does not act on, shows the
			// first was consumed.
			m.events <- nvml.EventData{EventType: nvml.EventTypeSingleBitEccError, Device: m.server.Devices[0]}
			deadline := time.After(10 * time.Second)
			for len(m.events) > 0 {
				select {
				case <-deadline:
					t.Fatal("events were not consumed")
				case <-time.After(10 * time.Millisecond):
				}
			}
			if len(tc.wantUnhealthy) > 0 {
				select {
				case <-changed:
				case <-deadline:
					t.Fatal("WatchHealth did not report the change")
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Errorf("WatchHealth: %v", err)
			}
			snap, err := b.Snapshot(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var got []int32
			for _, d := range snap.Devices {
				if d.Health == v1alpha1.DeviceUnhealthy {
					got = append(got, d.Index)
					if !strings.Contains(d.HealthReason, fmt.Sprintf("XID %d", tc.xid)) {
						t.Errorf("device %d reason %q does not name XID %d", d.Index, d.HealthReason, tc.xid)
					}
				}
			}
			if diff := cmp.Diff(tc.wantUnhealthy, got); diff != "" {
				t.Errorf("unhealthy devices (-want,+got):\n%s", diff)
			}
			if want := int64(8-len(tc.wantUnhealthy)) * 1000; capacityMilli(devicesOf(snap)) != want {
				t.Errorf("capacity = %d, want %d", capacityMilli(devicesOf(snap)), want)
			}
		})
	}
}

func TestNVMLProcessesMapToPods(t *testing.T) {
	procRoot := t.TempDir()
	const uid = "0c1d2e3f-1111-2222-3333-444455556666"
	cid := strings.Repeat("ab", 32)
	writeCgroup := func(pid int, content string) {
		dir := filepath.Join(procRoot, fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeCgroup(4242, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+strings.ReplaceAll(uid, "-", "_")+".slice/cri-containerd-"+cid+".scope\n")
	writeCgroup(4343, "0::/user.slice/user-0.slice/session-1.scope\n")
	m := newMachine(t)
	m.setProcs(1,
		nvml.ProcessInfo{Pid: 4242, UsedGpuMemory: 3 << 30},
		nvml.ProcessInfo{Pid: 4343, UsedGpuMemory: 1 << 30},
		nvml.ProcessInfo{Pid: 4444, UsedGpuMemory: 1 << 20}, // gone, or not visible without hostPID
	)
	snap, err := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: t.TempDir(), ProcRoot: procRoot}).Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []Process{
		{PID: 4242, DeviceIndex: 1, MemoryBytes: 3 << 30, PodUID: types.UID(uid), ContainerID: cid},
		{PID: 4343, DeviceIndex: 1, MemoryBytes: 1 << 30},
		{PID: 4444, DeviceIndex: 1, MemoryBytes: 1 << 20},
	}
	if diff := cmp.Diff(want, snap.Processes); diff != "" {
		t.Errorf("processes (-want,+got):\n%s", diff)
	}
}

// TestWatchdogKillRechecksTheProcess runs the watchdog's kill on NVML with a
// real process: between the snapshot that measured it and the kill, the
// process's PID comes to name a process of another pod (its cgroup, in an
// injected /proc, changes). The kill is refused and says why; once the PID
// names the measured process again, it is killed.
func TestWatchdogKillRechecksTheProcess(t *testing.T) {
	const uid = "0c1d2e3f-1111-2222-3333-444455556666"
	const other = "9f8e7d6c-1111-2222-3333-444455556666"
	cid := strings.Repeat("ab", 32)
	c := startChild(t)
	procRoot := t.TempDir()
	dir := filepath.Join(procRoot, fmt.Sprint(c.pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	inPod := func(uid string) string {
		return "0::/kubepods.slice/kubepods-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice/cri-containerd-" + cid + ".scope\n"
	}
	write("stat", string(stat))
	write("cgroup", inPod(uid))

	m := newMachine(t)
	m.setProcs(0, nvml.ProcessInfo{Pid: uint32(c.pid), UsedGpuMemory: 30 << 30})
	b := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: t.TempDir(), ProcRoot: procRoot})
	b.selfProcRoot = procRoot
	snap, err := b.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.Processes[0]; got.StartTicks != c.start || got.PodUID != uid {
		t.Fatalf("snapshot saw process %+v, want start tick %d in pod %s", got, c.start, uid)
	}
	clk := testingclock.NewFakeClock(time.Now())
	rec := &recorder{}
	metrics := NewMetrics()
	w := newWatchdog("n1", EnforceKill, time.Minute, clk, rec, b, metrics)
	held := heldOn("n1", h100(8), withUID(heldPod("hog", "n1", "20Gi", 0), uid))

	// The PID now names a process of another pod.
	write("cgroup", inPod(other))
	w.check(t.Context(), held, snap.Processes)
	events := rec.take()
	if len(events) != 1 || !strings.Contains(events[0], "could not end a process") || !strings.Contains(events[0], "process changed") {
		t.Errorf("events %q, want one saying the process changed and was not ended", events)
	}
	if !c.alive() {
		t.Fatal("a process of another pod was killed")
	}
	if got := testutil.ToFloat64(metrics.killErrors.WithLabelValues("n1")); got != 1 {
		t.Errorf("partita_gpu_overuse_kill_errors_total = %v, want 1", got)
	}

	// It is the measured process again: the next action kills it.
	write("cgroup", inPod(uid))
	clk.Step(time.Minute)
	w.check(t.Context(), held, snap.Processes)
	if events := rec.take(); len(events) != 1 || !strings.Contains(events[0], fmt.Sprintf("ended process %d", c.pid)) {
		t.Errorf("events %q, want one saying process %d was ended", events, c.pid)
	}
	if err := c.waitExit(t); err == nil {
		t.Error("the measured process exited cleanly; want it killed")
	}
}

// TestNVMLHealthMarksSurviveRestarts: a device NVML lost, or one a critical
// XID hit, stays unhealthy in a backend started again on the same boot
// (the agent restarted), not after a reboot, and not once an operator
// resets it.
func TestNVMLHealthMarksSurviveRestarts(t *testing.T) {
	dir := t.TempDir()
	m := newMachine(t)
	newBackend := func(boot string) *NVML {
		return newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: t.TempDir(), StateDir: dir, BootID: boot})
	}
	unhealthy := func(b *NVML) map[int32]string {
		t.Helper()
		snap, err := b.Snapshot(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		out := map[int32]string{}
		for _, d := range snap.Devices {
			if d.Health != v1alpha1.DeviceHealthy {
				out[d.Index] = d.HealthReason
			}
		}
		return out
	}
	first := newBackend("boot-1")
	if got := unhealthy(first); len(got) != 0 {
		t.Fatalf("unhealthy at start: %v", got)
	}
	if !first.markUnhealthy([]string{m.device(2).UUID}, "XID 79 (critical error)") {
		t.Fatal("marking device 2 changed nothing")
	}
	lost := m.device(5).GetMemoryInfoFunc
	m.device(5).GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	want := map[int32]string{2: "XID 79 (critical error)", 5: "GPU is lost (NVML GetMemoryInfo: ERROR_GPU_IS_LOST)"}
	if diff := cmp.Diff(want, unhealthy(first)); diff != "" {
		t.Fatalf("unhealthy after the faults (-want,+got):\n%s", diff)
	}
	m.device(5).GetMemoryInfoFunc = lost // a later call works, but the device needs a reset

	// The agent restarts on the same boot: both stay unhealthy.
	restarted := newBackend("boot-1")
	if diff := cmp.Diff(want, unhealthy(restarted)); diff != "" {
		t.Errorf("unhealthy after a restart (-want,+got):\n%s", diff)
	}
	// After a reboot the GPUs were reset: the marks are gone.
	if got := unhealthy(newBackend("boot-2")); len(got) != 0 {
		t.Errorf("unhealthy after a reboot: %v, want none", got)
	}

	// An operator resets device 5 (by index): only it takes work again, in
	// this run and the next.
	restarted = newBackend("boot-1")
	cleared, err := restarted.ResetHealth(DeviceSelector{Indexes: []int32{5}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{m.device(5).UUID}, cleared); diff != "" {
		t.Errorf("cleared (-want,+got):\n%s", diff)
	}
	want = map[int32]string{2: "XID 79 (critical error)"}
	if diff := cmp.Diff(want, unhealthy(restarted)); diff != "" {
		t.Errorf("unhealthy after resetting device 5 (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff(want, unhealthy(newBackend("boot-1"))); diff != "" {
		t.Errorf("unhealthy in the next run (-want,+got):\n%s", diff)
	}
	// "all" by UUID-less selector clears the rest.
	if cleared, err := restarted.ResetHealth(DeviceSelector{All: true}); err != nil || len(cleared) != 1 {
		t.Errorf("reset all cleared %v (%v), want device 2", cleared, err)
	}
	if got := unhealthy(newBackend("boot-1")); len(got) != 0 {
		t.Errorf("unhealthy after resetting all: %v", got)
	}
}

// TestNVMLHealthMarksFileDamaged: a state file that does not read does not
// keep the agent from serving.
func TestNVMLHealthMarksFileDamaged(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, healthStateFile), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := newMachine(t)
	b := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: t.TempDir(), StateDir: dir, BootID: "b"})
	snap, err := b.Snapshot(t.Context())
	if err != nil || capacityMilli(devicesOf(snap)) != 8000 {
		t.Fatalf("Snapshot with a damaged state file: %v", err)
	}
	b.markUnhealthy([]string{m.device(1).UUID}, "XID 48 (critical error)")
	marks, err := loadHealthMarks(dir, "b")
	if err != nil || marks[m.device(1).UUID].Reason != "XID 48 (critical error)" {
		t.Errorf("marks saved over the damaged file = %v (%v)", marks, err)
	}
}

// TestNVMLDeviceThatDoesNotOpen: a device NVML counts but cannot open at
// start-up is reported Unhealthy with the reason, not dropped, and joins
// once it opens.
func TestNVMLDeviceThatDoesNotOpen(t *testing.T) {
	cases := map[string]struct {
		breakIt    func(m *machine)
		wantReason string
	}{
		"handle": {
			breakIt: func(m *machine) {
				open := m.server.DeviceGetHandleByIndexFunc
				m.server.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
					if i == 3 && m.broken.Load() {
						return nil, nvml.ERROR_UNKNOWN
					}
					return open(i)
				}
			},
			wantReason: "NVML cannot open device 3: ERROR_UNKNOWN",
		},
		"UUID": {
			breakIt: func(m *machine) {
				uuid := m.device(3).GetUUIDFunc
				m.device(3).GetUUIDFunc = func() (string, nvml.Return) {
					if m.broken.Load() {
						return "", nvml.ERROR_GPU_IS_LOST
					}
					return uuid()
				}
			},
			wantReason: "NVML cannot describe device 3: read UUID of device 3: ERROR_GPU_IS_LOST",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := newMachine(t)
			m.broken.Store(true)
			tc.breakIt(m)
			b := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: t.TempDir()})
			snap, err := b.Snapshot(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(snap.Devices) != 8 {
				t.Fatalf("%d devices, want all 8 (the broken one too)", len(snap.Devices))
			}
			want := v1alpha1.GPUDevice{Index: 3, Health: v1alpha1.DeviceUnhealthy, HealthReason: tc.wantReason, MIGMode: v1alpha1.MIGUnsupported}
			if diff := cmp.Diff(want, snap.Devices[3].GPUDevice); diff != "" {
				t.Errorf("device 3 (-want,+got):\n%s", diff)
			}
			if got := capacityMilli(devicesOf(snap)); got != 7000 {
				t.Errorf("capacity = %d, want 7000", got)
			}
			m.broken.Store(false)
			if snap, err = b.Snapshot(t.Context()); err != nil {
				t.Fatal(err)
			}
			if d := snap.Devices[3]; d.UUID != m.device(3).UUID || d.Health != v1alpha1.DeviceHealthy {
				t.Errorf("device 3 once it opens = %+v, want healthy with its UUID", d.GPUDevice)
			}
		})
	}
}
