package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// These tests run the admission chain of a real API server (envtest): the
// policies as Register installs them, and the webhook served in-process,
// then stopped.

const testExtender = "system:serviceaccount:partita-system:partita-extender"

// apiServer is an envtest API server with namespaces team-a (managed),
// gpu-operator (excluded by default) and Partita's, and clients as the
// admin and as alice, who may edit team-a and, beyond that, write pod
// status, ephemeral containers and bindings there: more than a tenant
// usually has, to try those doors too.
type apiServer struct {
	cfg   *rest.Config
	admin kubernetes.Interface
	alice kubernetes.Interface
	// extender acts as Partita's extender (testExtender, trusted), with
	// alice's rights.
	extender kubernetes.Interface
	// calls counts the webhook's requests by path.
	calls pathCounter
	// url and ca reach the webhook serveWebhook serves, whose server also
	// answers pathLater (laterMutation).
	url string
	ca  []byte
}

// pathCounter counts HTTP requests by path.
type pathCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *pathCounter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		if c.n == nil {
			c.n = map[string]int{}
		}
		c.n[r.URL.Path]++
		c.mu.Unlock()
		if r.URL.Path == pathLater {
			laterMutation(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (c *pathCounter) get(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[path]
}

func startAPIServer(t *testing.T) *apiServer {
	t.Helper()
	cfg, _ := envtestutil.Start(t)
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// envtest runs no controller-manager, which aggregates the edit role:
	// alice gets its pod rights by hand, and more.
	for _, ns := range []string{doorNamespace, "gpu-operator", partitaNamespace} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		role := &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "alice", Namespace: ns},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list", "update", "patch", "delete"}},
				{APIGroups: []string{""}, Resources: []string{"pods/status", "pods/ephemeralcontainers"}, Verbs: []string{"update", "patch"}},
				{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
			},
		}
		if _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "alice"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "alice"},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "alice"},
				{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: testExtender}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	userCfg := rest.CopyConfig(cfg)
	userCfg.Impersonate = rest.ImpersonationConfig{UserName: "alice", Groups: []string{"system:authenticated"}}
	alice, err := kubernetes.NewForConfig(userCfg)
	if err != nil {
		t.Fatal(err)
	}
	extCfg := rest.CopyConfig(cfg)
	extCfg.Impersonate = rest.ImpersonationConfig{UserName: testExtender, Groups: []string{"system:authenticated"}}
	extender, err := kubernetes.NewForConfig(extCfg)
	if err != nil {
		t.Fatal(err)
	}
	return &apiServer{cfg: cfg, admin: admin, alice: alice, extender: extender}
}

