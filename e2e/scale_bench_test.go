package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/gpu"
)

// TestKAIScaleScenarios is issue 31's benchmark (docs/benchmarks.md, "At
// KAI's scale"): KAI's own scale suite (docs/scale-tests in its repository)
// on a dev cluster of its own, 500 simulated nodes × 8 GPUs, pods through
// the webhook and the admission loop as users' pods go:
//
//   - fill: nodes×8 single-GPU pods, each its own workload, created at once;
//   - gang: one PodGroup of 512 × 1 GPU;
//   - reclaim: queue "owner" (quota half the cluster) takes its share back
//     from queue "borrower" (quota 0), which fills the cluster;
//   - big-reclaim: one gang of "owner" of nodes/2 pods × 8 GPUs (KAI's
//     250 × 8) reclaims its room from a cluster that "borrower" fills;
//   - pending (not in the default list): the cluster full, then 50,000
//     more single-GPU pods (PARTITA_E2E_SCALE_PENDING) that wait for room:
//     the memory target, and the cycle's time at that size.
//
// KAI's suite runs Jobs (its pod grouper makes a PodGroup of each); here
// each single-GPU pod is a bare pod with a queue label, which Partita
// admits as a workload of one, so a reclaimed pod is gone rather than
// recreated; the fair share is checked from what each queue holds.
//
// For each it logs wall time, pods/s, p50/p99 latency from create to bound
// per pod (and per gang), CPU seconds of every Partita process and of the
// control plane, peak memory (VmHWM) of each, and API requests per pod;
// after each it checks the ledger: no device over-allocated, no GPU pod
// bound without devices.
//
// It runs only with PARTITA_E2E_SCALE=1 (PARTITA_E2E_BENCH=only skips the
// shared cluster). PARTITA_E2E_SCALE_NODES (500), PARTITA_E2E_SCALE_RUNS
// (1) and PARTITA_E2E_SCALE_SCENARIOS (fill,gang,reclaim,big-reclaim) size
// it; PARTITA_E2E_SCALE_KILL=N SIGKILLs the leading extender N times at
// random points of the fill and reclaim scenarios (the cluster then runs
// two replicas); PARTITA_E2E_SCALE_APISERVER_RESTART=N then SIGKILLs
// kube-apiserver N times in those scenarios (dev up starts it again);
// PARTITA_E2E_SCALE_DEV_UP passes more flags to dev up:
//
//	make build && PARTITA_E2E_BENCH=only PARTITA_E2E_SCALE=1 PARTITA_BIN=$PWD/bin/partita \
//	  go test -count=1 -v -timeout 120m -run TestKAIScaleScenarios ./e2e/
func TestKAIScaleScenarios(t *testing.T) {
	if os.Getenv("PARTITA_E2E_SCALE") == "" {
		t.Skip("set PARTITA_E2E_SCALE=1 to run KAI's scale scenarios")
	}
	nodes, runs := envInt(t, "PARTITA_E2E_SCALE_NODES", 500), envInt(t, "PARTITA_E2E_SCALE_RUNS", 1)
	kills := envInt(t, "PARTITA_E2E_SCALE_KILL", 0)
	apiRestarts := envInt(t, "PARTITA_E2E_SCALE_APISERVER_RESTART", 0)
	scenarios := strings.Split(cmpOr(os.Getenv("PARTITA_E2E_SCALE_SCENARIOS"), "fill,gang,reclaim,big-reclaim"), ",")
	const gpus, workers = 8, 32
	ctx := benchContext(t, 115*time.Minute)
	start := time.Now()
	var devUp []string
	if kills > 0 {
		// The chart's Lease timings, not dev up's short ones: with the API
		// server at a full core through a fill, a 4 s renew deadline was
		// missed and both replicas exited (docs/benchmarks.md).
		devUp = append(devUp, "--extender-replicas", "2", "--extender-flag=--leader-election-lease-duration=15s",
			"--extender-flag=--leader-election-renew-deadline=10s", "--extender-flag=--leader-election-retry-period=2s")
	}
	// More flags for dev up, e.g. --extender-flag=--profiling to read the
	// extender's heap (docs/benchmarks.md).
	devUp = append(devUp, strings.Fields(os.Getenv("PARTITA_E2E_SCALE_DEV_UP"))...)
	bc, cs, c := benchCluster(ctx, t, clusterName+"-scale", nodes, gpus, devUp...)
	t.Logf("cluster of %d nodes × %d GPUs ready in %s", nodes, gpus, time.Since(start).Round(time.Second))
	ns := createNamespace(ctx, t, cs)
	waitServiceAccount(ctx, t, cs, ns)
	s := &scaleRun{t: t, ctx: ctx, cs: cs, c: c, bc: bc, ns: ns, workers: workers, nodes: nodes, gpus: gpus, kills: kills, apiRestarts: apiRestarts, devUp: devUp}
	// KAI's suite: a filler queue, a queue with no quota that fills the
	// cluster, and one whose quota it reclaims (here half the cluster).
	for _, q := range []*v1alpha1.Queue{
		gpuQueue("filler", ns, "0", "-1", 1),
		gpuQueue("borrower", ns, "0", "-1", 1),
		gpuQueue("owner", ns, strconv.Itoa(nodes*gpus/2), "-1", 1),
	} {
		if err := c.Create(ctx, q); err != nil {
			t.Fatalf("create queue %s: %v", q.Name, err)
		}
	}
	s.watch()
	// A scenario named twice in the list runs twice a round: its runs are
	// numbered across rounds.
	ran := map[string]int{}
	for range runs {
		for _, sc := range scenarios {
			ran[sc]++
			run := ran[sc]
			switch sc {
			case "fill":
				s.fill(run)
			case "gang":
				s.gang(run)
			case "reclaim":
				s.reclaim(run)
			case "big-reclaim":
				s.bigReclaim(run)
			case "pending":
				s.pending(run)
			default:
				t.Fatalf("PARTITA_E2E_SCALE_SCENARIOS: no scenario %q (fill, gang, reclaim, big-reclaim, pending)", sc)
			}
		}
	}
	t.Logf("RESULT peak memory (VmHWM) of each process over the whole run: %s", peakMemory(bc.Dir()))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// scaleRun is one cluster's scenarios and what they saw.
type scaleRun struct {
	t       *testing.T
	ctx     context.Context
	cs      kubernetes.Interface
	c       client.Client
	bc      *devcluster.Cluster
	ns      string
	workers int
	nodes   int
	gpus    int
	kills   int
	// apiRestarts is how many times kube-apiserver is SIGKILLed (and
	// started again by dev up) in the fill and reclaim scenarios, after
	// the extender kills.
	apiRestarts int
	// devUp are the cluster's dev up flags beyond its size, passed again
	// when a killed replica is started (other flags would restart both).
	devUp []string

	// batches counts the batches of pods created (batchName).
	batches int

	mu sync.Mutex
	// created and bound are when each pod (by name) was created and first
	// seen bound.
	created map[string]time.Time
	bound   map[string]time.Time
	pods    toolscache.Indexer
}

// watch follows the namespace's pods from one informer: bind times, and
// what each queue holds.
func (s *scaleRun) watch() {
	s.created, s.bound = map[string]time.Time{}, map[string]time.Time{}
	f := informers.NewSharedInformerFactoryWithOptions(s.cs, 0, informers.WithNamespace(s.ns))
	inf := f.Core().V1().Pods().Informer()
	see := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		s.mu.Lock()
		if _, ok := s.bound[p.Name]; !ok {
			s.bound[p.Name] = time.Now()
		}
		s.mu.Unlock()
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: see, UpdateFunc: func(_, cur any) { see(cur) },
	}); err != nil {
		s.t.Fatal(err)
	}
	f.Start(s.ctx.Done())
	f.WaitForCacheSync(s.ctx.Done())
	s.pods = inf.GetIndexer()
}

