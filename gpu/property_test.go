package gpu_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// world is the API server's view in the property test: the objects that
// exist, from which BuildLedger must give the same ledger as the incremental
// updates did.
type world struct {
	t   *testing.T
	rnd *rand.Rand
	l   *gpu.Ledger
	// layouts fixes each node name's hardware once: device memory per index.
	layouts map[string][]int64
	// unhealthy marks devices by node and index.
	unhealthy map[string]map[int32]bool
	nodes     map[string]*v1alpha1.GPUNode
	pods      map[types.UID]*corev1.Pod
	// assumed are decisions recorded by Assume whose pods are not bound yet.
	assumed map[types.UID]*corev1.Pod
	seq     int
}

func newWorld(t *testing.T, seed uint64) *world {
	return &world{
		t:         t,
		rnd:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		l:         gpu.NewLedger(),
		layouts:   map[string][]int64{},
		unhealthy: map[string]map[int32]bool{},
		nodes:     map[string]*v1alpha1.GPUNode{},
		pods:      map[types.UID]*corev1.Pod{},
		assumed:   map[types.UID]*corev1.Pod{},
	}
}

func (w *world) nodeObj(name string) *v1alpha1.GPUNode {
	b := pt.MakeGPUNode(name)
	for i, mem := range w.layouts[name] {
		b.Device(int32(i), "GPU", mem)
	}
	for i := range w.unhealthy[name] {
		b.UnhealthyDevice(i)
	}
	return b.Obj()
}

func (w *world) upsertNode(name string) {
	if _, ok := w.layouts[name]; !ok {
		sizes := []int64{24576, 40960, 81920}
		n := 1 + w.rnd.IntN(8)
		mixed := w.rnd.IntN(4) == 0
		size := sizes[w.rnd.IntN(len(sizes))]
		for range n {
			if mixed {
				size = sizes[w.rnd.IntN(len(sizes))]
			}
			w.layouts[name] = append(w.layouts[name], size)
		}
	}
	n := w.nodeObj(name)
	w.nodes[name] = n
	w.l.UpsertNode(n)
}

func (w *world) randomNode() string {
	return fmt.Sprintf("n%d", w.rnd.IntN(8))
}

func (w *world) randomPod() *corev1.Pod {
	w.seq++
	b := pt.MakePod(fmt.Sprintf("p%d", w.seq), "ns")
	containers := 1 + w.rnd.IntN(4)/3 // mostly one
	switch k := w.rnd.IntN(10); {
	case k < 4:
		b.GPUFraction([]string{"0.1", "0.25", "0.3333", "0.5", "0.75", "1"}[w.rnd.IntN(6)])
	case k < 7:
		b.GPUMemory([]string{"4Gi", "10Gi", "20Gi", "30Gi"}[w.rnd.IntN(4)])
	default:
		b.GPUCount(1 + w.rnd.IntN(3))
	}
	if w.rnd.IntN(5) == 0 {
		b.GPUCount(2)
	}
	for c := range containers {
		b.Container(fmt.Sprintf("c%d", c)).Resource("", v1alpha1.ResourceGPUMilli, "0")
	}
	if containers > 1 {
		// Make every container a GPU container through its gpu-milli.
		r, errs := gpu.ParsePod(b.Clone().Obj())
		if len(errs) == 0 && r != nil {
			q := r.Containers[0].MilliResource(refMiB)
			for c := range containers {
				b.Resource(fmt.Sprintf("c%d", c), v1alpha1.ResourceGPUMilli, q.String())
			}
		}
	}
	return b.Obj()
}

