//go:build cgo

package nodeagent

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/client-go/util/retry"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// TestAgentOnNVML runs the agent on go-nvml's DGX H100 mock: NVML fails to
// load at first (the agent says why, is not ready, and publishes no
// capacity), then loads; later a critical XID takes one device, and its
// capacity, away at once.
func TestAgentOnNVML(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	createNode(t, c, "dgx", nil)
	m := newMachine(t)
	var broken atomic.Bool
	broken.Store(true)
	m.server.InitFunc = func() nvml.Return {
		if broken.Load() {
			return nvml.ERROR_DRIVER_NOT_LOADED
		}
		return nvml.SUCCESS
	}
	metrics := NewMetrics()
	b := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: fakeSys(t), IgnoredXIDs: DefaultIgnoredXIDs(), OnError: metrics.NVMLError})
	a, _ := runAgent(t, cfg, Options{NodeName: "dgx", Backends: StaticBackend(b), Metrics: metrics})

	waitFor(t, "the agent to say NVML is missing", func() (bool, error) {
		err := a.Ready()
		return err != nil && strings.Contains(err.Error(), "kernel driver is not loaded"), err
	})
	waitFor(t, "no capacity while NVML is missing", func() (bool, error) { return milliOf(t, c, "dgx") == "0/0", nil })

	broken.Store(false)
	waitFor(t, "the agent to recover", func() (bool, error) { return a.Ready() == nil, a.Ready() })
	waitFor(t, "8 GPUs of capacity", func() (bool, error) { return milliOf(t, c, "dgx") == "8000/8000", nil })

	m.events <- nvml.EventData{Device: m.server.Devices[5], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	var gn *v1alpha1.GPUNode
	// The capacity is set before the GPUNode is published: wait for both.
	waitFor(t, "device 5 out of the capacity and the GPUNode", func() (bool, error) {
		var err error
		if gn, err = gpuNode(t, c, "dgx"); err != nil {
			return false, err
		}
		return milliOf(t, c, "dgx") == "7000/7000" && gn.Status.HealthyDevices == 7, fmt.Errorf("capacity %s, %d healthy devices", milliOf(t, c, "dgx"), gn.Status.HealthyDevices)
	})
	if d := gn.Status.Devices[5]; d.Health != v1alpha1.DeviceUnhealthy || !strings.Contains(d.HealthReason, "XID 79") || gn.Status.HealthyDevices != 7 {
		t.Errorf("device 5 = %s (%q), healthy devices %d; want Unhealthy for XID 79 and 7 healthy", d.Health, d.HealthReason, gn.Status.HealthyDevices)
	}
}

// TestAgentKeepsBrokenDevicesAcrossRestarts: a device NVML cannot open when
// the agent starts again is published Unhealthy under the UUID the node
// published for it before (so pods holding it keep counting against it); a
// device a critical XID took stays out of the capacity after a restart, and
// comes back when an operator annotates the GPUNode with
// partita.dev/reset-health.
func TestAgentKeepsBrokenDevicesAcrossRestarts(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	createNode(t, c, "dgx", nil)
	stateDir := t.TempDir()
	m := newMachine(t)
	open := m.server.DeviceGetHandleByIndexFunc
	m.server.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 3 && m.broken.Load() {
			return nil, nvml.ERROR_UNKNOWN
		}
		return open(i)
	}
	start := func() (*recorder, func()) {
		b := newNVMLWithLibrary(m.server, NVMLConfig{SysRoot: fakeSys(t), StateDir: stateDir, BootID: "boot-1", IgnoredXIDs: DefaultIgnoredXIDs()})
		rec := &recorder{}
		_, stop := runAgent(t, cfg, Options{NodeName: "dgx", Backends: StaticBackend(b), Recorder: rec})
		return rec, stop
	}
	device := func(i int) v1alpha1.GPUDevice {
		t.Helper()
		gn, err := gpuNode(t, c, "dgx")
		if err != nil || len(gn.Status.Devices) != 8 {
			t.Fatalf("GPUNode dgx: %v (%d devices)", err, len(gn.Status.Devices))
		}
		return gn.Status.Devices[i]
	}

	_, stop := start()
	waitFor(t, "8 GPUs of capacity", func() (bool, error) { return milliOf(t, c, "dgx") == "8000/8000", nil })
	m.events <- nvml.EventData{Device: m.server.Devices[5], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	waitFor(t, "device 5 out of the capacity", func() (bool, error) { return milliOf(t, c, "dgx") == "7000/7000", nil })
	stop()

	// Restarted with device 3 broken: it keeps its UUID, unhealthy; device 5
	// is still out.
	m.broken.Store(true)
	rec, _ := start()
	// The agent sets the node's capacity before it publishes the GPUNode:
	// wait for both.
	waitFor(t, "devices 3 and 5 out of the capacity and unhealthy in the GPUNode", func() (bool, error) {
		if got := milliOf(t, c, "dgx"); got != "6000/6000" {
			return false, fmt.Errorf("capacity %s", got)
		}
		return device(3).Health == v1alpha1.DeviceUnhealthy && device(5).Health == v1alpha1.DeviceUnhealthy,
			fmt.Errorf("device 3 %s, device 5 %s", device(3).Health, device(5).Health)
	})
	if d := device(3); d.UUID != m.device(3).UUID || d.Health != v1alpha1.DeviceUnhealthy || !strings.Contains(d.HealthReason, "NVML cannot open device 3") {
		t.Errorf("device 3 = %+v, want its old UUID %s, Unhealthy because NVML cannot open it", d, m.device(3).UUID)
	}
	if d := device(5); d.Health != v1alpha1.DeviceUnhealthy || !strings.Contains(d.HealthReason, "XID 79") {
		t.Errorf("device 5 after the restart = %s (%q), want Unhealthy for XID 79", d.Health, d.HealthReason)
	}

	// The operator reset GPU 5. (The agent writes the GPUNode too: an
	// operator's update that meets its write is made again.)
	annotate := func(value string) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			gn, err := gpuNode(t, c, "dgx")
			if err != nil {
				return err
			}
			gn.Annotations = map[string]string{v1alpha1.AnnotationResetHealth: value}
			return c.Update(t.Context(), gn)
		}); err != nil {
			t.Fatal(err)
		}
	}
	annotate("5")
	waitFor(t, "device 5 back in the capacity", func() (bool, error) { return milliOf(t, c, "dgx") == "7000/7000", nil })
	waitFor(t, "the annotation removed", func() (bool, error) {
		gn, err := gpuNode(t, c, "dgx")
		return err == nil && gn.Annotations[v1alpha1.AnnotationResetHealth] == "", err
	})
	events := strings.Join(rec.take(), "\n")
	if !strings.Contains(events, "Normal HealthReset /dgx: partita.dev/reset-health=5: forgot the faults of "+m.device(5).UUID) {
		t.Errorf("events:\n%s\nwant a HealthReset for device 5", events)
	}

	// A value that does not read is refused, with an event, and removed.
	annotate("five")
	waitFor(t, "the bad annotation removed", func() (bool, error) {
		gn, err := gpuNode(t, c, "dgx")
		return err == nil && gn.Annotations[v1alpha1.AnnotationResetHealth] == "", err
	})
	if events := strings.Join(rec.take(), "\n"); !strings.Contains(events, "Warning HealthResetRefused") {
		t.Errorf("events:\n%s\nwant a HealthResetRefused", events)
	}
}
