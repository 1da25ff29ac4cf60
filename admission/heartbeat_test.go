package admission

import (
	"strings"
	"testing"
	"time"

	pt "github.com/partita-dev/partita/internal/partitatest"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/tools/events"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/extender"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// TestHeartbeatMonitor runs the monitor on a fake clock: an agent whose
// heartbeat stops moving for longer than the timeout loses its node for
// new pods, from filter and bind alike, with the reason and an event; its
// next heartbeat gives the node back at once. The bound is measured on the
// extender's clock from when a heartbeat was last seen to change, so an
// agent clock that lags does not trip it.
func TestHeartbeatMonitor(t *testing.T) {
	hb := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(hb.Add(time.Hour)) // the agents' clocks lag an hour
	ledger := gpu.NewLedger()
	n1, n2 := pt.H100Node("n1", 2).Heartbeat(hb), pt.H100Node("n2", 2).Heartbeat(hb)
	ledger.UpsertNode(n1.Clone().Obj())
	ledger.UpsertNode(n2.Clone().Obj())
	rec := events.NewFakeRecorder(10)
	reader := fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(n1.Clone().Obj(), n2.Clone().Obj()).Build()
	changes := 0
	m := NewHeartbeatMonitor(ledger, 3*time.Minute, WithMonitorClock(clk),
		WithMonitorEvents(reader, rec, func() bool { return true }), WithMonitorOnChange(func() { changes++ }))
	e := extender.New(ledger, nil, nil, extender.WithClock(clk))
	filter := func() *extenderv1.ExtenderFilterResult {
		t.Helper()
		res, err := e.Filter(pt.Context(t), &extenderv1.ExtenderArgs{Pod: pt.FractionPod("p", "0.5", "500").Obj(), NodeNames: &[]string{"n1", "n2"}})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	takeEvents := func() []string {
		var out []string
		for {
			select {
			case ev := <-rec.Events:
				out = append(out, ev)
			default:
				return out
			}
		}
	}
	if m.Interval() != 10*time.Second {
		t.Errorf("interval %s, want 10s (a tenth of the timeout, at most 10s)", m.Interval())
	}

	m.Check(pt.Context(t))
	// n2's agent goes on reporting, n1's does not.
	for range 4 {
		clk.Step(time.Minute)
		hb2 := clk.Now().Add(-time.Hour)
		ledger.UpsertNode(n2.Clone().Heartbeat(hb2).Obj())
		m.Check(pt.Context(t))
	}
	want := "the agent on node n1 has not reported for 4m0s (last heartbeat 2026-12-01T10:00:00Z): the node takes no new GPU pods until it does"
	if diff := cmp.Diff(&extenderv1.ExtenderFilterResult{NodeNames: &[]string{"n2"},
		FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{"n1": want}}, filter()); diff != "" {
		t.Errorf("filter while n1's agent is silent (-want,+got):\n%s", diff)
	}
	if got := takeEvents(); len(got) != 1 || got[0] != "Warning AgentSilent "+want {
		t.Errorf("events %q, want one AgentSilent on n1", got)
	}
	if changes != 1 {
		t.Errorf("%d changes told, want 1", changes)
	}
	req, _ := gpu.ParsePod(pt.FractionPod("q", "0.5", "500").Obj())
	if _, err := ledger.Choose("n1", req, ""); !gpu.IsAgentSilent(err) {
		t.Errorf("Choose on n1 (bind's choice) = %v, want the silence", err)
	}
	// Still silent a minute later: no second event, the duration moves on.
	clk.Step(time.Minute)
	m.Check(pt.Context(t))
	if got := takeEvents(); len(got) != 0 {
		t.Errorf("events %q, want none", got)
	}
	if got := filter().FailedAndUnresolvableNodes["n1"]; !strings.Contains(got, "has not reported for 5m0s") {
		t.Errorf("filter reason %q, want it to say 5m0s", got)
	}

	// n1's agent reports again: the node is back at once, and the monitor
	// says so at its next look.
	ledger.UpsertNode(n1.Clone().Heartbeat(hb.Add(5 * time.Minute)).Obj())
	if res := filter(); len(*res.NodeNames) != 2 {
		t.Errorf("filter after n1's heartbeat: %+v, want both nodes", res)
	}
	m.Check(pt.Context(t))
	if got := takeEvents(); len(got) != 1 || got[0] != "Normal AgentReporting the agent on node n1 reports again: the node takes new GPU pods" {
		t.Errorf("events %q, want one AgentReporting", got)
	}
	if changes != 2 {
		t.Errorf("%d changes told, want 2", changes)
	}

	// A restarted extender gives every agent a full timeout first.
	fresh := gpu.NewLedger()
	fresh.UpsertNode(n1.Clone().Obj()) // heartbeat an hour and more old on this clock
	m2 := NewHeartbeatMonitor(fresh, 3*time.Minute, WithMonitorClock(clk))
	m2.Check(pt.Context(t))
	if got := fresh.SilentAgents(); len(got) != 0 {
		t.Errorf("silent right after a restart: %v", got)
	}
	clk.Step(3*time.Minute + time.Second)
	m2.Check(pt.Context(t))
	if got := fresh.SilentAgents(); len(got) != 1 || got[0].Node != "n1" {
		t.Errorf("silent one timeout after a restart: %v, want n1", got)
	}
	// Nodes whose GPUNode has no heartbeat at all are not judged.
	none := gpu.NewLedger()
	none.UpsertNode(pt.H100Node("n3", 1).Obj())
	m3 := NewHeartbeatMonitor(none, time.Minute, WithMonitorClock(clk))
	m3.Check(pt.Context(t))
	clk.Step(time.Hour)
	m3.Check(pt.Context(t))
	if got := none.SilentAgents(); len(got) != 0 {
		t.Errorf("a GPUNode without heartbeat was judged silent: %v", got)
	}
}