// serveWebhook serves the webhook (modes time-slicing and mps, the
// admission gate, the extender trusted) on loopback until stop is called,
// and registers it with the policies.
func (s *apiServer) serveWebhook(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca, err := EnsureDevCertificates(DevCertificateOptions{Dir: dir, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	cw, err := WatchCertificates(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newTestServer(t, testOptions{gate: true, modes: []v1alpha1.IsolationMode{v1alpha1.IsolationTimeSlicing, v1alpha1.IsolationMPS},
		trusted: &Identities{Users: []string{testExtender}}})
	done := make(chan error, 1)
	go func() { done <- ServeTLS(ctx, l, s.calls.wrap(h), cw.GetCertificate, nil, logr.Discard()) }()
	s.url, s.ca = "https://"+l.Addr().String(), ca
	o := ConfigurationOptions{Namespace: partitaNamespace, URL: "https://" + l.Addr().String(), CABundle: ca,
		ExcludedNamespaces: DefaultExcludedNamespaces(), Policies: true, AdmissionGate: true, Trusted: Identities{Users: []string{testExtender}}}
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	if err := Register(rctx, s.admin, o); err != nil {
		t.Fatal(err)
	}
	if err := WaitForRegistration(rctx, s.admin, doorNamespace, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := WaitForPolicies(rctx, s.admin, doorNamespace, 30*time.Second); err != nil {
		vap, _ := s.admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(rctx, PodPolicyName(o.name()), metav1.GetOptions{})
		t.Fatalf("%v\nvalidating policy status: %+v", err, vap.Status)
	}
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, context.Canceled) {
			t.Errorf("serve: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// tryDoor creates d's pod as alice and checks the outcome the layer at
// hand owes: the API server's own validation, else (down) the outage's,
// else the refusal, else admission; a refused pod must not be stored.
func (s *apiServer) tryDoor(t *testing.T, d door, suffix string, down bool) {
	t.Helper()
	ctx := t.Context()
	pod := d.pod.DeepCopy()
	pod.Name += "-" + suffix
	want := d.refused
	switch {
	case d.api != "":
		want = d.api
	case down && d.down != "":
		want = d.down
	}
	got, err := s.alice.CoreV1().Pods(doorNamespace).Create(ctx, pod, metav1.CreateOptions{})
	switch {
	case want == "" && err != nil:
		t.Fatalf("refused: %v", err)
	case want != "" && err == nil:
		t.Fatalf("admitted, want a refusal with %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("refused with\n  %v\nwant it to contain\n  %s", err, want)
	case want != "":
		if _, err := s.admin.CoreV1().Pods(doorNamespace).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("a refused pod was stored (get: %v)", err)
		}
	case d.check != nil:
		d.check(t, got)
	}
}

// TestDoorsAPIServer: each door through a real API server with the
// webhook, then with the webhook stopped.
func TestDoorsAPIServer(t *testing.T) {
	s := startAPIServer(t)
	stop := s.serveWebhook(t)
	t.Run("webhook up", func(t *testing.T) {
		for name, d := range doors() {
			t.Run(name, func(t *testing.T) { s.tryDoor(t, d, "up", false) })
		}
	})
	stop()
	t.Run("webhook down", func(t *testing.T) {
		for name, d := range doors() {
			t.Run(name, func(t *testing.T) { s.tryDoor(t, d, "down", true) })
		}
	})
}

// TestUpdateDoorsAPIServer: what a tenant with more rights than usual
// tries on existing pods (status, ephemeral containers, bindings, gates),
// with the webhook up and down; and the excluded namespaces, which keep
// whatever they ask for.
func TestUpdateDoorsAPIServer(t *testing.T) {
	s := startAPIServer(t)
	stop := s.serveWebhook(t)
	ctx := t.Context()
	plain, err := s.alice.CoreV1().Pods(doorNamespace).Create(ctx, plainPod("plain").Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gpuPod, err := s.alice.CoreV1().Pods(doorNamespace).Create(ctx, gpuDoorPod("gpu").Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Released by the extender in a case of its own, so that the tenant's
	// cases still find gpuPod gated.
	toRelease, err := s.alice.CoreV1().Pods(doorNamespace).Create(ctx, gpuDoorPod("to-release").Obj(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	debug := func(name string, f func(*corev1.EphemeralContainer)) corev1.EphemeralContainer {
		ec := corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: name, Image: "busybox",
			TerminationMessagePolicy: corev1.TerminationMessageReadFile, ImagePullPolicy: corev1.PullIfNotPresent}}
		if f != nil {
			f(&ec)
		}
		return ec
	}
	addEphemeral := func(pod *corev1.Pod, ec corev1.EphemeralContainer) (*corev1.Pod, error) {
		cur, err := s.admin.CoreV1().Pods(doorNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		cur.Spec.EphemeralContainers = append(cur.Spec.EphemeralContainers, ec)
		return s.alice.CoreV1().Pods(doorNamespace).UpdateEphemeralContainers(ctx, pod.Name, cur, metav1.UpdateOptions{})
	}
	spoof := `{"metadata":{"annotations":{"` + v1alpha1.AnnotationDevicesPrefix + `main":"` + fakeUUID + `"}}}`
	cases := map[string]struct {
		do      func(suffix string) (*corev1.Pod, error)
		refused string
		check   func(*testing.T, *corev1.Pod)
	}{
		"a device annotation written through pods/status": {
			do: func(string) (*corev1.Pod, error) {
				return s.alice.CoreV1().Pods(doorNamespace).Patch(ctx, gpuPod.Name, types.MergePatchType, []byte(spoof), metav1.PatchOptions{}, "status")
			},
			refused: "metadata.annotations[partita.dev/devices.main]: Forbidden: is written only by Partita: no one else may add, change or remove it",
		},
		"a status update that leaves the annotations as they were": {
			do: func(suffix string) (*corev1.Pod, error) {
				return s.alice.CoreV1().Pods(doorNamespace).Patch(ctx, gpuPod.Name, types.MergePatchType,
					[]byte(`{"status":{"message":"`+suffix+`"}}`), metav1.PatchOptions{}, "status")
			},
			check: func(t *testing.T, p *corev1.Pod) {
				if p.Status.Message == "" {
					t.Errorf("status message %q, want the one written", p.Status.Message)
				}
			},
		},
		"a device annotation patched onto a pod without a GPU": {
			do: func(string) (*corev1.Pod, error) {
				return s.alice.CoreV1().Pods(doorNamespace).Patch(ctx, plain.Name, types.MergePatchType, []byte(spoof), metav1.PatchOptions{})
			},
			refused: "metadata.annotations[partita.dev/devices.main]: Forbidden: is written only by Partita",
		},
		"the admission gate removed by its tenant": {
			do: func(string) (*corev1.Pod, error) {
				return s.alice.CoreV1().Pods(doorNamespace).Patch(ctx, gpuPod.Name, types.StrategicMergePatchType,
					[]byte(`{"spec":{"$setElementOrder/schedulingGates":[],"schedulingGates":[{"$patch":"delete","name":"`+v1alpha1.SchedulingGateAdmission+`"}]}}`), metav1.PatchOptions{})
			},
			refused: "spec.schedulingGates: Forbidden: the scheduling gate partita.dev/admission is removed only by Partita's admission loop",
		},
		"a binding that names a device": {
			do: func(string) (*corev1.Pod, error) {
				b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: gpuPod.Name, Annotations: map[string]string{v1alpha1.AnnotationDevicesPrefix + "main": fakeUUID}},
					Target: corev1.ObjectReference{Kind: "Node", Name: "gpu-node-0"}}
				return nil, s.alice.CoreV1().Pods(doorNamespace).Bind(ctx, b, metav1.CreateOptions{})
			},
			refused: "metadata.annotations[partita.dev/devices.main]: Forbidden: is written only by Partita when it binds the pod: a pod cannot choose its own GPU or node; remove it; only Partita's extender may bind",
		},
		// The policy skips the extender's pod updates, which it can never
		// refuse (not-a-partita-update); they must still pass.
		"the extender releases the pod": {
			do: func(suffix string) (*corev1.Pod, error) {
				return s.extender.CoreV1().Pods(doorNamespace).Patch(ctx, toRelease.Name, types.StrategicMergePatchType,
					[]byte(`{"metadata":{"annotations":{"`+v1alpha1.AnnotationAdmitted+`":"`+suffix+`"}},"spec":{"schedulingGates":[{"$patch":"delete","name":"`+v1alpha1.SchedulingGateAdmission+`"}]}}`), metav1.PatchOptions{})
			},
			check: func(t *testing.T, p *corev1.Pod) {
				if v1alpha1.HasAdmissionGate(p) || p.Annotations[v1alpha1.AnnotationAdmitted] == "" {
					t.Errorf("gates %v, annotations %v: want the gate gone and %s set", p.Spec.SchedulingGates, p.Annotations, v1alpha1.AnnotationAdmitted)
				}
			},
		},
		// ... but not its ephemeral containers: the rules on devices hold
		// for everyone.
		"a privileged debug container from the extender": {
			do: func(suffix string) (*corev1.Pod, error) {
				cur, err := s.admin.CoreV1().Pods(doorNamespace).Get(ctx, gpuPod.Name, metav1.GetOptions{})
				if err != nil {
					return nil, err
				}
				cur.Spec.EphemeralContainers = append(cur.Spec.EphemeralContainers, debug("ext-"+suffix, func(ec *corev1.EphemeralContainer) {
					ec.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
				}))
				return s.extender.CoreV1().Pods(doorNamespace).UpdateEphemeralContainers(ctx, gpuPod.Name, cur, metav1.UpdateOptions{})
			},
			refused: "].securityContext.privileged: Forbidden: a privileged container sees every device",
		},
		"a debug container gets void": {
			do: func(suffix string) (*corev1.Pod, error) { return addEphemeral(plain, debug("debug-"+suffix, nil)) },
			check: func(t *testing.T, p *corev1.Pod) {
				ec := p.Spec.EphemeralContainers[len(p.Spec.EphemeralContainers)-1]
				if e, ok := envOf(corev1.Container(ec.EphemeralContainerCommon), EnvVisibleDevices); !ok || e.Value != VisibleDevicesVoid {
					t.Errorf("debug container env %v, want %s=void", ec.Env, EnvVisibleDevices)
				}
			},
		},
		"a debug container that asks for every GPU": {
			do: func(suffix string) (*corev1.Pod, error) {
				return addEphemeral(plain, debug("all-"+suffix, func(ec *corev1.EphemeralContainer) {
					ec.Env = []corev1.EnvVar{{Name: EnvVisibleDevices, Value: "all"}}
				}))
			},
			refused: `].env[0]: Forbidden: NVIDIA_VISIBLE_DEVICES="all" is set by Partita: a debug container gets "void" and no GPU`,
		},
		"a privileged debug container in a GPU pod": {
			do: func(suffix string) (*corev1.Pod, error) {
				return addEphemeral(gpuPod, debug("priv-"+suffix, func(ec *corev1.EphemeralContainer) {
					ec.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
				}))
			},
			refused: "].securityContext.privileged: Forbidden: a privileged container sees every device",
		},
		"a debug container that mounts the MPS pipes": {
			do: func(suffix string) (*corev1.Pod, error) {
				return addEphemeral(gpuPod, debug("mps-"+suffix, func(ec *corev1.EphemeralContainer) {
					ec.VolumeMounts = []corev1.VolumeMount{{Name: MPSVolume, MountPath: "/mps"}}
				}))
			},
			refused: "].volumeMounts[0]: Forbidden: the volume partita-mps is mounted by Partita only",
		},
	}
	for _, phase := range []struct {
		name string
		down bool
	}{{"webhook up", false}, {"webhook down", true}} {
		if phase.down {
			stop()
		}
		t.Run(phase.name, func(t *testing.T) {
			for name, tc := range cases {
				t.Run(name, func(t *testing.T) {
					before, err := s.admin.CoreV1().Pods(doorNamespace).List(ctx, metav1.ListOptions{})
					if err != nil {
						t.Fatal(err)
					}
					got, err := tc.do(strings.ReplaceAll(phase.name, "webhook ", ""))
					switch {
					case tc.refused == "" && err != nil:
						t.Fatalf("refused: %v", err)
					case tc.refused != "" && err == nil:
						t.Fatalf("admitted, want a refusal with %q", tc.refused)
					case tc.refused != "" && !strings.Contains(err.Error(), tc.refused):
						t.Fatalf("refused with\n  %v\nwant it to contain\n  %s", err, tc.refused)
					case tc.refused != "":
						after, err := s.admin.CoreV1().Pods(doorNamespace).List(ctx, metav1.ListOptions{})
						if err != nil {
							t.Fatal(err)
						}
						if before.ResourceVersion != after.ResourceVersion {
							t.Fatalf("a refused write changed the namespace's pods (resourceVersion %s, now %s)", before.ResourceVersion, after.ResourceVersion)
						}
					case tc.check != nil:
						tc.check(t, got)
					}
				})
			}
		})
	}

	// Namespaces Partita does not manage keep what they ask for, and get
	// nothing added (the GPU Operator's DaemonSets set all).
	op := plainPod("dcgm-exporter").Env("main", EnvVisibleDevices, "all").HostPath("dev", "/dev").Privileged("main").Obj()
	op.Namespace = "gpu-operator"
	got, err := s.alice.CoreV1().Pods("gpu-operator").Create(ctx, op, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a GPU Operator pod was refused: %v", err)
	}
	if env := got.Spec.Containers[0].Env; len(env) != 1 || env[0].Value != "all" {
		t.Errorf("GPU Operator pod's env = %v, want it untouched", env)
	}
}

// TestPoliciesTrustGroups: the policies compile and judge with trusted
// groups (the webhook's default identities) as with trusted users.
func TestPoliciesTrustGroups(t *testing.T) {
	s := startAPIServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	o := ConfigurationOptions{Namespace: partitaNamespace, URL: "https://127.0.0.1:1", ExcludedNamespaces: DefaultExcludedNamespaces(),
		Policies: true, AdmissionGate: true, Trusted: DefaultIdentities(partitaNamespace)}
	if err := Register(ctx, s.admin, o); err != nil {
		t.Fatal(err)
	}
	if err := WaitForPolicies(ctx, s.admin, doorNamespace, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	d := doors()["a device annotation without a GPU"]
	s.tryDoor(t, d, "groups", true)
}

// TestSealAPIServer: a GPU pod that leaves the mutating webhook as it was
// sealed costs one webhook call, not two (issue 19), in every dialect and
// for gang members; a pod that a later mutation changed is validated in
// full; a seal a tenant writes never spares a pod the validating webhook
// (the seal policy removes it before the mutating webhook runs, so with
// the webhook down the forged pod meets the validating webhook, which
// fails closed).
func TestSealAPIServer(t *testing.T) {
	s := startAPIServer(t)
	stop := s.serveWebhook(t)
	ctx := t.Context()
	for name, pod := range map[string]*corev1.Pod{
		"a fraction":               gpuDoorPod("seal-fraction").Queue("team-a").Obj(),
		"whole GPUs":               plainPod("seal-whole").Limit("main", "nvidia.com/gpu", "2").Obj(),
		"a memory slice":           plainPod("seal-memory").Annotation(v1alpha1.AnnotationGPUMemory, "20Gi").Obj(),
		"a gang member":            gpuDoorPod("seal-gang").Label(v1alpha1.LabelPodGroup, "g1").Annotation(v1alpha1.AnnotationMinMember, "2").Obj(),
		"two GPU containers":       gpuDoorPod("seal-two").Container("second").Obj(),
		"HAMi with cores and init": plainPod("seal-hami").Limit("main", "nvidia.com/gpu", "1").Limit("main", "nvidia.com/gpucores", "30").InitContainer("init").Obj(),
		"a forged seal":            gpuDoorPod("seal-forged").Annotation(v1alpha1.AnnotationCanonical, "v1;q=someone-elses;g=;c=main:1;a=").Obj(),
		"KAI's topology and sub-group": gpuDoorPod("seal-kai-topology").Annotation(v1alpha1.AnnotationKAITopology, "dc-1").
			Annotation(v1alpha1.AnnotationKAITopologyRequired, "network.example.com/rack").Label(v1alpha1.LabelKAISubGroup, "r0").Obj(),
		"Kueue's levels": plainPod("seal-kueue-topology").Limit("main", "nvidia.com/gpu", "1").
			Annotation(v1alpha1.AnnotationKueueTopologyRequired, "network.example.com/block").Annotation(v1alpha1.AnnotationKueueTopologyPreferred, "kubernetes.io/hostname").Obj(),
	} {
		t.Run(name, func(t *testing.T) {
			mutated, validated := s.calls.get(PathMutatePods), s.calls.get(PathValidatePods)
			got, err := s.alice.CoreV1().Pods(doorNamespace).Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if seal, want := got.Annotations[v1alpha1.AnnotationCanonical], sealOf(got); seal != want {
				t.Errorf("seal %q, want the pod's own %q", seal, want)
			}
			if n := s.calls.get(PathMutatePods) - mutated; n != 1 {
				t.Errorf("mutating webhook called %d times, want once", n)
			}
			if n := s.calls.get(PathValidatePods) - validated; n != 0 {
				t.Errorf("validating webhook called %d times for a sealed pod, want none (seal %q)", n, got.Annotations[v1alpha1.AnnotationCanonical])
			}
		})
	}
	t.Run("a mutation after Partita's breaks the seal", func(t *testing.T) {
		// Another vendor's webhook, ordered after Partita's and reinvoked as
		// it is, changes the queue label after Partita's reinvocation: the
		// seal no longer matches, and the validating webhook checks the pod.
		later := &admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: "zz-later"},
			Webhooks: []admissionregistrationv1.MutatingWebhook{{
				Name:         "later.e2e.partita.dev",
				ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: ptr.To(s.url + pathLater), CABundle: s.ca},
				Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
				ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{laterLabel: "true"}},
				SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
				AdmissionReviewVersions: []string{"v1"},
				ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
			}},
		}
		if _, err := s.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, later, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = s.admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.WithoutCancel(ctx), later.Name, metav1.DeleteOptions{})
		})
		pod := gpuDoorPod("later").Label(laterLabel, "true").Obj()
		// The API server picks the new configuration up asynchronously.
		var got *corev1.Pod
		var err error
		validated := s.calls.get(PathValidatePods)
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			got, err = s.alice.CoreV1().Pods(doorNamespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if s.calls.get(pathLater) > 0 {
				break
			}
		}
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if got.Labels[v1alpha1.LabelQueue] != laterQueue {
			t.Fatalf("queue %q: the later webhook did not run after Partita's reinvocation (calls: %d)", got.Labels[v1alpha1.LabelQueue], s.calls.get(pathLater))
		}
		if n := s.calls.get(PathValidatePods) - validated; n != 1 {
			t.Errorf("validating webhook called %d times for a pod whose seal %q is stale, want once", n, got.Annotations[v1alpha1.AnnotationCanonical])
		}
	})
	stop()
	// Written by hand exactly as the webhook writes it, seal included: the
	// seal policy removes the seal, and the validating webhook, down, fails
	// closed.
	forged := gpuDoorPod("forged-seal").Queue("team-a").Limit("main", v1alpha1.ResourceGPUMilli, "500").
		EnvFrom("main", EnvVisibleDevices, devicesRef("main")).SchedulingGates(v1alpha1.SchedulingGateAdmission).Obj()
	forged.Annotations[v1alpha1.AnnotationGPUCount] = "1"
	forged.Annotations[v1alpha1.AnnotationCanonical] = sealOf(forged)
	_, err := s.alice.CoreV1().Pods(doorNamespace).Create(ctx, forged, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), failedCalling) {
		t.Fatalf("a forged canonical pod with its seal, webhook down: %v, want a refusal with %q", err, failedCalling)
	}
}