// create creates pods with the run's workers, noting when each was sent.
func (s *scaleRun) create(pods []*corev1.Pod) {
	s.mu.Lock()
	now := time.Now()
	for _, p := range pods {
		s.created[p.Name] = now
		delete(s.bound, p.Name)
	}
	s.mu.Unlock()
	var retried atomic.Int64
	inParallel(s.t, s.workers, len(pods), func(i int) error {
		for attempt := 1; ; attempt++ {
			_, err := s.cs.CoreV1().Pods(pods[i].Namespace).Create(s.ctx, pods[i], metav1.CreateOptions{})
			// A webhook call past its 3 s timeout refuses a GPU pod (the
			// ValidatingAdmissionPolicy's "webhook is unavailable"); a
			// Job's controller would create it again, and so does this.
			if err != nil && attempt < 5 && strings.Contains(err.Error(), "webhook is unavailable") {
				retried.Add(1)
				continue
			}
			if err != nil {
				return fmt.Errorf("create pod %s: %w", pods[i].Name, err)
			}
			return nil
		}
	})
	if n := retried.Load(); n > 0 {
		s.t.Logf("RESULT %d of %d creates were refused because a webhook call timed out under the burst, and were sent again", n, len(pods))
	}
}

// scalePod is a single-GPU pod of queue q, as a user writes it.
func (s *scaleRun) scalePod(name, phase, q string) *corev1.Pod {
	p := tputPod(s.ns, name, phase, 1000)
	p.Labels[v1alpha1.LabelQueue] = q
	return p
}

