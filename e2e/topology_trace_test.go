package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// kaiTrace is what hack/peers/kai-topology wrote of one KAI run: the free
// GPUs of each node before the gangs went in (the fragmented state, a
// function of the seed alone) and the gangs, in submission order.
type kaiTrace struct {
	Seed       int            `json:"seed"`
	FreeBefore map[string]int `json:"freeGPUsPerNodeBeforeGangs"`
	Gangs      []struct {
		Name string `json:"name"`
		GPUs int    `json:"gpus"`
		Pods int    `json:"pods"`
	} `json:"gangs"`
	Placed   int `json:"gangsPlaced"`
	Stranded int `json:"strandedGPUs"`
	Oracle   int `json:"oracleGreedyRackFitGangs"`
}

// TestTopologyTraceAsKAI replays, on the dev cluster, the fragmented trace
// hack/peers/kai-topology ran against KAI-Scheduler (its build-seed*.json
// results: placement only, nothing moved): 32 nodes × 8 GPUs in 2 blocks ×
// 4 racks of 4 nodes, each node holding the same filler pods as in KAI's
// run, then six 8-GPU and three 16-GPU gangs of 4-GPU pods that require a
// rack, all at once. It reports gangs placed, racks per gang and stranded
// GPUs (free GPUs in racks that cannot take the smallest waiting gang), as
// KAI's run did. A benchmark: skipped unless PARTITA_TOPOLOGY_TRACE=1
// (docs/benchmarks.md).
func TestTopologyTraceAsKAI(t *testing.T) {
	if os.Getenv("PARTITA_TOPOLOGY_TRACE") != "1" {
		t.Skip("a benchmark: set PARTITA_TOPOLOGY_TRACE=1")
	}
	files, _ := filepath.Glob("../hack/peers/kai-topology/results/build-seed[0-9].json")
	if len(files) == 0 {
		t.Fatal("no hack/peers/kai-topology/results/build-seed*.json")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var tr kaiTrace
		if err := json.Unmarshal(b, &tr); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		t.Run(fmt.Sprintf("seed-%d", tr.Seed), func(t *testing.T) { replayKAITrace(t, tr) })
	}
}

