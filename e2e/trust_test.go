package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/webhook"
)

// Tests that play the tenant (issue "trust boundaries", items 5 and 6 and
// the failure radius of the webhook): an ordinary user of a namespace tries
// each door to a GPU that does not go through Partita, and the cluster must
// refuse it with a message that names the field and store nothing.

// grantExtras gives webhookUser, in ns, what some platforms hand tenants
// beyond the edit role: pod status, ephemeral containers and bindings.
func grantExtras(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-user-extras", Namespace: ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods/status", "pods/ephemeralcontainers"}, Verbs: []string{"update", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
		},
	}
	if _, err := clientset.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := clientset.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-user-extras"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: webhookUser}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// refusedAndNotStored creates pod as the user, through client-go and
// kubectl apply, and checks both refuse it with want and store nothing.
func (f *webhookFixture) refusedAndNotStored(ctx context.Context, t *testing.T, pod *corev1.Pod, want string) {
	t.Helper()
	_, err := f.create(ctx, pod.DeepCopy(), false)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("create = %v, want a refusal containing %q", err, want)
	}
	p := pod.DeepCopy()
	p.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
	manifest, err := yaml.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	out, err := kubectlIn(ctx, manifest, "apply", "--as", webhookUser, "--as-group", "system:authenticated", "-f", "-")
	switch {
	case os.IsNotExist(err):
		t.Log("kubectl not built; checked through client-go only")
	case err == nil:
		t.Errorf("kubectl apply succeeded:\n%s", out)
	case !strings.Contains(out, want):
		t.Errorf("kubectl apply output lacks %q:\n%s", want, out)
	}
	if _, err := clientset.CoreV1().Pods(f.ns).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused pod %s was stored (get: %v)", pod.Name, err)
	}
}

// assertNothingCharged: no pod of the namespace holds or waits for a GPU
// but the allowed ones, and the ledger invariants hold.
func assertNothingCharged(ctx context.Context, t *testing.T, ns string, allowed ...string) {
	t.Helper()
	pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if !slices.Contains(allowed, p.Name) {
			t.Errorf("pod %s is in the namespace (node %q, devices %v)", p.Name, p.Spec.NodeName, devicesOf(&p))
		}
	}
	checkClusterLedger(ctx, t)
}