// waitBound waits until want pods of phase are bound (failing after d,
// with what it saw) and returns when the last was bound.
func (s *scaleRun) waitBound(phase string, want int, d time.Duration) time.Time {
	s.t.Helper()
	sel := labels.SelectorFromSet(labels.Set{"e2e.partita.dev/phase": phase})
	var last time.Time
	poll(s.t, d, fmt.Sprintf("%d pods of %s bound", want, phase), func() (bool, string) {
		n := 0
		last = time.Time{}
		for _, o := range s.pods.List() {
			p := o.(*corev1.Pod)
			if p.DeletionTimestamp != nil || !sel.Matches(labels.Set(p.Labels)) || p.Spec.NodeName == "" {
				continue
			}
			n++
			s.mu.Lock()
			if b := s.bound[p.Name]; b.After(last) {
				last = b
			}
			s.mu.Unlock()
		}
		return n >= want, fmt.Sprintf("%d of %d bound", n, want)
	})
	return last
}

// latencies are the create-to-bound times of the named pods, sorted.
func (s *scaleRun) latencies(names []string) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]time.Duration, 0, len(names))
	for _, n := range names {
		if b, ok := s.bound[n]; ok {
			out = append(out, b.Sub(s.created[n]))
		}
	}
	slices.Sort(out)
	return out
}

// durationAt is the q quantile of sorted durations.
func durationAt(d []time.Duration, q float64) time.Duration {
	secs := make([]float64, len(d))
	for i, x := range d {
		secs[i] = x.Seconds()
	}
	return time.Duration(quantile(secs, q) * float64(time.Second)).Round(10 * time.Millisecond)
}

// measured is one scenario's timed part: when it began, and the CPU and
// API requests counted from then on.
type measured struct {
	name  string
	begin time.Time
	cpu   *restartingCounters
	reqs  *restartingCounters
}

// cpuReading is the CPU seconds of each of the cluster's processes, and
// their pids.
func (s *scaleRun) cpuReading() (map[string]float64, map[string]string) {
	cpu, pids := map[string]float64{}, map[string]string{}
	for name, pid := range componentPIDs(s.bc.Dir()) {
		if v, ok := processCPU(pid); ok {
			cpu[name], pids[name] = v, pid
		}
	}
	return cpu, pids
}

// requestsReading is kube-apiserver's request counts, all of them counted
// by its process of now.
func (s *scaleRun) requestsReading() (map[string]float64, map[string]string) {
	reqs := apiserverRequests(s.ctx, s.cs)
	pid := componentPIDs(s.bc.Dir())["kube-apiserver"]
	owners := make(map[string]string, len(reqs))
	for k := range reqs {
		owners[k] = pid
	}
	return reqs, owners
}

func (s *scaleRun) begin(name string) *measured {
	// Where processes are killed and started again, their counters are
	// read through the scenario: a difference of two readings would mix
	// processes (negative CPU, requests counted from a restart).
	var cpuEvery, reqsEvery time.Duration
	if s.kills+s.apiRestarts > 0 {
		cpuEvery, reqsEvery = time.Second, 5*time.Second
	}
	return &measured{name: name, begin: time.Now(),
		cpu: newRestartingCounters(s.cpuReading, cpuEvery), reqs: newRestartingCounters(s.requestsReading, reqsEvery)}
}

func (s *scaleRun) report(m *measured, end time.Time, pods []string, extra string) {
	wall := end.Sub(m.begin)
	lat := s.latencies(pods)
	s.t.Logf("RESULT %s: %d pods in %s (%.1f pods/s); per pod create→bound p50 %s, p99 %s%s",
		m.name, len(pods), wall.Round(100*time.Millisecond), float64(len(pods))/wall.Seconds(), durationAt(lat, 0.5), durationAt(lat, 0.99), extra)
	s.t.Logf("RESULT %s: CPU seconds: %s", m.name, formatCPU(m.cpu.since(s.cpuReading)))
	s.t.Logf("RESULT %s: API requests per pod: %s", m.name, requestsSince(m.reqs.since(s.requestsReading), nil, len(pods)))
	s.checkLedger(m.name)
}

