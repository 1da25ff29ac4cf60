package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/internal/envtestutil"
	"github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/policy"
	"github.com/partita-dev/partita/webhook"
)

// webhookUser is who the webhook tests act as: an ordinary user with the
// edit role in the test namespace, as users of a real cluster are. (The dev
// cluster's webhook trusts only the extender's ServiceAccount, so the
// admin could not spoof either.)
const webhookUser = "e2e-user"

// partitaNamespace is where the dev cluster's webhook reads policy
// ConfigMaps.
const partitaNamespace = "partita-system"

// webhookFixture is a namespace with a leaf queue that admits it, and
// clients acting as webhookUser.
type webhookFixture struct {
	ns    string
	queue string
	user  kubernetes.Interface
	crs   client.Client
}

func newWebhookFixture(ctx context.Context, t *testing.T) *webhookFixture {
	t.Helper()
	ns := createNamespace(ctx, t, clientset)
	_, err := clientset.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-user-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: webhookUser}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("bind edit role: %v", err)
	}
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	crs, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	q := partitatest.MakeQueue(ns).Namespaces(ns).GPU("2", "4", 1).Obj()
	if err := crs.Create(ctx, q); err != nil {
		t.Fatalf("create queue: %v", err)
	}
	t.Cleanup(func() { _ = crs.Delete(context.WithoutCancel(ctx), q) })
	userCfg := *cfg
	userCfg.Impersonate.UserName = webhookUser
	userCfg.Impersonate.Groups = []string{"system:authenticated"}
	user, err := kubernetes.NewForConfig(&userCfg)
	if err != nil {
		t.Fatal(err)
	}
	f := &webhookFixture{ns: ns, queue: ns, user: user, crs: crs}
	// The webhook sees the queue once its state batch is written.
	eventually(ctx, t, 10*time.Second, func() error {
		_, err := f.create(ctx, gpuPod(ns, "probe", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}, map[string]string{v1alpha1.LabelQueue: ns}), true)
		return err
	})
	return f
}

// create creates pod as webhookUser, or only tries it with dryRun.
func (f *webhookFixture) create(ctx context.Context, pod *corev1.Pod, dryRun bool) (*corev1.Pod, error) {
	opts := metav1.CreateOptions{}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	return f.user.CoreV1().Pods(f.ns).Create(ctx, pod, opts)
}

func gpuPod(ns, name string, annotations, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: maps.Clone(annotations), Labels: maps.Clone(labels)},
		Spec: corev1.PodSpec{
			// Nowhere to run: these tests look at admission only.
			NodeSelector: map[string]string{"e2e.partita.dev/nowhere": "true"},
			Containers:   []corev1.Container{{Name: "main", Image: "nvcr.io/nvidia/pytorch:24.05-py3"}},
		},
	}
}

