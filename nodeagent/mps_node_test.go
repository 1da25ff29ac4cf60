package nodeagent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// stubbornModes is a backend whose devices refuse compute mode changes, as
// NVML does without the needed privileges.
type stubbornModes struct{ *Simulated }

func (stubbornModes) SetComputeMode(context.Context, int32, ComputeMode) error {
	return errors.New("Insufficient Permissions")
}

func mpsTestAgent(t *testing.T, runner CommandRunner) (*Agent, *recorder) {
	t.Helper()
	rec := &recorder{}
	clk := testingclock.NewFakeClock(time.Now())
	return &Agent{
		opts:     Options{Clock: clk, Metrics: NewMetrics(), MPS: MPSConfig{ControlPath: "mps-control", Dir: "/run/mps", StateDir: t.TempDir(), Runner: runner}},
		recorder: rec, simRunner: NewSimulatedRunner(),
	}, rec
}

func gpuDevicesOf(t *testing.T, b Backend) []v1alpha1.GPUDevice {
	t.Helper()
	snap, err := b.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]v1alpha1.GPUDevice, len(snap.Devices))
	for i, d := range snap.Devices {
		out[i] = d.GPUDevice
	}
	return out
}

func modes(t *testing.T, b ComputeModeSetter, n int) []ComputeMode {
	t.Helper()
	var out []ComputeMode
	for i := range n {
		m, err := b.ComputeMode(t.Context(), int32(i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

// TestMPSComputeModes: devices with a daemon go to EXCLUSIVE_PROCESS, and
// back to DEFAULT when the daemon goes (held whole, the node leaves mps
// mode); MPSReady says whether the daemons run.
func TestMPSComputeModes(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	a, rec := mpsTestAgent(t, newFakeRunner())
	// As real hardware: the agent keeps its state directory for it.
	sim := hardware{NewSimulated("n1", h100(2))}
	st := &nodeState{name: "n1", backend: sim, ctx: ctx}
	devices := gpuDevicesOf(t, sim)
	defer func() {
		if st.mps != nil {
			st.mps.stopAll(ctx)
		}
	}()

	c := a.applyMode(ctx, st, v1alpha1.IsolationMPS, devices, nil)
	if diff := cmp.Diff([]ComputeMode{ComputeModeExclusiveProcess, ComputeModeExclusiveProcess}, modes(t, sim, 2)); diff != "" {
		t.Errorf("compute modes in mps mode (-want,+got):\n%s", diff)
	}
	eventually(t, "daemons running and MPSReady True", func() bool {
		c = a.applyMode(ctx, st, v1alpha1.IsolationMPS, devices, nil)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonMPSRunning
	})

	// Device 1 is held whole: no daemon, DEFAULT again.
	held := heldOn("n1", h100(2), withUID(heldPod("w", "n1", "1", 1), "w"))
	a.applyMode(ctx, st, v1alpha1.IsolationMPS, devices, held)
	if diff := cmp.Diff([]ComputeMode{ComputeModeExclusiveProcess, ComputeModeDefault}, modes(t, sim, 2)); diff != "" {
		t.Errorf("compute modes with device 1 held whole (-want,+got):\n%s", diff)
	}

	// A restarted agent remembers which devices it set (state directory)
	// and puts them back when the node leaves mps mode.
	st2 := &nodeState{name: "n1", backend: sim, ctx: ctx, mps: st.mps, mpsChecked: true}
	st.mps = nil
	if c := a.applyMode(ctx, st2, v1alpha1.IsolationTimeSlicing, devices, nil); c != nil {
		t.Errorf("condition %v outside mps mode, want none", c)
	}
	if diff := cmp.Diff([]ComputeMode{ComputeModeDefault, ComputeModeDefault}, modes(t, sim, 2)); diff != "" {
		t.Errorf("compute modes after leaving mps mode (-want,+got):\n%s", diff)
	}
	if len(rec.events) != 0 {
		t.Errorf("events %q, want none", rec.events)
	}
}

// TestMPSReadyTellsWhatDoesNotHold: status never says mps is in force when
// it is not.
func TestMPSReadyTellsWhatDoesNotHold(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	t.Run("compute mode refused", func(t *testing.T) {
		a, rec := mpsTestAgent(t, newFakeRunner())
		b := stubbornModes{NewSimulated("n1", h100(1))}
		st := &nodeState{name: "n1", backend: b, ctx: ctx}
		defer func() { st.mps.stopAll(ctx) }()
		devices := gpuDevicesOf(t, b)
		var c *metav1.Condition
		eventually(t, "MPSReady False for the compute mode", func() bool {
			c = a.applyMode(ctx, st, v1alpha1.IsolationMPS, devices, nil)
			return c.Reason == v1alpha1.ReasonComputeModeNotExclusive
		})
		if c.Status != metav1.ConditionFalse {
			t.Errorf("MPSReady %s, want False", c.Status)
		}
		conds := a.statusConditions(st, nil, c)
		if len(conds) != 1 || len(rec.events) != 1 {
			t.Errorf("conditions %v, events %q; want MPSReady and one MPSNotReady event", conds, rec.events)
		}
	})

	t.Run("keeper not running", func(t *testing.T) {
		a, _ := mpsTestAgent(t, newFakeRunner())
		a.opts.MPS.Keeper = true
		b := stubbornModes{NewSimulated("n1", h100(1))}
		st := &nodeState{name: "n1", backend: b, ctx: ctx}
		c := a.applyMode(ctx, st, v1alpha1.IsolationMPS, gpuDevicesOf(t, b), nil)
		if c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonMPSNotRunning {
			t.Errorf("MPSReady %s/%s (%s), want False/%s", c.Status, c.Reason, c.Message, v1alpha1.ReasonMPSNotRunning)
		}
	})

	t.Run("slices over several devices", func(t *testing.T) {
		plan := mpsPlan{spanned: []int32{0, 1}}
		for _, tc := range []struct {
			interposer bool
			want       string
		}{
			{false, "their slices are limited by the watchdog alone"},
			{true, "their slices are capped by the interposer (HAMi-core) when they span devices"},
		} {
			c := mpsCondition(plan, nil, nil, false, tc.interposer)
			if c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonSlicesSpanDevices || !strings.Contains(c.Message, tc.want) {
				t.Errorf("interposer %v: MPSReady %s/%s (%s), want False/%s saying %q", tc.interposer, c.Status, c.Reason, c.Message, v1alpha1.ReasonSlicesSpanDevices, tc.want)
			}
		}
	})
}
