package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/internal/envtestutil"
	"github.com/partita-dev/partita/nodeagent"
)

// crClient is a client that knows Partita's types.
func crClient(t *testing.T) client.Client {
	t.Helper()
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatalf("create client: %v", err)
	}
	return c
}

// poll calls cond every 200ms until it returns true or d passes, and fails
// the test with cond's last message.
func poll(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, msg := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %s", what, d, msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// agentPID reads the dev cluster agent's PID from its pid file.
func agentPID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cluster.Dir(), "partita", "agent.pid"))
	if err != nil {
		t.Fatalf("read the agent's pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("agent pid file: %v", err)
	}
	return pid
}

// agentAddr reads the agent's --health-addr from its command line.
func agentAddr(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", agentPID(t)))
	if err != nil {
		t.Fatalf("read the agent's command line: %v", err)
	}
	args := strings.Split(string(b), "\x00")
	for i, a := range args {
		if a == "--health-addr" && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("the agent runs without --health-addr: %q", args)
	return ""
}

// agentMetrics fetches the agent's metrics as "name{labels}" → value.
func agentMetrics(t *testing.T, ctx context.Context) map[string]float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+agentAddr(t)+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("fetch agent metrics: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return out
}

// fleetState is what the agent published for the dev cluster's GPU nodes:
// per node, the GPUNode's UID, its devices and the node's gpu-milli
// capacity and allocatable.
func fleetState(t *testing.T, ctx context.Context, c client.Client) (map[string]string, string) {
	t.Helper()
	var list v1alpha1.GPUNodeList
	if err := c.List(ctx, &list); err != nil {
		return nil, err.Error()
	}
	nodes, err := clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
	if err != nil {
		return nil, err.Error()
	}
	out := map[string]string{}
	for _, gn := range list.Items {
		var devs []string
		for _, d := range gn.Status.Devices {
			devs = append(devs, fmt.Sprintf("%d:%s:%s:%d:%s", d.Index, d.UUID, d.Product, d.MemoryMiB, d.Health))
		}
		out[gn.Name] = fmt.Sprintf("uid=%s mode=%s devices=[%s]", gn.UID, gn.Status.Isolation, strings.Join(devs, " "))
	}
	for _, n := range nodes.Items {
		c, a := n.Status.Capacity[v1alpha1.ResourceGPUMilli], n.Status.Allocatable[v1alpha1.ResourceGPUMilli]
		out[n.Name] += fmt.Sprintf(" capacity=%s allocatable=%s", c.String(), a.String())
	}
	return out, ""
}

func TestAgentPublishesGPUNodePerSimulatedNode(t *testing.T) {
	ctx := testContext(t, time.Minute)
	c := crClient(t)
	model := devcluster.GPUModels[devcluster.DefaultOptions().GPUModel]
	poll(t, 30*time.Second, "every simulated node published with 8000 milli-GPUs", func() (bool, string) {
		var list v1alpha1.GPUNodeList
		if err := c.List(ctx, &list); err != nil {
			return false, err.Error()
		}
		if len(list.Items) != e2eNodes {
			return false, fmt.Sprintf("%d GPUNodes, want %d", len(list.Items), e2eNodes)
		}
		for _, gn := range list.Items {
			st := gn.Status
			if st.DeviceCount != e2eGPUsPerNode || st.HealthyDevices != e2eGPUsPerNode || st.Isolation != v1alpha1.IsolationTimeSlicing || st.Heartbeat == nil {
				return false, fmt.Sprintf("GPUNode %s: %d devices, %d healthy, mode %q, heartbeat %v", gn.Name, st.DeviceCount, st.HealthyDevices, st.Isolation, st.Heartbeat)
			}
			for _, d := range st.Devices {
				if d.Product != model.Product || d.MemoryMiB != model.MemoryMiB || d.UUID != nodeagent.SimulatedUUID(gn.Name, int(d.Index)) {
					return false, fmt.Sprintf("GPUNode %s device %d: %+v", gn.Name, d.Index, d)
				}
			}
			node, err := clientset.CoreV1().Nodes().Get(ctx, gn.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			want := resource.MustParse(fmt.Sprint(1000 * e2eGPUsPerNode))
			if q := node.Status.Capacity[v1alpha1.ResourceGPUMilli]; q.Cmp(want) != 0 {
				return false, fmt.Sprintf("node %s capacity %s = %s, want %s", node.Name, v1alpha1.ResourceGPUMilli, q.String(), want.String())
			}
			if q := node.Status.Allocatable[v1alpha1.ResourceGPUMilli]; q.Cmp(want) != 0 {
				return false, fmt.Sprintf("node %s allocatable %s = %s, want %s", node.Name, v1alpha1.ResourceGPUMilli, q.String(), want.String())
			}
			if len(gn.OwnerReferences) != 1 || gn.OwnerReferences[0].UID != node.UID {
				return false, fmt.Sprintf("GPUNode %s is not owned by its node: %+v", gn.Name, gn.OwnerReferences)
			}
		}
		return true, ""
	})

	// The agent's metrics endpoint shows per-device figures.
	m := agentMetrics(t, ctx)
	for i := range e2eNodes {
		node := devcluster.NodeName(i)
		for _, name := range []string{"partita_gpu_memory_total_bytes", "partita_gpu_memory_used_bytes", "partita_gpu_utilization_ratio", "partita_gpu_allocated_milli", "partita_gpu_healthy"} {
			key := fmt.Sprintf(`%s{device="0",node="%s"}`, name, node)
			if _, ok := m[key]; !ok {
				t.Errorf("metric %s missing", key)
			}
		}
		if got := m[fmt.Sprintf(`partita_gpu_memory_total_bytes{device="7",node="%s"}`, node)]; got != float64(model.MemoryMiB<<20) {
			t.Errorf("node %s device 7 memory total = %v, want %d", node, got, model.MemoryMiB<<20)
		}
		if got := m[fmt.Sprintf(`partita_node_gpu_milli_capacity{node="%s"}`, node)]; got != 1000*e2eGPUsPerNode {
			t.Errorf("node %s capacity metric = %v", node, got)
		}
	}
}

func TestAgentWatchdogReportsOveruse(t *testing.T) {
	ctx := testContext(t, 90*time.Second)
	c := crClient(t)
	// The pod carries the allocation annotations that only Partita's bind
	// may write, so it lives in kube-system, which Partita's admission never
	// touches: this test is about the agent, not about bind.
	ns := metav1.NamespaceSystem
	node := devcluster.NodeName(1)
	var gn v1alpha1.GPUNode
	poll(t, 30*time.Second, "GPUNode "+node, func() (bool, string) {
		err := c.Get(ctx, client.ObjectKey{Name: node}, &gn)
		return err == nil && len(gn.Status.Devices) > 0, fmt.Sprint(err)
	})
	// A pod as bind leaves it: 20Gi of device 0, whose simulated process
	// uses 30Gi.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "agent-e2e-hog-", Namespace: ns, Annotations: map[string]string{
			v1alpha1.AnnotationGPUMemory:                          "20Gi",
			v1alpha1.AnnotationNode:                               node,
			v1alpha1.AnnotationDevicesPrefix + "main":             gn.Status.Devices[0].UUID,
			nodeagent.AnnotationSimulateMemoryUsedPrefix + "main": "30Gi",
		}},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{Name: "main", Image: "busybox", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{v1alpha1.ResourceGPUMilli: resource.MustParse("252")},
				Limits:   corev1.ResourceList{v1alpha1.ResourceGPUMilli: resource.MustParse("252")},
			}}},
		},
	}
	created, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	t.Cleanup(func() {
		_ = clientset.CoreV1().Pods(ns).Delete(context.WithoutCancel(ctx), created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	start := time.Now()
	var note string
	poll(t, 45*time.Second, "a GPUOveruse event on the pod", func() (bool, string) {
		evs, err := clientset.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range evs.Items {
			seen = append(seen, e.Reason)
			if e.Reason == nodeagent.ReasonGPUOveruse && e.Regarding.UID == created.UID && e.Type == corev1.EventTypeWarning {
				note = e.Note
				return true, ""
			}
		}
		return false, fmt.Sprintf("events: %v", seen)
	})
	t.Logf("GPUOveruse reported %s after the pod was created: %s", time.Since(start).Round(time.Millisecond), note)
	if want := "container main uses 30720MiB of GPU memory on device 0, over its limit of 20480MiB"; note != want {
		t.Errorf("event note %q, want %q", note, want)
	}
	poll(t, 30*time.Second, "the slice in GPUNode status", func() (bool, string) {
		if err := c.Get(ctx, client.ObjectKey{Name: node}, &gn); err != nil {
			return false, err.Error()
		}
		for _, s := range gn.Status.Slices {
			if s.Namespace == ns && s.Pod == created.Name {
				return s.Container == "main" && s.DeviceIndex == 0 && s.MemoryLimitMiB == 20480 && s.ObservedMemoryMiB == 30720, fmt.Sprintf("%+v", s)
			}
		}
		return false, fmt.Sprintf("slices: %+v", gn.Status.Slices)
	})
	m := agentMetrics(t, ctx)
	labels := fmt.Sprintf(`{container="main",device="0",namespace="%s",node="%s",pod="%s"}`, ns, node, created.Name)
	if used, limit := m["partita_pod_gpu_memory_used_bytes"+labels], m["partita_pod_gpu_memory_limit_bytes"+labels]; used != 30720<<20 || limit != 20480<<20 {
		t.Errorf("per-pod metrics used=%v limit=%v, want 30Gi and 20Gi", used, limit)
	}
	if got := m[fmt.Sprintf(`partita_gpu_overuse_total{action="report",node="%s"}`, node)]; got < 1 {
		t.Errorf("partita_gpu_overuse_total for %s = %v, want ≥ 1", node, got)
	}
}

func TestAgentRestartChangesNothing(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	c := crClient(t)
	var before map[string]string
	poll(t, 30*time.Second, "the fleet published", func() (bool, string) {
		var msg string
		before, msg = fleetState(t, ctx, c)
		return len(before) == e2eNodes && !strings.Contains(fmt.Sprint(before), "capacity=0 "), msg
	})

	pid := agentPID(t)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the agent: %v", err)
	}
	// Gone for good, reaped too: `dev up` takes a zombie for a live agent.
	poll(t, 30*time.Second, "the agent gone", func() (bool, string) {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		return os.IsNotExist(err), "still in the process table"
	})
	if after, _ := fleetState(t, ctx, c); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("killing the agent changed what it published:\nbefore %v\nafter  %v", before, after)
	}

	start := time.Now()
	out, err := partita(ctx, "dev", "up", "--name", clusterName, "--nodes", fmt.Sprint(e2eNodes), "--gpus-per-node", fmt.Sprint(e2eGPUsPerNode))
	if err != nil {
		t.Fatalf("dev up to restart the agent: %v\n%s", err, out)
	}
	if agentPID(t) == pid {
		t.Fatal("dev up did not restart the agent")
	}
	t.Logf("agent restarted and ready in %s", time.Since(start).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // a few sync intervals of the new agent
	after, msg := fleetState(t, ctx, c)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("restarting the agent changed what it published (%s):\nbefore %v\nafter  %v", msg, before, after)
	}
	m := agentMetrics(t, ctx)
	if got := m[`partita_agent_api_writes_total{kind="capacity",result="ok"}`]; got != 0 {
		t.Errorf("restarted agent patched node capacity %v times, want 0", got)
	}
	// Only heartbeats that fell due may be written.
	if got := m[`partita_agent_api_writes_total{kind="gpunode",result="ok"}`]; got > e2eNodes {
		t.Errorf("restarted agent wrote GPUNodes %v times, want at most one heartbeat each (%d)", got, e2eNodes)
	}
}