func eventually(ctx context.Context, t *testing.T, d time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("not within %s: %v", d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWebhookCanonicalisesEachDialect: a pod in each dialect comes back
// from the API server in canonical form.
func TestWebhookCanonicalisesEachDialect(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	f := newWebhookFixture(ctx, t)
	devicesRef := "metadata.annotations['" + v1alpha1.AnnotationDevicesPrefix + "main']"
	withLimits := func(p *corev1.Pod, limits corev1.ResourceList) *corev1.Pod {
		p.Spec.Containers[0].Resources.Limits = limits
		return p
	}
	cases := map[string]struct {
		pod             *corev1.Pod
		wantAnnotations map[string]string
		wantMilli       string
	}{
		"partita fraction": {
			pod:             gpuPod(f.ns, "partita", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}, map[string]string{v1alpha1.LabelQueue: f.queue}),
			wantAnnotations: map[string]string{v1alpha1.AnnotationGPUFraction: "0.5", v1alpha1.AnnotationGPUCount: "1"},
			wantMilli:       "500",
		},
		"partita memory": {
			pod:             gpuPod(f.ns, "memory", map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}, map[string]string{v1alpha1.LabelQueue: f.queue}),
			wantAnnotations: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi", v1alpha1.AnnotationGPUCount: "1"},
		},
		"run:ai fraction": {
			pod:             gpuPod(f.ns, "runai", map[string]string{"gpu-fraction": "0.25"}, map[string]string{"runai/queue": f.queue}),
			wantAnnotations: map[string]string{v1alpha1.AnnotationGPUFraction: "0.25", v1alpha1.AnnotationGPUCount: "1"},
			wantMilli:       "250",
		},
		"hami": {
			pod: withLimits(gpuPod(f.ns, "hami", nil, map[string]string{v1alpha1.LabelQueue: f.queue}),
				corev1.ResourceList{"nvidia.com/gpu": resourceQ("1"), "nvidia.com/gpumem": resourceQ("8000")}),
			wantAnnotations: map[string]string{v1alpha1.AnnotationGPUMemory: "8000Mi", v1alpha1.AnnotationGPUCount: "1"},
		},
		"whole gpu": {
			pod:             withLimits(gpuPod(f.ns, "whole", nil, map[string]string{v1alpha1.LabelQueue: f.queue}), corev1.ResourceList{"nvidia.com/gpu": resourceQ("2")}),
			wantAnnotations: map[string]string{v1alpha1.AnnotationGPUCount: "2"},
			wantMilli:       "2k",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			// These pods go to the GPU nodes: each dialect must end up bound.
			tc.pod.Spec.NodeSelector = gpuNodes
			created, err := f.create(ctx, tc.pod, false)
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			// What `kubectl get pod -o yaml` shows: read it back.
			got, err := clientset.CoreV1().Pods(f.ns).Get(ctx, created.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.wantAnnotations {
				if got.Annotations[k] != v {
					t.Errorf("annotation %s = %q, want %q", k, got.Annotations[k], v)
				}
			}
			if got.Labels[v1alpha1.LabelQueue] != f.queue {
				t.Errorf("label %s = %q, want %q", v1alpha1.LabelQueue, got.Labels[v1alpha1.LabelQueue], f.queue)
			}
			c := got.Spec.Containers[0]
			milli, ok := c.Resources.Limits[v1alpha1.ResourceGPUMilli]
			if !ok || (tc.wantMilli != "" && milli.String() != tc.wantMilli) {
				t.Errorf("limits[%s] = %v (set %v), want %s", v1alpha1.ResourceGPUMilli, milli.String(), ok, tc.wantMilli)
			}
			if req := c.Resources.Requests[v1alpha1.ResourceGPUMilli]; req.Cmp(milli) != 0 {
				t.Errorf("requests[%s] = %s, want it equal to the limit %s", v1alpha1.ResourceGPUMilli, req.String(), milli.String())
			}
			if len(c.Env) == 0 || c.Env[0].Name != "NVIDIA_VISIBLE_DEVICES" || c.Env[0].ValueFrom == nil || c.Env[0].ValueFrom.FieldRef.FieldPath != devicesRef {
				t.Errorf("env = %+v, want NVIDIA_VISIBLE_DEVICES from %s", c.Env, devicesRef)
			}
			for name := range c.Resources.Limits {
				if strings.HasPrefix(string(name), "nvidia.com/") {
					t.Errorf("limits still ask for %s, which Partita's nodes do not advertise", name)
				}
			}
			// Whatever the dialect, the pod gets devices on a node.
			poll(t, 60*time.Second, "pod "+got.Name+" bound with devices", func() (bool, string) {
				p, err := clientset.CoreV1().Pods(f.ns).Get(ctx, got.Name, metav1.GetOptions{})
				if err != nil {
					return false, err.Error()
				}
				return p.Spec.NodeName != "" && len(devicesOf(p)) > 0, fmt.Sprintf("node %q, devices %v, conditions %+v", p.Spec.NodeName, devicesOf(p), p.Status.Conditions)
			})
		})
	}

	// kubectl shows the same canonical pod.
	if out, err := kubectl(ctx, "get", "pod", "-n", f.ns, "runai", "-o", "yaml"); err == nil {
		for _, want := range []string{"partita.dev/gpu-fraction: \"0.25\"", "partita.dev/gpu-milli: \"250\"", "NVIDIA_VISIBLE_DEVICES"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl get pod -o yaml lacks %q:\n%s", want, out)
			}
		}
	} else if !os.IsNotExist(err) {
		t.Errorf("kubectl get pod: %v\n%s", err, out)
	}
}

