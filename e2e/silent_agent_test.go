package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/partita-dev/partita/admission"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/extender"
)

// devAgentHeartbeatTimeout is the extender's --agent-heartbeat-timeout in
// the dev cluster (cmd/partita/dev_processes.go).
const devAgentHeartbeatTimeout = 45 * time.Second

// stopAgent kills the dev cluster's agent and returns a func that starts it
// again (`partita dev up`, as a user would) and waits until its nodes
// report. The test restarts it when it ends, even on failure: every other
// test needs it.
func stopAgent(ctx context.Context, t *testing.T) (restart func()) {
	t.Helper()
	pid := agentPID(t)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	poll(t, 30*time.Second, "the agent gone", func() (bool, string) {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		return os.IsNotExist(err), "still in the process table"
	})
	restarted := false
	restart = func() {
		if restarted {
			return
		}
		restarted = true
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		out, err := partita(rctx, "dev", "up", "--name", clusterName, "--nodes", fmt.Sprint(e2eNodes), "--gpus-per-node", fmt.Sprint(e2eGPUsPerNode))
		if err != nil {
			t.Fatalf("dev up to restart the agent: %v\n%s", err, out)
		}
	}
	t.Cleanup(restart)
	return restart
}

// eventsAbout lists the events about the named object, in any namespace,
// as "reason: message".
func eventsAbout(ctx context.Context, name string) ([]string, error) {
	evs, err := clientset.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return out, nil
}

// TestSilentAgentHoldsNewPods stops the dev cluster's agent. Past the
// extender's bound its nodes take no new GPU pods: a new pod waits, and its
// events, its GPUNode's and `partita ctl why` say that the agent on its
// node has not reported; the pod already running there is left alone. Once
// the agent runs again, the waiting pod schedules.
func TestSilentAgentHoldsNewPods(t *testing.T) {
	ctx := testContext(t, 8*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	// One of the cluster's own nodes: restarting the agent with `dev up`
	// removes simulated nodes it did not make.
	node := devcluster.NodeName(0)
	sel := map[string]string{"kubernetes.io/hostname": node}
	t.Cleanup(func() { deletePods(ctx, t, ns) })

	createPods(ctx, t, clientset, []*corev1.Pod{extGPUPod(ns, "running", 1000, 1, sel)}, 1)
	before := waitPods(ctx, t, ns, 90*time.Second, "the first pod running on "+node, func(ps []corev1.Pod) (bool, string) {
		return len(ps) == 1 && ps[0].Spec.NodeName == node && ps[0].Status.Phase == corev1.PodRunning,
			devcluster.DescribePods(ctx, clientset, ns, extLabel)
	})[0]

	restart := stopAgent(ctx, t)
	stopped := time.Now()
	poll(t, devAgentHeartbeatTimeout+60*time.Second, "an AgentSilent event on GPUNode "+node, func() (bool, string) {
		evs, err := eventsAbout(ctx, node)
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs {
			if strings.HasPrefix(e, extender.ReasonAgentSilent+": the agent on node "+node+" has not reported for") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events: %q", evs)
	})
	t.Logf("the extender called the agent silent %.0fs after it stopped (bound %s)", time.Since(stopped).Seconds(), devAgentHeartbeatTimeout)

	createPods(ctx, t, clientset, []*corev1.Pod{extGPUPod(ns, "waiting", 1000, 1, sel)}, 1)
	want := "the agent on node " + node + " has not reported for"
	waitEvent(ctx, t, ns, "waiting", "WaitingForCapacity", want)
	out, err := partita(ctx, "ctl", "why", "waiting", "-n", ns, "--kubeconfig", cluster.KubeconfigPath(),
		"--agent-heartbeat-timeout", devAgentHeartbeatTimeout.String())
	if err != nil || !strings.Contains(out, want) {
		t.Errorf("partita ctl why (err %v) does not say %q:\n%s", err, want, out)
	}
	pods := listNS(ctx, t, ns)
	for _, p := range pods {
		switch p.Name {
		case "waiting":
			if p.Spec.NodeName != "" {
				t.Errorf("pod waiting was bound to %s while its node's agent is silent", p.Spec.NodeName)
			}
		case "running":
			if p.UID != before.UID || p.DeletionTimestamp != nil || p.Spec.NodeName != node {
				t.Errorf("the pod running on the silent node was disturbed: %+v", p.ObjectMeta)
			}
		}
	}

	restart()
	got := waitPods(ctx, t, ns, 90*time.Second, "the waiting pod bound once the agent reports", func(ps []corev1.Pod) (bool, string) {
		b, p := countBound(ps)
		return b == 2, fmt.Sprintf("%d bound, %d pending\n%s", b, p, devcluster.DescribePods(ctx, clientset, ns, extLabel))
	})
	for _, p := range got {
		if p.Spec.NodeName != node {
			t.Errorf("pod %s on %s, want %s", p.Name, p.Spec.NodeName, node)
		}
	}
	poll(t, 30*time.Second, "an AgentReporting event on GPUNode "+node, func() (bool, string) {
		evs, err := eventsAbout(ctx, node)
		for _, e := range evs {
			if strings.HasPrefix(e, admission.ReasonAgentReporting+":") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("events: %q (%v)", evs, err)
	})
	checkClusterLedger(ctx, t)
}