// TestTenantCannotReachGPUsAroundPartita: privileged GPU containers,
// hostPaths into the devices or the MPS directory (any name, any
// spelling), mounts of the MPS volume, CDI requests and device-list mounts
// are refused; device annotations cannot be written through pods/status or
// a binding; a debug container gets no GPU.
func TestTenantCannotReachGPUsAroundPartita(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	f := newWebhookFixture(ctx, t)
	grantExtras(ctx, t, f.ns)
	q := f.queue
	gpu := func(name string) *partitatest.PodWrapper {
		return partitatest.MakePod(name, f.ns).Container("main").GPUFraction("0.5").Queue(q).NodeSelector("e2e.partita.dev/nowhere", "true")
	}
	plain := func(name string) *partitatest.PodWrapper {
		return partitatest.MakePod(name, f.ns).Container("main").NodeSelector("e2e.partita.dev/nowhere", "true")
	}
	const mps = `reaches the MPS daemons' pipes of every GPU on the node (/run/partita/mps)`
	cases := map[string]struct {
		pod  *corev1.Pod
		want string
	}{
		"a privileged GPU container": {pod: gpu("priv").Privileged("main").Obj(),
			want: "spec.containers[0].securityContext.privileged: Forbidden: a privileged container sees every device of the node"},
		"a privileged sidecar beside a GPU container": {pod: gpu("privside").Container("sidecar").Privileged("sidecar").Obj(),
			want: "spec.containers[1].securityContext.privileged: Forbidden"},
		"the MPS directory under another name": {pod: gpu("mpsdir").HostPath("cache", "/run/partita/mps").Obj(),
			want: `spec.volumes[0].hostPath.path: Forbidden: "/run/partita/mps" ` + mps},
		"another device's pipe": {pod: gpu("pipe").HostPath("p", "/run/partita/mps/GPU-00000000-0000-0000-0000-000000000001/pipe").Obj(), want: mps},
		"the MPS directory spelled oddly": {pod: plain("odd").HostPath("x", "//run/./partita//mps/").Obj(),
			want: `"//run/./partita//mps/" ` + mps},
		"the MPS directory through /var/run":  {pod: plain("varrun").HostPath("x", "/var/run/partita/mps").Obj(), want: mps},
		"/run, which holds the MPS directory": {pod: plain("run").HostPath("x", "/run").Obj(), want: `"/run" ` + mps},
		"/dev/nvidia0": {pod: plain("dev0").HostPath("gpu", "/dev/nvidia0").Obj(),
			want: `spec.volumes[0].hostPath.path: Forbidden: "/dev/nvidia0" reaches the node's GPU devices (/dev/nvidia*)`},
		"/dev as a directory": {pod: plain("dev").Volume(corev1.Volume{Name: "dev", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: "/dev", Type: ptr.To(corev1.HostPathDirectory)}}}).Obj(),
			want: `"/dev" reaches the node's GPU devices`},
		"the node's root": {pod: plain("root").HostPath("root", "/").Obj(), want: `"/" reaches the node's GPU devices`},
		"Partita's MPS volume mounted whole": {pod: gpu("whole").Volume(corev1.Volume{Name: webhook.MPSVolume, VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: webhook.DefaultMPSDir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}).
			Mount("main", corev1.VolumeMount{Name: webhook.MPSVolume, MountPath: "/mps"}).Obj(),
			want: "spec.containers[0].volumeMounts[0]: Forbidden: the volume partita-mps is mounted by Partita only"},
		"a CDI device request": {pod: plain("cdi").Annotation("cdi.k8s.io/gpu", "nvidia.com/gpu=all").Obj(),
			want: "metadata.annotations[cdi.k8s.io/gpu]: Forbidden: asks the container runtime for devices directly (CDI)"},
		"a device-list mount for the NVIDIA runtime": {pod: plain("devlist").EmptyDir("x").
			Mount("main", corev1.VolumeMount{Name: "x", MountPath: "/var/run/nvidia-container-devices/all"}).Obj(),
			want: `spec.containers[0].volumeMounts[0].mountPath: Forbidden: "/var/run/nvidia-container-devices/all" is where the NVIDIA container runtime reads device requests`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) { f.refusedAndNotStored(ctx, t, tc.pod, tc.want) })
	}

	// An honest GPU pod, then what its tenant tries on it. It is half of
	// a gang of two, so it stays gated and unbound whatever the loop does.
	honest, err := f.create(ctx, gpu("honest").PodGroup("pair").Annotation(v1alpha1.AnnotationMinMember, "2").Obj(), false)
	if err != nil {
		t.Fatalf("create an honest GPU pod: %v", err)
	}
	fresh := func() *corev1.Pod {
		t.Helper()
		p, err := clientset.CoreV1().Pods(f.ns).Get(ctx, honest.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	spoof := fmt.Sprintf(`{"metadata":{"annotations":{%q:"GPU-00000000-0000-0000-0000-000000000000"}}}`, v1alpha1.AnnotationDevicesPrefix+"main")
	updates := map[string]struct {
		do   func() error
		want string
	}{
		"a device annotation through pods/status": {
			do: func() error {
				_, err := f.user.CoreV1().Pods(f.ns).Patch(ctx, honest.Name, types.MergePatchType, []byte(spoof), metav1.PatchOptions{}, "status")
				return err
			},
			want: "metadata.annotations[partita.dev/devices.main]: Forbidden: is written only by Partita: no one else may add, change or remove it",
		},
		"a binding that names a device": {
			do: func() error {
				return f.user.CoreV1().Pods(f.ns).Bind(ctx, &corev1.Binding{
					ObjectMeta: metav1.ObjectMeta{Name: honest.Name, Annotations: map[string]string{v1alpha1.AnnotationDevicesPrefix + "main": "GPU-00000000-0000-0000-0000-000000000000"}},
					Target:     corev1.ObjectReference{Kind: "Node", Name: "gpu-node-0"},
				}, metav1.CreateOptions{})
			},
			want: "only Partita's extender may bind a pod with device annotations",
		},
		"a privileged debug container": {
			do: func() error {
				p := fresh()
				p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
					Name: "debug", Image: "busybox", SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)}}})
				_, err := f.user.CoreV1().Pods(f.ns).UpdateEphemeralContainers(ctx, honest.Name, p, metav1.UpdateOptions{})
				return err
			},
			want: "spec.ephemeralContainers[0].securityContext.privileged: Forbidden",
		},
		"the admission gate removed": {
			do: func() error {
				p := fresh()
				p.Spec.SchedulingGates = nil
				_, err := f.user.CoreV1().Pods(f.ns).Update(ctx, p, metav1.UpdateOptions{})
				return err
			},
			want: "spec.schedulingGates: Forbidden: the scheduling gate partita.dev/admission is removed only by Partita's admission loop",
		},
	}
	for name, tc := range updates {
		t.Run(name, func(t *testing.T) {
			if err := tc.do(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("= %v, want a refusal containing %q", err, tc.want)
			}
			after := fresh()
			if _, ok := after.Annotations[v1alpha1.AnnotationDevicesPrefix+"main"]; ok || after.Spec.NodeName != "" ||
				len(after.Spec.EphemeralContainers) > 0 || !slices.ContainsFunc(after.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
				return g.Name == v1alpha1.SchedulingGateAdmission
			}) {
				t.Errorf("the pod changed: annotations %v, node %q, ephemeral containers %d, gates %v",
					after.Annotations, after.Spec.NodeName, len(after.Spec.EphemeralContainers), after.Spec.SchedulingGates)
			}
		})
	}
	// A debug container is allowed, and sees no GPU.
	p := fresh()
	p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "look", Image: "busybox"}})
	got, err := f.user.CoreV1().Pods(f.ns).UpdateEphemeralContainers(ctx, honest.Name, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("add a debug container: %v", err)
	}
	if env := got.Spec.EphemeralContainers[0].Env; len(env) != 1 || env[0].Name != webhook.EnvVisibleDevices || env[0].Value != webhook.VisibleDevicesVoid {
		t.Errorf("debug container env %v, want %s=void", env, webhook.EnvVisibleDevices)
	}
	assertNothingCharged(ctx, t, f.ns, honest.Name)
}

