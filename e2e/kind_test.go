package e2e

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// The TestKind* tests run against a cluster where the chart is installed
// for real (e2e/kind/run.sh: release partita in partita-system, the agent's
// simulated backend, GPU nodes labelled partita.dev/gpu-node=true). There
// the containers run, so they check what the dev cluster cannot: the
// webhook behind its Service with its rotated certificate, the second
// kube-scheduler calling the extender over TLS.

func kindOnly(t *testing.T) client.Client {
	t.Helper()
	if externalKubeconfig == "" {
		t.Skip("runs against a cluster with the chart installed: e2e/kind/run.sh")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", externalKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestKindGPUNodesPublished(t *testing.T) {
	c := kindOnly(t)
	ctx := testContext(t, 3*time.Minute)
	nodes, err := clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
	if err != nil || len(nodes.Items) == 0 {
		t.Fatalf("no node labelled %s=true (%v): run e2e/kind/run.sh", v1alpha1.LabelGPUNode, err)
	}
	for _, n := range nodes.Items {
		poll(t, 2*time.Minute, "GPUNode "+n.Name, func() (bool, string) {
			var gn v1alpha1.GPUNode
			if err := c.Get(ctx, client.ObjectKey{Name: n.Name}, &gn); err != nil {
				return false, err.Error()
			}
			return gn.Status.HealthyDevices == 8, fmt.Sprintf("%d healthy devices", gn.Status.HealthyDevices)
		})
	}
}

// TestKindFractionalPodRuns: half a GPU goes through the webhook (Service,
// rotated certificate), Partita's kube-scheduler and the extender's bind,
// and the container starts with its device.
func TestKindFractionalPodRuns(t *testing.T) {
	kindOnly(t)
	ctx := testContext(t, 4*time.Minute)
	ns := createNamespace(ctx, t, clientset)
	waitServiceAccount(ctx, t, clientset, ns)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "half", Namespace: ns, Annotations: map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{v1alpha1.LabelGPUNode: "true"},
			Containers:   []corev1.Container{{Name: "main", Image: "busybox:1.36", Command: []string{"sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES; sleep 3600"}}},
		},
	}
	if _, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	var got *corev1.Pod
	poll(t, 3*time.Minute, "the half-GPU pod Running", func() (bool, string) {
		var err error
		if got, err = clientset.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == corev1.PodRunning, fmt.Sprintf("phase %s on %q, conditions %+v", got.Status.Phase, got.Spec.NodeName, got.Status.Conditions)
	})
	if got.Spec.SchedulerName != "partita" {
		t.Errorf("schedulerName %q, want partita (the webhook's --scheduler-name)", got.Spec.SchedulerName)
	}
	if got.Annotations[v1alpha1.AnnotationDevicesPrefix+"main"] == "" || got.Annotations[v1alpha1.AnnotationNode] != got.Spec.NodeName {
		t.Errorf("pod bound without its devices: %v", got.Annotations)
	}
}

// TestKindSpoofRefused: the chart trusts the extender's ServiceAccount
// alone, so even the cluster's admin cannot choose a device.
func TestKindSpoofRefused(t *testing.T) {
	kindOnly(t)
	ctx := testContext(t, time.Minute)
	ns := createNamespace(ctx, t, clientset)
	waitServiceAccount(ctx, t, clientset, ns)
	pod := gpuPod(ns, "spoof", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5",
		v1alpha1.AnnotationDevicesPrefix + "main": "GPU-00000000-0000-0000-0000-000000000000"}, nil)
	_, err := clientset.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil {
		t.Fatal("a pod naming its own device was admitted")
	}
	t.Logf("refused as it should: %v", err)
}
