package realnode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// TestRealNodeDRAClaimGetsItsDeviceFromCDI (PARTITA_E2E_GPU_BACKEND=dra):
// on the real kubelet, the chart's agent is the DRA kubelet plugin of the
// node. A 0.25 slice's claim is allocated by the chart's kube-scheduler,
// prepared by the plugin, and its container shows in its own environment
// the device the CDI spec gave it; in mps mode also the memory limit and
// the pipe of its own device, mounted. A pod that sets
// NVIDIA_VISIBLE_DEVICES itself is refused, and one outside Partita's
// admission (its own namespace) that sets it and holds a Partita claim
// still gets the CDI spec's value: the runtime applies the spec over the
// pod's env.
func TestRealNodeDRAClaimGetsItsDeviceFromCDI(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 6*time.Minute)
	poll(t, 2*time.Minute, "the kubelet plugin's ResourceSlice of "+realnode.NodeName, func() (bool, string) {
		sl, err := clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, dra.DriverName),
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, realnode.NodeName)).String()})
		if err != nil {
			return false, err.Error()
		}
		return len(sl.Items) == 1 && len(sl.Items[0].Spec.Devices) == gpusPerNode, fmt.Sprintf("%d slices", len(sl.Items))
	})

	t.Run("time-slicing", func(t *testing.T) {
		pod, uuid := runQuarter(ctx, t, "default", nil)
		logs := waitLogLine(ctx, t, pod, "NVIDIA_VISIBLE_DEVICES=")
		if got := envFromLog(logs, "NVIDIA_VISIBLE_DEVICES"); got != uuid {
			t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q, the device its claim holds; log:\n%s", got, uuid, logs)
		}
		if strings.Contains(logs, "CUDA_MPS_") {
			t.Errorf("a time-slicing slice got MPS env:\n%s", logs)
		}
	})

	t.Run("the pod's own NVIDIA_VISIBLE_DEVICES", func(t *testing.T) {
		own := func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "all"}}
		}
		p := samplePod("own-env", map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"})
		own(p)
		// Refused by the webhook, or (seen in mode chart) by the admission
		// policy that finds the pod not in Partita's form; either way not
		// stored.
		if _, err := clientset.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err == nil || !apierrors.IsForbidden(err) {
			t.Fatalf("a pod that sets NVIDIA_VISIBLE_DEVICES=all: err %v, want it refused", err)
		} else {
			t.Logf("refused: %v", err)
		}
		// Outside the namespaces Partita admits (its own is one), nothing
		// refuses the env: a pod there that sets it and holds a claim from
		// Partita's template still sees the device of its CDI spec.
		mem := devcluster.GPUModels[devcluster.DefaultOptions().GPUModel].MemoryMiB
		tmpl, err := dra.Template(ns, gpu.ContainerRequest{Count: 1, Milli: 250}, []int64{mem})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := clientset.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		pod, uuid := runQuarter(ctx, t, ns, func(p *corev1.Pod) {
			own(p)
			p.Annotations = nil
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: dra.PodClaimName(0), ResourceClaimTemplateName: &tmpl.Name}}
			p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: dra.PodClaimName(0)}}
		})
		logs := waitLogLine(ctx, t, pod, "NVIDIA_VISIBLE_DEVICES=")
		if got := envFromLog(logs, "NVIDIA_VISIBLE_DEVICES"); got != uuid {
			t.Errorf("the container that set NVIDIA_VISIBLE_DEVICES=all sees %q, want the CDI spec's %q; log:\n%s", got, uuid, logs)
		}
	})

	t.Run("mps", func(t *testing.T) {
		setIsolation(ctx, t, v1alpha1.IsolationMPS)
		t.Cleanup(func() { setIsolation(context.WithoutCancel(ctx), t, "") })
		pod, uuid := runQuarter(ctx, t, "default", func(p *corev1.Pod) {
			p.Spec.Containers[0].Args = []string{"--print-file", "/proc/self/mountinfo"}
		})
		logs := waitLogLine(ctx, t, pod, "end of file /proc/self/mountinfo")
		memMiB := devcluster.GPUModels[devcluster.DefaultOptions().GPUModel].MemoryMiB * 250 / 1000
		for k, want := range map[string]string{
			"NVIDIA_VISIBLE_DEVICES":           uuid,
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": fmt.Sprintf("%dM", memMiB),
			"CUDA_MPS_PIPE_DIRECTORY":          dra.MPSPipeMountPath,
		} {
			if got := envFromLog(logs, k); got != want {
				t.Errorf("%s=%q, want %q; log:\n%s", k, got, want, logs)
			}
		}
		var pipes []string
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, " "+dra.MPSPipeMountPath+" ") {
				pipes = append(pipes, l)
			}
		}
		if len(pipes) != 1 || !strings.Contains(pipes[0], "/"+uuid+"/pipe") {
			t.Errorf("mounts at %s: %q, want one, of %s's pipe", dra.MPSPipeMountPath, pipes, uuid)
		}
	})
}

