package nodeagent

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	testingclock "k8s.io/utils/clock/testing"
)

func TestWatchdog(t *testing.T) {
	hog := withUID(heldPod("hog", "n1", "20Gi", 0), "hog")
	whole := withUID(heldPod("whole", "n1", "1", 1), "whole")
	byID := withUID(heldPod("byid", "n1", "0.25", 2), "byid")
	byID.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", ContainerID: "containerd://abc"}}
	pods := []*corev1.Pod{hog, whole, byID}
	cases := map[string]struct {
		enforce          EnforceMode
		procs            []Process
		fail             map[int32]bool
		wantEvents       []string
		wantKilled       []int32
		wantUsedMiB      map[string]int64
		wantUnattributed map[int32]int64
		wantOveruse      float64
		wantKillErrors   float64
	}{
		"under the limit": {
			enforce:     EnforceKill,
			procs:       []Process{{PID: 10, DeviceIndex: 0, MemoryBytes: 20480 * mib, PodUID: "hog", Container: "main"}},
			wantUsedMiB: map[string]int64{"hog": 20480},
		},
		"whole devices have no limit": {
			enforce:     EnforceKill,
			procs:       []Process{{PID: 10, DeviceIndex: 1, MemoryBytes: 80000 * mib, PodUID: "whole", Container: "main"}},
			wantUsedMiB: map[string]int64{"whole": 80000},
		},
		"off measures only": {
			enforce:     EnforceOff,
			procs:       []Process{{PID: 10, DeviceIndex: 0, MemoryBytes: 30720 * mib, PodUID: "hog", Container: "main"}},
			wantUsedMiB: map[string]int64{"hog": 30720},
			wantOveruse: 1,
		},
		"report": {
			enforce:     EnforceReport,
			procs:       []Process{{PID: 10, DeviceIndex: 0, MemoryBytes: 30720 * mib, PodUID: "hog", Container: "main"}},
			wantEvents:  []string{"Warning GPUOveruse ns/hog: container main uses 30720MiB of GPU memory on device 0, over its limit of 20480MiB"},
			wantUsedMiB: map[string]int64{"hog": 30720},
			wantOveruse: 1,
		},
		"kill ends the largest first until under": {
			enforce: EnforceKill,
			procs: []Process{
				{PID: 10, DeviceIndex: 0, MemoryBytes: 8192 * mib, PodUID: "hog", Container: "main"},
				{PID: 11, DeviceIndex: 0, MemoryBytes: 16384 * mib, PodUID: "hog", Container: "main"},
				{PID: 12, DeviceIndex: 0, MemoryBytes: 6144 * mib, PodUID: "hog", Container: "main"},
			},
			wantKilled:  []int32{11},
			wantEvents:  []string{"Warning GPUOveruse ns/hog: container main uses 30720MiB of GPU memory on device 0, over its limit of 20480MiB; ended process 11"},
			wantUsedMiB: map[string]int64{"hog": 30720},
			wantOveruse: 1,
		},
		"kill without hostPID": {
			enforce:        EnforceKill,
			procs:          []Process{{PID: 10, DeviceIndex: 0, MemoryBytes: 30720 * mib, PodUID: "hog", Container: "main"}},
			fail:           map[int32]bool{10: true},
			wantEvents:     []string{"Warning GPUOveruse ns/hog: container main uses 30720MiB of GPU memory on device 0, over its limit of 20480MiB; could not end a process: kill process 10: process not found"},
			wantUsedMiB:    map[string]int64{"hog": 30720},
			wantOveruse:    1,
			wantKillErrors: 1,
		},
		"container found by its ID": {
			enforce:     EnforceReport,
			procs:       []Process{{PID: 10, DeviceIndex: 2, MemoryBytes: 1024 * mib, PodUID: "byid", ContainerID: "abc"}},
			wantUsedMiB: map[string]int64{"byid": 1024},
		},
		"processes outside any slice": {
			enforce: EnforceKill,
			procs: []Process{
				{PID: 10, DeviceIndex: 0, MemoryBytes: 4096 * mib},                                        // a host process
				{PID: 11, DeviceIndex: 3, MemoryBytes: 2048 * mib, PodUID: "hog", Container: "main"},      // not hog's device
				{PID: 12, DeviceIndex: 3, MemoryBytes: 1024 * mib, PodUID: "stranger", Container: "main"}, // not a pod here
			},
			wantUnattributed: map[int32]int64{0: 4096, 3: 3072},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			m := NewMetrics()
			rec := &recorder{}
			k := &killer{fail: tc.fail}
			w := newWatchdog("n1", tc.enforce, 5*time.Minute, testingclock.NewFakeClock(time.Now()), rec, k, m)
			used, unattributed := w.check(t.Context(), heldOn("n1", h100(8), pods...), tc.procs)
			if diff := cmp.Diff(tc.wantEvents, rec.take()); diff != "" {
				t.Errorf("events (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantKilled, k.killed); diff != "" {
				t.Errorf("killed (-want,+got):\n%s", diff)
			}
			gotUsed := map[string]int64{}
			for key, b := range used {
				gotUsed[string(key.UID)] = b / mib
			}
			if diff := cmp.Diff(tc.wantUsedMiB, gotUsed, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("used MiB (-want,+got):\n%s", diff)
			}
			gotUn := map[int32]int64{}
			for d, b := range unattributed {
				gotUn[d] = b / mib
			}
			if diff := cmp.Diff(tc.wantUnattributed, gotUn, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("unattributed MiB (-want,+got):\n%s", diff)
			}
			if got := testutil.ToFloat64(m.overuse.WithLabelValues("n1", string(tc.enforce))); got != tc.wantOveruse {
				t.Errorf("partita_gpu_overuse_total = %v, want %v", got, tc.wantOveruse)
			}
			if got := testutil.ToFloat64(m.killErrors.WithLabelValues("n1")); got != tc.wantKillErrors {
				t.Errorf("partita_gpu_overuse_kill_errors_total = %v, want %v", got, tc.wantKillErrors)
			}
			if got := testutil.ToFloat64(m.podMemoryLimit.WithLabelValues("n1", "ns", "hog", "main", "0")); got != 20480*mib {
				t.Errorf("partita_pod_gpu_memory_limit_bytes of hog = %v, want 20Gi", got)
			}
		})
	}
}

