// Command kai-topology drives a seeded, fragmented GPU trace against a peer
// scheduler (KAI-Scheduler) running on a kwok cluster and measures placement
// quality of rack-required gangs: how many gangs land inside one rack, how
// many racks each gang spans, and how many free GPUs are stranded.
//
// It talks only to the Kubernetes API (client-go); it contains no KAI code.
// KAI's objects (Topology, Queue, PodGroup) are written as unstructured
// objects. See README.md for how to run it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	blockLabel = "network.example.com/block"
	rackLabel  = "network.example.com/rack"
	hostLabel  = "kubernetes.io/hostname"
	gpuRes     = corev1.ResourceName("nvidia.com/gpu")
	ns         = "kai-trace"
	queueLabel = "kai.scheduler/queue"
	queue      = "default-queue"
	topoName   = "rack-topology"
	pgAnnot    = "pod-group-name"
	roleLabel  = "trace.partita.dev/role"
	gangLabel  = "trace.partita.dev/gang"
)

var (
	topologyGVR = schema.GroupVersionResource{Group: "kai.scheduler", Version: "v1alpha1", Resource: "topologies"}
	queueGVR    = schema.GroupVersionResource{Group: "scheduling.run.ai", Version: "v2", Resource: "queues"}
	podGroupGVR = schema.GroupVersionResource{Group: "scheduling.run.ai", Version: "v2alpha2", Resource: "podgroups"}
)

type opts struct {
	kubeconfig, scheduler, out, gangs string
	priorityClass, required           string
	recreate                          bool
	quota                             int64
	seed                              int64
	blocks, racks, nodes, gpus        int
	podGPUs                           int
	freeFrac                          float64
	settle, timeout                   time.Duration
}

type gangResult struct {
	Name        string   `json:"name"`
	GPUs        int      `json:"gpus"`
	Pods        int      `json:"pods"`
	Placed      bool     `json:"placed"`
	BoundPods   int      `json:"boundPods"`
	Racks       []string `json:"racks,omitempty"`
	Blocks      []string `json:"blocks,omitempty"`
	Nodes       []string `json:"nodes,omitempty"`
	InOneRack   bool     `json:"inOneRack"`
	PlacedAfter string   `json:"placedAfter,omitempty"`
	Condition   string   `json:"lastCondition,omitempty"`
}

type result struct {
	Scheduler          string         `json:"scheduler"`
	Seed               int64          `json:"seed"`
	Cluster            string         `json:"cluster"`
	PriorityClass      string         `json:"priorityClass"`
	Recreate           bool           `json:"recreateEvicted"`
	QueueQuota         int64          `json:"queueQuota"`
	RequiredLevel      string         `json:"requiredLevel"`
	Fillers            int            `json:"fillers"`
	FillersBound       int            `json:"fillersBound"`
	FillWall           string         `json:"fillWall"`
	FillersDeleted     int            `json:"fillersDeleted"`
	FillersEvicted     int            `json:"fillersEvictedByScheduler"`
	GangPodsEvicted    int            `json:"gangPodsEvictedByScheduler"`
	FreeBefore         map[string]int `json:"freeGPUsPerRackBeforeGangs"`
	FreeNodesBefore    map[string]int `json:"freeGPUsPerNodeBeforeGangs"`
	Gangs              []gangResult   `json:"gangs"`
	GangsPlaced        int            `json:"gangsPlaced"`
	GangsInOneRack     int            `json:"gangsPlacedInsideOneRack"`
	GangsTotal         int            `json:"gangsTotal"`
	GangWall           string         `json:"gangWall"`
	FreeAfter          map[string]int `json:"freeGPUsPerRackAfter"`
	FreeGPUsAfter      int            `json:"freeGPUsAfter"`
	Stranded           int            `json:"strandedGPUs"`
	StrandedSmallest   int            `json:"strandedForSmallestGang"`
	OracleRackFitGangs int            `json:"oracleGreedyRackFitGangs"`
}

