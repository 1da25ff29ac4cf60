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
	corev1 "k8s.io/api/core/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
)

// fakeRunner stands in for the MPS programs and the process table: it
// records what it is asked to run, and its daemons run until sent quit,
// signalled, or made to die.
type fakeRunner struct {
	lock     sync.Mutex
	next     int
	daemons  map[string]DaemonProcess // live, by UUID
	launches []string                 // UUIDs of launched daemons, in order
	runs     []string                 // "<UUID>: <stdin>" of control commands that set or quit
	reads    int                      // control runs that only read
	servers  map[string][]int         // MPS server PIDs, by UUID
	settings map[string]string        // "<UUID> <setting> [of what]" → value
}

func newFakeRunner() *fakeRunner {
	return &fakeRunner{next: 100, daemons: map[string]DaemonProcess{}, servers: map[string][]int{}, settings: map[string]string{}}
}

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
	if strings.Contains(stdin, "set_") || strings.Contains(stdin, "quit") {
		r.runs = append(r.runs, uuid+": "+strings.ReplaceAll(strings.TrimSpace(stdin), "\n", "; "))
	} else {
		r.reads++
	}
	if _, ok := r.daemons[uuid]; !ok {
		return []byte("Cannot find MPS control daemon process"), errors.New("exit status 1")
	}
	var out []string
	for line := range strings.SplitSeq(strings.TrimSpace(stdin), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 1 && f[0] == "quit":
			delete(r.daemons, uuid)
		case len(f) == 1 && f[0] == "get_server_list":
			for _, pid := range r.servers[uuid] {
				out = append(out, fmt.Sprint(pid))
			}
		case len(f) >= 2 && strings.HasPrefix(f[0], "set_"):
			r.settings[uuid+" "+strings.Join(append([]string{strings.TrimPrefix(f[0], "set_")}, f[1:len(f)-1]...), " ")] = f[len(f)-1]
		case len(f) >= 1 && strings.HasPrefix(f[0], "get_"):
			out = append(out, r.settings[uuid+" "+strings.Join(append([]string{strings.TrimPrefix(f[0], "get_")}, f[1:]...), " ")])
		}
	}
	return []byte(strings.Join(out, "\n")), nil
}

// setting is what a device's daemon holds for key ("device_pinned_mem_limit 7 0").
func (r *fakeRunner) setting(uuid, key string) string {
	r.lock.Lock()
	defer r.lock.Unlock()
	return r.settings[uuid+" "+key]
}

// set changes a setting as a client that reaches the control pipe would.
func (r *fakeRunner) set(uuid, key, value string) {
	r.lock.Lock()
	defer r.lock.Unlock()
	r.settings[uuid+" "+key] = value
}