// webhookPID reads the dev cluster webhook's pid file.
func webhookPID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cluster.Dir(), "partita", "webhook.pid"))
	if err != nil {
		t.Fatalf("read the webhook's pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("webhook pid file: %v", err)
	}
	return pid
}

// restartHostProcesses runs `dev up`, which starts what is not running.
func restartHostProcesses(ctx context.Context, t *testing.T) {
	t.Helper()
	if out, err := partita(ctx, "dev", "up", "--name", clusterName, "--nodes", fmt.Sprint(e2eNodes), "--gpus-per-node", fmt.Sprint(e2eGPUsPerNode)); err != nil {
		t.Fatalf("dev up to restart the webhook: %v\n%s", err, out)
	}
}

// TestWebhookOutage: with Partita's webhook stopped, a pod that asks for no
// GPU is still created and gets NVIDIA_VISIBLE_DEVICES=void, a GPU pod is
// refused with a message that says the webhook is unavailable, and a
// spoofed device annotation is still refused (the admission policies run
// in the API server). Once the webhook is back, GPU pods are admitted
// again.
func TestWebhookOutage(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	f := newWebhookFixture(ctx, t)
	pid := webhookPID(t)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("stop the webhook (pid %d): %v", pid, err)
	}
	poll(t, 30*time.Second, "the webhook gone", func() (bool, string) {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		return os.IsNotExist(err), "still in the process table"
	})
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			restartHostProcesses(context.WithoutCancel(ctx), t)
		}
	})

	plain := partitatest.MakePod("plain", f.ns).Container("main").Container("sidecar").NodeSelector("e2e.partita.dev/nowhere", "true").Obj()
	start := time.Now()
	got, err := f.create(ctx, plain, false)
	if err != nil {
		t.Fatalf("a pod without a GPU was refused with the webhook down: %v", err)
	}
	t.Logf("a pod without a GPU was admitted in %s with the webhook down", time.Since(start).Round(time.Millisecond))
	for _, c := range got.Spec.Containers {
		if len(c.Env) != 1 || c.Env[0].Name != webhook.EnvVisibleDevices || c.Env[0].Value != webhook.VisibleDevicesVoid {
			t.Errorf("container %s env %v, want %s=void", c.Name, c.Env, webhook.EnvVisibleDevices)
		}
	}

	gpuPod := partitatest.MakePod("gpu", f.ns).Container("main").GPUFraction("0.5").Queue(f.queue).NodeSelector("e2e.partita.dev/nowhere", "true").Obj()
	start = time.Now()
	f.refusedAndNotStored(ctx, t, gpuPod, "Partita's admission webhook is unavailable")
	t.Logf("a GPU pod was refused in %s with the webhook down", time.Since(start).Round(time.Millisecond))
	spoofed := partitatest.MakePod("spoofed", f.ns).Container("main").NodeSelector("e2e.partita.dev/nowhere", "true").
		Annotation(v1alpha1.AnnotationDevicesPrefix+"main", "GPU-00000000-0000-0000-0000-000000000000").Obj()
	f.refusedAndNotStored(ctx, t, spoofed, "metadata.annotations[partita.dev/devices.main]: Forbidden: is written only by Partita when it binds the pod")
	spoofedGPU := gpuPod.DeepCopy()
	spoofedGPU.Name = "spoofed-gpu"
	spoofedGPU.Annotations[v1alpha1.AnnotationDevicesPrefix+"main"] = "GPU-00000000-0000-0000-0000-000000000000"
	f.refusedAndNotStored(ctx, t, spoofedGPU, "metadata.annotations[partita.dev/devices.main]: Forbidden: is written only by Partita")
	all := partitatest.MakePod("all", f.ns).Container("main").Env("main", webhook.EnvVisibleDevices, "all").NodeSelector("e2e.partita.dev/nowhere", "true").Obj()
	f.refusedAndNotStored(ctx, t, all, `NVIDIA_VISIBLE_DEVICES="all" is set by Partita: a container without a GPU request gets "void"`)

	restarted = true
	restartHostProcesses(ctx, t)
	if webhookPID(t) == pid {
		t.Fatal("dev up did not restart the webhook")
	}
	created, err := f.create(ctx, gpuPod, false)
	if err != nil {
		t.Fatalf("with the webhook back, a GPU pod: %v", err)
	}
	if _, ok := created.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPUMilli]; !ok || !slices.ContainsFunc(created.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool {
		return g.Name == v1alpha1.SchedulingGateAdmission
	}) {
		t.Errorf("with the webhook back, the GPU pod is not canonical: limits %v, gates %v", created.Spec.Containers[0].Resources.Limits, created.Spec.SchedulingGates)
	}
	assertNothingCharged(ctx, t, f.ns, plain.Name, gpuPod.Name)
}
