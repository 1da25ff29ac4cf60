package nodeagent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
	pt "github.com/partita-dev/partita/internal/partitatest"
)

// runAgent starts an agent and returns a func that stops it and waits.
func runAgent(t *testing.T, cfg *rest.Config, opts Options) (*Agent, func()) {
	t.Helper()
	if opts.SyncInterval == 0 {
		opts.SyncInterval = 100 * time.Millisecond
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = time.Hour
	}
	if opts.Recorder == nil {
		opts.Recorder = &recorder{}
	}
	a, err := New(cfg, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(logr.NewContext(t.Context(), testr.NewWithOptions(t, testr.Options{Verbosity: 2})))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return a, stop
}

// waitFor polls cond for up to 30s.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	waitForWithin(t, 30*time.Second, what, cond)
}

// waitForWithin polls cond for up to d.
func waitForWithin(t *testing.T, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (last error: %v)", what, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func createNode(t *testing.T, c client.Client, name string, lbls map[string]string) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
	if err := c.Create(t.Context(), n); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	return n
}

// gpuLabels are the GPU Feature Discovery labels of a simulated node.
func gpuLabels(count int) map[string]string {
	return map[string]string{
		v1alpha1.LabelGPUNode:          "true",
		v1alpha1.LabelNVIDIAGPUCount:   strconv.Itoa(count),
		v1alpha1.LabelNVIDIAGPUProduct: "NVIDIA-L4",
		v1alpha1.LabelNVIDIAGPUMemory:  "23034",
	}
}

// milliOf reads a node's gpu-milli capacity and allocatable ("-1" absent).
func milliOf(t *testing.T, c client.Client, name string) string {
	t.Helper()
	n := &corev1.Node{}
	if err := c.Get(t.Context(), client.ObjectKey{Name: name}, n); err != nil {
		return "error: " + err.Error()
	}
	ca, al := nodeMilli(n)
	return fmt.Sprintf("%d/%d", ca, al)
}

func gpuNode(t *testing.T, c client.Client, name string) (*v1alpha1.GPUNode, error) {
	gn := &v1alpha1.GPUNode{}
	err := c.Get(t.Context(), client.ObjectKey{Name: name}, gn)
	return gn, err
}

func writes(m *Metrics, kind string) float64 {
	return testutil.ToFloat64(m.apiWrites.WithLabelValues(kind, resultOK))
}

