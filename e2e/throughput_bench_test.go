package e2e

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// TestPodThroughput is issue 19's benchmark (docs/benchmarks.md, "A GPU pod
// as cheap as a plain pod"): on one dev cluster of its own, in one run, it
// creates with one Go client (32 workers, QPS 1000) N plain pods, N
// half-GPU pods and N/8 gangs of 8 one-GPU pods, all as users write them
// (no canonical keys: the GPU pods go through the webhook and the admission
// loop), in a namespace the webhook manages. For each phase it prints
// pods/s from the first create to the last pod bound and the ratio to the
// plain pods' rate, the creation time, and the API writes per pod by kind,
// counted from watch events: every ADDED or MODIFIED event of a pod, an
// Event, a PodGroup, a Queue or a GPUNode is one write the API server
// stored (a new resourceVersion). It also creates the half-GPU pods, held
// by a gate, in partita-system, which the webhook skips, and compares the
// creation times with and without the webhook.
//
// It runs only with PARTITA_E2E_BENCH=1; PARTITA_E2E_BENCH_NODES (50) and
// PARTITA_E2E_BENCH_PODS (400) set the size. PARTITA_E2E_BENCH_WEBHOOK_FLAGS
// (space-separated) are more flags for the webhook: with
// --admission-gate=false the GPU pods skip the admission loop, which
// measures what the loop costs (not what users get):
//
//	make build && PARTITA_E2E_BENCH=1 PARTITA_BIN=$PWD/bin/partita go test -count=1 -v -timeout 40m -run TestPodThroughput ./e2e/
func TestPodThroughput(t *testing.T) {
	if os.Getenv("PARTITA_E2E_BENCH") == "" {
		t.Skip("set PARTITA_E2E_BENCH=1 to run the end-to-end throughput benchmark")
	}
	nodes, n := envInt(t, "PARTITA_E2E_BENCH_NODES", 50), envInt(t, "PARTITA_E2E_BENCH_PODS", 400)
	const gpus, gangSize, workers = 8, 8, 32
	n = max(gangSize, n/gangSize*gangSize)
	if n > nodes*gpus {
		t.Fatalf("%d one-GPU gang pods do not fit %d nodes × %d GPUs", n, nodes, gpus)
	}
	ctx := benchContext(t, 40*time.Minute)
	start := time.Now()
	webhookFlags := strings.Fields(os.Getenv("PARTITA_E2E_BENCH_WEBHOOK_FLAGS"))
	var devUp []string
	for _, f := range webhookFlags {
		devUp = append(devUp, "--webhook-flag="+f)
	}
	bc, cs, c := benchCluster(ctx, t, clusterName+"-tput", nodes, gpus, devUp...)
	t.Logf("cluster of %d nodes × %d GPUs ready in %s", nodes, gpus, time.Since(start).Round(time.Second))
	cfg, err := bc.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 1000, 2000
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ns := createNamespace(ctx, t, cs)
	waitServiceAccount(ctx, t, cs, ns)
	const system = "partita-system"
	waitServiceAccount(ctx, t, cs, system)

	// A warm-up: the client's connections, the webhook's and the
	// extender's caches, and the API server's watch caches.
	warm := make([]*corev1.Pod, 2*workers)
	for i := range warm {
		warm[i] = tputPod(ns, fmt.Sprintf("warm-%03d", i), "warm", 500*int64(i%2))
	}
	createPods(ctx, t, cs, warm, workers)
	waitAllBound(ctx, t, cs, ns, "e2e.partita.dev/phase=warm", len(warm), 5*time.Minute)
	deletePhase(ctx, t, cs, ns, "warm")

	// Creation with and without the webhook: the same half-GPU pods,
	// created as dry runs (admission runs, nothing is stored, so nothing
	// is scheduled) in the test's namespace and in partita-system, which
	// the webhook skips; twice each, alternating.
	var withWebhook, withoutWebhook time.Duration
	for range 2 {
		for _, target := range []string{system, ns} {
			pods := make([]*corev1.Pod, n)
			for i := range pods {
				pods[i] = tputPod(target, fmt.Sprintf("dry-%04d", i), "dry", 500)
			}
			begin := time.Now()
			createPodsDry(ctx, t, cs, pods, workers)
			if target == ns {
				withWebhook += time.Since(begin)
			} else {
				withoutWebhook += time.Since(begin)
			}
		}
	}

	type phase struct {
		name     string
		pods     []*corev1.Pod
		groups   int
		rate     float64
		created  time.Duration
		bound    time.Duration
		writes   map[string]int
		cpu      string
		extender string
		reviews  string
		// apiWebhook is the API server's time in webhook calls.
		apiWebhook string
		// requests are the API server's requests per pod until the last
		// bind, by verb and resource.
		requests string
	}
	phases := []*phase{{name: "plain"}, {name: "half-GPU"}, {name: "gang 8×1 GPU"}}
	for i := range n {
		phases[0].pods = append(phases[0].pods, tputPod(ns, fmt.Sprintf("plain-%04d", i), "plain", 0))
		phases[1].pods = append(phases[1].pods, tputPod(ns, fmt.Sprintf("half-%04d", i), "half", 500))
		g := fmt.Sprintf("gang-%03d", i/gangSize)
		p := tputPod(ns, fmt.Sprintf("%s-%d", g, i%gangSize), "gang", 1000)
		p.Labels[v1alpha1.LabelPodGroup] = g
		phases[2].pods = append(phases[2].pods, p)
	}
	phases[2].groups = n / gangSize
	for _, ph := range phases {
		label := ph.pods[0].Labels["e2e.partita.dev/phase"]
		selector := "e2e.partita.dev/phase=" + label
		counter := countWrites(ctx, t, cs, wc, ns, selector, n)
		reviewsBefore := webhookReviews(ctx, t, bc)
		apiBefore := apiserverWebhookTimes(ctx, cs)
		requestsBefore := apiserverRequests(ctx, cs)
		cpuBefore := componentCPU(bc.Dir())
		profiled := profilePhase(ctx, t, cs, label)
		begin := time.Now()
		// The PodGroups first, by the same workers as the pods: one at a
		// time, their creates (each through the PodGroup webhook) left the
		// cluster idle for a second or two of the phase.
		inParallel(t, workers, ph.groups, func(g int) error {
			pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gang-%03d", g), Namespace: ns,
				Labels: map[string]string{"e2e.partita.dev/phase": label}}, Spec: v1alpha1.PodGroupSpec{MinMember: gangSize}}
			if err := c.Create(ctx, pg); err != nil {
				return fmt.Errorf("create pod group %s: %w", pg.Name, err)
			}
			return nil
		})
		createPods(ctx, t, cs, ph.pods, workers)
		ph.created = time.Since(begin)
		ph.bound = counter.waitAllBound(t, 10*time.Minute).Sub(begin)
		ph.rate = float64(n) / ph.bound.Seconds()
		ph.cpu = cpuSince(bc.Dir(), cpuBefore)
		ph.requests = requestsSince(apiserverRequests(ctx, cs), requestsBefore, n)
		profiled()
		// Writes that follow the binding (the node's status updates, the
		// agent's GPUNode status) count too.
		waitAllRunning(ctx, t, cs, ns, selector, n, 5*time.Minute)
		time.Sleep(3 * time.Second)
		ph.writes = counter.stop()
		for _, k := range slices.Sorted(maps.Keys(counter.samples)) {
			if !strings.HasSuffix(k, " Scheduled") {
				t.Logf("%s: %s, e.g.: %s", ph.name, k, counter.samples[k])
			}
		}
		ph.reviews = reviewsSince(webhookReviews(ctx, t, bc), reviewsBefore, n)
		ph.apiWebhook = webhookTimesSince(apiserverWebhookTimes(ctx, cs), apiBefore)
		ph.extender = extenderCounts(ctx, bc)
		t.Logf("%s: %d pods created in %s (%.1f pods/s); all bound %s after the first create: %.1f pods/s",
			ph.name, n, ph.created.Round(time.Millisecond), float64(n)/ph.created.Seconds(), ph.bound.Round(time.Millisecond), ph.rate)
		t.Logf("%s: CPU used until the last bind: %s", ph.name, ph.cpu)
		t.Logf("%s: API writes per pod: %s", ph.name, formatWrites(ph.writes, n))
		t.Logf("%s: API requests per pod until the last bind, by verb and resource: %s", ph.name, ph.requests)
		t.Logf("%s: extender so far: %s", ph.name, ph.extender)
		t.Logf("%s: webhook calls per pod: %s", ph.name, ph.reviews)
		t.Logf("%s: the API server's webhook calls, mean time each: %s", ph.name, ph.apiWebhook)
		deletePhase(ctx, t, cs, ns, label)
		for g := range ph.groups {
			_ = c.Delete(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gang-%03d", g), Namespace: ns}})
		}
		waitNoGPUsHeld(ctx, t, c, cs)
	}
	plain := phases[0]
	t.Logf("RESULT %d nodes × %d GPUs, %d pods a phase, %d workers", nodes, gpus, n, workers)
	if len(webhookFlags) > 0 {
		t.Logf("RESULT the webhook ran with %s: not as users run it", strings.Join(webhookFlags, " "))
	}
	for _, ph := range phases[1:] {
		t.Logf("RESULT %s %.1f pods/s vs plain %.1f pods/s: ratio %.2f (target ≥ 0.9)", ph.name, ph.rate, plain.rate, ph.rate/plain.rate)
	}
	half := phases[1]
	t.Logf("RESULT creation of %d half-GPU pods (dry runs, twice): through the webhook %.1f pods/s, without it (%s) %.1f pods/s: ratio %.2f (target ≥ 0.9)",
		n, float64(2*n)/withWebhook.Seconds(), system, float64(2*n)/withoutWebhook.Seconds(), withoutWebhook.Seconds()/withWebhook.Seconds())
	t.Logf("RESULT creation during the phases: half-GPU pods through the webhook %s (%.1f pods/s), plain pods (no webhook call) %s (%.1f pods/s): ratio %.2f",
		half.created.Round(time.Millisecond), float64(n)/half.created.Seconds(), plain.created.Round(time.Millisecond), float64(n)/plain.created.Seconds(),
		plain.created.Seconds()/half.created.Seconds())
	for _, ph := range phases {
		t.Logf("RESULT writes per pod, %s: %s", ph.name, formatWrites(ph.writes, n))
		t.Logf("RESULT webhook calls per pod, %s: %s", ph.name, ph.reviews)
	}
}