// allocate places a new pod with Choose and Assume, and binds it at once or
// later.
func (w *world) allocate() {
	pod := w.randomPod()
	r, errs := gpu.ParsePod(pod)
	if len(errs) > 0 {
		w.t.Fatalf("random pod does not parse: %v", errs)
	}
	node := w.randomNode()
	placement := []gpu.Placement{"", gpu.PlacementBinpack, gpu.PlacementSpread}[w.rnd.IntN(3)]
	fitErr := w.l.Fit(node, r)
	a, err := w.l.Choose(node, r, placement)
	if placement != gpu.PlacementSpread && (fitErr == nil) != (err == nil) {
		w.t.Fatalf("Fit and Choose disagree on %s for %+v: Fit %v, Choose %v", node, r.Containers, fitErr, err)
	}
	if err != nil {
		if !gpu.IsInsufficient(err) && !gpu.IsNodeNotFound(err) && !gpu.IsAgentSilent(err) {
			w.t.Fatalf("Choose: %v", err)
		}
		if w.l.Score(node, r, placement) != 0 {
			w.t.Fatalf("Score > 0 on a node where Choose fails")
		}
		return
	}
	if err := w.l.Assume(a); err != nil {
		w.t.Fatalf("Assume(Choose()) failed: %v", err)
	}
	// A concurrent bind that chose on the same state must not double-book.
	if w.rnd.IntN(4) == 0 {
		rival := *a
		rival.UID, rival.Name = "rival", "rival"
		if err := w.l.Assume(&rival); err == nil {
			w.l.Forget("rival")
		}
	}
	boundPod := bound(pod, r, a)
	if w.rnd.IntN(5) == 0 {
		w.assumed[pod.UID] = boundPod
		// The pod's pre-bind updates must not drop the assumption.
		w.l.UpsertPod(pod)
		return
	}
	w.pods[pod.UID] = boundPod
	w.l.UpsertPod(boundPod)
}

func (w *world) pickPod() *corev1.Pod {
	if len(w.pods) == 0 {
		return nil
	}
	uids := slices.Sorted(maps.Keys(w.pods))
	return w.pods[uids[w.rnd.IntN(len(uids))]]
}

func (w *world) step() string {
	switch k := w.rnd.IntN(100); {
	case k < 8:
		w.upsertNode(w.randomNode())
		return "upsert node"
	case k < 11:
		name := w.randomNode()
		delete(w.nodes, name)
		w.l.DeleteNode(name)
		return "delete node"
	case k < 18:
		name := w.randomNode()
		if _, ok := w.nodes[name]; !ok {
			return "noop"
		}
		i := int32(w.rnd.IntN(len(w.layouts[name])))
		if w.unhealthy[name] == nil {
			w.unhealthy[name] = map[int32]bool{}
		}
		if w.unhealthy[name][i] {
			delete(w.unhealthy[name], i)
		} else {
			w.unhealthy[name][i] = true
		}
		w.upsertNode(name)
		return "toggle device health"
	case k < 21:
		// An agent falls silent, or reports again (a newer heartbeat).
		name := w.randomNode()
		if slices.ContainsFunc(w.l.SilentAgents(), func(e gpu.AgentSilentError) bool { return e.Node == name }) {
			w.l.SetAgentSilent(name, nil)
			return "agent reports again"
		}
		w.l.SetAgentSilent(name, &gpu.AgentSilentError{For: time.Hour})
		return "agent falls silent"
	case k < 60:
		w.allocate()
		return "allocate"
	case k < 70:
		for uid, p := range w.assumed {
			if w.rnd.IntN(2) == 0 {
				w.l.Forget(uid)
			} else {
				w.pods[uid] = p
				w.l.UpsertPod(p)
			}
			delete(w.assumed, uid)
		}
		return "settle assumptions"
	case k < 82:
		p := w.pickPod()
		if p == nil {
			return "noop"
		}
		done := p.DeepCopy()
		done.Status.Phase = []corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed}[w.rnd.IntN(2)]
		w.pods[p.UID] = done
		w.l.UpsertPod(done)
		return "pod finished"
	case k < 92:
		p := w.pickPod()
		if p == nil {
			return "noop"
		}
		delete(w.pods, p.UID)
		w.l.DeletePod(p.UID)
		return "delete pod"
	case k < 96:
		p := w.pickPod()
		if p == nil {
			return "noop"
		}
		upd := p.DeepCopy()
		upd.Labels = map[string]string{"touched": fmt.Sprint(w.seq)}
		w.pods[p.UID] = upd
		w.l.UpsertPod(upd)
		return "pod status update"
	default:
		w.gang()
		return "gang on a snapshot"
	}
}

