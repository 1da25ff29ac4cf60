package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
)

// TestFailover is the smallest version of issue 31's failover scenarios,
// on a cluster of its own whose extender runs two replicas (`dev up
// --extender-replicas 2`): the leading extender is SIGKILLed in the middle
// of a fill and of a reclaim, and kube-apiserver in the middle of a fill.
// Each time a standby (or the restarted API server) carries on: every pod
// binds, no device is given twice and no GPU pod is bound without devices
// (the ledger rebuilt from GPUNodes and pods), no gang is left half bound,
// and a reclaim ends at the fair share, its evictions neither lost nor
// repeated.
func TestFailover(t *testing.T) {
	if benchOnly() || externalKubeconfig != "" {
		t.Skip("runs on a dev cluster of its own, not with PARTITA_E2E_BENCH=only or an external cluster")
	}
	const nodes, gpus = 4, 8
	ctx := benchContext(t, 15*time.Minute)
	name := clusterName + "-failover"
	bc, cs, c := benchCluster(ctx, t, name, nodes, gpus, "--extender-replicas", "2")
	devUpAgain := func() {
		t.Helper()
		out, err := partita(ctx, "dev", "up", "--name", name, "--nodes", fmt.Sprint(nodes), "--gpus-per-node", fmt.Sprint(gpus), "--extender-replicas", "2")
		if err != nil {
			t.Fatalf("dev up: %v\n%s", err, out)
		}
	}
	ns := createNamespace(ctx, t, cs)
	waitServiceAccount(ctx, t, cs, ns)
	for _, q := range []*v1alpha1.Queue{gpuQueue("borrower", ns, "0", "-1", 1), gpuQueue("owner", ns, "16", "-1", 1)} {
		if err := c.Create(ctx, q); err != nil {
			t.Fatalf("create queue %s: %v", q.Name, err)
		}
	}
	pod := func(name, phase, q string) *corev1.Pod {
		p := tputPod(ns, name, phase, 1000)
		p.Labels[v1alpha1.LabelQueue] = q
		return p
	}
	// fill: 16 single pods and 4 gangs of 4, created while f kills; all
	// bind, gangs whole, and the ledger is sound.
	fill := func(phase string, kill func()) {
		t.Helper()
		var pods []*corev1.Pod
		for i := range 16 {
			pods = append(pods, pod(fmt.Sprintf("%s-%02d", phase, i), phase, "borrower"))
		}
		for g := range 4 {
			group := fmt.Sprintf("%s-gang-%d", phase, g)
			if err := c.Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: group, Namespace: ns},
				Spec: v1alpha1.PodGroupSpec{MinMember: 4, Queue: "borrower"}}); err != nil {
				t.Fatalf("create pod group: %v", err)
			}
			for i := range 4 {
				p := pod(fmt.Sprintf("%s-%d", group, i), phase, "borrower")
				p.Labels[v1alpha1.LabelPodGroup] = group
				pods = append(pods, p)
			}
		}
		createPods(ctx, t, cs, pods[:12], 8)
		kill()
		createPods(ctx, t, cs, pods[12:], 8)
		waitAllBound(ctx, t, cs, ns, "e2e.partita.dev/phase="+phase, len(pods), 3*time.Minute)
		checkFailoverLedger(ctx, t, c, cs, ns)
		deletePhase(ctx, t, cs, ns, phase)
		waitNoGPUsHeld(ctx, t, c, cs)
	}

	t.Run("leader killed mid-fill", func(t *testing.T) {
		fill("fill-a", func() {
			pause := killExtenderLeader(ctx, t, bc)
			t.Logf("a standby led %s after the leader was killed", pause.Round(100*time.Millisecond))
		})
		// The killed replica comes back as a standby; kill the new leader
		// too.
		devUpAgain()
		fill("fill-b", func() {
			pause := killExtenderLeader(ctx, t, bc)
			t.Logf("second kill: a standby led %s after", pause.Round(100*time.Millisecond))
		})
		devUpAgain()
	})

	t.Run("kube-apiserver restarted mid-fill", func(t *testing.T) {
		fill("fill-c", func() {
			killAPIServer(t, bc)
			begin := time.Now()
			devUpAgain()
			t.Logf("kube-apiserver answered again %s after it was killed", time.Since(begin).Round(100*time.Millisecond))
		})
	})

	t.Run("leader killed mid-reclaim", func(t *testing.T) {
		var borrowed []*corev1.Pod
		for i := range nodes * gpus {
			borrowed = append(borrowed, pod(fmt.Sprintf("borrowed-%02d", i), "borrowed", "borrower"))
		}
		createPods(ctx, t, cs, borrowed, 8)
		waitAllBound(ctx, t, cs, ns, "e2e.partita.dev/phase=borrowed", len(borrowed), 3*time.Minute)
		var owned []*corev1.Pod
		for i := range 16 {
			owned = append(owned, pod(fmt.Sprintf("owned-%02d", i), "owned", "owner"))
		}
		createPods(ctx, t, cs, owned, 8)
		// Kill once the first eviction is decided: the rest are the new
		// leader's to make, and none may be made twice.
		poll(t, 2*time.Minute, "the first borrower pod evicted", func() (bool, string) {
			n := countHeld(ctx, t, cs, ns, "borrower")
			return n < len(borrowed), fmt.Sprintf("borrower holds %d", n)
		})
		pause := killExtenderLeader(ctx, t, bc)
		t.Logf("a standby led %s after the leader was killed mid-reclaim", pause.Round(100*time.Millisecond))
		waitAllBound(ctx, t, cs, ns, "e2e.partita.dev/phase=owned", len(owned), 3*time.Minute)
		// Nothing more is evicted once the owner holds its quota.
		time.Sleep(10 * time.Second)
		if b, o := countHeld(ctx, t, cs, ns, "borrower"), countHeld(ctx, t, cs, ns, "owner"); b != 16 || o != 16 {
			t.Errorf("after the reclaim the borrower holds %d and the owner %d GPUs, want 16 and 16 (evictions lost or repeated)", b, o)
		}
		checkFailoverLedger(ctx, t, c, cs, ns)
		devUpAgain()
	})

	t.Run("a leader that lost its Lease comes back as a standby", func(t *testing.T) {
		// A leader frozen past its Lease (SIGSTOP: as an API server too
		// slow to answer its renewals looks to it) finds another leading
		// when it wakes, stops leading and, with no kubelet to restart
		// it, starts itself again in place (--on-lost-leadership=restart):
		// same pid, ready again, a standby. Without that the next kill of
		// the leader left the cluster with no extender at all.
		leader, err := bc.WaitExtenderLeader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(leader.PID, syscall.SIGSTOP); err != nil {
			t.Fatalf("stop %s: %v", leader.Name, err)
		}
		stopped := true
		defer func() {
			if stopped {
				_ = syscall.Kill(leader.PID, syscall.SIGCONT)
			}
		}()
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if _, err := bc.WaitExtenderLeader(wctx, leader.Name); err != nil {
			t.Fatalf("no standby took over from the stopped leader: %v", err)
		}
		if err := syscall.Kill(leader.PID, syscall.SIGCONT); err != nil {
			t.Fatalf("continue %s: %v", leader.Name, err)
		}
		stopped = false
		poll(t, time.Minute, leader.Name+" back as a ready standby, same pid", func() (bool, string) {
			reps, err := bc.ExtenderReplicas(ctx)
			if err != nil {
				return false, err.Error()
			}
			for _, r := range reps {
				if r.Name == leader.Name {
					return r.PID == leader.PID && r.Running && r.Ready && !r.Leader, fmt.Sprintf("%+v", reps)
				}
			}
			return false, fmt.Sprintf("no replica %s in %+v", leader.Name, reps)
		})
		// It restarted rather than led on: its log says so.
		b, err := os.ReadFile(bc.HostProcessLog(leader.Name))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "Lost the Lease; starting again as a standby") {
			t.Errorf("%s's log does not say it started again after losing the Lease", leader.Name)
		}
		// And the cluster still binds, through either (the reclaim's pods
		// gone first: they fill it).
		deletePhase(ctx, t, cs, ns, "borrowed")
		deletePhase(ctx, t, cs, ns, "owned")
		waitNoGPUsHeld(ctx, t, c, cs)
		fill("fill-d", func() {})
	})
}