func main() {
	var o opts
	flag.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the kwok cluster")
	flag.StringVar(&o.scheduler, "scheduler-name", "kai-scheduler", "schedulerName of every pod")
	flag.StringVar(&o.out, "out", "result.json", "where to write the JSON result")
	flag.StringVar(&o.gangs, "gangs", "8:6,16:3", "gang sizes in GPUs and how many of each, size:count,...")
	flag.StringVar(&o.priorityClass, "priority-class", "train", "PriorityClass of fillers and gangs (KAI: train=50 preemptible, build=100 not)")
	flag.BoolVar(&o.recreate, "recreate", true, "recreate pods the scheduler evicts (as their Job/operator would), so consolidation can move them")
	flag.Int64Var(&o.quota, "queue-quota", 0, "quota of both queues for cpu, memory, gpu (0: KAI's default queues; -1: unlimited, which KAI needs for non-preemptible jobs)")
	flag.StringVar(&o.required, "required-level", rackLabel, "requiredTopologyLevel of every gang (empty: no topology constraint, a control run)")
	flag.Int64Var(&o.seed, "seed", 1, "seed of the fragmentation and of the gang order")
	flag.IntVar(&o.blocks, "blocks", 2, "blocks")
	flag.IntVar(&o.racks, "racks", 4, "racks per block")
	flag.IntVar(&o.nodes, "nodes", 4, "nodes per rack")
	flag.IntVar(&o.gpus, "gpus", 8, "GPUs per node")
	flag.IntVar(&o.podGPUs, "pod-gpus", 4, "GPUs per gang pod (a gang of G GPUs has G/pod-gpus pods)")
	flag.Float64Var(&o.freeFrac, "free-frac", 0.5, "share of the 1-GPU filler pods deleted to fragment the cluster")
	flag.DurationVar(&o.settle, "settle", 45*time.Second, "stop waiting once no gang pod was bound for this long")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "longest wait for the fill and for the gangs")
	flag.Parse()
	if err := run(context.Background(), o); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func logf(f string, a ...any) {
	fmt.Printf("%s "+f+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, a...)...)
}

type node struct{ name, rack, block string }