func replayKAITrace(t *testing.T, tr kaiTrace) {
	ctx := testContext(t, 8*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	sel := map[string]string{"e2e.partita.dev/trace": ns}
	// gpu-b0-r1-n2 → block b0, rack b0-r1 (KAI's rack values).
	rackOf := map[string]string{}
	var names []string
	for name := range tr.FreeBefore {
		parts := strings.Split(strings.TrimPrefix(name, "gpu-"), "-")
		node := ns + "-" + strings.TrimPrefix(name, "gpu-")
		rackOf[node] = parts[0] + "-" + parts[1]
		names = append(names, name)
		addGPUNode(ctx, t, node, 8, map[string]string{"e2e.partita.dev/trace": ns, "type": "e2e", e2eBlock: parts[0], e2eRack: parts[0] + "-" + parts[1]})
	}
	slices.Sort(names)
	topo := "trace-" + ns
	c := crClient(t)
	if err := c.Create(ctx, &v1alpha1.Topology{ObjectMeta: metav1.ObjectMeta{Name: topo}, Spec: v1alpha1.TopologySpec{Levels: []v1alpha1.TopologyLevel{
		{NodeLabel: e2eBlock}, {NodeLabel: e2eRack}, {NodeLabel: "kubernetes.io/hostname"},
	}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(ctx, &v1alpha1.Topology{ObjectMeta: metav1.ObjectMeta{Name: topo}}) })
	q := "trace-" + ns
	createQueue(ctx, t, gpuQueue(q, ns, "0", "-1", 1))

	// The fragmented state: each node holds 8 − free filler GPUs.
	var fillers []*corev1.Pod
	for _, name := range names {
		node := ns + "-" + strings.TrimPrefix(name, "gpu-")
		for i := range 8 - tr.FreeBefore[name] {
			fillers = append(fillers, queuedPod(ns, fmt.Sprintf("filler-%s-%d", strings.TrimPrefix(name, "gpu-"), i), q, map[string]string{"kubernetes.io/hostname": node}))
		}
	}
	createPods(ctx, t, clientset, fillers, 8)
	waitBound(ctx, t, ns, "filler-", len(fillers))

	start := time.Now()
	var gangPods []*corev1.Pod
	for _, g := range tr.Gangs {
		if err := c.Create(ctx, &v1alpha1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: g.Name, Namespace: ns, Annotations: map[string]string{
			v1alpha1.AnnotationTopology: topo, v1alpha1.AnnotationTopologyRequired: e2eRack,
		}}, Spec: v1alpha1.PodGroupSpec{MinMember: int32(g.Pods), Queue: q}}); err != nil {
			t.Fatal(err)
		}
		for i := range g.Pods {
			p := extGPUPod(ns, fmt.Sprintf("%s-%d", g.Name, i), 1000, g.GPUs/g.Pods, sel)
			p.Labels[v1alpha1.LabelPodGroup] = g.Name
			gangPods = append(gangPods, p)
		}
	}
	createPods(ctx, t, clientset, gangPods, 8)
	// Settled: nothing more bound for 20 s.
	last, lastChange := -1, time.Now()
	for time.Since(lastChange) < 20*time.Second {
		n := 0
		for _, p := range listNS(ctx, t, ns) {
			if p.Spec.NodeName != "" && strings.HasPrefix(p.Name, "gang-") {
				n++
			}
		}
		if n != last {
			last, lastChange = n, time.Now()
		}
		time.Sleep(time.Second)
	}
	settled := lastChange.Sub(start)

	free := map[string]int{}
	for node := range rackOf {
		free[node] = 8
	}
	racksOfGang := map[string][]string{}
	bound := map[string]int{}
	for _, p := range listNS(ctx, t, ns) {
		if p.Spec.NodeName == "" {
			continue
		}
		gpus, err := strconv.Atoi(p.Annotations[v1alpha1.AnnotationGPUCount])
		if err != nil {
			t.Fatalf("pod %s: %s: %v", p.Name, v1alpha1.AnnotationGPUCount, err)
		}
		free[p.Spec.NodeName] -= gpus
		if g := p.Labels[v1alpha1.LabelPodGroup]; g != "" {
			bound[g]++
			if rk := rackOf[p.Spec.NodeName]; !slices.Contains(racksOfGang[g], rk) {
				racksOfGang[g] = append(racksOfGang[g], rk)
			}
		}
	}
	placed, inOneRack, minWaiting := 0, 0, 0
	var lines []string
	for _, g := range tr.Gangs {
		ok := bound[g.Name] == g.Pods
		if ok {
			placed++
			if len(racksOfGang[g.Name]) == 1 {
				inOneRack++
			}
		} else if minWaiting == 0 || g.GPUs < minWaiting {
			minWaiting = g.GPUs
		}
		lines = append(lines, fmt.Sprintf("%s placed=%v racks=%v", g.Name, ok, racksOfGang[g.Name]))
	}
	// Stranded, as hack/peers/kai-topology counts it: free GPUs in racks
	// whose nodes cannot take the smallest waiting gang as 4-GPU pods.
	slots, rackFree := map[string]int{}, map[string]int{}
	for node, f := range free {
		slots[rackOf[node]] += f / 4
		rackFree[rackOf[node]] += f
	}
	stranded, total := 0, 0
	for rk, f := range rackFree {
		total += f
		if minWaiting > 0 && slots[rk] < minWaiting/4 {
			stranded += f
		}
	}
	t.Logf("seed %d: Partita placed %d/%d gangs, %d inside one rack; free %d GPUs, stranded %d; settled %s after submission. KAI (same state, placement only): placed %d, stranded %d; oracle %d.\n%s",
		tr.Seed, placed, len(tr.Gangs), inOneRack, total, stranded, settled.Round(100*time.Millisecond), tr.Placed, tr.Stranded, tr.Oracle, strings.Join(lines, "\n"))
	if inOneRack != placed {
		t.Errorf("%d gangs placed, only %d inside one rack", placed, inOneRack)
	}
}
