package e2e

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/webhook"
)

// realNodeImageEnv names an image with a shell (sh, cat) that the real
// node already has: the host has no registry.
const realNodeImageEnv = "PARTITA_E2E_REAL_NODE_IMAGE"

// realGPUNode is a Ready Partita GPU node run by a real kubelet (no kwok
// annotation), or "" when the dev cluster has none.
func realGPUNode(t *testing.T) string {
	t.Helper()
	nodes, err := clientset.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if _, fake := n.Annotations["kwok.x-k8s.io/node"]; fake {
			continue
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return n.Name
			}
		}
	}
	return ""
}

// TestRealNodeMPSClientSeesOnlyItsPipe: on a real kubelet, an MPS client
// container sees its own device's pipe directory at
// webhook.MPSPipeMountPath and nothing else of the MPS directory: the
// kubelet resolves the mount's subPathExpr from the allocation annotation
// written at bind. It reads its own /proc/self/mountinfo. It skips unless
// the dev cluster has a real GPU node (the realnode setup) and
// PARTITA_E2E_REAL_NODE_IMAGE names an image with a shell on it.
func TestRealNodeMPSClientSeesOnlyItsPipe(t *testing.T) {
	if externalKubeconfig != "" {
		t.Skip("dev cluster only")
	}
	node := realGPUNode(t)
	if node == "" {
		t.Skip("no real GPU node in this dev cluster (kwok nodes only)")
	}
	image := os.Getenv(realNodeImageEnv)
	if image == "" {
		t.Skipf("set %s to an image with sh and cat that node %s has", realNodeImageEnv, node)
	}
	ctx := testContext(t, 4*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })

	// The webhook wires MPS clients while some GPUNode runs mps.
	c := crClient(t)
	var gn v1alpha1.GPUNode
	if err := c.Get(ctx, client.ObjectKey{Name: node}, &gn); err != nil {
		t.Fatalf("GPUNode of %s: %v", node, err)
	}
	was := gn.Spec.Isolation
	gn.Spec.Isolation = v1alpha1.IsolationMPS
	if err := c.Update(ctx, &gn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		var cur v1alpha1.GPUNode
		if err := c.Get(ctx, client.ObjectKey{Name: node}, &cur); err == nil {
			cur.Spec.Isolation = was
			_ = c.Update(ctx, &cur)
		}
	})
	pod := extGPUPod(ns, "mps-client", 500, 1, map[string]string{corev1.LabelHostname: node})
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.Containers[0].Image = image
	pod.Spec.Containers[0].Command = []string{"sh", "-c", "cat /proc/self/mountinfo"}
	poll(t, 60*time.Second, "the webhook to wire MPS clients", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		for _, m := range p.Spec.Containers[0].VolumeMounts {
			if m.Name == webhook.MPSVolume {
				return true, ""
			}
		}
		return false, fmt.Sprintf("mounts %v", p.Spec.Containers[0].VolumeMounts)
	})
	createPods(ctx, t, clientset, []*corev1.Pod{pod}, 1)
	var done *corev1.Pod
	poll(t, 3*time.Minute, "the MPS client to run to completion", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		done = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
			fmt.Sprintf("phase %s, node %q, devices %v, conditions %+v, statuses %+v", p.Status.Phase, p.Spec.NodeName, devicesOf(p), p.Status.Conditions, p.Status.ContainerStatuses)
	})
	devices := devicesOf(done)
	if done.Status.Phase != corev1.PodSucceeded || len(devices) != 1 {
		t.Fatalf("the MPS client ended %s with devices %v: %+v", done.Status.Phase, devices, done.Status.ContainerStatuses)
	}
	logs, err := clientset.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs: %v", err)
	}
	// mountinfo: ID parent major:minor root mount-point options ...; a
	// bind mount's root is the path inside the source filesystem.
	var mps []string
	sc := bufio.NewScanner(strings.NewReader(string(logs)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		root, point := f[3], f[4]
		if point == webhook.MPSPipeMountPath || strings.Contains(root, "/partita/mps") {
			mps = append(mps, root+" at "+point)
		}
	}
	want := "/" + devices[0] + "/pipe at " + webhook.MPSPipeMountPath
	if len(mps) != 1 || !strings.HasSuffix(mps[0], want) {
		t.Errorf("MPS mounts in the container: %v, want exactly one, its own device's pipe (…%s)\nmountinfo:\n%s", mps, want, logs)
	}
}