// profilePhase profiles the phase named label when PARTITA_E2E_BENCH_PROFILE
// names a folder: a CPU profile of kube-apiserver
// (<folder>/apiserver-<label>.pprof, `go tool pprof -top` reads it) and,
// with PARTITA_E2E_BENCH_PERF=1, `perf record -a -g` of the whole machine
// (<folder>/perf-<label>.data, `perf report --sort comm,sym`), for the
// first PARTITA_E2E_BENCH_PROFILE_SECONDS (5 s unless set). It returns a
// function that waits for both.
func profilePhase(ctx context.Context, t *testing.T, cs kubernetes.Interface, label string) func() {
	dir := os.Getenv("PARTITA_E2E_BENCH_PROFILE")
	if dir == "" {
		return func() {}
	}
	seconds := envInt(t, "PARTITA_E2E_BENCH_PROFILE_SECONDS", 5)
	var perf *exec.Cmd
	if os.Getenv("PARTITA_E2E_BENCH_PERF") == "1" {
		perf = exec.CommandContext(ctx, "perf", "record", "-a", "-g", "-o", filepath.Join(dir, "perf-"+label+".data"), "--", "sleep", strconv.Itoa(seconds))
		if err := perf.Start(); err != nil {
			t.Logf("perf record: %v", err)
			perf = nil
		}
	}
	done := make(chan struct{})
	var profile []byte
	var err error
	go func() {
		defer close(done)
		profile, err = cs.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
			Param("seconds", strconv.Itoa(seconds)).Timeout(time.Duration(seconds+30) * time.Second).DoRaw(ctx)
	}()
	return func() {
		if perf != nil {
			if err := perf.Wait(); err != nil {
				t.Logf("perf record, phase %s: %v", label, err)
			}
		}
		<-done
		if err != nil {
			t.Logf("profile of kube-apiserver, phase %s: %v", label, err)
			return
		}
		path := filepath.Join(dir, "apiserver-"+label+".pprof")
		if err := os.WriteFile(path, profile, 0o644); err != nil {
			t.Logf("write %s: %v", path, err)
			return
		}
		t.Logf("profiles of phase %s, its first %d s, in %s", label, seconds, dir)
	}
}