// killExtenderLeader SIGKILLs the leading extender replica and returns how
// long until another led.
func killExtenderLeader(ctx context.Context, t *testing.T, bc *devcluster.Cluster) time.Duration {
	t.Helper()
	pause, err := killLeadingExtender(ctx, bc)
	if err != nil {
		t.Fatal(err)
	}
	// The dev cluster's Lease lasts 6 s; a standby must lead within it
	// and a few retry periods.
	if pause > 15*time.Second {
		t.Errorf("a standby led %s after the leader was killed, want within the Lease's time", pause)
	}
	return pause
}

// killLeadingExtender SIGKILLs the leading extender replica, waits for
// another to lead and returns how long that took.
func killLeadingExtender(ctx context.Context, bc *devcluster.Cluster) (time.Duration, error) {
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	leader, err := bc.WaitExtenderLeader(wctx)
	if err != nil {
		return 0, err
	}
	killed := time.Now()
	if err := bc.KillHostProcess(leader.Name, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("kill %s: %w", leader.Name, err)
	}
	if _, err := bc.WaitExtenderLeader(wctx, leader.Name); err != nil {
		return 0, err
	}
	return time.Since(killed), nil
}

// killAPIServer SIGKILLs the cluster's kube-apiserver.
func killAPIServer(t *testing.T, bc *devcluster.Cluster) {
	t.Helper()
	if err := killAPIServerProcess(t.Context(), bc); err != nil {
		t.Fatal(err)
	}
}

