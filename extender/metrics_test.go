package extender

import (
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// TestMetrics drives each verb once and reads the metrics back.
func TestMetrics(t *testing.T) {
	ctx := pt.Context(t)
	full := []*corev1.Pod{pt.Bound(pt.WholePod("a", 1, "1000"), "n1", 0), pt.Bound(pt.WholePod("b", 1, "1000"), "n1", 1)}
	half, late := pt.FractionPod("p", "0.5", "500").Obj(), pt.FractionPod("late", "0.5", "500").Obj()
	c := fakeClient(append(full, half, late)...)
	l := pt.Ledger([]*v1alpha1.GPUNode{pt.H100Node("n1", 2).Obj(), pt.H100Node("n2", 2).Obj()}, full...)
	reg := prometheus.NewRegistry()
	binder := &fakeBinder{c: c}
	e := New(l, c, binder, WithMetrics(NewMetrics(reg, l, func() bool { return true })))

	if _, err := e.Filter(ctx, &extenderv1.ExtenderArgs{Pod: half, NodeNames: names("n1", "n2", "cpu-only")}); err != nil {
		t.Fatal(err)
	}
	if err := e.Bind(ctx, bindArgs("p", "n2")); err != nil {
		t.Fatal(err)
	}
	if err := e.Bind(ctx, bindArgs("late", "n1")); err == nil {
		t.Fatal("bind on a full node succeeded")
	}
	binder.err = errors.New("webhook said no")
	if err := e.Bind(ctx, bindArgs("late", "n2")); err == nil {
		t.Fatal("a failed Binding succeeded")
	}

	want := `
# HELP partita_extender_bind_conflicts_total Binds refused because the room filter saw on the node was gone (or the pod's GPUs were reserved elsewhere); kube-scheduler retries them.
# TYPE partita_extender_bind_conflicts_total counter
partita_extender_bind_conflicts_total 1
# HELP partita_extender_bind_rollbacks_total GPU assignments dropped from the ledger because their Binding failed or never showed on the pod.
# TYPE partita_extender_bind_rollbacks_total counter
partita_extender_bind_rollbacks_total 1
# HELP partita_extender_binds_total Bind requests answered, by result: Bound, AlreadyBound, NotLeader, Conflict, Refused, Failed.
# TYPE partita_extender_binds_total counter
partita_extender_binds_total{result="AlreadyBound"} 0
partita_extender_binds_total{result="Bound"} 1
partita_extender_binds_total{result="Conflict"} 1
partita_extender_binds_total{result="Failed"} 1
partita_extender_binds_total{result="NotLeader"} 0
partita_extender_binds_total{result="Refused"} 0
# HELP partita_extender_filter_nodes_total Candidate nodes judged by filter, by reason: Fits, InsufficientGPU, NeverFits, NoGPUInventory, ReservedElsewhere, InvalidRequest, AgentSilent, DRAManaged.
# TYPE partita_extender_filter_nodes_total counter
partita_extender_filter_nodes_total{reason="AgentSilent"} 0
partita_extender_filter_nodes_total{reason="DRAManaged"} 0
partita_extender_filter_nodes_total{reason="Fits"} 1
partita_extender_filter_nodes_total{reason="InsufficientGPU"} 1
partita_extender_filter_nodes_total{reason="InvalidRequest"} 0
partita_extender_filter_nodes_total{reason="NeverFits"} 0
partita_extender_filter_nodes_total{reason="NoGPUInventory"} 1
partita_extender_filter_nodes_total{reason="ReservedElsewhere"} 0
# HELP partita_gpu_allocated_milli Milli-GPUs allocated on a device (1000 = whole), from the extender's ledger.
# TYPE partita_gpu_allocated_milli gauge
partita_gpu_allocated_milli{device="0",node="n1"} 1000
partita_gpu_allocated_milli{device="0",node="n2"} 500
partita_gpu_allocated_milli{device="1",node="n1"} 1000
partita_gpu_allocated_milli{device="1",node="n2"} 0
# HELP partita_extender_ledger_pods Pods that hold GPUs in the extender's ledger, by whether the pod shows them yet (assumed true or false).
# TYPE partita_extender_ledger_pods gauge
partita_extender_ledger_pods{assumed="false"} 2
partita_extender_ledger_pods{assumed="true"} 1
# HELP partita_extender_pending_binds GPU assignments recorded by bind that the pod does not show yet.
# TYPE partita_extender_pending_binds gauge
partita_extender_pending_binds 1
# HELP partita_extender_leader 1 on the replica that is the elected leader (the one that binds), else 0.
# TYPE partita_extender_leader gauge
partita_extender_leader 1
# HELP partita_extender_silent_agent_nodes GPU nodes whose agent has stopped reporting (no new heartbeat within --agent-heartbeat-timeout): they take no new GPU pods.
# TYPE partita_extender_silent_agent_nodes gauge
partita_extender_silent_agent_nodes 0
`
	metricNames := []string{"partita_extender_bind_conflicts_total", "partita_extender_bind_rollbacks_total", "partita_extender_binds_total",
		"partita_extender_filter_nodes_total", "partita_gpu_allocated_milli", "partita_extender_ledger_pods",
		"partita_extender_pending_binds", "partita_extender_leader", "partita_extender_silent_agent_nodes"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), metricNames...); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "partita_extender_request_duration_seconds"); err != nil || n != 2 {
		t.Errorf("request duration series: %d (%v), want filter and bind", n, err)
	}
}