// startServer makes a device's daemon report an MPS server.
func (r *fakeRunner) startServer(uuid string, pid int) {
	r.lock.Lock()
	defer r.lock.Unlock()
	r.servers[uuid] = append(r.servers[uuid], pid)
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
	a := mpsTarget{Index: 0, UUID: "GPU-a", MemLimitMiB: 81559, ThreadPercent: 100}
	b := mpsTarget{Index: 1, UUID: "GPU-b", MemLimitMiB: 61079, ThreadPercent: 75}
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
	// The limits the daemons took are known, to the agent's NRI plugin
	// from the manager and, with the keeper, from the record.
	fromRecord := mpsLimits{stateFile: filepath.Join(cfg.StateDir, mpsStateFile), node: "n1"}
	for _, want := range []mpsTarget{a, b} {
		eventually(t, want.UUID+"'s limit recorded", func() bool {
			got, ok := fromRecord.memLimit(want.UUID)
			return ok && got == want.MemLimitMiB
		})
		if got, ok := (mpsLimits{mgr: m}).memLimit(want.UUID); !ok || got != want.MemLimitMiB {
			t.Errorf("%s's limit from the manager = %d, %v; want %d", want.UUID, got, ok, want.MemLimitMiB)
		}
	}
	if _, ok := (mpsLimits{stateFile: fromRecord.stateFile, node: "n2"}).memLimit("GPU-a"); ok {
		t.Error("a record of node n1 answered for node n2")
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
	b.MemLimitMiB = 40960
	m.ensure(ctx, []mpsTarget{a, b})
	eventually(t, "new limits sent", func() bool { _, runs := r.snapshot(); return len(runs) == 4 })
	if got := runsSince(3); got[0] != "GPU-b: set_default_active_thread_percentage 75; set_default_device_pinned_mem_limit 0 40960M" {
		t.Errorf("sent %q for the changed limits", got[0])
	}
	eventually(t, "GPU-b's new limit recorded", func() bool { got, ok := fromRecord.memLimit("GPU-b"); return ok && got == 40960 })

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

func TestPlanMPS(t *testing.T) {
	devices := []v1alpha1.GPUDevice{
		{Index: 0, UUID: "GPU-0", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy},
		{Index: 1, UUID: "GPU-1", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy},
		{Index: 2, UUID: "GPU-2", MemoryMiB: 81559, Health: v1alpha1.DeviceUnhealthy},
		{Index: 3, UUID: "GPU-3", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy, MIGMode: v1alpha1.MIGEnabled},
		{Index: 4, UUID: "GPU-4", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy},
		{Index: 5, UUID: "GPU-5", MemoryMiB: 81559, Health: v1alpha1.DeviceHealthy},
	}
	// slice is a pod holding one container's slice of the given devices.
	slice := func(mib int64, sm int32, devs ...int32) boundPod {
		return boundPod{pod: &corev1.Pod{}, alloc: &gpu.PodAllocation{Containers: []gpu.ContainerAllocation{
			{Container: "c", DeviceIndexes: devs, Milli: mib * 1000 / 81559, MemoryMiB: mib, SMPercent: sm},
		}}}
	}
	whole := func(devs ...int32) boundPod {
		return boundPod{pod: &corev1.Pod{}, alloc: &gpu.PodAllocation{Containers: []gpu.ContainerAllocation{
			{Container: "c", DeviceIndexes: devs, Milli: gpu.MilliPerGPU},
		}}}
	}
	free := func(i int32) mpsTarget {
		return mpsTarget{Index: i, UUID: fmt.Sprintf("GPU-%d", i), MemLimitMiB: 1, ThreadPercent: 100}
	}
	cases := map[string]struct {
		held []boundPod
		want mpsPlan
	}{
		"shared devices without slices hold clients to 1 MiB and every SM": {
			want: mpsPlan{targets: []mpsTarget{free(0), free(1), free(4), free(5)}},
		},
		"the largest slice is every client's limit, and no slice is throttled below its own": {
			held: []boundPod{slice(20480, 0, 1), slice(40779, 0, 1)},
			want: mpsPlan{targets: []mpsTarget{free(0), {Index: 1, UUID: "GPU-1", MemLimitMiB: 40779, ThreadPercent: 100}, free(4), free(5)}},
		},
		"compute is capped only when every slice on the device has a compute limit": {
			held: []boundPod{slice(20480, 30, 0), slice(20480, 50, 0), slice(20480, 30, 1), slice(10240, 0, 1)},
			want: mpsPlan{targets: []mpsTarget{
				{Index: 0, UUID: "GPU-0", MemLimitMiB: 20480, ThreadPercent: 50},
				{Index: 1, UUID: "GPU-1", MemLimitMiB: 20480, ThreadPercent: 100},
				free(4), free(5),
			}},
		},
		"devices held whole get no daemon": {
			held: []boundPod{whole(4)},
			want: mpsPlan{targets: []mpsTarget{free(0), free(1), free(5)}},
		},
		"a slice over several devices leaves them without MPS, with the slices beside it": {
			held: []boundPod{slice(10240, 0, 4, 5), slice(20480, 0, 5)},
			want: mpsPlan{targets: []mpsTarget{free(0), free(1)}, spanned: []int32{4, 5}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, planMPS(devices, tc.held), cmp.AllowUnexported(mpsPlan{})); diff != "" {
				t.Errorf("plan (-want,+got):\n%s", diff)
			}
		})
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
		// No slice yet: clients are held to 1 MiB until one comes.
		b, err := os.ReadFile(filepath.Join(dir, d.UUID, "pipe", "default_device_pinned_mem_limit.0"))
		if err != nil || strings.TrimSpace(string(b)) != "1M" {
			t.Errorf("device %d pinned memory default = %q (%v), want 1M", d.Index, b, err)
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

// TestMPSServerLimitsHeld: the limits reach running servers as well as the
// defaults, and limits a client changes through the control pipe are found
// at the next check, set again, counted and reported.
func TestMPSServerLimitsHeld(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	r := newFakeRunner()
	metrics := NewMetrics()
	var drifts []string
	var driftLock sync.Mutex
	cfg := MPSConfig{ControlPath: "mps-control", Dir: "/run/mps", Runner: r, OnDrift: func(device int32, drift []string) {
		driftLock.Lock()
		defer driftLock.Unlock()
		drifts = append(drifts, fmt.Sprintf("%d: %s", device, strings.Join(drift, "; ")))
	}}
	ctx := t.Context()
	m := newMPSManager(ctx, "n1", cfg, clk, metrics)
	defer m.stopAll(ctx)
	a := mpsTarget{Index: 0, UUID: "GPU-a", MemLimitMiB: 40779, ThreadPercent: 100}
	m.ensure(ctx, []mpsTarget{a})
	eventually(t, "defaults set", func() bool { return r.setting("GPU-a", "default_device_pinned_mem_limit 0") == "40779M" })

	// A server runs (a client connected); a bigger slice arrives: the
	// server gets the new limit too.
	r.startServer("GPU-a", 7001)
	a.MemLimitMiB = 61079
	m.ensure(ctx, []mpsTarget{a})
	eventually(t, "server limits set", func() bool {
		return r.setting("GPU-a", "device_pinned_mem_limit 7001 0") == "61079M" && r.setting("GPU-a", "active_thread_percentage 7001") == "100"
	})

	// A client raises the server's limit and lowers the default thread
	// percentage through the control pipe: the next check sets both back.
	r.set("GPU-a", "device_pinned_mem_limit 7001 0", "80G")
	r.set("GPU-a", "default_active_thread_percentage", "1")
	eventually(t, "drifted limits set again", func() bool {
		clk.Step(mpsVerify)
		return r.setting("GPU-a", "device_pinned_mem_limit 7001 0") == "61079M" && r.setting("GPU-a", "default_active_thread_percentage") == "100"
	})
	if got := testutil.ToFloat64(metrics.mpsDrift.WithLabelValues("n1", "0")); got < 1 {
		t.Errorf("partita_mps_limit_drift_total = %v, want at least 1", got)
	}
	driftLock.Lock()
	got := slices.Clone(drifts)
	driftLock.Unlock()
	if len(got) == 0 || !strings.Contains(got[0], `get_device_pinned_mem_limit 7001 0 answered "80G"`) || !strings.Contains(got[0], `get_default_active_thread_percentage answered "1"`) {
		t.Errorf("drift reported %q, want the server's memory limit and the default thread percentage", got)
	}

	// Limits that hold are left alone: a check sends no set.
	_, before := r.snapshot()
	clk.Step(mpsVerify)
	time.Sleep(50 * time.Millisecond)
	if _, after := r.snapshot(); len(after) != len(before) {
		t.Errorf("a check of limits that hold sent %q", after[len(before):])
	}
}

func TestMemLimitHolds(t *testing.T) {
	cases := map[string]struct {
		answer   string
		want     int64
		ok, read bool
	}{
		"MiB as set":             {answer: "40779M", want: 40779, ok: true, read: true},
		"whole GiB rounded down": {answer: "39G", want: 40779, ok: true, read: true},
		"raised":                 {answer: "80G", want: 40779, read: true},
		"lowered":                {answer: "1M", want: 40779, read: true},
		"unreadable":             {answer: "N/A", want: 40779},
		"empty":                  {answer: "", want: 40779},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ok, read := memLimitHolds(tc.answer, tc.want)
			if diff := cmp.Diff([2]bool{tc.ok, tc.read}, [2]bool{ok, read}); diff != "" {
				t.Errorf("memLimitHolds(%q, %d) (-want,+got):\n%s", tc.answer, tc.want, diff)
			}
		})
	}
}
