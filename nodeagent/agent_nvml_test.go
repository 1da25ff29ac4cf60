//go:build cgo

package nodeagent

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

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
	waitFor(t, "device 5 out of the capacity", func() (bool, error) { return milliOf(t, c, "dgx") == "7000/7000", nil })
	gn, err := gpuNode(t, c, "dgx")
	if err != nil {
		t.Fatal(err)
	}
	if d := gn.Status.Devices[5]; d.Health != v1alpha1.DeviceUnhealthy || !strings.Contains(d.HealthReason, "XID 79") || gn.Status.HealthyDevices != 7 {
		t.Errorf("device 5 = %s (%q), healthy devices %d; want Unhealthy for XID 79 and 7 healthy", d.Health, d.HealthReason, gn.Status.HealthyDevices)
	}
}
