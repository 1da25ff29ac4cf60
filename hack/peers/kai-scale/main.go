// Command kai-scale runs KAI-Scheduler's own scale scenarios (its
// test/e2e/scale suite: fill the cluster with single-GPU Jobs, one large
// gang, reclaim of many single-GPU Jobs, reclaim for one very large job)
// against KAI on a kwok cluster, in the shape and with the reporting of
// Partita's TestKAIScaleScenarios (e2e/scale_bench_test.go), so that the
// two can be read side by side.
//
// It talks only to the Kubernetes API (client-go) and reads /proc for the
// CPU time and peak memory of the processes named with --pids; it contains
// no KAI code. KAI's objects (Queue, PodGroup) are written as unstructured
// objects. See README.md for how to run it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

const (
	ns          = "kai-scale"
	gpuRes      = corev1.ResourceName("nvidia.com/gpu")
	queueLabel  = "kai.scheduler/queue"
	pgAnnot     = "pod-group-name"
	phaseLabel  = "scale.partita.dev/phase"
	unitLabel   = "scale.partita.dev/unit"
	kwokTaint   = "kwok.x-k8s.io/node"
	parentQueue = "scale-parent"
	// The leaf queues, as KAI's suite and Partita's benchmark name their
	// roles: filler (fill, gang), borrower (no GPU quota, fills the cluster
	// in the reclaim scenarios), owner (reclaims its quota from borrower).
	fillerQueue   = "filler"
	borrowerQueue = "borrower"
	ownerQueue    = "owner"
	image         = "registry.k8s.io/pause:3.10"
)

var (
	queueGVR    = schema.GroupVersionResource{Group: "scheduling.run.ai", Version: "v2", Resource: "queues"}
	podGroupGVR = schema.GroupVersionResource{Group: "scheduling.run.ai", Version: "v2alpha2", Resource: "podgroups"}
)

type opts struct {
	kubeconfig, out, scenarios, pids string
	schedulerName, priorityClass     string
	kaiRef                           string
	nodes, gpus, gangSize, workers   int
	ownerQuota, burst                int
	borrowerWeight                   int
	qps                              float64
	timeout, settle, cleanupTimeout  time.Duration
	// skipLastCleanup: the last scenario's objects are left for the
	// cluster's deletion (run.sh deletes it on exit).
	skipLastCleanup bool
}

// scenarioResult is what one scenario measured. Wall time runs from the
// first create of the timed part to the last wanted pod bound (or to the
// timeout); latencies run from the create of a pod's unit (its Job, or the
// pod itself) to the first time a pod of that unit was seen bound.
type scenarioResult struct {
	Name      string `json:"name"`
	Pods      int    `json:"pods"`
	PodGPUs   int    `json:"gpusPerPod"`
	Bound     int    `json:"podsBound"`
	Completed bool   `json:"completed"`
	TimedOut  bool   `json:"timedOut,omitempty"`
	Error     string `json:"error,omitempty"`

	WallSeconds   float64 `json:"wallSeconds"`
	CreateSeconds float64 `json:"createSeconds"`
	PodsPerSecond float64 `json:"podsPerSecond"`
	P50Seconds    float64 `json:"p50Seconds"`
	P99Seconds    float64 `json:"p99Seconds"`
	// From the first time the driver's informer saw a pod of the unit: for
	// Jobs this leaves out the Job controller's time to create the pod.
	P50FromPodSeconds float64 `json:"p50FromPodSeenSeconds"`
	P99FromPodSeconds float64 `json:"p99FromPodSeenSeconds"`

	// Reclaim scenarios: the borrower's fill before the timed part, what
	// each queue holds after it (and --settle), the share owner is due,
	// the bound pods the scheduler evicted during the timed part and the
	// settle, and the pods left pending (a borrower Job's replacement
	// for an evicted pod).
	BorrowerFillSeconds float64        `json:"borrowerFillSeconds,omitempty"`
	GPUsHeld            map[string]int `json:"gpusHeldByQueue,omitempty"`
	OwnerShareGPUs      int            `json:"ownerShareGPUs,omitempty"`
	// How far owner and borrower end from their fair shares (owner's share,
	// and the rest of the cluster), in percent of the share; Partita's
	// benchmark fails beyond ±5%.
	OffFairShare map[string]float64 `json:"offFairSharePercent,omitempty"`
	Evicted      map[string]int     `json:"podsEvictedByQueue,omitempty"`
	Pending      map[string]int     `json:"podsPendingByQueue,omitempty"`

	CPUSeconds        map[string]float64 `json:"cpuSeconds"`
	PeakRSSKiB        map[string]int64   `json:"peakRSSKiB"`
	ProcessesMissing  []string           `json:"processesMissing,omitempty"`
	APIRequestsPerPod float64            `json:"apiRequestsPerPod"`
	APIRequestsTop    map[string]float64 `json:"apiRequestsPerPodByVerbResource,omitempty"`
	CleanupSeconds    float64            `json:"cleanupSeconds"`
	FinishedByKwok    int                `json:"podsFinishedByKwok,omitempty"`
	StartedAtUTC      string             `json:"startedAt"`
}