func TestAgentSingleNode(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	node := createNode(t, c, "n1", nil)
	m1 := NewMetrics()
	sim := NewSimulated("n1", h100(8))
	a, stop := runAgent(t, cfg, Options{NodeName: "n1", Backends: StaticBackend(sim), Metrics: m1, Version: "test"})

	waitFor(t, "the agent is ready", func() (bool, error) { return a.Ready() == nil, a.Ready() })
	gn, err := gpuNode(t, c, "n1")
	if err != nil {
		t.Fatal(err)
	}
	snap, _ := sim.Snapshot(t.Context())
	wantDevices := devicesOf(snap)
	if diff := cmp.Diff(wantDevices, gn.Status.Devices); diff != "" {
		t.Errorf("published devices (-want,+got):\n%s", diff)
	}
	got := fmt.Sprintf("devices=%d healthy=%d mode=%s version=%s owner=%v heartbeat=%v", gn.Status.DeviceCount, gn.Status.HealthyDevices, gn.Status.Isolation, gn.Status.AgentVersion, gn.OwnerReferences[0].UID == node.UID, gn.Status.Heartbeat != nil)
	if want := "devices=8 healthy=8 mode=time-slicing version=test owner=true heartbeat=true"; got != want {
		t.Errorf("GPUNode: %s, want %s", got, want)
	}
	if got := milliOf(t, c, "n1"); got != "8000/8000" {
		t.Errorf("node gpu-milli capacity/allocatable = %s, want 8000/8000", got)
	}

	// Steady state: no writes while nothing changes.
	time.Sleep(time.Second)
	if g, ca := writes(m1, writeGPUNode), writes(m1, writeCapacity); g != 2 || ca != 1 {
		t.Errorf("writes after settling: gpunode=%v capacity=%v, want 2 (create, status) and 1", g, ca)
	}

	// A restarted agent finds everything in place and writes nothing.
	stop()
	m2 := NewMetrics()
	a, _ = runAgent(t, cfg, Options{NodeName: "n1", Backends: StaticBackend(NewSimulated("n1", h100(8))), Metrics: m2, Version: "test"})
	waitFor(t, "the restarted agent is ready", func() (bool, error) { return a.Ready() == nil, a.Ready() })
	time.Sleep(time.Second)
	if g, ca := writes(m2, writeGPUNode), writes(m2, writeCapacity); g != 0 || ca != 0 {
		t.Errorf("restarted agent wrote gpunode=%v capacity=%v times, want none", g, ca)
	}
	after, _ := gpuNode(t, c, "n1")
	if after.UID != gn.UID || after.ResourceVersion != gn.ResourceVersion {
		t.Errorf("restart changed the GPUNode: uid %s→%s, resourceVersion %s→%s", gn.UID, after.UID, gn.ResourceVersion, after.ResourceVersion)
	}

	// A pod bound here shows up as a slice.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
	pod := heldPod("p", "n1", "20Gi", 2)
	pod.UID = ""
	if err := c.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the slice is published", func() (bool, error) {
		gn, err := gpuNode(t, c, "n1")
		return err == nil && len(gn.Status.Slices) == 1 && gn.Status.AllocatedMilli == gn.Status.Slices[0].Milli, err
	})
	gn, _ = gpuNode(t, c, "n1")
	wantSlice := v1alpha1.GPUSlice{Namespace: "ns", Pod: "p", Container: "main", DeviceIndex: 2, Milli: 252, MemoryLimitMiB: 20480}
	if diff := cmp.Diff(wantSlice, gn.Status.Slices[0]); diff != "" {
		t.Errorf("slice (-want,+got):\n%s", diff)
	}

	// Someone (a kubelet re-registering) drops the capacity: it comes back.
	patch := []byte(`{"status":{"capacity":{"partita.dev/gpu-milli":null},"allocatable":{"partita.dev/gpu-milli":null}}}`)
	if err := c.Status().Patch(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "capacity restored", func() (bool, error) { return milliOf(t, c, "n1") == "8000/8000", nil })

	// The GPUNode is deleted: it comes back.
	if err := c.Delete(t.Context(), gn); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "GPUNode re-created", func() (bool, error) {
		again, err := gpuNode(t, c, "n1")
		return err == nil && again.UID != gn.UID && again.Status.DeviceCount == 8, err
	})

	// The node is deleted and created again: the GPUNode follows its new UID.
	if err := c.Delete(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node gone", func() (bool, error) {
		err := c.Get(t.Context(), client.ObjectKey{Name: "n1"}, &corev1.Node{})
		return apierrors.IsNotFound(err), nil
	})
	node = createNode(t, c, "n1", nil)
	waitFor(t, "GPUNode owned by the new node, capacity back", func() (bool, error) {
		gn, err := gpuNode(t, c, "n1")
		return err == nil && gn.OwnerReferences[0].UID == node.UID && milliOf(t, c, "n1") == "8000/8000", err
	})
	var list v1alpha1.GPUNodeList
	if err := c.List(t.Context(), &list); err != nil || len(list.Items) != 1 {
		t.Errorf("GPUNodes: %d (%v), want exactly 1", len(list.Items), err)
	}
}

