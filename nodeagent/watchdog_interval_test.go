package nodeagent

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/internal/envtestutil"
)

func TestCheckInterval(t *testing.T) {
	base := Options{SyncInterval: 10 * time.Second, WatchdogInterval: time.Second}
	cases := map[string]struct {
		enforce  EnforceMode
		limited  bool
		watchdog time.Duration
		want     time.Duration
	}{
		"kill with limited slices":        {enforce: EnforceKill, limited: true, want: time.Second},
		"kill without limited slices":     {enforce: EnforceKill, want: 10 * time.Second},
		"report waits for the next sync":  {enforce: EnforceReport, limited: true, want: 10 * time.Second},
		"off waits for the next sync":     {enforce: EnforceOff, limited: true, want: 10 * time.Second},
		"a watchdog slower than the sync": {enforce: EnforceKill, limited: true, watchdog: time.Minute, want: 10 * time.Second},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := base
			o.Enforce = tc.enforce
			if tc.watchdog != 0 {
				o.WatchdogInterval = tc.watchdog
			}
			if got := checkInterval(o, tc.limited); got != tc.want {
				t.Errorf("checkInterval = %s, want %s", got, tc.want)
			}
		})
	}
}

// processBackend is a simulated node whose GPU processes the test sets
// itself (the agent does not derive them from the pods, as it does for a
// *Simulated), so that a process can go over its limit without an API
// event that would wake the agent at once: only the watchdog's own
// sampling finds it, as on a real node.
type processBackend struct{ *Simulated }

// TestWatchdogKillLatency measures, in kill mode, how long a process over
// its slice's memory limit runs before the agent ends it, with the
// default --watchdog-interval (1 s) and a --sync-interval of 10 s. The
// bound is the watchdog interval plus its tenth of jitter plus one sync;
// docs/benchmarks.md records the figures it logs (go test ./nodeagent/
// -run TestWatchdogKillLatency -v).
func TestWatchdogKillLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("takes a few seconds of real time")
	}
	cfg, c := envtestutil.Start(t)
	createNode(t, c, "n1", nil)
	sim := processBackend{NewSimulated("n1", h100(8))}
	rec := &recorder{}
	a, _ := runAgent(t, cfg, Options{NodeName: "n1", Backends: StaticBackend(sim), Enforce: EnforceKill,
		SyncInterval: 10 * time.Second, Recorder: rec, Version: "test"})
	waitFor(t, "the agent is ready", func() (bool, error) { return a.Ready() == nil, a.Ready() })

	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}); err != nil {
		t.Fatal(err)
	}
	pod := heldPod("hog", "n1", "20Gi", 2)
	pod.UID = ""
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the slice is published", func() (bool, error) {
		gn, err := gpuNode(t, c, "n1")
		return err == nil && len(gn.Status.Slices) == 1, err
	})

	const rounds = 5
	bound := time.Second + time.Second/10
	var worst time.Duration
	for i := range rounds {
		pid := int32(5000 + i)
		sim.SetProcesses([]Process{{PID: pid, DeviceIndex: 2, MemoryBytes: 30 << 30, PodUID: pod.UID, Container: "main"}})
		start := time.Now()
		for {
			snap, err := sim.Snapshot(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(snap.Processes) == 0 {
				break
			}
			if time.Since(start) > 30*time.Second {
				t.Fatalf("round %d: process %d over its limit still runs after 30s; events %v", i, pid, rec.take())
			}
			time.Sleep(5 * time.Millisecond)
		}
		took := time.Since(start)
		worst = max(worst, took)
		t.Logf("round %d: the over-limit process ended after %s", i, took.Round(time.Millisecond))
	}
	t.Logf("worst of %d: %s (bound: watchdog interval %s with jitter, plus one sync)", rounds, worst.Round(time.Millisecond), bound)
	// A loaded machine adds scheduling delay; the sync interval (10 s) is
	// what it must stay well under.
	if worst > bound+2*time.Second {
		t.Errorf("worst kill latency %s, want under %s (the watchdog interval, not the 10s sync interval)", worst, bound+2*time.Second)
	}
}
