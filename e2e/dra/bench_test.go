package dra

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// labelExtenderHalf marks the bench cluster's nodes that an extender-mode
// agent serves.
const labelExtenderHalf = "e2e.partita.dev/extender-half"

// TestDRAThroughput is the dra backend's end-to-end benchmark
// (docs/benchmarks.md): on one dev cluster of its own in dra mode, half of
// whose simulated nodes are handed to a second agent in extender mode (so
// kube-scheduler calls the extender for them), it schedules in one run
// plain pods (kube-scheduler alone), half-GPU pods through the extender
// (partita.dev/gpu-milli) and half-GPU pods through kube-scheduler's DRA
// plugin (a claim on gpu.partita.dev), the same count of each, each phase on
// the same number of nodes. Pods are created held by a scheduling gate and
// released at once, so that the rate is scheduling and binding, not
// creation; they go to partita-system, which the webhook skips, and are
// written in their final form. It runs only with PARTITA_E2E_BENCH=1:
//
//	make build && PARTITA_E2E_BENCH=1 PARTITA_BIN=$PWD/bin/partita go test -count=1 -v -timeout 40m -run TestDRAThroughput ./e2e/dra/
//
// PARTITA_E2E_BENCH_NODES and PARTITA_E2E_BENCH_PODS change the size
// (default 200 nodes × 8 GPUs, 1,000 pods a phase).
func TestDRAThroughput(t *testing.T) {
	if os.Getenv("PARTITA_E2E_BENCH") == "" {
		t.Skip("set PARTITA_E2E_BENCH=1 to run the end-to-end dra benchmark")
	}
	nodes, n := envInt("PARTITA_E2E_BENCH_NODES", 200), envInt("PARTITA_E2E_BENCH_PODS", 1000)
	const gpus = 8
	ctx := testContext(t, 35*time.Minute)
	name := clusterName + "-bench"
	if os.Getenv("PARTITA_E2E_KEEP") == "" {
		t.Cleanup(func() { _, _ = partita(context.WithoutCancel(ctx), "dev", "down", "--name", name) })
	}
	start := time.Now()
	for attempt := 1; ; attempt++ {
		out, err := partita(ctx, "dev", "up", "--name", name, "--gpu-backend", "dra", "--nodes", fmt.Sprint(nodes), "--gpus-per-node", fmt.Sprint(gpus))
		if err == nil {
			break
		}
		if attempt == 5 || !strings.Contains(out, "did not become ready") {
			t.Fatalf("dev up: %v\n%s", err, out)
		}
	}
	opts := devcluster.DefaultOptions()
	opts.Name = name
	bc, err := devcluster.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := bc.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// The second half of the nodes goes to an extender-mode agent: the
	// dra agent releases them (GPUNode and slices), the other publishes
	// them with gpu-milli capacity.
	half := nodes / 2
	for i := half; i < nodes; i++ {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null,%q:"true"}}}`, v1alpha1.LabelGPUNode, labelExtenderHalf)
		if _, err := cs.CoreV1().Nodes().Patch(ctx, devcluster.NodeName(i), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	agent := exec.CommandContext(ctx, partitaBin, "agent", "--kubeconfig", bc.ServiceAccountKubeconfig(devcluster.ChartRelease+"-agent"),
		"--simulate-nodes="+labelExtenderHalf+"=true", "--sync-interval", "2s", "--heartbeat-interval", "15s",
		"--health-addr", "127.0.0.1:0", "--kube-api-qps", "200", "--kube-api-burst", "400")
	logFile, err := os.Create(filepath.Join(bc.LogsDir(), "bench-extender-agent.log"))
	if err != nil {
		t.Fatal(err)
	}
	agent.Stdout, agent.Stderr = logFile, logFile
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agent.Process.Kill(); _ = agent.Wait(); _ = logFile.Close() })
	poll(t, 10*time.Minute, "both halves published", func() (bool, string) {
		ext, slices := 0, 0
		for i := range nodes {
			node, err := cs.CoreV1().Nodes().Get(ctx, devcluster.NodeName(i), metav1.GetOptions{ResourceVersion: "0"})
			if err != nil {
				return false, err.Error()
			}
			if q, ok := node.Status.Allocatable[v1alpha1.ResourceGPUMilli]; ok && q.Value() == gpus*1000 && i >= half {
				ext++
			}
		}
		sl, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, err.Error()
		}
		for _, s := range sl.Items {
			if s.Spec.Driver == dra.DriverName {
				slices++
			}
		}
		return ext == nodes-half && slices == half, fmt.Sprintf("%d extender nodes with capacity, %d slices", ext, slices)
	})
	t.Logf("cluster of %d nodes × %d GPUs ready in %s (%d dra, %d extender)", nodes, gpus, time.Since(start).Round(time.Second), half, nodes-half)

	const ns = "partita-system"
	// The dra pods' claim template, as the webhook would write it.
	tmpl, err := dra.Template(ns, gpu.ContainerRequest{Count: 1, Milli: 500}, []int64{devcluster.GPUModels[opts.GPUModel].MemoryMiB})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	draNodes := map[string]string{v1alpha1.LabelGPUNode: "true"}
	extNodes := map[string]string{labelExtenderHalf: "true"}
	pod := func(phase string, i int, sel map[string]string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%04d", phase, i), Namespace: ns, Labels: map[string]string{"e2e.partita.dev/phase": phase}},
			Spec: corev1.PodSpec{
				NodeSelector:    sel,
				SchedulingGates: []corev1.PodSchedulingGate{{Name: "e2e.partita.dev/hold"}},
				Containers:      []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
			},
		}
	}
	run := func(what, phase string, mk func(i int) *corev1.Pod) float64 {
		pods := make([]*corev1.Pod, n)
		for i := range pods {
			pods[i] = mk(i)
		}
		createAll(ctx, t, cs, pods)
		begin := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		ungate := []byte(`[{"op":"remove","path":"/spec/schedulingGates"}]`)
		for range 32 {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					if _, err := cs.CoreV1().Pods(ns).Patch(ctx, pods[i].Name, types.JSONPatchType, ungate, metav1.PatchOptions{}); err != nil {
						t.Errorf("ungate %s: %v", pods[i].Name, err)
					}
				}
			})
		}
		for {
			list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: "e2e.partita.dev/phase=" + phase})
			if err != nil {
				t.Fatal(err)
			}
			bound := 0
			for _, p := range list.Items {
				if p.Spec.NodeName != "" {
					bound++
				}
			}
			if bound == n {
				break
			}
			if time.Since(begin) > 10*time.Minute {
				t.Fatalf("%s: %d of %d bound after 10 minutes", what, bound, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
		took := time.Since(begin)
		wg.Wait()
		rate := float64(n) / took.Seconds()
		t.Logf("%s: %d pods bound %s after the first release: %.1f pods/s", what, n, took.Round(time.Millisecond), rate)
		return rate
	}
	plain := run("plain pods, kube-scheduler alone", "plain", func(i int) *corev1.Pod { return pod("plain", i, draNodes) })
	extender := run("half-GPU pods, kube-scheduler + extender", "ext", func(i int) *corev1.Pod {
		p := pod("ext", i, extNodes)
		q := resource.MustParse("500")
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{v1alpha1.ResourceGPUMilli: q}, Limits: corev1.ResourceList{v1alpha1.ResourceGPUMilli: q},
		}
		p.Annotations = map[string]string{v1alpha1.AnnotationGPUFraction: "0.5", v1alpha1.AnnotationGPUCount: "1"}
		return p
	})
	viaDRA := run("half-GPU pods, kube-scheduler's DRA plugin", "dra", func(i int) *corev1.Pod {
		p := pod("dra", i, draNodes)
		p.Annotations = map[string]string{v1alpha1.AnnotationGPUFraction: "0.5", v1alpha1.AnnotationGPUCount: "1"}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: dra.PodClaimName(0), ResourceClaimTemplateName: &tmpl.Name}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: dra.PodClaimName(0)}}
		return p
	})
	t.Logf("RESULT plain %.1f pods/s, extender %.1f pods/s (%.2f of plain), dra %.1f pods/s (%.2f of plain)",
		plain, extender, extender/plain, viaDRA, viaDRA/plain)
}

func createAll(ctx context.Context, t *testing.T, cs kubernetes.Interface, pods []*corev1.Pod) {
	t.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(pods); i = int(next.Add(1)) - 1 {
				if _, err := cs.CoreV1().Pods(pods[i].Namespace).Create(ctx, pods[i], metav1.CreateOptions{}); err != nil {
					t.Errorf("create %s: %v", pods[i].Name, err)
				}
			}
		})
	}
	wg.Wait()
}

func envInt(key string, def int) int {
	var v int
	if _, err := fmt.Sscan(os.Getenv(key), &v); err != nil || v <= 0 {
		return def
	}
	return v
}