func TestAgentServesNodesAddedLater(t *testing.T) {
	ctx := testContext(t, 90*time.Second)
	c := crClient(t)
	name := "agent-e2e-late"
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		v1alpha1.LabelGPUNode:          "true",
		v1alpha1.LabelNVIDIAGPUCount:   "2",
		v1alpha1.LabelNVIDIAGPUProduct: "NVIDIA-L4",
		v1alpha1.LabelNVIDIAGPUMemory:  "23034",
	}}}
	created, err := clientset.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() {
		_ = clientset.CoreV1().Nodes().Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{})
	})
	start := time.Now()
	capacity := func() string {
		n, err := clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err.Error()
		}
		q := n.Status.Capacity[v1alpha1.ResourceGPUMilli]
		return q.String()
	}
	poll(t, 15*time.Second, "the new node published", func() (bool, string) { got := capacity(); return got == "2k", got })
	t.Logf("node added later published in %s", time.Since(start).Round(time.Millisecond))

	// A device goes bad: it leaves the capacity and the GPUNode says why.
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"1"}}}`, nodeagent.AnnotationSimulateUnhealthy)
	if _, err := clientset.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, 15*time.Second, "the bad device out of the capacity", func() (bool, string) { got := capacity(); return got == "1k", got })
	var gn v1alpha1.GPUNode
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &gn); err != nil {
		t.Fatal(err)
	}
	if d := gn.Status.Devices[1]; d.Health != v1alpha1.DeviceUnhealthy || d.HealthReason == "" || gn.Status.HealthyDevices != 1 {
		t.Errorf("device 1 is %s (%q) with %d healthy devices; want Unhealthy with a reason", d.Health, d.HealthReason, gn.Status.HealthyDevices)
	}

	// The node goes: so does its GPUNode.
	if err := clientset.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &created.UID}}); err != nil {
		t.Fatal(err)
	}
	poll(t, 30*time.Second, "the GPUNode deleted", func() (bool, string) {
		err := c.Get(ctx, client.ObjectKey{Name: name}, &v1alpha1.GPUNode{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}