type result struct {
	Scheduler   string            `json:"scheduler"`
	KAIRef      string            `json:"kaiRef,omitempty"`
	Nodes       int               `json:"nodes"`
	GPUsPerNode int               `json:"gpusPerNode"`
	TotalGPUs   int               `json:"totalGPUs"`
	Workers     int               `json:"creators"`
	ClientQPS   float64           `json:"clientQPS"`
	ClientBurst int               `json:"clientBurst"`
	Timeout     string            `json:"timeoutPerScenario"`
	Queues      map[string]any    `json:"queues"`
	Processes   map[string]string `json:"processes,omitempty"`
	Scenarios   []scenarioResult  `json:"scenarios"`
}

func main() {
	var o opts
	flag.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the kwok cluster")
	flag.StringVar(&o.out, "out", "result.json", "where to write the JSON result (rewritten after each scenario)")
	flag.StringVar(&o.scenarios, "scenarios", "fill,gang,big-reclaim", "scenarios to run, in order, of: fill, gang, reclaim, big-reclaim")
	flag.StringVar(&o.pids, "pids", "", "processes to measure, name=pid,... (CPU seconds from /proc/PID/stat, peak RSS from VmHWM)")
	flag.StringVar(&o.schedulerName, "scheduler-name", "kai-scheduler", "schedulerName of every pod")
	flag.StringVar(&o.priorityClass, "priority-class", "train", "priorityClassName of the explicit PodGroups (gang, big-reclaim); Jobs get theirs from KAI's pod-grouper (train)")
	flag.StringVar(&o.kaiRef, "kai-ref", "", "KAI commit under test, recorded in the result")
	flag.IntVar(&o.nodes, "nodes", 500, "kwok nodes")
	flag.IntVar(&o.gpus, "gpus", 8, "GPUs per node")
	flag.IntVar(&o.gangSize, "gang-size", 512, "pods (1 GPU each) of the gang scenario's PodGroup; capped at the cluster's GPUs")
	flag.IntVar(&o.ownerQuota, "owner-quota", 0, "GPU quota of queue owner (0: half the cluster, as Partita's benchmark; -1: unlimited, as KAI's suite)")
	flag.IntVar(&o.borrowerWeight, "borrower-weight", 0, "GPU overQuotaWeight of queue borrower (KAI's suite: 0; Partita's benchmark: 1)")
	flag.IntVar(&o.workers, "workers", 32, "parallel creators")
	flag.Float64Var(&o.qps, "qps", 1000, "client QPS of the driver")
	flag.IntVar(&o.burst, "burst", 2000, "client burst of the driver")
	flag.DurationVar(&o.timeout, "timeout", 30*time.Minute, "per scenario: longest wait for the wanted pods to be bound (and for the borrower's fill); after it, how far it got is recorded")
	flag.DurationVar(&o.settle, "settle", 10*time.Second, "reclaim scenarios: wait this long after the owner is bound before reading what each queue holds")
	flag.DurationVar(&o.cleanupTimeout, "cleanup-timeout", 10*time.Minute, "longest wait for a scenario's objects to be gone")
	flag.BoolVar(&o.skipLastCleanup, "skip-last-cleanup", false, "leave the last scenario's objects in place: at 500 nodes deleting thousands of Jobs takes minutes, and run.sh deletes the whole cluster on exit")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func logf(f string, a ...any) {
	fmt.Printf("%s "+f+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, a...)...)
}

func run(ctx context.Context, o opts) error {
	scenarios := strings.Split(o.scenarios, ",")
	for _, sc := range scenarios {
		if !slices.Contains([]string{"fill", "gang", "reclaim", "big-reclaim"}, sc) {
			return fmt.Errorf("--scenarios: no scenario %q (fill, gang, reclaim, big-reclaim)", sc)
		}
	}
	if o.nodes < 2 || o.gpus < 1 || o.workers < 1 {
		return fmt.Errorf("--nodes must be at least 2, --gpus and --workers at least 1")
	}
	procs, err := parsePIDs(o.pids)
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig %q: %w", o.kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = float32(o.qps), o.burst
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	r := newRunner(o, cs, dc, procs)
	queues, err := r.setup(ctx)
	if err != nil {
		return err
	}
	if err := r.watch(ctx); err != nil {
		return err
	}
	res := result{
		Scheduler: o.schedulerName, KAIRef: o.kaiRef, Nodes: o.nodes, GPUsPerNode: o.gpus, TotalGPUs: o.nodes * o.gpus,
		Workers: o.workers, ClientQPS: o.qps, ClientBurst: o.burst, Timeout: o.timeout.String(), Queues: queues,
		Processes: map[string]string{},
	}
	for _, p := range procs {
		res.Processes[p.name] = fmt.Sprintf("%d: %s", p.pid, cmdline(p.pid))
	}
	for i, sc := range scenarios {
		var sr scenarioResult
		var err error
		r.last = i == len(scenarios)-1
		switch sc {
		case "fill":
			sr, err = r.fill(ctx)
		case "gang":
			sr, err = r.gang(ctx)
		case "reclaim":
			sr, err = r.reclaim(ctx)
		case "big-reclaim":
			sr, err = r.bigReclaim(ctx)
		}
		res.Scenarios = append(res.Scenarios, sr)
		if werr := writeResult(o.out, res); werr != nil {
			return errors.Join(err, werr)
		}
		if err != nil {
			return fmt.Errorf("scenario %s: %w", sc, err)
		}
	}
	logf("result in %s", o.out)
	return nil
}