func run(ctx context.Context, o opts) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 200, 400
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	nodes, err := setup(ctx, o, cs, dc)
	if err != nil {
		return err
	}
	res := result{Scheduler: o.scheduler, Seed: o.seed, PriorityClass: o.priorityClass, Recreate: o.recreate, QueueQuota: o.quota, RequiredLevel: o.required,
		Cluster: fmt.Sprintf("%d blocks x %d racks x %d nodes x %d GPUs", o.blocks, o.racks, o.nodes, o.gpus)}
	nodeOf := map[string]node{}
	for _, n := range nodes {
		nodeOf[n.name] = n
	}

	// want holds every pod that should exist; a pod of it that disappeared
	// without the trace deleting it was evicted by the scheduler, and is
	// recreated (with --recreate) as a Job or training operator would.
	want := map[string]*corev1.Pod{}
	evicted := map[string]int{}
	reconcile := func() error {
		pl, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, p := range pl.Items {
			have[p.Name] = true
		}
		for name, p := range want {
			if have[name] {
				continue
			}
			evicted[p.Labels[roleLabel]]++
			if !o.recreate {
				delete(want, name)
				continue
			}
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, p.DeepCopy(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return err
			}
			logf("recreated evicted pod %s", name)
		}
		return nil
	}

	// 1. Fill every GPU with a 1-GPU pod.
	total := len(nodes) * o.gpus
	res.Fillers = total
	start := time.Now()
	for i := 0; i < total; i++ {
		p := pod(o, fmt.Sprintf("fill-%04d", i), 1, map[string]string{roleLabel: "filler"}, nil)
		want[p.Name] = p.DeepCopy()
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	logf("created %d filler pods", total)
	bound, err := waitBound(ctx, cs, "filler", total, o.timeout, 20*time.Second, reconcile)
	res.FillersBound = bound
	res.FillWall = time.Since(start).Round(time.Millisecond).String()
	logf("fill: %d/%d filler pods bound in %s", bound, total, res.FillWall)
	if err != nil {
		return err
	}

	// 2. Fragment: delete a seeded subset of (node, slot) positions, so the
	// free GPUs per node depend only on the seed, not on how the scheduler
	// packed the fillers.
	fillers, err := listPods(ctx, cs, "filler")
	if err != nil {
		return err
	}
	byNode := map[string][]string{}
	for _, p := range fillers {
		if p.Spec.NodeName != "" {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p.Name)
		}
	}
	var slots []string
	for _, n := range nodes {
		names := byNode[n.name]
		sort.Strings(names)
		for s := 0; s < o.gpus; s++ {
			if s < len(names) {
				slots = append(slots, names[s])
			} else {
				slots = append(slots, "")
			}
		}
	}
	rng := rand.New(rand.NewSource(o.seed))
	perm := rng.Perm(len(slots))
	del := int(o.freeFrac * float64(len(slots)))
	zero := int64(0)
	deleted := map[string]bool{}
	for _, idx := range perm[:del] {
		if slots[idx] == "" {
			continue
		}
		deleted[slots[idx]] = true
		delete(want, slots[idx])
		if err := cs.CoreV1().Pods(ns).Delete(ctx, slots[idx], metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	res.FillersDeleted = len(deleted)
	evictedDuringFill := evicted["filler"]
	for deadline := time.Now().Add(o.timeout); ; {
		ps, err := listPods(ctx, cs, "filler")
		if err != nil {
			return err
		}
		if len(ps) == total-len(deleted) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deleted filler pods did not go away")
		}
		time.Sleep(time.Second)
	}
	freeNode, err := freePerNode(ctx, cs, nodes, o.gpus)
	if err != nil {
		return err
	}
	res.FreeNodesBefore = freeNode
	res.FreeBefore = perRack(freeNode, nodes)
	logf("fragmented: deleted %d fillers; free GPUs per rack %v", len(deleted), res.FreeBefore)

	// 3. Gangs, in a seeded order, all submitted at once.
	var sizes []int
	for _, part := range strings.Split(o.gangs, ",") {
		sc := strings.SplitN(part, ":", 2)
		size, err1 := strconv.Atoi(sc[0])
		count, err2 := strconv.Atoi(sc[1])
		if len(sc) != 2 || err1 != nil || err2 != nil || size%o.podGPUs != 0 {
			return fmt.Errorf("bad --gangs entry %q", part)
		}
		for i := 0; i < count; i++ {
			sizes = append(sizes, size)
		}
	}
	rng.Shuffle(len(sizes), func(i, j int) { sizes[i], sizes[j] = sizes[j], sizes[i] })
	res.GangsTotal = len(sizes)
	res.OracleRackFitGangs = oracle(freeNode, nodes, sizes, o.podGPUs)
	gangs := make([]gangResult, len(sizes))
	start = time.Now()
	for i, size := range sizes {
		g := &gangs[i]
		g.Name, g.GPUs, g.Pods = fmt.Sprintf("gang-%02d-%dg", i, size), size, size/o.podGPUs
		pg := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
			"metadata": map[string]any{"name": g.Name, "namespace": ns, "labels": map[string]any{queueLabel: queue}},
			"spec": map[string]any{
				"minMember": int64(g.Pods), "queue": queue, "priorityClassName": o.priorityClass,
			},
		}}
		if o.required != "" {
			pg.Object["spec"].(map[string]any)["topologyConstraint"] = map[string]any{"topology": topoName, "requiredTopologyLevel": o.required}
		}
		if _, err := dc.Resource(podGroupGVR).Namespace(ns).Create(ctx, pg, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create PodGroup %s: %w", g.Name, err)
		}
		for j := 0; j < g.Pods; j++ {
			annotations := map[string]string{pgAnnot: g.Name}
			if o.required != "" {
				annotations["kai.scheduler/topology"] = topoName
				annotations["kai.scheduler/topology-required-placement"] = o.required
			}
			p := pod(o, fmt.Sprintf("%s-%d", g.Name, j), o.podGPUs,
				map[string]string{roleLabel: "gang", gangLabel: g.Name}, annotations)
			want[p.Name] = p.DeepCopy()
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	logf("submitted %d gangs: %v", len(sizes), sizes)
	// Wait until nothing changed (bindings, evictions) for --settle.
	placedAt := map[string]time.Duration{}
	last, lastChange := "", time.Now()
	for deadline := time.Now().Add(o.timeout); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		if err := reconcile(); err != nil {
			return err
		}
		ps, err := listPods(ctx, cs, "")
		if err != nil {
			return err
		}
		boundPer := map[string]int{}
		var sig []string
		n := 0
		for _, p := range ps {
			if p.Spec.NodeName != "" {
				sig = append(sig, p.Name+"@"+p.Spec.NodeName)
				if p.Labels[roleLabel] == "gang" {
					boundPer[p.Labels[gangLabel]]++
					n++
				}
			}
		}
		sort.Strings(sig)
		for _, g := range gangs {
			if boundPer[g.Name] == g.Pods {
				if _, ok := placedAt[g.Name]; !ok {
					placedAt[g.Name] = time.Since(start)
				}
			} else {
				delete(placedAt, g.Name) // evicted again: time to its final placement
			}
		}
		if s := strings.Join(sig, ",") + fmt.Sprint(evicted); s != last {
			last, lastChange = s, time.Now()
			logf("gang pods bound: %d, gangs placed: %d/%d, evicted so far: %v", n, len(placedAt), len(gangs), evicted)
		}
		if time.Since(lastChange) > o.settle {
			break
		}
	}
	res.GangWall = lastChange.Sub(start).Round(time.Millisecond).String() // until the last change

	// 4. Measure.
	ps, err := listPods(ctx, cs, "gang")
	if err != nil {
		return err
	}
	for i := range gangs {
		g := &gangs[i]
		racks, blocks, hosts := map[string]bool{}, map[string]bool{}, map[string]bool{}
		for _, p := range ps {
			if p.Labels[gangLabel] != g.Name || p.Spec.NodeName == "" {
				continue
			}
			g.BoundPods++
			n := nodeOf[p.Spec.NodeName]
			racks[n.rack], blocks[n.block], hosts[n.name] = true, true, true
		}
		g.Racks, g.Blocks, g.Nodes = keys(racks), keys(blocks), keys(hosts)
		g.Placed = g.BoundPods == g.Pods
		g.InOneRack = g.Placed && len(racks) == 1
		if d, ok := placedAt[g.Name]; ok {
			g.PlacedAfter = d.Round(time.Millisecond).String()
		}
		if g.Placed {
			res.GangsPlaced++
		}
		if g.InOneRack {
			res.GangsInOneRack++
		}
		if u, err := dc.Resource(podGroupGVR).Namespace(ns).Get(ctx, g.Name, metav1.GetOptions{}); err == nil {
			conds, _, _ := unstructured.NestedSlice(u.Object, "status", "schedulingConditions")
			if len(conds) > 0 {
				if c, ok := conds[len(conds)-1].(map[string]any); ok {
					g.Condition = fmt.Sprintf("%v: %v", c["reason"], c["message"])
				}
			}
		}
	}
	res.Gangs = gangs
	fillersNow, err := listPods(ctx, cs, "filler")
	if err != nil {
		return err
	}
	res.FillersEvicted = evicted["filler"] - evictedDuringFill
	res.GangPodsEvicted = evicted["gang"]
	if !o.recreate && len(fillersNow) != total-len(deleted)-res.FillersEvicted {
		logf("warning: %d fillers left, expected %d", len(fillersNow), total-len(deleted)-res.FillersEvicted)
	}
	freeNode, err = freePerNode(ctx, cs, nodes, o.gpus)
	if err != nil {
		return err
	}
	res.FreeAfter = perRack(freeNode, nodes)
	minWaiting, smallest := 0, 0
	for _, g := range gangs {
		if !g.Placed && (minWaiting == 0 || g.GPUs < minWaiting) {
			minWaiting = g.GPUs
		}
		if smallest == 0 || g.GPUs < smallest {
			smallest = g.GPUs
		}
	}
	for _, f := range freeNode {
		res.FreeGPUsAfter += f
	}
	res.Stranded = stranded(freeNode, nodes, minWaiting, o.podGPUs)
	res.StrandedSmallest = stranded(freeNode, nodes, smallest, o.podGPUs)
	logf("evicted by the scheduler during the gang phase: %d fillers, %d gang pods", res.FillersEvicted, res.GangPodsEvicted)
	logf("gangs placed %d/%d, inside one rack %d; free GPUs %d, stranded %d (for smallest gang: %d); oracle greedy rack-fit %d",
		res.GangsPlaced, res.GangsTotal, res.GangsInOneRack, res.FreeGPUsAfter, res.Stranded, res.StrandedSmallest, res.OracleRackFitGangs)
	for _, g := range gangs {
		logf("  %s placed=%v racks=%v blocks=%v after=%s %s", g.Name, g.Placed, g.Racks, g.Blocks, g.PlacedAfter, g.Condition)
	}
	b, _ := json.MarshalIndent(res, "", "  ")
	return os.WriteFile(o.out, append(b, '\n'), 0o644)
}