// webhookReviews reads the dev cluster's webhook's request counters, by
// webhook and operation.
func webhookReviews(ctx context.Context, t *testing.T, c *devcluster.Cluster) map[string]float64 {
	t.Helper()
	port, err := c.Port("webhook")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(filepath.Join(c.Dir(), "partita", "webhook-certs", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("read the webhook's metrics: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range metricFamilies(t, b)["partita_webhook_admission_requests_total"].GetMetric() {
		out[metricLabel(m, "webhook")+" "+metricLabel(m, "operation")] += m.GetCounter().GetValue()
	}
	return out
}

// metricFamilies parses a /metrics page in Prometheus' text format.
func metricFamilies(t *testing.T, b []byte) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := parseMetrics(b)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	return fams
}

// parseMetrics parses Prometheus' text format.
func parseMetrics(b []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(b))
}

// metricLabel is the value of m's label name, "" without it.
func metricLabel(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// reviewsSince is the webhook calls per pod since before, by webhook and
// operation.
func reviewsSince(now, before map[string]float64, pods int) string {
	total := 0.0
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(now)) {
		d := now[k] - before[k]
		if d == 0 {
			continue
		}
		total += d
		parts = append(parts, fmt.Sprintf("%s %.2f", k, d/float64(pods)))
	}
	return fmt.Sprintf("%.2f (%s)", total/float64(pods), strings.Join(parts, ", "))
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// tputPod is a pod as a user writes it: milli 0 asks for no GPU, 1000 for
// one whole GPU (nvidia.com/gpu: 1, as the NVIDIA device plugin's users
// write it), anything else for a slice (partita.dev/gpu-fraction).
func tputPod(ns, name, phase string, milli int64) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{extLabel: "true", "e2e.partita.dev/phase": phase}},
		Spec: corev1.PodSpec{
			NodeSelector:                  gpuNodes,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	switch {
	case milli == 1000:
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	case milli > 0:
		p.Annotations = map[string]string{v1alpha1.AnnotationGPUFraction: gpu.FormatMilli(milli)}
	}
	return p
}