func writeResult(path string, res result) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	return nil
}

// runner holds the clients and what the pod informer saw.
type runner struct {
	o     opts
	cs    kubernetes.Interface
	dc    dynamic.Interface
	procs []proc
	pods  toolscache.Indexer
	// last: the scenario running is the last of the invocation.
	last bool

	mu sync.Mutex
	// created is when the create of each unit (a Job, or a bare pod) was
	// sent; seen and unitBound are when a pod of the unit was first seen,
	// and first seen bound; podBound is when each pod was first seen bound.
	created   map[string]time.Time
	seen      map[string]time.Time
	unitBound map[string]time.Time
	podBound  map[types.UID]time.Time
	// evicted counts, by queue, bound pods deleted while the driver was not
	// cleaning up: the scheduler's evictions.
	evicted  map[string]int
	counted  map[types.UID]bool
	finished map[types.UID]bool
	cleaning bool
}

func newRunner(o opts, cs kubernetes.Interface, dc dynamic.Interface, procs []proc) *runner {
	return &runner{
		o: o, cs: cs, dc: dc, procs: procs,
		created: map[string]time.Time{}, seen: map[string]time.Time{}, unitBound: map[string]time.Time{},
		podBound: map[types.UID]time.Time{}, evicted: map[string]int{}, counted: map[types.UID]bool{},
		finished: map[types.UID]bool{},
	}
}

// watch starts one informer on the namespace's pods.
func (r *runner) watch(ctx context.Context) error {
	f := informers.NewSharedInformerFactoryWithOptions(r.cs, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.observe(obj, false) },
		UpdateFunc: func(_, cur any) { r.observe(cur, false) },
		DeleteFunc: func(obj any) { r.observe(obj, true) },
	}); err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	f.Start(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("pod informer did not sync")
	}
	r.pods = inf.GetIndexer()
	return nil
}

func (r *runner) observe(obj any, deleted bool) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	unit := p.Labels[unitLabel]
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.seen[unit]; !ok && unit != "" {
		r.seen[unit] = now
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		r.finished[p.UID] = true
	}
	if p.Spec.NodeName == "" {
		return
	}
	if _, ok := r.podBound[p.UID]; !ok {
		r.podBound[p.UID] = now
	}
	if _, ok := r.unitBound[unit]; !ok && unit != "" {
		r.unitBound[unit] = now
	}
	if (deleted || p.DeletionTimestamp != nil) && !r.cleaning && !r.counted[p.UID] {
		r.counted[p.UID] = true
		r.evicted[p.Labels[queueLabel]]++
	}
}

// livePods are the namespace's pods of a phase ("" for all) that are not
// being deleted.
func (r *runner) livePods(phase string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, o := range r.pods.List() {
		p := o.(*corev1.Pod)
		if p.DeletionTimestamp == nil && (phase == "" || p.Labels[phaseLabel] == phase) {
			out = append(out, p)
		}
	}
	return out
}

// boundNow counts the bound pods of a phase and says when the last of them
// was first seen bound.
func (r *runner) boundNow(phase string) (int, time.Time) {
	pods := r.livePods(phase)
	r.mu.Lock()
	defer r.mu.Unlock()
	n, last := 0, time.Time{}
	for _, p := range pods {
		if p.Spec.NodeName == "" {
			continue
		}
		n++
		if b := r.podBound[p.UID]; b.After(last) {
			last = b
		}
	}
	return n, last
}

// waitBound waits until want pods of phase are bound, or deadline. It
// returns how many are bound and, when all are, when the last was bound.
func (r *runner) waitBound(ctx context.Context, phase string, want int, deadline time.Time) (int, time.Time, bool) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	lastLog, lastN := time.Now(), -1
	for {
		n, last := r.boundNow(phase)
		if n >= want {
			logf("%s: %d/%d pods bound", phase, n, want)
			return n, last, true
		}
		if time.Now().After(deadline) {
			logf("%s: timed out with %d/%d pods bound", phase, n, want)
			return n, time.Time{}, false
		}
		if time.Since(lastLog) >= 10*time.Second && n != lastN {
			logf("%s: %d/%d pods bound", phase, n, want)
			lastLog, lastN = time.Now(), n
		}
		select {
		case <-ctx.Done():
			return n, time.Time{}, false
		case <-tick.C:
		}
	}
}