func TestAgentFleet(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	// PARTITA_FLEET_NODES=1000 measures a large fleet.
	nodes := 20
	if s := os.Getenv("PARTITA_FLEET_NODES"); s != "" {
		nodes, _ = strconv.Atoi(s)
	}
	fast := rest.CopyConfig(cfg)
	fast.QPS, fast.Burst = 1000, 2000
	c, err := client.New(fast, client.Options{Scheme: c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	// The agent's client is paced as `partita agent` paces it by default.
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 20, 40
	for i := range nodes {
		createNode(t, c, fmt.Sprintf("gpu-%d", i), gpuLabels(4))
	}
	createNode(t, c, "cpu-0", map[string]string{"kubernetes.io/os": "linux"})
	m := NewMetrics()
	start := time.Now()
	a, _ := runAgent(t, cfg, Options{
		NodeSelector: labels.SelectorFromSet(labels.Set{v1alpha1.LabelGPUNode: "true"}),
		Backends:     SimulatedBackends(nil),
		Metrics:      m,
		SyncInterval: time.Second,
		Workers:      4,
	})
	waitForWithin(t, 30*time.Second+time.Duration(nodes)*200*time.Millisecond, "every node published", func() (bool, error) { return a.Ready() == nil, a.Ready() })
	took := time.Since(start)
	time.Sleep(2 * time.Second)
	t.Logf("fleet of %d nodes: published in %s with %v GPUNode and %v capacity writes; none more in 2s of 1s syncs: %v",
		nodes, took.Round(time.Millisecond), writes(m, writeGPUNode), writes(m, writeCapacity), writes(m, writeGPUNode) == float64(2*nodes))
	if g, ca := writes(m, writeGPUNode), writes(m, writeCapacity); g != float64(2*nodes) || ca != float64(nodes) {
		t.Errorf("writes: gpunode=%v capacity=%v, want %d and %d", g, ca, 2*nodes, nodes)
	}
	var list v1alpha1.GPUNodeList
	if err := c.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != nodes {
		t.Errorf("%d GPUNodes, want %d", len(list.Items), nodes)
	}
	for _, gn := range list.Items {
		if gn.Status.DeviceCount != 4 || gn.Status.Devices[0].Product != "NVIDIA-L4" || gn.Status.Devices[0].MemoryMiB != 23034 {
			t.Errorf("GPUNode %s: %d devices of %s with %dMiB, want 4 NVIDIA-L4 of 23034MiB", gn.Name, gn.Status.DeviceCount, gn.Status.Devices[0].Product, gn.Status.Devices[0].MemoryMiB)
		}
		if got := milliOf(t, c, gn.Name); got != "4000/4000" {
			t.Errorf("node %s gpu-milli = %s, want 4000/4000", gn.Name, got)
		}
	}
	if _, err := gpuNode(t, c, "cpu-0"); !apierrors.IsNotFound(err) {
		t.Errorf("node without the label got a GPUNode (%v)", err)
	}

	// A node added later is picked up within seconds.
	added := time.Now()
	createNode(t, c, "gpu-late", gpuLabels(2))
	waitFor(t, "the new node is published", func() (bool, error) { return milliOf(t, c, "gpu-late") == "2000/2000", nil })
	if d := time.Since(added); d > 5*time.Second {
		t.Errorf("new node took %s to be published", d)
	}
	t.Logf("node added later published in %s", time.Since(added).Round(time.Millisecond))

	// An unhealthy simulated device leaves the capacity. (The agent writes
	// the nodes' status: an update that meets its write is made again.)
	updateNode := func(name string, change func(*corev1.Node)) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n := &corev1.Node{}
			if err := c.Get(t.Context(), client.ObjectKey{Name: name}, n); err != nil {
				return err
			}
			change(n)
			return c.Update(t.Context(), n)
		}); err != nil {
			t.Fatal(err)
		}
	}
	updateNode("gpu-0", func(n *corev1.Node) { n.Annotations = map[string]string{AnnotationSimulateUnhealthy: "1"} })
	waitFor(t, "capacity without the unhealthy device", func() (bool, error) { return milliOf(t, c, "gpu-0") == "3000/3000", nil })

	// A node that loses the label loses its GPUNode and its capacity.
	updateNode("gpu-1", func(n *corev1.Node) { delete(n.Labels, v1alpha1.LabelGPUNode) })
	waitFor(t, "gpu-1 released", func() (bool, error) {
		_, err := gpuNode(t, c, "gpu-1")
		return apierrors.IsNotFound(err) && milliOf(t, c, "gpu-1") == "-1/-1", nil
	})

	// A deleted node loses its GPUNode.
	if err := c.Delete(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-2"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "gpu-2's GPUNode deleted", func() (bool, error) {
		_, err := gpuNode(t, c, "gpu-2")
		return apierrors.IsNotFound(err), nil
	})
	waitFor(t, "partita_agent_nodes to count the nodes served", func() (bool, error) {
		got := testutil.ToFloat64(m.nodes)
		return got == float64(nodes-1), fmt.Errorf("partita_agent_nodes = %v, want %d", got, nodes-1)
	})
}

// flakyTransport fails the first n writes to status subresources.
type flakyTransport struct {
	next   http.RoundTripper
	left   atomic.Int32
	failed atomic.Int32
}

func (f *flakyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet && strings.HasSuffix(r.URL.Path, "/status") && f.left.Add(-1) >= 0 {
		f.failed.Add(1)
		return &http.Response{
			StatusCode: http.StatusInternalServerError,
			Header:     http.Header{"Content-Type": []string{"application/json"}},
			Body:       http.NoBody,
			Request:    r,
		}, nil
	}
	return f.next.RoundTrip(r)
}

func TestAgentRetriesAPIErrors(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	createNode(t, c, "n1", nil)
	flaky := &flakyTransport{}
	flaky.left.Store(4)
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { flaky.next = rt; return flaky })
	m := NewMetrics()
	a, _ := runAgent(t, cfg, Options{NodeName: "n1", Backends: StaticBackend(NewSimulated("n1", h100(8))), Metrics: m})
	waitFor(t, "published despite errors", func() (bool, error) { return a.Ready() == nil, a.Ready() })
	if got := milliOf(t, c, "n1"); got != "8000/8000" {
		t.Errorf("capacity = %s, want 8000/8000", got)
	}
	var list v1alpha1.GPUNodeList
	if err := c.List(t.Context(), &list); err != nil || len(list.Items) != 1 || list.Items[0].Status.DeviceCount != 8 {
		t.Errorf("GPUNodes after errors: %+v (%v), want one with 8 devices", list.Items, err)
	}
	errs := testutil.ToFloat64(m.apiWrites.WithLabelValues(writeGPUNode, resultError)) + testutil.ToFloat64(m.apiWrites.WithLabelValues(writeCapacity, resultError))
	if errs != float64(flaky.failed.Load()) || errs != 4 {
		t.Errorf("counted %v failed writes, want the 4 injected (%d)", errs, flaky.failed.Load())
	}
}

