package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// fakeRunner stands in for the MPS programs: it records what it is asked
// to run, and its daemons run until stopped or made to die.
type fakeRunner struct {
	lock    sync.Mutex
	starts  []string // UUIDs of started daemons, in order
	runs    []string // "<UUID>: <stdin>" of control commands
	daemons map[string]*fakeDaemon
}

type fakeDaemon struct {
	once    sync.Once
	exit    chan error
	stopped bool
}

func (d *fakeDaemon) Wait() error { return <-d.exit }
func (d *fakeDaemon) Stop()       { d.end(nil, true) }
func (d *fakeDaemon) end(err error, stopped bool) {
	d.once.Do(func() { d.stopped = stopped; d.exit <- err })
}

func envValue(env []string, key string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key+"="); ok {
			return v
		}
	}
	return ""
}

func (r *fakeRunner) Start(_ context.Context, c Command) (RunningCommand, error) {
	r.lock.Lock()
	defer r.lock.Unlock()
	uuid := envValue(c.Env, "CUDA_VISIBLE_DEVICES")
	if !slices.Equal(c.Args, []string{"-f"}) || !strings.HasSuffix(envValue(c.Env, "CUDA_MPS_PIPE_DIRECTORY"), uuid+"/pipe") || len(c.Dirs) != 2 {
		return nil, fmt.Errorf("unexpected daemon command %+v", c)
	}
	d := &fakeDaemon{exit: make(chan error, 1)}
	r.starts = append(r.starts, uuid)
	r.daemons[uuid] = d
	return d, nil
}

func (r *fakeRunner) Run(_ context.Context, c Command, stdin string) ([]byte, error) {
	r.lock.Lock()
	defer r.lock.Unlock()
	pipe := envValue(c.Env, "CUDA_MPS_PIPE_DIRECTORY")
	uuid := pipe[strings.LastIndex(strings.TrimSuffix(pipe, "/pipe"), "/")+1 : len(pipe)-len("/pipe")]
	r.runs = append(r.runs, uuid+": "+strings.ReplaceAll(strings.TrimSpace(stdin), "\n", "; "))
	return nil, nil
}

func (r *fakeRunner) snapshot() (starts, runs []string) {
	r.lock.Lock()
	defer r.lock.Unlock()
	return slices.Clone(r.starts), slices.Clone(r.runs)
}

func (r *fakeRunner) daemon(uuid string) *fakeDaemon {
	r.lock.Lock()
	defer r.lock.Unlock()
	return r.daemons[uuid]
}

// eventually polls cond for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestMPSDaemons(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	r := &fakeRunner{daemons: map[string]*fakeDaemon{}}
	metrics := NewMetrics()
	m := newMPSManager("n1", MPSConfig{ControlPath: "mps-control", Dir: "/run/mps", Runner: r}, clk, metrics)
	a := mpsTarget{Index: 0, UUID: "GPU-a", DefaultMemLimitMiB: 81559, DefaultThreadPercent: 100}
	b := mpsTarget{Index: 1, UUID: "GPU-b", DefaultMemLimitMiB: 61079, DefaultThreadPercent: 75}
	limitsA := "GPU-a: set_default_active_thread_percentage 100; set_default_device_pinned_mem_limit 0 81559M"
	limitsB := "GPU-b: set_default_active_thread_percentage 75; set_default_device_pinned_mem_limit 0 61079M"

	// One daemon per device, each with its limits.
	m.ensure(t.Context(), []mpsTarget{a, b})
	eventually(t, "both daemons started with their limits", func() bool { _, runs := r.snapshot(); return len(runs) == 2 })
	starts, runs := r.snapshot()
	slices.Sort(starts)
	slices.Sort(runs)
	if diff := cmp.Diff([]string{"GPU-a", "GPU-b"}, starts); diff != "" {
		t.Errorf("started (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{limitsA, limitsB}, runs); diff != "" {
		t.Errorf("control commands (-want,+got):\n%s", diff)
	}

	// A daemon that dies is started again after a backoff, with its limits.
	r.daemon("GPU-a").end(errors.New("exit status 1"), false)
	eventually(t, "the supervisor waits to restart", clk.HasWaiters)
	clk.Step(time.Second)
	eventually(t, "GPU-a restarted", func() bool { s, _ := r.snapshot(); return len(s) == 3 })
	eventually(t, "GPU-a limits applied again", func() bool { _, runs := r.snapshot(); return len(runs) == 3 })
	if _, runs := r.snapshot(); runs[2] != limitsA {
		t.Errorf("after restart sent %q, want %q", runs[2], limitsA)
	}
	if got := testutil.ToFloat64(metrics.mpsRestarts.WithLabelValues("n1", "0")); got != 1 {
		t.Errorf("partita_mps_daemon_restarts_total = %v, want 1", got)
	}

	// Changed limits reach the running daemon; unchanged ones send nothing.
	b.DefaultMemLimitMiB = 40960
	m.ensure(t.Context(), []mpsTarget{a, b})
	eventually(t, "new limits sent", func() bool { _, runs := r.snapshot(); return len(runs) == 4 })
	if _, runs := r.snapshot(); runs[3] != "GPU-b: set_default_active_thread_percentage 75; set_default_device_pinned_mem_limit 0 40960M" {
		t.Errorf("sent %q for the changed limits", runs[3])
	}

	// A device no longer shared loses its daemon: quit, then stop.
	oldA := r.daemon("GPU-a")
	m.ensure(t.Context(), []mpsTarget{b})
	if !oldA.stopped {
		t.Error("GPU-a's daemon was not stopped")
	}
	if _, runs := r.snapshot(); runs[len(runs)-1] != "GPU-a: quit" {
		t.Errorf("last control command %q, want GPU-a: quit", runs[len(runs)-1])
	}
	m.stopAll()
	if !r.daemon("GPU-b").stopped {
		t.Error("GPU-b's daemon was not stopped")
	}
	if starts, _ := r.snapshot(); len(starts) != 3 {
		t.Errorf("%d daemon starts, want 3 (no restart after a stop)", len(starts))
	}
}

