package console_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/partita-dev/partita/console"
)

// TestSnapshotsWaitForSomeoneToLook: a console nobody looks at builds no
// snapshot however the cluster churns; an API call sees every change
// (built then), and an open page is sent changes as they come, those made
// before it opened included.
func TestSnapshotsWaitForSomeoneToLook(t *testing.T) {
	c := setup(t)
	// No history samples during the test: they read the snapshot too.
	inst := c.startShared(t, func(cfg *console.Config) { cfg.SampleInterval = time.Hour })
	base, admin := inst.URL, c.token(t, "default", "admin")
	builds := func() int {
		t.Helper()
		a := call(t, base, "GET", "/metrics", "", nil)
		wantStatus(t, a, http.StatusOK, "metrics")
		for line := range strings.SplitSeq(string(a.body), "\n") {
			if v, ok := strings.CutPrefix(line, "partita_console_snapshot_build_seconds_count "); ok {
				n, err := strconv.Atoi(strings.TrimSpace(v))
				if err != nil {
					t.Fatalf("metrics: %q: %v", line, err)
				}
				return n
			}
		}
		t.Fatalf("metrics without partita_console_snapshot_build_seconds_count:\n%s", a.body)
		return 0
	}
	onGPU := func(m console.MapView, gpu int, pod string) bool {
		for _, n := range m.Nodes {
			if n.Name != "n1" || gpu >= len(n.GPUs) {
				continue
			}
			for _, s := range n.GPUs[gpu].Slices {
				if s.Pod == pod {
					return true
				}
			}
		}
		return false
	}

	var m console.MapView
	call(t, base, "GET", "/api/v1/map", admin, nil).decode(t, &m)
	before := builds()
	c.bound(t, "team-a", "unseen", "0.25", 3)
	// The builder, with a page open, builds 100–300 ms after a change.
	time.Sleep(1500 * time.Millisecond)
	if got := builds(); got != before {
		t.Errorf("with no page open, the console built %d snapshots after a change; want none until something reads", got-before)
	}
	call(t, base, "GET", "/api/v1/map", admin, nil).decode(t, &m)
	if !onGPU(m, 3, "unseen") {
		t.Errorf("the map read after the change does not show team-a/unseen on GPU 3: %+v", m.Nodes)
	}
	if got := builds(); got != before+1 {
		t.Errorf("reading the map built %d snapshots, want 1", got-before)
	}

	// A change just after that build, then a page: the read that starts
	// its stream may serve the snapshot just built; the stream brings the
	// change.
	c.bound(t, "team-a", "early", "0.25", 2)
	sc := openNodesStream(t, base, admin, m.Version)
	var seen []string
	want := map[string]int{"early": 2}
	for sc.Scan() && len(want) > 0 {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		seen = append(seen, data)
		var ev console.NodesEvent
		if json.Unmarshal([]byte(data), &ev) != nil {
			continue
		}
		for pod, gpu := range want {
			if onGPU(console.MapView{Nodes: ev.Nodes}, gpu, pod) {
				delete(want, pod)
				if pod == "early" {
					// And a change while the page is open.
					c.bound(t, "team-a", "late", "0.25", 1)
					want["late"] = 1
				}
			}
		}
	}
	if len(want) > 0 {
		t.Fatalf("the open page was not sent %v (%v); it saw %v", want, sc.Err(), seen)
	}
}