func TestAgentLeavesOtherDRADriversGPUs(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	createNode(t, c, "n1", nil)
	a, _ := runAgent(t, cfg, Options{NodeName: "n1", Backends: StaticBackend(NewSimulated("n1", h100(2))), Version: "test"})
	waitFor(t, "the agent is ready", func() (bool, error) { return a.Ready() == nil, a.Ready() })
	if got := milliOf(t, c, "n1"); got != "2000/2000" {
		t.Fatalf("gpu-milli capacity/allocatable = %s, want 2000/2000", got)
	}
	state := func() string {
		gn, err := gpuNode(t, c, "n1")
		if err != nil {
			return err.Error()
		}
		var devs []string
		for _, d := range gn.Status.Devices {
			devs = append(devs, fmt.Sprintf("%d:%s", d.Index, d.DRADriver))
		}
		return fmt.Sprintf("capacity=%s devices=%s drivers=%s healthy=%d", milliOf(t, c, "n1"), strings.Join(devs, ","), strings.Join(gn.Status.DRADrivers, ","), gn.Status.HealthyDevices)
	}
	expect := func(what, want string) {
		t.Helper()
		var got string
		waitForWithin(t, 15*time.Second, what, func() (bool, error) {
			got = state()
			return got == want, fmt.Errorf("got %s, want %s", got, want)
		})
	}

	// NVIDIA's driver publishes GPU 0 by its UUID.
	byUUID := pt.MakeResourceSlice("n1-gpu.nvidia.com", "gpu.nvidia.com", "n1").GPU("gpu-0", SimulatedUUID("n1", 0), "H100", "80Gi").Obj()
	if err := c.Create(t.Context(), byUUID); err != nil {
		t.Fatal(err)
	}
	expect("GPU 0 left to gpu.nvidia.com", "capacity=1000/1000 devices=0:gpu.nvidia.com,1: drivers=gpu.nvidia.com healthy=2")

	// A NIC driver's slice changes nothing.
	nic := pt.MakeResourceSlice("n1-dra.net", "dra.net", "n1").GPU("eth0", "", "nic", "1").Obj()
	if err := c.Create(t.Context(), nic); err != nil {
		t.Fatal(err)
	}
	// NVIDIA's driver without UUIDs owns every GPU of the node.
	anon := pt.MakeResourceSlice("n1-gpu.nvidia.com", "gpu.nvidia.com", "n1").GPU("gpu-0", "", "H100", "80Gi").Obj()
	if err := c.Delete(t.Context(), byUUID); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), anon); err != nil {
		t.Fatal(err)
	}
	expect("every GPU left to gpu.nvidia.com", "capacity=0/0 devices=0:gpu.nvidia.com,1:gpu.nvidia.com drivers=gpu.nvidia.com healthy=2")

	// The driver goes: Partita offers its GPUs again.
	if err := c.Delete(t.Context(), anon); err != nil {
		t.Fatal(err)
	}
	expect("GPUs offered again", "capacity=2000/2000 devices=0:,1: drivers= healthy=2")
}

// TestAgentBatchesSliceWrites: pods that land on a node one after another
// share GPUNode status writes (SliceWriteInterval), and every one of them
// is published.
func TestAgentBatchesSliceWrites(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	createNode(t, c, "n1", nil)
	m := NewMetrics()
	a, _ := runAgent(t, cfg, Options{NodeName: "n1", Backends: StaticBackend(NewSimulated("n1", h100(8))), Metrics: m,
		SliceWriteInterval: 2 * time.Second})
	waitFor(t, "the agent is ready", func() (bool, error) { return a.Ready() == nil, a.Ready() })
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}); err != nil {
		t.Fatal(err)
	}
	before := writes(m, writeGPUNode)
	const pods = 8
	start := time.Now()
	for i := range pods {
		p := heldPod(fmt.Sprintf("p%d", i), "n1", "20Gi", i)
		p.UID = ""
		if err := c.Create(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var last *v1alpha1.GPUNode
	waitFor(t, "every pod's slice is published", func() (bool, error) {
		gn, err := gpuNode(t, c, "n1")
		last = gn
		return err == nil && len(gn.Status.Slices) == pods, err
	})
	took := time.Since(start)
	// The pods came over 0.8 s: the first is written at once, the rest
	// together once the interval has passed.
	if n := writes(m, writeGPUNode) - before; n > 3 {
		t.Errorf("%d pods took %v GPUNode status writes, want at most 3 (slices: %d)", pods, n, len(last.Status.Slices))
	}
	if took > 10*time.Second {
		t.Errorf("the slices took %s to be published, want about the interval (2 s)", took)
	}
}
