package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/internal/envtestutil"
)

func TestGPUNodesBecomeReady(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	nodes, err := clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
	if err != nil {
		t.Fatalf("list nodes: %v", err)
	}
	if len(nodes.Items) != e2eNodes {
		t.Fatalf("got %d GPU nodes, want %d", len(nodes.Items), e2eNodes)
	}
	model := devcluster.GPUModels[devcluster.DefaultOptions().GPUModel]
	for _, n := range nodes.Items {
		if !devcluster.NodeReady(&n) {
			t.Errorf("node %s is not Ready: %+v", n.Name, n.Status.Conditions)
		}
		want := map[string]string{
			v1alpha1.LabelNVIDIAGPUCount:   fmt.Sprint(e2eGPUsPerNode),
			v1alpha1.LabelNVIDIAGPUProduct: model.Product,
			v1alpha1.LabelNVIDIAGPUMemory:  fmt.Sprint(model.MemoryMiB),
		}
		for k, v := range want {
			if n.Labels[k] != v {
				t.Errorf("node %s label %s = %q, want %q", n.Name, k, n.Labels[k], v)
			}
		}
	}
}

func TestJobCompletesOnSimulatedGPUNode(t *testing.T) {
	ctx := testContext(t, 90*time.Second)
	ns := createNamespace(ctx, t, clientset)
	job := sampleJob(ns, "complete")
	if _, err := clientset.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create job: %v", err)
	}
	done, err := devcluster.WaitJobComplete(ctx, clientset, ns, job.Name, 60*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if done.Status.Succeeded != 1 {
		t.Errorf("succeeded = %d, want 1", done.Status.Succeeded)
	}
	pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + job.Name})
	if err != nil {
		t.Fatalf("list pods: %v", err)
	}
	for _, p := range pods.Items {
		if !strings.HasPrefix(p.Spec.NodeName, "gpu-node-") {
			t.Errorf("pod %s ran on %q, want a simulated GPU node", p.Name, p.Spec.NodeName)
		}
	}
}

func TestCRDsAreServed(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatalf("create client: %v", err)
	}
	for _, list := range []client.ObjectList{&v1alpha1.QueueList{}, &v1alpha1.PodGroupList{}, &v1alpha1.GPUNodeList{}} {
		if err := c.List(ctx, list); err != nil {
			t.Errorf("list %T: %v", list, err)
		}
	}
	q := &v1alpha1.Queue{ObjectMeta: metav1.ObjectMeta{Name: "e2e-crd-check"}}
	if err := c.Create(ctx, q); err != nil {
		t.Fatalf("create queue: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), q) })
}

func TestUpTwiceIsHarmless(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	out, err := partita(ctx, "dev", "up", "--name", clusterName,
		"--nodes", fmt.Sprint(e2eNodes), "--gpus-per-node", fmt.Sprint(e2eGPUsPerNode))
	if err != nil {
		t.Fatalf("second dev up: %v\n%s", err, out)
	}
	if !strings.Contains(out, "already running") {
		t.Errorf("second dev up did not say the cluster was already running:\n%s", out)
	}
	out, err = partita(ctx, "dev", "status", "--name", clusterName, "-o", "json")
	if err != nil {
		t.Fatalf("dev status: %v\n%s", err, out)
	}
	var st devcluster.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("decode status: %v\n%s", err, out)
	}
	if st.APIServer != "ready" || st.GPUNodes != e2eNodes || st.ReadyNodes != e2eNodes {
		t.Errorf("status after second up = %+v, want ready API server and %d ready GPU nodes", st, e2eNodes)
	}
	for comp, state := range st.Components {
		if state != "running" {
			t.Errorf("component %s is %s after second up", comp, state)
		}
	}
	out, err = partita(ctx, "dev", "kubeconfig", "--name", clusterName)
	if err != nil || strings.TrimSpace(out) != cluster.KubeconfigPath() {
		t.Errorf("dev kubeconfig = %q (%v), want %q", out, err, cluster.KubeconfigPath())
	}
}

func TestUpWithMissingBinariesSaysWhatToRun(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	out, err := partita(ctx, "dev", "up", "--name", "e2e-nobins", "--bin-dir", t.TempDir())
	if err == nil {
		t.Fatalf("dev up without binaries succeeded:\n%s", out)
	}
	for _, want := range []string{"kube-apiserver", "make cluster-bins"} {
		if !strings.Contains(out, want) {
			t.Errorf("error does not mention %q:\n%s", want, out)
		}
	}
}

// TestBrokenClusterFailsFastWithPodState starts a second cluster without
// kube-scheduler: the Job wait must fail within its short timeout and show the
// pod's state. Then `dev down` must leave no process of that cluster behind.
func TestBrokenClusterFailsFastWithPodState(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	name := clusterName + "-nosched"
	opts := devcluster.DefaultOptions()
	opts.Name = name
	broken, err := devcluster.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = partita(context.WithoutCancel(ctx), "dev", "down", "--name", name) })
	if out, err := partita(ctx, "dev", "up", "--name", name, "--nodes", "1", "--disable", "kube-scheduler"); err != nil {
		t.Fatalf("dev up without scheduler: %v\n%s", err, out)
	}
	cs, err := broken.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	ns := createNamespace(ctx, t, cs)
	job := sampleJob(ns, "never")
	if _, err := cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create job: %v", err)
	}
	start := time.Now()
	_, err = devcluster.WaitJobComplete(ctx, cs, ns, job.Name, 8*time.Second)
	if err == nil {
		t.Fatal("job completed without a scheduler")
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("wait took %s, want it to give up soon after its 8s timeout", took)
	}
	t.Logf("the wait failed as it should:\n%v", err)
	for _, want := range []string{"did not complete", "phase Pending", "<not scheduled>"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("failure message does not show %q:\n%v", want, err)
		}
	}

	if out, err := partita(ctx, "dev", "down", "--name", name); err != nil {
		t.Fatalf("dev down: %v\n%s", err, out)
	}
	if left := devcluster.ProcessesUsing(broken.Dir()); len(left) > 0 {
		t.Errorf("processes left after dev down: %v", left)
	}
	out, err := partita(ctx, "dev", "status", "--name", name)
	if err != nil || !strings.Contains(out, "does not exist") {
		t.Errorf("status after down = %q (%v), want it to say the cluster does not exist", out, err)
	}
}

func createNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns.Name, metav1.DeleteOptions{})
	})
	return ns.Name
}

func sampleJob(ns, name string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					NodeSelector:  map[string]string{v1alpha1.LabelGPUNode: "true"},
					Containers:    []corev1.Container{{Name: "main", Image: "busybox", Command: []string{"true"}}},
				},
			},
		},
	}
}