// killLeaderAt SIGKILLs the leading extender at random points within
// window, s.kills times, and logs how long the standby took to lead; then
// SIGKILLs kube-apiserver s.apiRestarts times, and logs how long until it
// answered again.
func (s *scaleRun) killLeaderAt(window time.Duration) func() {
	if s.kills == 0 && s.apiRestarts == 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	devUp := func(what string) bool {
		if out, err := partita(s.ctx, append([]string{"dev", "up", "--name", s.bc.Name(), "--nodes", fmt.Sprint(s.nodes),
			"--gpus-per-node", fmt.Sprint(s.gpus)}, s.devUp...)...); err != nil {
			s.t.Errorf("dev up after %s: %v\n%s", what, err, out)
			return false
		}
		return true
	}
	wg.Go(func() {
		step := window / time.Duration(s.kills+s.apiRestarts)
		for i := range s.kills + s.apiRestarts {
			select {
			case <-time.After(time.Duration(rand.Int64N(int64(step) + 1))):
			case <-done:
				return
			}
			if i < s.kills {
				pause, err := killLeadingExtender(s.ctx, s.bc)
				if err != nil {
					s.t.Errorf("kill %d of the leading extender: %v", i+1, err)
					return
				}
				s.t.Logf("RESULT kill %d: a standby led %s after the leader was killed", i+1, pause.Round(100*time.Millisecond))
				// The killed replica comes back as the standby of the next kill.
				if !devUp(fmt.Sprintf("kill %d", i+1)) {
					return
				}
				continue
			}
			n := i - s.kills + 1
			if err := killAPIServerProcess(s.ctx, s.bc); err != nil {
				s.t.Errorf("kube-apiserver restart %d: %v", n, err)
				return
			}
			killed := time.Now()
			if !devUp(fmt.Sprintf("kube-apiserver restart %d", n)) {
				return
			}
			s.t.Logf("RESULT kube-apiserver restart %d: it answered again %s after it was killed", n, time.Since(killed).Round(100*time.Millisecond))
		}
	})
	return func() { close(done); wg.Wait() }
}

func names(pods []*corev1.Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		out[i] = p.Name
	}
	return out
}

// batchName is new for each batch of pods the run creates: names are
// never reused. kwok deletes a deleted pod again, by name, minutes later
// when it lags behind; a new pod of the same name was deleted in its place
// (a big reclaim waited for 103 of its 4,000 pods that kwok had deleted).
func (s *scaleRun) batchName() string {
	s.batches++
	return fmt.Sprintf("b%d", s.batches)
}

func (s *scaleRun) fillPods(phase, q string, n int) []*corev1.Pod {
	pods := make([]*corev1.Pod, n)
	batch := s.batchName()
	for i := range pods {
		pods[i] = s.scalePod(fmt.Sprintf("%s-%s-%05d", phase, batch, i), phase, q)
	}
	return pods
}

func (s *scaleRun) clear(phases ...string) {
	for _, ph := range phases {
		deletePhase(s.ctx, s.t, s.cs, s.ns, ph)
	}
	waitNoGPUsHeld(s.ctx, s.t, s.c, s.cs)
}

func (s *scaleRun) fill(run int) {
	total := s.nodes * s.gpus
	pods := s.fillPods("fill", "filler", total)
	m := s.begin(fmt.Sprintf("fill run %d", run))
	stop := s.killLeaderAt(30 * time.Second)
	s.create(pods)
	end := s.waitBound("fill", total, 30*time.Minute)
	stop()
	s.report(m, end, names(pods), "")
	s.clear("fill")
}

func (s *scaleRun) gang(run int) {
	const size = 512
	pods := make([]*corev1.Pod, size)
	batch := s.batchName()
	for i := range pods {
		pods[i] = s.scalePod(fmt.Sprintf("gang-%s-%03d", batch, i), "gang", "filler")
		pods[i].Labels[v1alpha1.LabelPodGroup] = "gang"
	}
	m := s.begin(fmt.Sprintf("gang of %d run %d", size, run))
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "gang", Namespace: s.ns}, Spec: v1alpha1.PodGroupSpec{MinMember: size}}
	if err := s.c.Create(s.ctx, pg); err != nil {
		s.t.Fatalf("create pod group: %v", err)
	}
	s.create(pods)
	end := s.waitBound("gang", size, 10*time.Minute)
	s.report(m, end, names(pods), fmt.Sprintf("; the gang bound whole %s after its first create", end.Sub(m.begin).Round(100*time.Millisecond)))
	s.clear("gang")
	_ = s.c.Delete(s.ctx, pg)
}