// gang places a random gang on a snapshot and checks that the ledger did not
// change and the snapshot's invariants hold.
func (w *world) gang() {
	before := w.l.State()
	s := w.l.Snapshot()
	if p := w.pickPod(); p != nil && w.rnd.IntN(2) == 0 {
		// Try the gang without a victim, as the admitter does before it
		// preempts.
		held := len(s.State().Pods)
		s.Forget(p.UID)
		if _, ok := s.Allocation(p.UID); ok {
			w.t.Fatalf("the snapshot still holds %s after Forget", p.UID)
		}
		if got := len(s.State().Pods); got > held {
			w.t.Fatalf("Forget on the snapshot added pods: %d > %d", got, held)
		}
	}
	var reqs []*gpu.PodRequest
	for range 1 + w.rnd.IntN(6) {
		r, _ := gpu.ParsePod(w.randomPod())
		reqs = append(reqs, r)
	}
	snapBefore := s.State()
	allocs, err := s.PlaceGang(reqs, nil, "")
	if err != nil {
		if diff := cmp.Diff(snapBefore, s.State()); diff != "" {
			w.t.Fatalf("a failed gang changed the snapshot (-before,+after):\n%s", diff)
		}
	} else if len(allocs) != len(reqs) {
		w.t.Fatalf("PlaceGang placed %d of %d", len(allocs), len(reqs))
	}
	for _, a := range allocs {
		if slices.ContainsFunc(w.l.SilentAgents(), func(e gpu.AgentSilentError) bool { return e.Node == a.Node }) {
			w.t.Fatalf("PlaceGang placed %s on %s, whose agent is silent", a.Name, a.Node)
		}
	}
	if errs := s.CheckInvariants(); len(errs) > 0 {
		w.t.Fatalf("snapshot invariants after a gang: %v", errs)
	}
	if diff := cmp.Diff(before, w.l.State()); diff != "" {
		w.t.Fatalf("a gang on a snapshot changed the ledger (-before,+after):\n%s", diff)
	}
}

func (w *world) checkBuild() {
	var nodes []v1alpha1.GPUNode
	for _, name := range slices.Sorted(maps.Keys(w.nodes)) {
		nodes = append(nodes, *w.nodes[name])
	}
	var pods []corev1.Pod
	for _, uid := range slices.Sorted(maps.Keys(w.pods)) {
		pods = append(pods, *w.pods[uid])
	}
	w.rnd.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
	if diff := cmp.Diff(gpu.BuildLedger(nodes, pods).State(), w.l.State()); diff != "" {
		w.t.Fatalf("BuildLedger(objects) differs from the incremental ledger (-built,+incremental):\n%s", diff)
	}
}

// TestLedgerProperties runs random operations and checks, after each, that
// the invariants hold, and regularly that BuildLedger of the objects equals
// the incremental state.
func TestLedgerProperties(t *testing.T) {
	const steps = 1500
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			w := newWorld(t, seed)
			counts := map[string]int{}
			for i := range steps {
				op := w.step()
				counts[op]++
				if errs := w.l.CheckInvariants(); len(errs) > 0 {
					t.Fatalf("step %d (%s): invariants: %v", i, op, errs)
				}
				if len(w.assumed) == 0 && i%20 == 0 {
					w.checkBuild()
				}
			}
			for uid, p := range w.assumed {
				w.pods[uid] = p
				w.l.UpsertPod(p)
			}
			w.assumed = map[types.UID]*corev1.Pod{}
			w.checkBuild()
			if counts["allocate"] == 0 || len(w.l.State().Pods) == 0 {
				t.Errorf("the run allocated nothing: %v", counts)
			}
		})
	}
}