// fits reports how many pods of podGPUs a rack's nodes can take.
func podSlots(freeNode map[string]int, nodes []node, rack string, podGPUs int) int {
	s := 0
	for _, n := range nodes {
		if n.rack == rack {
			s += freeNode[n.name] / podGPUs
		}
	}
	return s
}

func rackNames(nodes []node) []string {
	m := map[string]bool{}
	for _, n := range nodes {
		m[n.rack] = true
	}
	return keys(m)
}

// stranded counts free GPUs in racks that cannot take a gang of gangGPUs
// (gangGPUs/podGPUs pods of podGPUs each, all in that rack). With no gang
// (gangGPUs == 0) nothing is stranded.
func stranded(freeNode map[string]int, nodes []node, gangGPUs, podGPUs int) int {
	if gangGPUs == 0 {
		return 0
	}
	free := perRack(freeNode, nodes)
	s := 0
	for _, r := range rackNames(nodes) {
		if podSlots(freeNode, nodes, r, podGPUs) < gangGPUs/podGPUs {
			s += free[r]
		}
	}
	return s
}

// oracle is a reference, not a scheduler under test: in submission order, it
// puts each gang into the fitting rack with the fewest pod slots (best fit),
// and reports how many gangs fit inside one rack.
func oracle(freeNode map[string]int, nodes []node, sizes []int, podGPUs int) int {
	free := map[string]int{}
	for k, v := range freeNode {
		free[k] = v
	}
	placed := 0
	for _, size := range sizes {
		need := size / podGPUs
		best, bestSlots := "", 0
		for _, r := range rackNames(nodes) {
			s := podSlots(free, nodes, r, podGPUs)
			if s >= need && (best == "" || s < bestSlots) {
				best, bestSlots = r, s
			}
		}
		if best == "" {
			continue
		}
		placed++
		for _, n := range nodes {
			for n.rack == best && need > 0 && free[n.name] >= podGPUs {
				free[n.name] -= podGPUs
				need--
			}
		}
	}
	return placed
}