// runQuarter creates a 0.25 slice on the real node through cs, waits until
// it runs, and returns it with the UUID of the device its claim holds.
func runQuarter(ctx context.Context, t *testing.T, namespace string, mutate func(*corev1.Pod)) (*corev1.Pod, string) {
	t.Helper()
	p := samplePod("quarter", map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"})
	if mutate != nil {
		mutate(p)
	}
	got, err := clientset.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	t.Cleanup(func() {
		_ = clientset.CoreV1().Pods(namespace).Delete(context.WithoutCancel(ctx), got.Name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)})
	})
	if len(got.Spec.ResourceClaims) != 1 {
		t.Fatalf("the webhook gave the pod no claim: %+v", got.Spec)
	}
	pod := waitRunning(ctx, t, got)
	names, _ := dra.PodClaimNames(pod)
	if len(names) != 1 {
		t.Fatalf("claims of the running pod: %v", names)
	}
	claim, err := clientset.ResourceV1().ResourceClaims(namespace).Get(ctx, names[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shares := dra.ClaimShares(claim, dra.GPUDrivers{dra.DriverName}, nil)
	if len(shares) != 1 || shares[0].Pool != realnode.NodeName || shares[0].Milli != 250 {
		t.Fatalf("the claim holds %+v, want 250 milli of one device of %s", shares, realnode.NodeName)
	}
	gn := &v1alpha1.GPUNode{}
	if err := getJSON(ctx, "/apis/partita.dev/v1alpha1/gpunodes/"+realnode.NodeName, gn); err != nil {
		t.Fatal(err)
	}
	for _, d := range gn.Status.Devices {
		if dra.DeviceName(d.Index) == shares[0].Device {
			return pod, d.UUID
		}
	}
	t.Fatalf("GPUNode %s has no device %s", realnode.NodeName, shares[0].Device)
	return nil, ""
}

// setIsolation sets the real node's isolation mode and waits until its
// slice says so (the plugin then prepares claims for it).
func setIsolation(ctx context.Context, t *testing.T, mode v1alpha1.IsolationMode) {
	t.Helper()
	patch := fmt.Sprintf(`{"spec":{"isolation":%q}}`, mode)
	if mode == "" {
		patch = `{"spec":{"isolation":null}}`
	}
	if err := clientset.Discovery().RESTClient().Patch(types.MergePatchType).AbsPath("/apis/partita.dev/v1alpha1/gpunodes", realnode.NodeName).
		Body([]byte(patch)).Do(ctx).Error(); err != nil {
		t.Fatalf("set isolation %q: %v", mode, err)
	}
	want := string(mode)
	if want == "" {
		want = string(v1alpha1.IsolationTimeSlicing)
	}
	poll(t, time.Minute, "the slice of "+realnode.NodeName+" in "+want, func() (bool, string) {
		sl, err := clientset.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, realnode.NodeName).String()})
		if err != nil || len(sl.Items) == 0 || len(sl.Items[0].Spec.Devices) == 0 {
			return false, fmt.Sprint(err)
		}
		got := sl.Items[0].Spec.Devices[0].Attributes[dra.AttributeIsolation].StringValue
		return got != nil && *got == want, fmt.Sprintf("isolation %v", got)
	})
}