// createPodsDry creates pods as dry runs with a few workers at once.
func createPodsDry(ctx context.Context, t *testing.T, cs kubernetes.Interface, pods []*corev1.Pod, workers int) {
	t.Helper()
	var next atomic.Int64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(pods); i = int(next.Add(1)) - 1 {
				if _, err := cs.CoreV1().Pods(pods[i].Namespace).Create(ctx, pods[i], metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
					if failed.Add(1) == 1 {
						t.Errorf("create pod %s/%s (dry run): %v", pods[i].Namespace, pods[i].Name, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// waitAllBound polls (from the watch cache) until want pods of the
// selector are bound, and returns when the last was seen bound.
func waitAllBound(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, selector string, want int, d time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: selector})
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := countBound(list.Items); b == want {
			return time.Now()
		} else if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d pods bound after %s", selector, b, want, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitAllRunning(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, selector string, want int, d time.Duration) {
	t.Helper()
	poll(t, d, fmt.Sprintf("%d pods of %s running", want, selector), func() (bool, string) {
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == want, fmt.Sprintf("%d of %d running", running, len(list.Items))
	})
}

// deletePhase deletes a phase's pods and waits until they are gone. The
// pods are deleted one by one by 16 workers: a DeleteCollection of
// thousands outlasts the API server's request timeout (kube-apiserver
// deletes a collection's items one at a time), and the scale benchmark's
// cleanups then took minutes. They are deleted gracefully, as users
// delete pods: kwok, as a kubelet does, removes each once it sees it
// terminating, so that gone means kwok is done with it. (With grace 0 a
// pod was gone at once, and kwok's own delete of it came minutes later,
// amid the next scenario: a DELETE per pod in its API counts, and the
// victims of a big reclaim queued behind them.)
func deletePhase(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, phase string) {
	t.Helper()
	sel := metav1.ListOptions{LabelSelector: "e2e.partita.dev/phase=" + phase}
	now := metav1.DeleteOptions{}
	poll(t, 5*time.Minute, "the "+phase+" pods gone", func() (bool, string) {
		list, err := cs.CoreV1().Pods(ns).List(ctx, sel)
		if err != nil {
			return false, err.Error()
		}
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < len(list.Items); i = int(next.Add(1)) - 1 {
					if p := &list.Items[i]; p.DeletionTimestamp == nil {
						// Errors are seen again at the next poll, as pods left.
						_ = cs.CoreV1().Pods(ns).Delete(ctx, p.Name, now)
					}
				}
			})
		}
		wg.Wait()
		return len(list.Items) == 0, fmt.Sprintf("%d left", len(list.Items))
	})
}