func perRack(freeNode map[string]int, nodes []node) map[string]int {
	m := map[string]int{}
	for _, n := range nodes {
		m[n.rack] += freeNode[n.name]
	}
	return m
}

func freePerNode(ctx context.Context, cs *kubernetes.Clientset, nodes []node, gpus int) (map[string]int, error) {
	pl, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	m := map[string]int{}
	for _, n := range nodes {
		m[n.name] = gpus
	}
	for _, p := range pl.Items {
		if p.Spec.NodeName == "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range p.Spec.Containers {
			q := c.Resources.Limits[gpuRes]
			m[p.Spec.NodeName] -= int(q.Value())
		}
	}
	return m, nil
}

func keys(m map[string]bool) []string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

func listPods(ctx context.Context, cs *kubernetes.Clientset, role string) ([]corev1.Pod, error) {
	sel := roleLabel
	if role != "" {
		sel += "=" + role
	}
	pl, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pl.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out, nil
}

// waitBound waits until want pods of a role are bound, or until nothing was
// bound for quiet, or timeout.
func waitBound(ctx context.Context, cs *kubernetes.Clientset, role string, want int, timeout, quiet time.Duration, reconcile func() error) (int, error) {
	last, lastChange := -1, time.Now()
	for deadline := time.Now().Add(timeout); ; time.Sleep(2 * time.Second) {
		if err := reconcile(); err != nil {
			return 0, err
		}
		ps, err := listPods(ctx, cs, role)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, p := range ps {
			if p.Spec.NodeName != "" {
				n++
			}
		}
		if n != last {
			last, lastChange = n, time.Now()
			logf("%s pods bound: %d/%d", role, n, want)
		}
		if n >= want {
			return n, nil
		}
		if time.Now().After(deadline) || time.Since(lastChange) > 3*quiet {
			return n, fmt.Errorf("only %d/%d %s pods bound", n, want, role)
		}
	}
}

