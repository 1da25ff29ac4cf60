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
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// fakeRunner stands in for the MPS programs and the process table: it
// records what it is asked to run, and its daemons run until sent quit,
// signalled, or made to die.
type fakeRunner struct {
	lock     sync.Mutex
	next     int
	daemons  map[string]DaemonProcess // live, by UUID
	launches []string                 // UUIDs of launched daemons, in order
	runs     []string                 // "<UUID>: <stdin>" of control commands
}

func newFakeRunner() *fakeRunner { return &fakeRunner{next: 100, daemons: map[string]DaemonProcess{}} }

func envValue(env []string, key string) string {
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key+"="); ok {
			return v
		}
	}
	return ""
}

// uuidOfPipe is the device of a pipe directory <dir>/<UUID>/pipe.
func uuidOfPipe(pipe string) string { return filepath.Base(filepath.Dir(pipe)) }

func (r *fakeRunner) Launch(_ context.Context, c Command) error {
	r.lock.Lock()
	defer r.lock.Unlock()
	uuid := envValue(c.Env, "CUDA_VISIBLE_DEVICES")
	if !slices.Equal(c.Args, []string{"-d"}) || uuidOfPipe(envValue(c.Env, "CUDA_MPS_PIPE_DIRECTORY")) != uuid || len(c.Dirs) != 2 {
		return fmt.Errorf("unexpected daemon command %+v", c)
	}
	r.next++
	r.daemons[uuid] = DaemonProcess{PID: r.next, StartTicks: uint64(r.next)}
	r.launches = append(r.launches, uuid)
	return nil
}

func (r *fakeRunner) Run(_ context.Context, c Command, stdin string) ([]byte, error) {
	r.lock.Lock()
	defer r.lock.Unlock()
	uuid := uuidOfPipe(envValue(c.Env, "CUDA_MPS_PIPE_DIRECTORY"))
	r.runs = append(r.runs, uuid+": "+strings.ReplaceAll(strings.TrimSpace(stdin), "\n", "; "))
	if _, ok := r.daemons[uuid]; !ok {
		return []byte("Cannot find MPS control daemon process"), errors.New("exit status 1")
	}
	if strings.TrimSpace(stdin) == "quit" {
		delete(r.daemons, uuid)
	}
	return nil, nil
}

func (r *fakeRunner) Find(pipeDir, _ string) (DaemonProcess, bool) {
	r.lock.Lock()
	defer r.lock.Unlock()
	p, ok := r.daemons[uuidOfPipe(pipeDir)]
	return p, ok
}

func (r *fakeRunner) Alive(p DaemonProcess) bool {
	r.lock.Lock()
	defer r.lock.Unlock()
	for _, d := range r.daemons {
		if d == p {
			return true
		}
	}
	return false
}

func (r *fakeRunner) Signal(p DaemonProcess, _ syscall.Signal) error {
	r.lock.Lock()
	defer r.lock.Unlock()
	for uuid, d := range r.daemons {
		if d == p {
			delete(r.daemons, uuid)
			return nil
		}
	}
	return ErrProcessNotFound
}

// die ends a device's daemon as a crash would.
func (r *fakeRunner) die(uuid string) {
	r.lock.Lock()
	defer r.lock.Unlock()
	delete(r.daemons, uuid)
}

func (r *fakeRunner) alive(uuid string) bool {
	r.lock.Lock()
	defer r.lock.Unlock()
	_, ok := r.daemons[uuid]
	return ok
}