// waitNoGPUsHeld waits until no pod holds a GPU, so that each phase finds
// the cluster empty.
func waitNoGPUsHeld(ctx context.Context, t *testing.T, c client.Client, cs kubernetes.Interface) {
	t.Helper()
	poll(t, 3*time.Minute, "every GPU free", func() (bool, string) {
		var gns v1alpha1.GPUNodeList
		if err := c.List(ctx, &gns); err != nil {
			return false, err.Error()
		}
		pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		st := gpu.BuildLedger(gns.Items, pods.Items).State()
		return len(st.Pods) == 0, fmt.Sprintf("%d pods hold GPUs", len(st.Pods))
	})
	// The extender's ledger and the admission loop hear of the deletions
	// through their informers.
	time.Sleep(2 * time.Second)
}

// writeCounter counts the writes a phase causes, from watches opened
// before its first create.
type writeCounter struct {
	mu       sync.Mutex
	counts   map[string]int
	samples  map[string]string
	stopped  atomic.Bool
	watchers []watch.Interface
	wg       sync.WaitGroup

	// bound are the phase's pods seen bound; allBound is closed, and
	// boundAt set, when they are want.
	bound    map[string]bool
	want     int
	allBound chan struct{}
	boundAt  time.Time
}

// seeBound notes a pod seen bound.
func (w *writeCounter) seeBound(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bound[name] {
		return
	}
	w.bound[name] = true
	if len(w.bound) == w.want {
		w.boundAt = time.Now()
		close(w.allBound)
	}
}

// waitAllBound waits until the watch has seen every pod of the phase bound
// and returns when it saw the last. A watch rather than polls: listing the
// phase's pods every 50 ms (as JSON) used a fifth of a core of the API
// server's and as much of the test's, for as long as a phase lasted.
func (w *writeCounter) waitAllBound(t *testing.T, d time.Duration) time.Time {
	t.Helper()
	select {
	case <-w.allBound:
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.boundAt
	case <-time.After(d):
		w.mu.Lock()
		defer w.mu.Unlock()
		t.Fatalf("%d of %d pods seen bound after %s", len(w.bound), w.want, d)
		return time.Time{}
	}
}

func (w *writeCounter) add(kind string) {
	if w.stopped.Load() {
		return
	}
	w.mu.Lock()
	w.counts[kind]++
	w.mu.Unlock()
}

// sample keeps the first message of a kind of event.
func (w *writeCounter) sample(kind, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.samples[kind]; !ok {
		w.samples[kind] = msg
	}
}

func (w *writeCounter) stop() map[string]int {
	w.stopped.Store(true)
	for _, wi := range w.watchers {
		wi.Stop()
	}
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.counts)
}