// TestWebhookRefusesBadRequests: refusals come back through the API server
// (and kubectl apply) with the webhook's message.
func TestWebhookRefusesBadRequests(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	f := newWebhookFixture(ctx, t)
	withEnv := func(p *corev1.Pod, value string) *corev1.Pod {
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: value}}
		return p
	}
	q := map[string]string{v1alpha1.LabelQueue: f.queue}
	cases := map[string]struct {
		pod  *corev1.Pod
		want string
	}{
		"fraction over one": {
			pod:  gpuPod(f.ns, "big", map[string]string{v1alpha1.AnnotationGPUFraction: "1.5"}, q),
			want: `metadata.annotations[partita.dev/gpu-fraction]: Invalid value: "1.5": must be a decimal in (0, 1]; ask for whole GPUs with partita.dev/gpu-count`,
		},
		"spoofed device annotation": {
			pod:  gpuPod(f.ns, "spoof", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5", v1alpha1.AnnotationDevicesPrefix + "main": "GPU-00000000-0000-0000-0000-000000000000"}, q),
			want: "metadata.annotations[partita.dev/devices.main]: Forbidden: is written only by Partita when it binds the pod",
		},
		"NVIDIA_VISIBLE_DEVICES=all on a GPU pod": {
			pod:  withEnv(gpuPod(f.ns, "all", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}, q), "all"),
			want: `spec.containers[0].env[0]: Forbidden: NVIDIA_VISIBLE_DEVICES="all" is set by Partita`,
		},
		"NVIDIA_VISIBLE_DEVICES=all without a GPU request": {
			pod:  withEnv(gpuPod(f.ns, "sneak", nil, nil), "all"),
			want: `NVIDIA_VISIBLE_DEVICES="all" is set by Partita: a container without a GPU request gets "void"`,
		},
		"over the queue's limit": {
			pod:  gpuPod(f.ns, "greedy", map[string]string{v1alpha1.AnnotationGPUCount: "8"}, q),
			want: fmt.Sprintf(`refused by policy: the pod asks for 8 GPUs, more than the 4 GPU limit of queue %q`, f.queue),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := f.create(ctx, tc.pod, false)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("create = %v, want a refusal containing %q", err, tc.want)
			}
			// kubectl apply shows the same message.
			tc.pod.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
			manifest, err := yaml.Marshal(tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			out, err := kubectlIn(ctx, manifest, "apply", "--as", webhookUser, "--as-group", "system:authenticated", "-f", "-")
			switch {
			case os.IsNotExist(err):
				t.Log("kubectl not built; checked through client-go only")
			case err == nil:
				t.Errorf("kubectl apply succeeded:\n%s", out)
			case !strings.Contains(out, tc.want):
				t.Errorf("kubectl apply output lacks %q:\n%s", tc.want, out)
			}
		})
	}

	// The same user may not add a device annotation to a pod later.
	created, err := f.create(ctx, gpuPod(f.ns, "honest", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}, q), false)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"GPU-00000000-0000-0000-0000-000000000000"}}}`, v1alpha1.AnnotationDevicesPrefix+"main")
	_, err = f.user.CoreV1().Pods(f.ns).Patch(ctx, created.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "is written only by Partita") {
		t.Errorf("patching a device annotation = %v, want a refusal", err)
	}
}

// TestWebhookAnswersOnlyTheAPIServer forges AdmissionReviews and sends
// them straight to the webhook's port: without the API server's client
// certificate (the dev cluster's admission configuration presents it) the
// webhook answers no review and compiles nothing; with it, the same review
// is answered. Every pod the other tests create shows the API server
// presenting it.
func TestWebhookAnswersOnlyTheAPIServer(t *testing.T) {
	ctx := testContext(t, time.Minute)
	policyCM := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "forged", Namespace: devcluster.PartitaNamespace, Labels: map[string]string{v1alpha1.LabelPolicy: "rego"}},
		Data:       map[string]string{"forged.rego": "package partita.admission\nthis is not rego"},
	}
	policyReview, err := partitatest.CreateReview(policyCM, "ConfigMap", "mallory")
	if err != nil {
		t.Fatal(err)
	}
	podReview, err := partitatest.CreateReview(gpuPod("default", "forged", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}, nil), "Pod", "mallory")
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		path        string
		body        []byte
		apiServer   bool
		wantStatus  int
		wantAnswer  bool
		wantMessage string
	}{
		"a forged policy review": {path: webhook.PathValidatePolicies, body: policyReview, wantStatus: 401,
			wantMessage: "no client certificate; only kube-apiserver may call the admission webhooks"},
		"a forged pod review": {path: webhook.PathMutatePods, body: podReview, wantStatus: 401, wantMessage: "no client certificate"},
		"a forged pod check":  {path: webhook.PathValidatePods, body: podReview, wantStatus: 401, wantMessage: "no client certificate"},
		"the API server's policy review": {path: webhook.PathValidatePolicies, body: policyReview, apiServer: true, wantStatus: 200, wantAnswer: true,
			wantMessage: "forged.rego"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			status, body, err := cluster.WebhookCall(ctx, tc.path, tc.body, tc.apiServer)
			if err != nil {
				t.Fatal(err)
			}
			resp := partitatest.ReviewResponse(body)
			if status != tc.wantStatus || (resp != nil) != tc.wantAnswer || !strings.Contains(string(body), tc.wantMessage) {
				t.Errorf("%s answered %d, an AdmissionReview: %v, %q; want %d, %v, containing %q", tc.path, status, resp != nil, body, tc.wantStatus, tc.wantAnswer, tc.wantMessage)
			}
			if tc.wantAnswer && resp.Allowed {
				t.Errorf("the broken policy was allowed: %+v", resp)
			}
		})
	}
}

// TestWebhookPolicyConfigMap: a policy ConfigMap changes decisions within 5
// seconds; a broken one is refused with the compiler's message and the
// policy in force keeps deciding.
func TestWebhookPolicyConfigMap(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	f := newWebhookFixture(ctx, t)
	q := map[string]string{v1alpha1.LabelQueue: f.queue}
	pod := func() *corev1.Pod {
		return gpuPod(f.ns, "", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}, q)
	}
	unlabelled := pod()
	unlabelled.GenerateName = "p-"
	labelled := pod()
	labelled.GenerateName = "p-"
	labelled.Labels["cost-center"] = "ml"
	if _, err := f.create(ctx, unlabelled, true); err != nil {
		t.Fatalf("before the policy: %v", err)
	}

	const msg = "GPU pods need the label cost-center"
	// Scoped to this test's namespace: the cluster is shared.
	rule := fmt.Sprintf("package partita.admission\n\ndeny contains %q if {\n\tinput.namespace == %q\n\tnot input.pod.labels[\"cost-center\"]\n}\n", msg, f.ns)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-" + f.ns, Namespace: partitaNamespace,
			Labels: map[string]string{v1alpha1.LabelPolicy: policy.PolicyLabelValue}},
		Data: map[string]string{f.ns + ".rego": rule},
	}
	cms := clientset.CoreV1().ConfigMaps(partitaNamespace)
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create policy ConfigMap: %v", err)
	}
	t.Cleanup(func() { _ = cms.Delete(context.WithoutCancel(ctx), cm.Name, metav1.DeleteOptions{}) })
	start := time.Now()
	eventually(ctx, t, 5*time.Second, func() error {
		if _, err := f.create(ctx, unlabelled, true); err == nil || !strings.Contains(err.Error(), msg) {
			return fmt.Errorf("the new policy does not decide yet: %w", err)
		}
		return nil
	})
	t.Logf("the policy decided %.1fs after the ConfigMap was created", time.Since(start).Seconds())
	if _, err := f.create(ctx, labelled, true); err != nil {
		t.Fatalf("a labelled pod was refused: %v", err)
	}
	eventually(ctx, t, 5*time.Second, func() error {
		cur, err := cms.Get(ctx, cm.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if st := cur.Annotations[policy.AnnotationPolicyStatus]; !strings.HasPrefix(st, "Loaded: policy ") {
			return fmt.Errorf("status annotation = %q", st)
		}
		return nil
	})

	// A broken update is refused at apply, with the compiler's message.
	broken := cm.DeepCopy()
	broken.Data[f.ns+".rego"] = "package partita.admission\n\ndeny contains msg if {\n\tmsg := sprintf(\"%s\", [input.namespace)\n}\n"
	cur, err := cms.Get(ctx, cm.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	broken.ResourceVersion = cur.ResourceVersion
	_, err = cms.Update(ctx, broken, metav1.UpdateOptions{})
	if err == nil || !strings.Contains(err.Error(), "rego_parse_error") || !strings.Contains(err.Error(), "the policy in force stays") {
		t.Fatalf("updating to a broken policy = %v, want a refusal with the compiler's message", err)
	}
	broken.ResourceVersion = ""
	broken.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}
	manifest, _ := yaml.Marshal(broken)
	if out, err := kubectlIn(ctx, manifest, "apply", "-f", "-"); err == nil || (!os.IsNotExist(err) && !strings.Contains(out, "rego_parse_error")) {
		t.Errorf("kubectl apply of a broken policy: %v\n%s", err, out)
	}
	// The old policy still decides.
	if _, err := f.create(ctx, unlabelled, true); err == nil || !strings.Contains(err.Error(), msg) {
		t.Errorf("after the refused update: %v, want the old policy's refusal", err)
	}
	if _, err := f.create(ctx, labelled, true); err != nil {
		t.Errorf("after the refused update, a labelled pod: %v", err)
	}

	// Deleting the ConfigMap brings back the default policy.
	if err := cms.Delete(ctx, cm.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	eventually(ctx, t, 5*time.Second, func() error {
		_, err := f.create(ctx, unlabelled, true)
		return err
	})
}

// kubectl runs the dev cluster's kubectl; an error satisfying os.IsNotExist
// means it is not built.
func kubectl(ctx context.Context, args ...string) (string, error) {
	return kubectlIn(ctx, nil, args...)
}

func kubectlIn(ctx context.Context, stdin []byte, args ...string) (string, error) {
	bin := filepath.Join(devcluster.CacheDir(), "bin", "k8s-"+devcluster.K8sVersion, "kubectl")
	if _, err := os.Stat(bin); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", cluster.KubeconfigPath()}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err := cmd.Run()
	return out.String(), err
}

func resourceQ(s string) resource.Quantity { return resource.MustParse(s) }

// addMPSNode adds a one-GPU node labelled sel and switches it to mps
// through its GPUNode.
func addMPSNode(ctx context.Context, t *testing.T, name string, sel map[string]string) {
	t.Helper()
	addGPUNode(ctx, t, name, 1, sel)
	c := crClient(t)
	// The agent writes the GPUNode too: an update that meets its write is
	// made again.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var gn v1alpha1.GPUNode
		if err := c.Get(ctx, client.ObjectKey{Name: name}, &gn); err != nil {
			return err
		}
		gn.Spec.Isolation = v1alpha1.IsolationMPS
		return c.Update(ctx, &gn)
	}); err != nil {
		t.Fatalf("set the node's isolation to mps: %v", err)
	}
}

// TestWebhookWiresMPSClients: once a node runs mps, a GPU pod with a slice
// of one device gets the MPS volume and CUDA_MPS_PIPE_DIRECTORY of its
// device's daemon, and the API server accepts and places it.
func TestWebhookWiresMPSClients(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	ns := extNamespace(ctx, t, clientset)
	ensureGPUPriorityClass(ctx, t, clientset)
	sel := map[string]string{"e2e.partita.dev/mps": ns}
	name := ns + "-mps"
	addMPSNode(ctx, t, name, sel)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	// The webhook learns the cluster's modes from GPUNodes: probe until a
	// slice pod comes back with the MPS wiring.
	var got *corev1.Pod
	poll(t, 60*time.Second, "the webhook to wire MPS clients", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Create(ctx, extGPUPod(ns, "probe", 500, 1, sel), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		got = p
		return slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == webhook.MPSVolume }), fmt.Sprintf("volumes %v", p.Spec.Volumes)
	})
	env := map[string]corev1.EnvVar{}
	for _, e := range got.Spec.Containers[0].Env {
		env[e.Name] = e
	}
	if e := env[webhook.EnvMPSPipeDirectory]; e.Value != webhook.MPSPipeMountPath {
		t.Errorf("%s = %q, want %q", webhook.EnvMPSPipeDirectory, e.Value, webhook.MPSPipeMountPath)
	}
	if e := env[webhook.EnvPartitaDevice]; e.ValueFrom == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.annotations['"+v1alpha1.AnnotationDevicesPrefix+"main']" {
		t.Errorf("%s = %+v, want the devices annotation", webhook.EnvPartitaDevice, e)
	}
	// The client mounts its own device's pipe directory, never the MPS
	// root: the kubelet picks <mps-dir>/<uuid>/pipe from PARTITA_DEVICE.
	var mpsMounts []corev1.VolumeMount
	for _, m := range got.Spec.Containers[0].VolumeMounts {
		if m.Name == webhook.MPSVolume {
			mpsMounts = append(mpsMounts, m)
		}
	}
	if len(mpsMounts) != 1 || mpsMounts[0].MountPath != webhook.MPSPipeMountPath || mpsMounts[0].SubPathExpr != "$(PARTITA_DEVICE)/pipe" || mpsMounts[0].SubPath != "" {
		t.Errorf("MPS mounts %+v, want one at %s with subPathExpr $(PARTITA_DEVICE)/pipe", mpsMounts, webhook.MPSPipeMountPath)
	}
	if i := slices.IndexFunc(got.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == webhook.MPSVolume }); i < 0 ||
		got.Spec.Volumes[i].HostPath == nil || got.Spec.Volumes[i].HostPath.Path != webhook.DefaultMPSDir {
		t.Errorf("volumes %+v, want %s the hostPath %s", got.Spec.Volumes, webhook.MPSVolume, webhook.DefaultMPSDir)
	}
	createPods(ctx, t, clientset, []*corev1.Pod{extGPUPod(ns, "half", 500, 1, sel)}, 1)
	poll(t, 60*time.Second, "the MPS client bound with its device", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, "half", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName == name && len(devicesOf(p)) == 1, fmt.Sprintf("node %q, devices %v", p.Spec.NodeName, devicesOf(p))
	})
}