// held counts the bound pods of queue q.
func (s *scaleRun) held(q string) int {
	n := 0
	for _, o := range s.pods.List() {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp == nil && p.Spec.NodeName != "" && p.Labels[v1alpha1.LabelQueue] == q {
			n++
		}
	}
	return n
}

func (s *scaleRun) reclaim(run int) {
	total := s.nodes * s.gpus
	s.create(s.fillPods("borrowed", "borrower", total))
	s.waitBound("borrowed", total, 30*time.Minute)
	share := total / 2
	pods := s.fillPods("reclaim", "owner", share)
	m := s.begin(fmt.Sprintf("reclaim of %d run %d", share, run))
	stop := s.killLeaderAt(60 * time.Second)
	s.create(pods)
	end := s.waitBound("reclaim", share, 60*time.Minute)
	stop()
	// Nothing more is evicted once the owner holds its share.
	time.Sleep(10 * time.Second)
	borrower, owner := s.held("borrower"), s.held("owner")
	off := func(got int) float64 { return 100 * float64(got-share) / float64(share) }
	s.report(m, end, names(pods), fmt.Sprintf("; then borrower holds %d (%+.1f%% of its fair share %d), owner %d (%+.1f%%)",
		borrower, off(borrower), share, owner, off(owner)))
	if off(borrower) < -5 || off(borrower) > 5 || off(owner) < -5 || off(owner) > 5 {
		s.t.Errorf("reclaim ended off the fair share by more than 5%%: borrower %d, owner %d, share %d", borrower, owner, share)
	}
	s.clear("borrowed", "reclaim")
}

// pending fills the cluster with "borrower" and then creates
// PARTITA_E2E_SCALE_PENDING (50,000) more of its single-GPU pods, which
// wait for capacity (same queue and priority: nothing to reclaim or
// preempt). Once the loop counts them all in the queue's status it reports
// the memory of every process and the admission cycle's mean time over
// 30 s.
func (s *scaleRun) pending(run int) {
	total := s.nodes * s.gpus
	n := envInt(s.t, "PARTITA_E2E_SCALE_PENDING", 50000)
	s.create(s.fillPods("full", "borrower", total))
	s.waitBound("full", total, 30*time.Minute)
	pods := s.fillPods("pending", "borrower", n)
	m := s.begin(fmt.Sprintf("%d pending run %d", n, run))
	s.create(pods)
	s.t.Logf("RESULT %d pending pods created in %s", n, time.Since(m.begin).Round(100*time.Millisecond))
	poll(s.t, 20*time.Minute, fmt.Sprintf("queue borrower counting %d pending workloads", n), func() (bool, string) {
		q := &v1alpha1.Queue{}
		if err := s.c.Get(s.ctx, client.ObjectKey{Name: "borrower"}, q); err != nil {
			return false, err.Error()
		}
		return q.Status.PendingWorkloads >= int32(n), fmt.Sprintf("status.pendingWorkloads %d", q.Status.PendingWorkloads)
	})
	s.t.Logf("RESULT %d pending: the loop counted them all %s after the first create", n, time.Since(m.begin).Round(100*time.Millisecond))
	// The cycle's histogram has two series: decide and total (with the
	// API writes).
	cycles := func(phase string) (sum, count float64) {
		for _, line := range extenderMetrics(s.ctx, s.bc, "partita_admission_cycle_duration_seconds_sum", "partita_admission_cycle_duration_seconds_count") {
			if !strings.Contains(line, `phase="`+phase+`"`) {
				continue
			}
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				continue
			}
			if strings.HasPrefix(line, "partita_admission_cycle_duration_seconds_sum") {
				sum = v
			} else {
				count = v
			}
		}
		return sum, count
	}
	decide0, n0 := cycles("decide")
	total0, _ := cycles("total")
	time.Sleep(30 * time.Second)
	decide1, n1 := cycles("decide")
	total1, _ := cycles("total")
	if n1 > n0 {
		s.t.Logf("RESULT %d pending: %.0f admission cycles in 30 s; on average %.0f ms to decide, %.0f ms with the API writes", n, n1-n0,
			1000*(decide1-decide0)/(n1-n0), 1000*(total1-total0)/(n1-n0))
	}
	s.t.Logf("RESULT %d pending: memory now (VmRSS): %s", n, memoryOf(s.bc.Dir(), "VmRSS"))
	s.t.Logf("RESULT %d pending: peak memory so far (VmHWM): %s", n, peakMemory(s.bc.Dir()))
	s.t.Logf("RESULT %s: CPU seconds: %s", m.name, formatCPU(m.cpu.since(s.cpuReading)))
	m.reqs.stop()
	s.checkLedger(m.name)
	s.clear("pending", "full")
}