// countWrites watches the phase's pods (each ADDED or MODIFIED event is one
// stored write, classified by what it changed), the Events in the
// namespace (by involved kind and reason), the namespace's PodGroups and
// every Queue and GPUNode.
func countWrites(ctx context.Context, t *testing.T, cs kubernetes.Interface, wc client.WithWatch, ns, selector string, want int) *writeCounter {
	t.Helper()
	w := &writeCounter{counts: map[string]int{}, samples: map[string]string{}, bound: map[string]bool{}, want: want, allBound: make(chan struct{})}
	// Each watch resumes from the last version it saw when the API server
	// closes it (it drops watchers that fall behind, which a busy box
	// makes likely), so that no write goes uncounted.
	start := func(rv, what string, open func(context.Context, metav1.ListOptions) (watch.Interface, error), f func(watch.Event)) {
		wi, err := watchtools.NewRetryWatcherWithContext(ctx, rv, &toolscache.ListWatch{WatchFuncWithContext: open})
		if err != nil {
			t.Fatalf("watch %s: %v", what, err)
		}
		w.watchers = append(w.watchers, wi)
		w.wg.Go(func() {
			for ev := range wi.ResultChan() {
				if p, ok := ev.Object.(*corev1.Pod); ok && p.Spec.NodeName != "" {
					w.seeBound(p.Name)
				}
				if w.stopped.Load() {
					continue
				}
				if ev.Type == watch.Error {
					t.Errorf("watch %s: %v", what, apierrors.FromObject(ev.Object))
					continue
				}
				f(ev)
			}
		})
	}
	// Watches from "now": resourceVersion of a fresh list.
	pl, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	rv := pl.ResourceVersion
	last := map[string]*corev1.Pod{}
	start(rv, "pods", func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.LabelSelector = selector
		return cs.CoreV1().Pods(ns).Watch(ctx, o)
	}, func(ev watch.Event) {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			return
		}
		switch ev.Type {
		case watch.Added:
			w.add("pod create")
		case watch.Modified:
			if old := last[p.Name]; old != nil {
				w.add("pod " + podChange(old, p))
			} else {
				w.add("pod update")
			}
		}
		last[p.Name] = p
	})
	start(rv, "events", func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return cs.CoreV1().Events(ns).Watch(ctx, o)
	}, func(ev watch.Event) {
		e, ok := ev.Object.(*corev1.Event)
		if ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
			kind := "event " + e.InvolvedObject.Kind + " " + e.Reason
			w.add(kind)
			w.sample(kind, e.Message)
		}
	})
	for _, l := range []struct {
		what string
		list client.ObjectList
		opts []client.ListOption
	}{
		{"podgroup", &v1alpha1.PodGroupList{}, []client.ListOption{client.InNamespace(ns)}},
		{"queue", &v1alpha1.QueueList{}, nil},
		{"gpunode", &v1alpha1.GPUNodeList{}, nil},
	} {
		what, l := l.what, l
		start(rv, what, func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return wc.Watch(ctx, l.list, append(l.opts, &client.ListOptions{Raw: &o})...)
		}, func(ev watch.Event) {
			switch ev.Type {
			case watch.Added:
				w.add(what + " create")
			case watch.Modified:
				w.add(what + " update")
			}
		})
	}
	return w
}

// podChange names what one pod write changed.
func podChange(old, cur *corev1.Pod) string {
	var parts []string
	if old.Spec.NodeName == "" && cur.Spec.NodeName != "" {
		parts = append(parts, "binding")
	}
	if len(old.Spec.SchedulingGates) != len(cur.Spec.SchedulingGates) {
		parts = append(parts, "ungate")
	}
	if !slices.Equal(conditionTypes(old), conditionTypes(cur)) || conditionsChanged(old, cur) {
		parts = append(parts, "conditions")
	}
	if old.Status.Phase != cur.Status.Phase {
		parts = append(parts, "phase")
	}
	if len(parts) == 0 {
		switch {
		case !equalStrings(old.Annotations, cur.Annotations) || !equalStrings(old.Labels, cur.Labels):
			parts = append(parts, "metadata")
		default:
			parts = append(parts, "other")
		}
	}
	return strings.Join(parts, "+")
}

func conditionTypes(p *corev1.Pod) []string {
	var out []string
	for _, c := range p.Status.Conditions {
		out = append(out, string(c.Type))
	}
	slices.Sort(out)
	return out
}