func TestWatchdogReportsOncePerInterval(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	rec := &recorder{}
	m := NewMetrics()
	w := newWatchdog("n1", EnforceReport, 5*time.Minute, clk, rec, nil, m)
	held := heldOn("n1", h100(8), withUID(heldPod("hog", "n1", "20Gi", 0), "hog"))
	over := []Process{{PID: 10, DeviceIndex: 0, MemoryBytes: 30720 * mib, PodUID: "hog", Container: "main"}}
	under := []Process{{PID: 10, DeviceIndex: 0, MemoryBytes: 1024 * mib, PodUID: "hog", Container: "main"}}
	steps := []struct {
		name  string
		after time.Duration
		procs []Process
		want  int
	}{
		{"first overuse", 0, over, 1},
		{"still over, soon after", time.Minute, over, 0},
		{"still over, interval passed", 5 * time.Minute, over, 1},
		{"back under", time.Second, under, 0},
		{"over again", time.Second, over, 1},
	}
	for _, s := range steps {
		clk.Step(s.after)
		w.check(t.Context(), held, s.procs)
		if got := len(rec.take()); got != s.want {
			t.Errorf("%s: %d events, want %d", s.name, got, s.want)
		}
	}
	// The pod ends: its series go.
	w.check(t.Context(), nil, nil)
	if n := testutil.CollectAndCount(m.podMemoryUsed); n != 0 {
		t.Errorf("%d per-pod series left after the pod ended", n)
	}
}

// TestWatchdogKillsAReplacementAtOnce: in kill mode, a process that
// replaces an ended one and goes over the limit again before any check
// sees the slice under it is ended at the next check, not a report
// interval later.
func TestWatchdogKillsAReplacementAtOnce(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	rec := &recorder{}
	k := &killer{}
	w := newWatchdog("n1", EnforceKill, 5*time.Minute, clk, rec, k, NewMetrics())
	held := heldOn("n1", h100(8), withUID(heldPod("hog", "n1", "20Gi", 0), "hog"))
	for pid := int32(10); pid < 13; pid++ {
		clk.Step(time.Second)
		w.check(t.Context(), held, []Process{{PID: pid, DeviceIndex: 0, MemoryBytes: 30720 * mib, PodUID: "hog", Container: "main"}})
	}
	if diff := cmp.Diff([]int32{10, 11, 12}, k.killed); diff != "" {
		t.Errorf("killed (-want,+got):\n%s", diff)
	}
	if got := len(rec.take()); got != 3 {
		t.Errorf("%d events, want one a kill", got)
	}
}
