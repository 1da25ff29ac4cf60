package e2e

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
)

// TestMPSDeviceServesOneNamespace: every client of an MPS daemon can command
// it (quit, set its limits), so on an mps node a GPU's slices belong to one
// namespace. The first namespace shares its GPU; a second namespace's slice
// waits, saying why, and binds once the GPU is free of the first.
func TestMPSDeviceServesOneNamespace(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	teamA := extNamespace(ctx, t, clientset)
	teamB := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, teamA); deletePods(ctx, t, teamB) })
	sel := map[string]string{"e2e.partita.dev/mps": teamA}
	name := teamA + "-mps"
	addMPSNode(ctx, t, name, sel)
	poll(t, 60*time.Second, "the GPUNode to report mps", func() (bool, string) {
		var gn v1alpha1.GPUNode
		if err := crClient(t).Get(ctx, client.ObjectKey{Name: name}, &gn); err != nil {
			return false, err.Error()
		}
		return gn.Status.Isolation == v1alpha1.IsolationMPS, fmt.Sprintf("status.isolation %q", gn.Status.Isolation)
	})
	bound := func(ns, pod string) {
		t.Helper()
		poll(t, 60*time.Second, ns+"/"+pod+" bound with its device", func() (bool, string) {
			p, err := clientset.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if p.Spec.NodeName == name && len(devicesOf(p)) == 1 {
				return true, ""
			}
			var msgs []string
			for _, e := range devcluster.PodEvents(ctx, clientset, p, 5) {
				msgs = append(msgs, e.Reason+": "+e.Message)
			}
			return false, fmt.Sprintf("node %q, devices %v, events %q", p.Spec.NodeName, devicesOf(p), msgs)
		})
	}
	// Team A shares its own GPU.
	createPods(ctx, t, clientset, []*corev1.Pod{extGPUPod(teamA, "a-half", 500, 1, sel), extGPUPod(teamA, "a-quarter", 250, 1, sel)}, 1)
	bound(teamA, "a-half")
	bound(teamA, "a-quarter")
	checkClusterLedger(ctx, t)

	bQuarter := extGPUPod(teamB, "b-quarter", 250, 1, sel)
	createPods(ctx, t, clientset, []*corev1.Pod{bQuarter}, 1)
	waitWaitingEvent(ctx, t, bQuarter, 60*time.Second, "serves MPS clients of another namespace")
	p, err := clientset.CoreV1().Pods(teamB).Get(ctx, "b-quarter", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Fatalf("team B's slice bound to %s beside team A's on an mps GPU (devices %v)", p.Spec.NodeName, devicesOf(p))
	}

	deletePods(ctx, t, teamA)
	bound(teamB, "b-quarter")
	checkClusterLedger(ctx, t)
}