func conditionsChanged(old, cur *corev1.Pod) bool {
	m := map[corev1.PodConditionType]corev1.PodCondition{}
	for _, c := range old.Status.Conditions {
		m[c.Type] = c
	}
	for _, c := range cur.Status.Conditions {
		o, ok := m[c.Type]
		if !ok || o.Status != c.Status || o.Reason != c.Reason || o.Message != c.Message {
			return true
		}
	}
	return false
}

func equalStrings(a, b map[string]string) bool { return maps.Equal(a, b) }

// formatWrites is the writes per pod, in all and by kind.
func formatWrites(m map[string]int, pods int) string {
	total := 0
	kinds := make([]string, 0, len(m))
	for k, v := range m {
		total += v
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		return m[kinds[i]] > m[kinds[j]] || m[kinds[i]] == m[kinds[j]] && kinds[i] < kinds[j]
	})
	parts := make([]string, 0, len(kinds))
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(m[k])/float64(pods)))
	}
	return fmt.Sprintf("%.2f (%s)", float64(total)/float64(pods), strings.Join(parts, ", "))
}

// apiserverMetrics reads the API server's /metrics; nil when it cannot.
func apiserverMetrics(ctx context.Context, cs kubernetes.Interface) map[string]*dto.MetricFamily {
	b, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil
	}
	fams, err := parseMetrics(b)
	if err != nil {
		return nil
	}
	return fams
}

// apiserverWebhookTimes reads the API server's admission webhook latency
// sums and counts (apiserver_admission_webhook_admission_duration_seconds),
// by webhook name and type; nil when /metrics cannot be read.
func apiserverWebhookTimes(ctx context.Context, cs kubernetes.Interface) map[string][2]float64 {
	fams := apiserverMetrics(ctx, cs)
	if fams == nil {
		return nil
	}
	out := map[string][2]float64{}
	for _, m := range fams["apiserver_admission_webhook_admission_duration_seconds"].GetMetric() {
		k := metricLabel(m, "name") + " (" + metricLabel(m, "type") + ")"
		e := out[k]
		e[0] += m.GetHistogram().GetSampleSum()
		e[1] += float64(m.GetHistogram().GetSampleCount())
		out[k] = e
	}
	return out
}

// apiserverRequests reads the API server's request counts
// (apiserver_request_total) by verb and resource; nil when /metrics cannot
// be read.
func apiserverRequests(ctx context.Context, cs kubernetes.Interface) map[string]float64 {
	fams := apiserverMetrics(ctx, cs)
	if fams == nil {
		return nil
	}
	out := map[string]float64{}
	for _, m := range fams["apiserver_request_total"].GetMetric() {
		res := metricLabel(m, "resource")
		if res == "" {
			continue // /metrics, /healthz and the like
		}
		if sub := metricLabel(m, "subresource"); sub != "" {
			res += "/" + sub
		}
		out[metricLabel(m, "verb")+" "+res] += m.GetCounter().GetValue()
	}
	return out
}

// requestsSince lists the requests per pod between two readings, most
// first, leaving out those under 0.02 a pod.
func requestsSince(now, before map[string]float64, pods int) string {
	type req struct {
		key string
		n   float64
	}
	var reqs []req
	var total float64
	for k, v := range now {
		if d := (v - before[k]) / float64(pods); d > 0 {
			total += d
			if d >= 0.02 {
				reqs = append(reqs, req{k, d})
			}
		}
	}
	slices.SortFunc(reqs, func(a, b req) int { return cmp.Or(cmp.Compare(b.n, a.n), strings.Compare(a.key, b.key)) })
	parts := make([]string, len(reqs))
	for i, r := range reqs {
		parts[i] = fmt.Sprintf("%s %.2f", r.key, r.n)
	}
	return fmt.Sprintf("%.2f (%s)", total, strings.Join(parts, ", "))
}

func webhookTimesSince(now, before map[string][2]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(now)) {
		sum, n := now[k][0]-before[k][0], now[k][1]-before[k][1]
		if n == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.0f calls, %.1f ms", k, n, 1000*sum/n))
	}
	return strings.Join(parts, "; ")
}