func (r *fakeRunner) snapshot() (launches, runs []string) {
	r.lock.Lock()
	defer r.lock.Unlock()
	return slices.Clone(r.launches), slices.Clone(r.runs)
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
	r := newFakeRunner()
	metrics := NewMetrics()
	cfg := MPSConfig{ControlPath: "mps-control", Dir: "/run/mps", StateDir: t.TempDir(), Runner: r}
	ctx := t.Context()
	m := newMPSManager(ctx, "n1", cfg, clk, metrics)
	a := mpsTarget{Index: 0, UUID: "GPU-a", DefaultMemLimitMiB: 81559, DefaultThreadPercent: 100}
	b := mpsTarget{Index: 1, UUID: "GPU-b", DefaultMemLimitMiB: 61079, DefaultThreadPercent: 75}
	limitsA := "GPU-a: set_default_active_thread_percentage 100; set_default_device_pinned_mem_limit 0 81559M"
	limitsB := "GPU-b: set_default_active_thread_percentage 75; set_default_device_pinned_mem_limit 0 61079M"
	runsSince := func(n int) []string { _, runs := r.snapshot(); return runs[n:] }

	// One daemon per device, each with its limits, each recorded.
	m.ensure(ctx, []mpsTarget{a, b})
	eventually(t, "both daemons started with their limits", func() bool { _, runs := r.snapshot(); return len(runs) == 2 })
	launches, runs := r.snapshot()
	slices.Sort(launches)
	slices.Sort(runs)
	if diff := cmp.Diff([]string{"GPU-a", "GPU-b"}, launches); diff != "" {
		t.Errorf("launched (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{limitsA, limitsB}, runs); diff != "" {
		t.Errorf("control commands (-want,+got):\n%s", diff)
	}
	if got := recordedUUIDs(t, cfg.StateDir); !slices.Equal(got, []string{"GPU-a", "GPU-b"}) {
		t.Errorf("recorded daemons %v, want GPU-a and GPU-b", got)
	}

	// A daemon that dies is found dead at the next check and started again
	// after a backoff, with its limits.
	r.die("GPU-a")
	eventually(t, "GPU-a started again", func() bool {
		clk.Step(time.Second)
		l, _ := r.snapshot()
		return len(l) == 3
	})
	eventually(t, "GPU-a limits applied again", func() bool { _, runs := r.snapshot(); return len(runs) == 3 })
	if got := runsSince(2); got[0] != limitsA {
		t.Errorf("after restart sent %q, want %q", got[0], limitsA)
	}
	if got := testutil.ToFloat64(metrics.mpsRestarts.WithLabelValues("n1", "0")); got != 1 {
		t.Errorf("partita_mps_daemon_restarts_total = %v, want 1", got)
	}

	// Changed limits reach the running daemon; unchanged ones send nothing.
	b.DefaultMemLimitMiB = 40960
	m.ensure(ctx, []mpsTarget{a, b})
	eventually(t, "new limits sent", func() bool { _, runs := r.snapshot(); return len(runs) == 4 })
	if got := runsSince(3); got[0] != "GPU-b: set_default_active_thread_percentage 75; set_default_device_pinned_mem_limit 0 40960M" {
		t.Errorf("sent %q for the changed limits", got[0])
	}

	// A device no longer shared loses its daemon: quit.
	m.ensure(ctx, []mpsTarget{b})
	if r.alive("GPU-a") {
		t.Error("GPU-a's daemon still runs")
	}
	if got := runsSince(4); !slices.Equal(got, []string{"GPU-a: quit"}) {
		t.Errorf("control commands %q, want GPU-a: quit", got)
	}

	// The agent stops: the daemon runs on, recorded, without a quit.
	m.detach()
	if !r.alive("GPU-b") || len(runsSince(5)) != 0 {
		t.Errorf("after detach: GPU-b alive %v, commands %q; want it running and untouched", r.alive("GPU-b"), runsSince(5))
	}
	if got := recordedUUIDs(t, cfg.StateDir); !slices.Equal(got, []string{"GPU-b"}) {
		t.Errorf("recorded daemons after detach %v, want GPU-b", got)
	}

	// The next agent adopts it: no second daemon, its limits sent again.
	m = newMPSManager(ctx, "n1", cfg, clk, metrics)
	m.ensure(ctx, []mpsTarget{b})
	eventually(t, "limits sent to the adopted daemon", func() bool { return len(runsSince(5)) == 1 })
	if l, _ := r.snapshot(); len(l) != 3 {
		t.Errorf("%d launches, want 3: the adopted daemon must not be started again", len(l))
	}
	m.detach()

	// A recorded daemon that died while no agent ran is started afresh.
	r.die("GPU-b")
	m = newMPSManager(ctx, "n1", cfg, clk, metrics)
	if m.recorded() {
		t.Error("a dead daemon was kept for adoption")
	}
	m.ensure(ctx, []mpsTarget{b})
	eventually(t, "GPU-b started afresh", func() bool { l, _ := r.snapshot(); return len(l) == 4 })
	m.detach()

	// A recorded daemon no device wants any more (the node left mps mode
	// while no agent ran) is ended by the next agent.
	m = newMPSManager(ctx, "n1", cfg, clk, metrics)
	m.stopAll(ctx)
	if r.alive("GPU-b") {
		t.Error("GPU-b's daemon still runs after stopAll")
	}
	if got := recordedUUIDs(t, cfg.StateDir); len(got) != 0 {
		t.Errorf("recorded daemons after stopAll: %v", got)
	}
	if l, _ := r.snapshot(); len(l) != 4 {
		t.Errorf("%d launches, want 4 (no start after a stop)", len(l))
	}
}

// recordedUUIDs are the devices mps-daemons.json in dir lists.
func recordedUUIDs(t *testing.T, dir string) []string {
	t.Helper()
	var st mpsState
	if _, err := readStateFile(filepath.Join(dir, mpsStateFile), &st); err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, d := range st.Daemons {
		out = append(out, d.UUID)
	}
	slices.Sort(out)
	return out
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
		if _, err := os.Stat(filepath.Join(dir, d.UUID, "pipe", mpsPIDFile)); !os.IsNotExist(err) {
			t.Errorf("device %d's daemon did not quit (%v)", d.Index, err)
		}
	}
	// Without daemons, the check fails and says so.
	err = TryMPS(t.Context(), MPSConfig{ControlPath: "/bin/false", Dir: t.TempDir(), Runner: ExecRunner{}}, inv, time.Second)
	if err == nil {
		t.Error("TryMPS succeeded with a control program that always fails")
	}
}