func pod(o opts, name string, gpus int, labels, annotations map[string]string) *corev1.Pod {
	labels[queueLabel] = queue
	q := resource.MustParse(strconv.Itoa(gpus))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			SchedulerName:     o.scheduler,
			PriorityClassName: o.priorityClass,
			Tolerations:       []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name: "main", Image: "busybox",
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi"), gpuRes: q},
					Limits:   corev1.ResourceList{gpuRes: q},
				},
			}},
		},
	}
}

// setup creates the namespace, the kwok GPU nodes, KAI's Topology and its
// default queues (the ones KAI's chart creates on a fresh install).
func setup(ctx context.Context, o opts, cs *kubernetes.Clientset, dc dynamic.Interface) ([]node, error) {
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	var nodes []node
	for b := 0; b < o.blocks; b++ {
		for r := 0; r < o.racks; r++ {
			for n := 0; n < o.nodes; n++ {
				nd := node{name: fmt.Sprintf("gpu-b%d-r%d-n%d", b, r, n), rack: fmt.Sprintf("b%d-r%d", b, r), block: fmt.Sprintf("b%d", b)}
				nodes = append(nodes, nd)
				capacity := corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("512Gi"),
					corev1.ResourcePods: resource.MustParse("110"), gpuRes: resource.MustParse(strconv.Itoa(o.gpus)),
				}
				obj := &corev1.Node{
					ObjectMeta: metav1.ObjectMeta{Name: nd.name,
						Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
						Labels: map[string]string{
							hostLabel: nd.name, rackLabel: nd.rack, blockLabel: nd.block, "type": "kwok",
							"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
							"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": strconv.Itoa(o.gpus),
							"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
						}},
					Spec:   corev1.NodeSpec{Taints: []corev1.Taint{{Key: "kwok.x-k8s.io/node", Value: "fake", Effect: corev1.TaintEffectNoSchedule}}},
					Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity.DeepCopy()},
				}
				if _, err := cs.CoreV1().Nodes().Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					return nil, err
				}
				patch, _ := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": capacity}})
				if _, err := cs.CoreV1().Nodes().Patch(ctx, nd.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
					return nil, err
				}
			}
		}
	}
	topo := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
		"metadata": map[string]any{"name": topoName},
		"spec": map[string]any{"levels": []any{
			map[string]any{"nodeLabel": blockLabel}, map[string]any{"nodeLabel": rackLabel}, map[string]any{"nodeLabel": hostLabel},
		}},
	}}
	if _, err := dc.Resource(topologyGVR).Create(ctx, topo, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create Topology: %w", err)
	}
	unlimited := map[string]any{"quota": o.quota, "limit": int64(-1), "overQuotaWeight": int64(1)}
	res := map[string]any{"cpu": unlimited, "gpu": unlimited, "memory": unlimited}
	for _, q := range []struct{ name, parent string }{{"default-parent-queue", ""}, {queue, "default-parent-queue"}} {
		spec := map[string]any{"resources": res}
		if q.parent != "" {
			spec["parentQueue"] = q.parent
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
			"metadata": map[string]any{"name": q.name}, "spec": spec,
		}}
		if _, err := dc.Resource(queueGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create Queue %s: %w", q.name, err)
		}
	}
	// Wait for kwok to mark the nodes Ready.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		nl, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		ready := 0
		for _, n := range nl.Items {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready >= len(nodes) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d/%d nodes Ready", ready, len(nodes))
		}
	}
	logf("setup: %d nodes Ready, Topology %s, queues default-parent-queue/default-queue", len(nodes), topoName)
	return nodes, nil
}