// heldGPUs sums the GPUs of each queue's bound pods.
func (r *runner) heldGPUs() (held, pending map[string]int) {
	held, pending = map[string]int{}, map[string]int{}
	for _, p := range r.livePods("") {
		q := p.Labels[queueLabel]
		if p.Spec.NodeName == "" {
			pending[q]++
			continue
		}
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range p.Spec.Containers {
			g := c.Resources.Limits[gpuRes]
			held[q] += int(g.Value())
		}
	}
	return held, pending
}

func (r *runner) resetEvictions() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evicted = map[string]int{}
}

func (r *runner) evictions() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.evicted))
	for k, v := range r.evicted {
		out[k] = v
	}
	return out
}

// takeFinished counts the pods seen Succeeded or Failed since the last call.
func (r *runner) takeFinished() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.finished)
	r.finished = map[types.UID]bool{}
	return n
}

func (r *runner) setCleaning(v bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleaning = v
}

// latencies are, for the units, create→first bound and first seen→first
// bound, each sorted.
func (r *runner) latencies(units []string) (fromCreate, fromSeen []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range units {
		b, ok := r.unitBound[u]
		if !ok {
			continue
		}
		fromCreate = append(fromCreate, b.Sub(r.created[u]))
		if s, ok := r.seen[u]; ok {
			fromSeen = append(fromSeen, b.Sub(s))
		}
	}
	slices.Sort(fromCreate)
	slices.Sort(fromSeen)
	return fromCreate, fromSeen
}

// quantile is the q quantile of sorted durations in seconds, as Partita's
// benchmark takes it (the element at q×(n-1)).
func quantile(d []time.Duration, q float64) float64 {
	if len(d) == 0 {
		return 0
	}
	return round3(d[int(q*float64(len(d)-1))].Seconds())
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// --- Creating objects ---

// created notes that a unit's create is being sent, forgetting what an
// earlier unit of the same name saw.
func (r *runner) noteCreate(unit string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.created[unit] = time.Now()
	delete(r.seen, unit)
	delete(r.unitBound, unit)
}

// inParallel runs do(0..n-1) with the run's workers and returns the first
// few errors.
func (r *runner) inParallel(n int, do func(i int) error) error {
	var next atomic.Int64
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range r.o.workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := do(i); err != nil {
					mu.Lock()
					if len(errs) < 5 {
						errs = append(errs, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// retry sends a create up to 5 times while the API server answers with a
// transient error; an object that already exists counts as created.
func retry(ctx context.Context, create func() error) error {
	var err error
	for attempt := range 5 {
		err = create()
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) || apierrors.IsForbidden(err) || apierrors.IsNotFound(err) || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(100*(attempt+1)) * time.Millisecond)
	}
	return err
}

func (r *runner) createJobs(ctx context.Context, jobs []*batchv1.Job) error {
	return r.inParallel(len(jobs), func(i int) error {
		r.noteCreate(jobs[i].Name)
		return retry(ctx, func() error {
			_, err := r.cs.BatchV1().Jobs(ns).Create(ctx, jobs[i], metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("create Job %s: %w", jobs[i].Name, err)
			}
			return nil
		})
	})
}

func (r *runner) createPods(ctx context.Context, pods []*corev1.Pod) error {
	return r.inParallel(len(pods), func(i int) error {
		r.noteCreate(pods[i].Name)
		return retry(ctx, func() error {
			_, err := r.cs.CoreV1().Pods(ns).Create(ctx, pods[i], metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("create pod %s: %w", pods[i].Name, err)
			}
			return nil
		})
	})
}

// podSpec is a pod of gpus whole GPUs for kwok nodes, as KAI's suite
// writes it: GPU limits only, the kwok taint tolerated, kwok nodes required.
func (r *runner) podSpec(gpus int) corev1.PodSpec {
	q := *resource.NewQuantity(int64(gpus), resource.DecimalSI)
	return corev1.PodSpec{
		SchedulerName:                 r.o.schedulerName,
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		Tolerations:                   []corev1.Toleration{{Key: kwokTaint, Value: "fake", Effect: corev1.TaintEffectNoSchedule}},
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "type", Operator: corev1.NodeSelectorOpIn, Values: []string{"kwok"}}},
			}}},
		}},
		Containers: []corev1.Container{{
			Name: "main", Image: image,
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{gpuRes: q}},
		}},
	}
}