func TestMPSTargets(t *testing.T) {
	devices := []v1alpha1.GPUDevice{
		{Index: 0, UUID: "GPU-0", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy},
		{Index: 1, UUID: "GPU-1", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy},
		{Index: 2, UUID: "GPU-2", MemoryMiB: 81559, Health: v1alpha1.DeviceUnhealthy},
		{Index: 3, UUID: "GPU-3", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy, MIGMode: v1alpha1.MIGEnabled},
		{Index: 4, UUID: "GPU-4", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy},
	}
	held := heldOn("n1", h100(8),
		withUID(heldPod("a", "n1", "20Gi", 1), "a"),
		withUID(heldPod("b", "n1", "0.5", 1), "b"),
		withUID(heldPod("w", "n1", "1", 4), "w"),
	)
	want := []mpsTarget{
		{Index: 0, UUID: "GPU-0", DefaultMemLimitMiB: 81559, DefaultThreadPercent: 100},
		// 20Gi (252 milli) and half (500 milli, 40779MiB) are claimed.
		{Index: 1, UUID: "GPU-1", DefaultMemLimitMiB: 81559 - 20480 - 40779, DefaultThreadPercent: 100 - (252+500)/10},
	}
	if diff := cmp.Diff(want, mpsTargets(devices, held)); diff != "" {
		t.Errorf("targets (-want,+got):\n%s", diff)
	}
}

// TestTryMPSWithExecRunner runs the real runner against a stand-in for
// nvidia-cuda-mps-control: daemons start in their directories, take their
// limits, answer, and quit.
func TestTryMPSWithExecRunner(t *testing.T) {
	control, err := filepath.Abs("testdata/fake-mps-control")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	inv, err := Discover(t.Context(), "n1", "simulated", NewSimulated("n1", h100(2)))
	if err != nil {
		t.Fatal(err)
	}
	if err := TryMPS(t.Context(), MPSConfig{ControlPath: control, Dir: dir, Runner: ExecRunner{}}, inv, 10*time.Second); err != nil {
		t.Fatalf("TryMPS: %v", err)
	}
	for _, d := range inv.Devices {
		b, err := os.ReadFile(filepath.Join(dir, d.UUID, "pipe", "default_device_pinned_mem_limit"))
		if err != nil || strings.TrimSpace(string(b)) != "0 81559M" {
			t.Errorf("device %d pinned memory default = %q (%v), want 0 81559M", d.Index, b, err)
		}
		if _, err := os.Stat(filepath.Join(dir, d.UUID, "pipe", "daemon.pid")); !os.IsNotExist(err) {
			t.Errorf("device %d's daemon did not quit (%v)", d.Index, err)
		}
	}
	// Without daemons, the check fails and says so.
	err = TryMPS(t.Context(), MPSConfig{ControlPath: "/bin/false", Dir: t.TempDir(), Runner: ExecRunner{}}, inv, time.Second)
	if err == nil {
		t.Error("TryMPS succeeded with a control program that always fails")
	}
}