func (s *scaleRun) bigReclaim(run int) {
	total := s.nodes * s.gpus
	// KAI's job is 250 × 8 GPUs on 500 nodes: half the cluster.
	members, each := s.nodes/2, s.gpus
	s.create(s.fillPods("borrowed", "borrower", total))
	s.waitBound("borrowed", total, 30*time.Minute)
	pods := make([]*corev1.Pod, members)
	batch := s.batchName()
	for i := range pods {
		p := tputPod(s.ns, fmt.Sprintf("big-%s-%03d", batch, i), "big", 1000)
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(int64(each), resource.DecimalSI)}
		p.Labels[v1alpha1.LabelQueue] = "owner"
		p.Labels[v1alpha1.LabelPodGroup] = "big"
		pods[i] = p
	}
	m := s.begin(fmt.Sprintf("big reclaim %d × %d GPUs run %d", members, each, run))
	pg := &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: s.ns}, Spec: v1alpha1.PodGroupSpec{MinMember: int32(members), Queue: "owner"}}
	if err := s.c.Create(s.ctx, pg); err != nil {
		s.t.Fatalf("create pod group: %v", err)
	}
	s.create(pods)
	end := s.waitBound("big", members, 30*time.Minute)
	s.report(m, end, names(pods), fmt.Sprintf("; borrower then holds %d", s.held("borrower")))
	s.clear("borrowed", "big")
	_ = s.c.Delete(s.ctx, pg)
}

// checkLedger rebuilds the ledger from GPUNodes and pods, as the extender
// does, and fails on a device given past its capacity or a GPU pod bound
// without devices.
func (s *scaleRun) checkLedger(name string) {
	s.t.Helper()
	var gns v1alpha1.GPUNodeList
	if err := s.c.List(s.ctx, &gns); err != nil {
		s.t.Fatal(err)
	}
	pods, err := s.cs.CoreV1().Pods(s.ns).List(s.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if problems := ledgerProblems(gns.Items, pods.Items); len(problems) > 0 {
		s.t.Errorf("%s: the ledger shows %d problems, e.g. %s", name, len(problems), strings.Join(problems[:min(5, len(problems))], "; "))
	}
}

// ledgerProblems are the devices allocated past their capacity and the
// bound GPU pods that hold no device.
func ledgerProblems(gns []v1alpha1.GPUNode, pods []corev1.Pod) []string {
	st := gpu.BuildLedger(gns, pods).State()
	var out []string
	for _, n := range st.Nodes {
		for _, d := range n.Devices {
			if d.AllocatedMilli > gpu.MilliPerGPU || (d.Whole && d.Allocations > 1) {
				out = append(out, fmt.Sprintf("%s device %d holds %d milli in %d allocations", n.Name, d.Index, d.AllocatedMilli, d.Allocations))
			}
		}
	}
	holding := map[string]bool{}
	for _, p := range st.Pods {
		holding[p.Allocation.Namespace+"/"+p.Allocation.Name] = true
	}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if _, asks := p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; asks && !holding[p.Namespace+"/"+p.Name] {
			out = append(out, fmt.Sprintf("pod %s bound to %s without devices", p.Name, p.Spec.NodeName))
		}
	}
	return out
}

// peakMemory reads the peak resident memory (VmHWM) of each process of
// the cluster.
func peakMemory(dir string) string { return memoryOf(dir, "VmHWM") }

// memoryOf is field (VmHWM: peak, VmRSS: now) of /proc/PID/status for
// every process of the dev cluster in dir.
func memoryOf(dir, field string) string {
	var parts []string
	for name, pid := range componentPIDs(dir) {
		status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				parts = append(parts, name+" "+strings.TrimSpace(v))
			}
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