// jobs are n single-GPU batch/v1 Jobs of one pod each, named
// <phase>-NNNNN, whose pods carry the queue label (KAI's pod-grouper makes
// a PodGroup of each Job, priority class train).
func (r *runner) jobs(phase, queue string, n int) ([]*batchv1.Job, []string) {
	jobs, units := make([]*batchv1.Job, n), make([]string, n)
	for i := range jobs {
		name := fmt.Sprintf("%s-%05d", phase, i)
		spec := r.podSpec(1)
		spec.RestartPolicy = corev1.RestartPolicyNever
		jobs[i] = &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{phaseLabel: phase}},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{phaseLabel: phase, unitLabel: name, queueLabel: queue}},
				Spec:       spec,
			}},
		}
		units[i] = name
	}
	return jobs, units
}

// gang is an explicit KAI PodGroup of n pods of gpus GPUs each, and its
// pods, annotated with the group's name.
func (r *runner) gangObjects(phase, queue string, n, gpus int) (*unstructured.Unstructured, []*corev1.Pod, []string) {
	spec := map[string]any{"minMember": int64(n), "queue": queue}
	if r.o.priorityClass != "" {
		spec["priorityClassName"] = r.o.priorityClass
	}
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
		"metadata": map[string]any{"name": phase, "namespace": ns, "labels": map[string]any{queueLabel: queue, phaseLabel: phase}},
		"spec":     spec,
	}}
	pods, units := make([]*corev1.Pod, n), make([]string, n)
	for i := range pods {
		name := fmt.Sprintf("%s-%04d", phase, i)
		pods[i] = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: ns,
				Labels:      map[string]string{phaseLabel: phase, unitLabel: name, queueLabel: queue},
				Annotations: map[string]string{pgAnnot: phase},
			},
			Spec: r.podSpec(gpus),
		}
		units[i] = name
	}
	return pg, pods, units
}

// --- Measuring ---

type meter struct {
	begin time.Time
	cpu   map[string]float64
	reqs  map[string]float64
}

func (r *runner) start(ctx context.Context) meter {
	return meter{begin: time.Now(), cpu: cpuSeconds(r.procs), reqs: apiserverRequests(ctx, r.cs)}
}

// finish fills in the timed part's results: wall time to end (or to now
// when not every pod was bound), rate, latencies, CPU, memory and API
// requests per pod.
func (r *runner) finish(ctx context.Context, m meter, sr *scenarioResult, end time.Time, units []string) {
	if end.IsZero() {
		end = time.Now()
	}
	wall := end.Sub(m.begin)
	sr.WallSeconds = round3(wall.Seconds())
	if wall > 0 {
		sr.PodsPerSecond = round3(float64(sr.Bound) / wall.Seconds())
	}
	fromCreate, fromSeen := r.latencies(units)
	sr.P50Seconds, sr.P99Seconds = quantile(fromCreate, 0.5), quantile(fromCreate, 0.99)
	sr.P50FromPodSeconds, sr.P99FromPodSeconds = quantile(fromSeen, 0.5), quantile(fromSeen, 0.99)
	now := cpuSeconds(r.procs)
	sr.CPUSeconds = map[string]float64{}
	for name, v := range now {
		sr.CPUSeconds[name] = round3(v - m.cpu[name])
	}
	sr.PeakRSSKiB = peakRSS(r.procs)
	for _, p := range r.procs {
		if _, ok := now[p.name]; !ok {
			sr.ProcessesMissing = append(sr.ProcessesMissing, p.name)
		}
	}
	sr.APIRequestsPerPod, sr.APIRequestsTop = requestsPerPod(apiserverRequests(ctx, r.cs), m.reqs, sr.Pods)
	logf("RESULT %s: %d/%d pods bound in %.1fs (%.1f pods/s); create→bound p50 %.2fs p99 %.2fs (pod seen→bound p50 %.2fs p99 %.2fs); CPU s %v; API requests/pod %.2f",
		sr.Name, sr.Bound, sr.Pods, sr.WallSeconds, sr.PodsPerSecond, sr.P50Seconds, sr.P99Seconds,
		sr.P50FromPodSeconds, sr.P99FromPodSeconds, sr.CPUSeconds, sr.APIRequestsPerPod)
}

// --- Scenarios ---

func newResult(name string, pods, gpus int) scenarioResult {
	return scenarioResult{Name: name, Pods: pods, PodGPUs: gpus, StartedAtUTC: time.Now().UTC().Format(time.RFC3339)}
}

// timed runs a scenario's timed part: create, then wait until want pods of
// phase are bound or --timeout passes; what a failed create left out will
// not be bound, so then it only counts what is.
func (r *runner) timed(ctx context.Context, sr *scenarioResult, phase string, want int, units []string, create func() error) {
	m := r.start(ctx)
	deadline := m.begin.Add(r.o.timeout)
	if err := create(); err != nil {
		sr.Error = err.Error()
		deadline = time.Now()
	}
	sr.CreateSeconds = round3(time.Since(m.begin).Seconds())
	n, end, ok := r.waitBound(ctx, phase, want, deadline)
	sr.Bound, sr.Completed, sr.TimedOut = n, ok, !ok && sr.Error == ""
	r.finish(ctx, m, sr, end, units)
}