// killAPIServerProcess SIGKILLs the cluster's kube-apiserver and waits
// until it is gone (for callers off the test's goroutine).
func killAPIServerProcess(ctx context.Context, bc *devcluster.Cluster) error {
	b, err := os.ReadFile(filepath.Join(bc.Dir(), "pids", "kube-apiserver.pid"))
	if err != nil {
		return fmt.Errorf("read kube-apiserver's pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("kube-apiserver's pid file: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill kube-apiserver (pid %d): %w", pid, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver (pid %d) still in the process table 30s after SIGKILL", pid)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// countHeld counts the bound, not deleted pods of queue q in ns.
func countHeld(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, q string) int {
	t.Helper()
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelQueue + "=" + q})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range list.Items {
		if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
			n++
		}
	}
	return n
}

// checkFailoverLedger fails on a device given twice, a GPU pod bound
// without devices, or a gang bound in part.
func checkFailoverLedger(ctx context.Context, t *testing.T, c client.Client, cs kubernetes.Interface, ns string) {
	t.Helper()
	var gns v1alpha1.GPUNodeList
	if err := c.List(ctx, &gns); err != nil {
		t.Fatal(err)
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if problems := ledgerProblems(gns.Items, pods.Items); len(problems) > 0 {
		t.Errorf("the ledger shows %d problems: %s", len(problems), strings.Join(problems, "; "))
	}
	bound, total := map[string]int{}, map[string]int{}
	for _, p := range pods.Items {
		g := p.Labels[v1alpha1.LabelPodGroup]
		if p.Namespace != ns || g == "" || p.DeletionTimestamp != nil {
			continue
		}
		total[g]++
		if p.Spec.NodeName != "" {
			bound[g]++
		}
	}
	for g, n := range total {
		if bound[g] != 0 && bound[g] != n {
			t.Errorf("gang %s is half bound: %d of %d members", g, bound[g], n)
		}
	}
}