// pathLater is where laterMutation answers; laterLabel selects the pods it
// sees.
const (
	pathLater  = "/later"
	laterLabel = "e2e.partita.dev/later"
	laterQueue = "elsewhere"
)

// laterMutation is another vendor's mutating webhook, called after
// Partita's: the first time it marks the pod and spoils Partita's seal,
// so that Partita's webhook is called again and writes the seal anew; the
// second time it moves the pod to laterQueue.
func laterMutation(w http.ResponseWriter, r *http.Request) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, "bad review", http.StatusBadRequest)
		return
	}
	var pod corev1.Pod
	if err := json.Unmarshal(review.Request.Object.Raw, &pod); err != nil {
		http.Error(w, "bad pod", http.StatusBadRequest)
		return
	}
	patch := `[{"op":"add","path":"/metadata/annotations/e2e.partita.dev~1later","value":"seen"},` +
		`{"op":"add","path":"/metadata/annotations/partita.dev~1canonical","value":"spoiled"}]`
	if _, seen := pod.Annotations["e2e.partita.dev/later"]; seen {
		patch = `[{"op":"add","path":"/metadata/labels/partita.dev~1queue","value":"` + laterQueue + `"}]`
	}
	review.Response = &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true, Patch: []byte(patch), PatchType: ptr.To(admissionv1.PatchTypeJSONPatch)}
	review.Request = nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&review)
}