// fill: nodes×gpus single-GPU Jobs, created at once, fill the cluster.
func (r *runner) fill(ctx context.Context) (scenarioResult, error) {
	total := r.o.nodes * r.o.gpus
	sr := newResult("fill", total, 1)
	jobs, units := r.jobs("fill", fillerQueue, total)
	r.timed(ctx, &sr, "fill", total, units, func() error { return r.createJobs(ctx, jobs) })
	return sr, r.cleanup(ctx, &sr, "fill")
}

// gang: one PodGroup of --gang-size single-GPU pods.
func (r *runner) gang(ctx context.Context) (scenarioResult, error) {
	size := min(r.o.gangSize, r.o.nodes*r.o.gpus)
	sr := newResult(fmt.Sprintf("gang of %d", size), size, 1)
	pg, pods, units := r.gangObjects("gang", fillerQueue, size, 1)
	r.timed(ctx, &sr, "gang", size, units, func() error { return r.createGang(ctx, pg, pods) })
	return sr, r.cleanup(ctx, &sr, "gang")
}

func (r *runner) createGang(ctx context.Context, pg *unstructured.Unstructured, pods []*corev1.Pod) error {
	if err := retry(ctx, func() error {
		_, err := r.dc.Resource(podGroupGVR).Namespace(ns).Create(ctx, pg, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create PodGroup %s: %w", pg.GetName(), err)
	}
	return r.createPods(ctx, pods)
}

// borrow has queue borrower fill the cluster with single-GPU Jobs and
// waits for them (up to --timeout); it is not part of the timed part.
func (r *runner) borrow(ctx context.Context, phase string, sr *scenarioResult) bool {
	total := r.o.nodes * r.o.gpus
	jobs, _ := r.jobs(phase, borrowerQueue, total)
	begin := time.Now()
	if err := r.createJobs(ctx, jobs); err != nil {
		sr.Error = fmt.Sprintf("borrower fill: %v", err)
		return false
	}
	n, end, ok := r.waitBound(ctx, phase, total, begin.Add(r.o.timeout))
	if !ok {
		sr.Error = fmt.Sprintf("borrower fill: only %d/%d pods bound within %s", n, total, r.o.timeout)
		sr.BorrowerFillSeconds = round3(time.Since(begin).Seconds())
		return false
	}
	sr.BorrowerFillSeconds = round3(end.Sub(begin).Seconds())
	r.resetEvictions()
	return true
}

// afterReclaim waits --settle, then reads what each queue holds, what was
// evicted since the borrower's fill, and what is left pending.
func (r *runner) afterReclaim(ctx context.Context, sr *scenarioResult) {
	select {
	case <-ctx.Done():
	case <-time.After(r.o.settle):
	}
	sr.GPUsHeld, sr.Pending = r.heldGPUs()
	sr.Evicted = r.evictions()
	sr.OwnerShareGPUs = r.ownerShare()
	shares := map[string]int{ownerQueue: sr.OwnerShareGPUs, borrowerQueue: r.o.nodes*r.o.gpus - sr.OwnerShareGPUs}
	sr.OffFairShare = map[string]float64{}
	for q, share := range shares {
		if share > 0 {
			sr.OffFairShare[q] = round3(100 * float64(sr.GPUsHeld[q]-share) / float64(share))
		}
	}
	logf("RESULT %s: GPUs held %v (owner's share %d, off fair share %v%%); evicted %v; pending %v",
		sr.Name, sr.GPUsHeld, sr.OwnerShareGPUs, sr.OffFairShare, sr.Evicted, sr.Pending)
}

// ownerShare is the GPUs queue owner is due: what it asks for in either
// reclaim scenario (half the cluster), or its quota if that is less.
func (r *runner) ownerShare() int {
	if r.o.ownerQuota > 0 {
		return min(r.o.ownerQuota, r.o.nodes*r.o.gpus/2)
	}
	return r.o.nodes * r.o.gpus / 2
}

// reclaim: borrower fills the cluster; owner then submits half the
// cluster's worth of single-GPU Jobs and takes its share back.
func (r *runner) reclaim(ctx context.Context) (scenarioResult, error) {
	share := r.o.nodes * r.o.gpus / 2
	sr := newResult(fmt.Sprintf("reclaim of %d", share), share, 1)
	if r.borrow(ctx, "reclaim-borrower", &sr) {
		jobs, units := r.jobs("reclaim-owner", ownerQueue, share)
		r.timed(ctx, &sr, "reclaim-owner", share, units, func() error { return r.createJobs(ctx, jobs) })
		r.afterReclaim(ctx, &sr)
	}
	return sr, r.cleanup(ctx, &sr, "reclaim-borrower", "reclaim-owner")
}

// bigReclaim: borrower fills the cluster; owner then submits one gang of
// nodes/2 pods of a whole node's GPUs each (KAI's 250 × 8 on 500 nodes).
func (r *runner) bigReclaim(ctx context.Context) (scenarioResult, error) {
	members := r.o.nodes / 2
	sr := newResult(fmt.Sprintf("big reclaim %d x %d GPUs", members, r.o.gpus), members, r.o.gpus)
	if r.borrow(ctx, "big-reclaim-borrower", &sr) {
		pg, pods, units := r.gangObjects("big-reclaim-owner", ownerQueue, members, r.o.gpus)
		r.timed(ctx, &sr, "big-reclaim-owner", members, units, func() error { return r.createGang(ctx, pg, pods) })
		r.afterReclaim(ctx, &sr)
	}
	return sr, r.cleanup(ctx, &sr, "big-reclaim-borrower", "big-reclaim-owner")
}

// cleanup deletes the phases' Jobs, PodGroups and pods and waits until the
// namespace has no pods, Jobs or PodGroups left (so every GPU is free and
// KAI's pod-grouper's PodGroups are gone too). Deletions meanwhile are not
// counted as evictions.
func (r *runner) cleanup(ctx context.Context, sr *scenarioResult, phases ...string) error {
	sr.FinishedByKwok = r.takeFinished()
	if sr.FinishedByKwok > 0 {
		logf("warning: %d pods were moved to Succeeded/Failed (a kwok pod-complete stage?); the scenarios want them running", sr.FinishedByKwok)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if r.last && r.o.skipLastCleanup {
		logf("%s: objects left in place (--skip-last-cleanup)", sr.Name)
		return nil
	}
	r.setCleaning(true)
	defer r.setCleaning(false)
	begin := time.Now()
	defer func() { sr.CleanupSeconds = round3(time.Since(begin).Seconds()) }()
	sel := metav1.ListOptions{LabelSelector: fmt.Sprintf("%s in (%s)", phaseLabel, strings.Join(phases, ","))}
	del := metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}
	// A collection of thousands may outlast the API server's request
	// timeout, or its stream be reset under load: the deletes are repeated
	// every 10 s while anything is left, and their errors only logged.
	deleteAll := func(what string, del1 func() error) {
		if err := del1(); err != nil {
			logf("%s: delete %s: %v (tried again while any is left)", sr.Name, what, err)
		}
	}
	deadline := begin.Add(r.o.cleanupTimeout)
	var lastDelete time.Time
	for {
		pods := len(r.pods.List())
		jobs, err := r.cs.BatchV1().Jobs(ns).List(ctx, sel)
		if err != nil {
			return fmt.Errorf("list Jobs: %w", err)
		}
		pgs, err := r.dc.Resource(podGroupGVR).Namespace(ns).List(ctx, sel)
		if err != nil {
			return fmt.Errorf("list PodGroups: %w", err)
		}
		if time.Since(lastDelete) > 10*time.Second {
			if len(jobs.Items) > 0 {
				deleteAll("Jobs", func() error { return r.cs.BatchV1().Jobs(ns).DeleteCollection(ctx, del, sel) })
			}
			if len(pgs.Items) > 0 {
				deleteAll("PodGroups", func() error { return r.dc.Resource(podGroupGVR).Namespace(ns).DeleteCollection(ctx, del, sel) })
			}
			if pods > 0 {
				deleteAll("pods", func() error { return r.cs.CoreV1().Pods(ns).DeleteCollection(ctx, del, sel) })
			}
			lastDelete = time.Now()
		}
		if pods == 0 && len(jobs.Items) == 0 && len(pgs.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cleanup: %d pods, %d Jobs, %d PodGroups left after %s", pods, len(jobs.Items), len(pgs.Items), r.o.cleanupTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
	// KAI's components hear of the deletions through their informers.
	time.Sleep(2 * time.Second)
	logf("%s: cleaned up in %s", sr.Name, time.Since(begin).Round(100*time.Millisecond))
	return nil
}

// --- Setup ---

// setup creates the namespace, the kwok GPU nodes and KAI's queues: a
// parent queue and the leaf queues filler, borrower and owner under it, with
// the GPU quota, limit and over-quota weight of KAI's suite (owner's quota
// from --owner-quota). It returns the queues' GPU settings for the result.
func (r *runner) setup(ctx context.Context) (map[string]any, error) {
	if _, err := r.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace: %w", err)
	}
	begin := time.Now()
	if err := r.inParallel(r.o.nodes, func(i int) error { return r.createNode(ctx, fmt.Sprintf("kwok-gpu-%04d", i)) }); err != nil {
		return nil, err
	}
	ownerQuota := int64(r.o.ownerQuota)
	if ownerQuota == 0 {
		ownerQuota = int64(r.o.nodes * r.o.gpus / 2)
	}
	unlimited := map[string]any{"quota": int64(-1), "limit": int64(-1), "overQuotaWeight": int64(1)}
	gpu := map[string]map[string]any{
		parentQueue:   unlimited,
		fillerQueue:   unlimited,
		borrowerQueue: {"quota": int64(0), "limit": int64(-1), "overQuotaWeight": int64(r.o.borrowerWeight)},
		ownerQueue:    {"quota": ownerQuota, "limit": int64(-1), "overQuotaWeight": int64(1)},
	}
	summary := map[string]any{}
	for _, name := range []string{parentQueue, fillerQueue, borrowerQueue, ownerQueue} {
		spec := map[string]any{"resources": map[string]any{"gpu": gpu[name], "cpu": unlimited, "memory": unlimited}}
		if name != parentQueue {
			spec["parentQueue"] = parentQueue
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
			"metadata": map[string]any{"name": name}, "spec": spec,
		}}
		if _, err := r.dc.Resource(queueGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create Queue %s: %w", name, err)
		}
		summary[name] = map[string]any{"gpu": gpu[name], "parent": spec["parentQueue"]}
	}
	// Wait for kwok to mark the nodes Ready.
	for deadline := time.Now().Add(5 * time.Minute); ; {
		nl, err := r.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "type=kwok"})
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		ready := 0
		for _, n := range nl.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready >= r.o.nodes {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d/%d nodes Ready", ready, r.o.nodes)
		}
		time.Sleep(time.Second)
	}
	logf("setup: %d kwok nodes × %d GPUs Ready in %s; queues %s/{%s,%s,%s}",
		r.o.nodes, r.o.gpus, time.Since(begin).Round(100*time.Millisecond), parentQueue, fillerQueue, borrowerQueue, ownerQueue)
	return summary, nil
}

func (r *runner) createNode(ctx context.Context, name string) error {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods: resource.MustParse("110"), gpuRes: *resource.NewQuantity(int64(r.o.gpus), resource.DecimalSI),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{kwokTaint: "fake", "node.alpha.kubernetes.io/ttl": "0"},
			Labels: map[string]string{
				"kubernetes.io/hostname": name, "type": "kwok",
				"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
				"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": strconv.Itoa(r.o.gpus),
				"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
			}},
		Spec:   corev1.NodeSpec{Taints: []corev1.Taint{{Key: kwokTaint, Value: "fake", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity.DeepCopy()},
	}
	if err := retry(ctx, func() error {
		_, err := r.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": capacity}})
	if err != nil {
		return fmt.Errorf("node status patch: %w", err)
	}
	if err := retry(ctx, func() error {
		_, err := r.cs.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
		return err
	}); err != nil {
		return fmt.Errorf("patch status of node %s: %w", name, err)
	}
	return nil
}

// --- Processes and the API server's counters ---

type proc struct {
	name string
	pid  int
}

// parsePIDs reads name=pid,... .
func parsePIDs(s string) ([]proc, error) {
	var out []proc
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, pid, ok := strings.Cut(part, "=")
		n, err := strconv.Atoi(pid)
		if !ok || name == "" || err != nil || n <= 0 {
			return nil, fmt.Errorf("--pids: want name=pid, got %q", part)
		}
		out = append(out, proc{name: name, pid: n})
	}
	return out, nil
}

// cpuSeconds reads utime+stime of each process (clock ticks of 1/100 s,
// Linux's USER_HZ); a process that is gone is left out.
func cpuSeconds(procs []proc) map[string]float64 {
	out := map[string]float64{}
	for _, p := range procs {
		stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.pid), "stat"))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 > len(stat) {
			continue
		}
		// After the command name: state is field 3; utime and stime
		// are fields 14 and 15, i.e. the 12th and 13th here.
		fields := strings.Fields(string(stat[i+2:]))
		if len(fields) < 13 {
			continue
		}
		u, err1 := strconv.ParseFloat(fields[11], 64)
		s, err2 := strconv.ParseFloat(fields[12], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out[p.name] = (u + s) / 100
	}
	return out
}

// peakRSS reads VmHWM (KiB) of each process.
func peakRSS(procs []proc) map[string]int64 {
	out := map[string]int64{}
	for _, p := range procs {
		status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.pid), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				if kib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64); err == nil {
					out[p.name] = kib
				}
			}
		}
	}
	return out
}

func cmdline(pid int) string {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return "(gone)"
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// apiserverRequests reads apiserver_request_total by verb and resource;
// nil when /metrics cannot be read.
func apiserverRequests(ctx context.Context, cs kubernetes.Interface) map[string]float64 {
	b, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
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

func metricLabel(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// requestsPerPod is the requests per pod between two readings, in all and
// by verb and resource (those of at least 0.02 a pod).
func requestsPerPod(now, before map[string]float64, pods int) (float64, map[string]float64) {
	if now == nil || before == nil || pods == 0 {
		return 0, nil
	}
	total, by := 0.0, map[string]float64{}
	for k, v := range now {
		if d := (v - before[k]) / float64(pods); d > 0 {
			total += d
			if d >= 0.02 {
				by[k] = round3(d)
			}
		}
	}
	return round3(total), by
}
