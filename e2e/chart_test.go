package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// The chart's end-to-end test installs helm/partita into the shared dev
// cluster beside the host processes `partita dev up` runs. The kwok nodes
// run no containers: what it checks is that the real API server accepts
// every object, that the pods land where their selectors say and show
// Running, and what helm upgrade and uninstall leave behind.

// chartRelease is the test's release; its objects are named e2e-chart-*,
// apart from the dev cluster's partita-* ones.
const chartRelease = "e2e-chart"

func helmBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(cluster.BinDir(), "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no helm at %s (make cluster-bins builds it): %v", bin, err)
	}
	return bin
}

func runHelm(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, helmBin(t), append([]string{"--kubeconfig", cluster.KubeconfigPath()}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// chartValues are the values every step uses: the agent's simulated
// backend (no NVML, no nvidia RuntimeClass on kwok nodes), and pod webhooks
// that select no namespace. The chart's webhook pods run no process here,
// so webhooks that selected namespaces (failing closed) would refuse every
// pod of the other tests while this one runs.
func chartValues() []string {
	return []string{
		"--set", "agent.simulate=8xH100-80GB",
		"--set", "webhook.namespaceSelector.matchLabels.e2e\\.partita\\.dev/chart-webhook=nowhere",
		// The dev cluster already has its default Queue (cluster-scoped, one
		// per cluster), which `partita dev up` created from the same template.
		"--set", "webhook.createDefaultQueue=false",
		// kwok nodes run no container runtime, and the dev cluster's own
		// Partita manages this release's namespace: its admission
		// policies refuse the hostPaths of the NRI hook (/dev, the
		// interposer directory) there, as they would any tenant's.
		"--set", "agent.nri.enabled=off",
		// The CA of the dev API server's webhook client certificate, as on a
		// cluster set up for Partita (docs/install.md).
		"--set-file", "webhook.clientAuth.caBundle=" + cluster.WebhookClientCAFile(),
	}
}

func TestChartInstallUpgradeUninstall(t *testing.T) {
	ctx := testContext(t, 8*time.Minute)
	helmBin(t)
	ns := fmt.Sprintf("e2e-chart-%d", os.Getpid())
	chartDir := filepath.Join("..", "helm", "partita")
	t.Cleanup(func() {
		cctx := context.WithoutCancel(ctx)
		_ = exec.CommandContext(cctx, helmBin(t), "--kubeconfig", cluster.KubeconfigPath(), "uninstall", chartRelease, "-n", ns).Run()
		_ = clientset.CoreV1().Namespaces().Delete(cctx, ns, metav1.DeleteOptions{})
	})
	gpuNodes, err := clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	runHelm(ctx, t, append([]string{"install", chartRelease, chartDir, "-n", ns, "--create-namespace", "--wait", "--timeout", "3m"}, chartValues()...)...)
	t.Logf("helm install --wait took %s", time.Since(start).Round(time.Millisecond))
	webhookName, extenderName, agentName := chartRelease+"-partita-webhook", chartRelease+"-partita-extender", chartRelease+"-partita-agent"
	schedulerName := chartRelease + "-partita-scheduler"
	waitRunning(ctx, t, ns, "webhook", 2)
	waitRunning(ctx, t, ns, "extender", 1)
	waitRunning(ctx, t, ns, "scheduler", 1)
	waitRunning(ctx, t, ns, "agent", len(gpuNodes.Items))
	if c := containersOf(ctx, t, ns, extenderName); c != "extender" {
		t.Errorf("extender pod containers %q, want the extender alone", c)
	}
	// kube-scheduler runs in its own pod, as its own ServiceAccount.
	if c := containersOf(ctx, t, ns, schedulerName); c != "kube-scheduler" {
		t.Errorf("scheduler pod containers %q, want kube-scheduler", c)
	}
	if d, err := clientset.AppsV1().Deployments(ns).Get(ctx, schedulerName, metav1.GetOptions{}); err != nil || d.Spec.Template.Spec.ServiceAccountName != schedulerName {
		t.Errorf("scheduler Deployment's ServiceAccount: %v, want %s", err, schedulerName)
	}
	ds, err := clientset.AppsV1().DaemonSets(ns).Get(ctx, agentName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ds.Spec.Template.Spec.HostPID {
		t.Errorf("agent has hostPID with enforce=report")
	}
	for _, p := range podsOf(ctx, t, ns, "agent") {
		if !strings.HasPrefix(p.Spec.NodeName, "gpu-node-") && p.Spec.NodeName != "" {
			n, _ := clientset.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
			if n == nil || n.Labels[v1alpha1.LabelGPUNode] != "true" {
				t.Errorf("agent pod %s on %s, not a GPU node", p.Name, p.Spec.NodeName)
			}
		}
	}
	mwc, err := clientset.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, chartRelease+"-partita", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's MutatingWebhookConfiguration: %v", err)
	}
	if got := fmt.Sprint(mwc.Webhooks[0].NamespaceSelector.MatchExpressions[0].Values); got != "[kube-system "+ns+" gpu-operator]" {
		t.Errorf("mutating webhook excludes %s, want kube-system, %s and gpu-operator", got, ns)
	}
	// The admission policies are the chart's too, and select what the
	// webhooks select.
	vap, err := clientset.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, chartRelease+"-partita-pods", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the chart's ValidatingAdmissionPolicy: %v", err)
	}
	if got, want := fmt.Sprint(vap.Spec.MatchConstraints.NamespaceSelector), fmt.Sprint(mwc.Webhooks[0].NamespaceSelector); got != want {
		t.Errorf("validating policy selects %s, the webhook %s", got, want)
	}
	if _, err := clientset.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Get(ctx, chartRelease+"-partita-void", metav1.GetOptions{}); err != nil {
		t.Errorf("the chart's MutatingAdmissionPolicyBinding: %v", err)
	}

	start = time.Now()
	runHelm(ctx, t, append([]string{"upgrade", chartRelease, chartDir, "-n", ns, "--wait", "--timeout", "3m",
		"--set", "webhook.replicas=3", "--set", "scheduler.mode=default", "--set", "agent.enforce=kill"}, chartValues()...)...)
	t.Logf("helm upgrade --wait took %s", time.Since(start).Round(time.Millisecond))
	waitRunning(ctx, t, ns, "webhook", 3)
	waitRunning(ctx, t, ns, "extender", 1)
	waitRunning(ctx, t, ns, "agent", len(gpuNodes.Items))
	if c := containersOf(ctx, t, ns, extenderName); c != "extender" {
		t.Errorf("after scheduler.mode=default the extender pod has containers %q, want the extender alone", c)
	}
	if _, err := clientset.AppsV1().Deployments(ns).Get(ctx, schedulerName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the scheduler's Deployment after scheduler.mode=default: %v, want it gone", err)
	}
	waitRunning(ctx, t, ns, "scheduler", 0)
	if ds, err = clientset.AppsV1().DaemonSets(ns).Get(ctx, agentName, metav1.GetOptions{}); err != nil || !ds.Spec.Template.Spec.HostPID {
		t.Errorf("agent hostPID after enforce=kill: %v (%v)", ds != nil && ds.Spec.Template.Spec.HostPID, err)
	}
	if _, err := clientset.CoreV1().ServiceAccounts(ns).Get(ctx, chartRelease+"-partita-scheduler", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the scheduler's ServiceAccount after scheduler.mode=default: %v, want it gone", err)
	}
	if _, err := clientset.AppsV1().Deployments(ns).Get(ctx, webhookName, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}

	runHelm(ctx, t, "uninstall", chartRelease, "-n", ns, "--wait", "--timeout", "2m")
	assertNothingLeft(ctx, t, ns)
}

func podsOf(ctx context.Context, t *testing.T, ns, component string) []corev1.Pod {
	t.Helper()
	pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + chartRelease + ",app.kubernetes.io/component=" + component})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// waitRunning waits until the component has exactly want pods, all Running
// and none terminating (a rollout has finished).
func waitRunning(ctx context.Context, t *testing.T, ns, component string, want int) {
	t.Helper()
	poll(t, 2*time.Minute, fmt.Sprintf("%d %s pods Running", want, component), func() (bool, string) {
		pods := podsOf(ctx, t, ns, component)
		var states []string
		running := 0
		for _, p := range pods {
			states = append(states, fmt.Sprintf("%s %s on %q", p.Name, p.Status.Phase, p.Spec.NodeName))
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running++
			}
		}
		return running == want && len(pods) == want, strings.Join(states, "; ")
	})
}

func containersOf(ctx context.Context, t *testing.T, ns, deployment string) string {
	t.Helper()
	d, err := clientset.AppsV1().Deployments(ns).Get(ctx, deployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range d.Spec.Template.Spec.Containers {
		names = append(names, c.Name)
	}
	return strings.Join(names, ",")
}

// assertNothingLeft: after helm uninstall only the CRDs (and the namespace
// with what Kubernetes itself puts in every namespace) remain.
func assertNothingLeft(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	instance := "app.kubernetes.io/instance=" + chartRelease
	kinds := map[schema.GroupVersionResource]bool{ // true: namespaced
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}:                         false,
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}:                  false,
		{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingwebhookconfigurations"}:     false,
		{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}:   false,
		{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}:       false,
		{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicybindings"}: false,
		{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicies"}:         false,
		{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "mutatingadmissionpolicybindings"}:   false,
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "rolebindings"}:                         true,
		{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "roles"}:                                true,
		{Group: "apps", Version: "v1", Resource: "deployments"}:                                               true,
		{Group: "apps", Version: "v1", Resource: "daemonsets"}:                                                true,
		{Group: "", Version: "v1", Resource: "services"}:                                                      true,
		{Group: "", Version: "v1", Resource: "configmaps"}:                                                    true,
		{Group: "", Version: "v1", Resource: "secrets"}:                                                       true,
		{Group: "", Version: "v1", Resource: "serviceaccounts"}:                                               true,
		{Group: "policy", Version: "v1", Resource: "poddisruptionbudgets"}:                                    true,
		{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}:                                     true,
	}
	poll(t, 90*time.Second, "nothing of the release left", func() (bool, string) {
		var left []string
		for gvr, namespaced := range kinds {
			var list *unstructured.UnstructuredList
			var err error
			if namespaced {
				// All namespaces: the scheduler's RoleBinding lives in kube-system.
				list, err = dyn.Resource(gvr).Namespace(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: instance})
			} else {
				list, err = dyn.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: instance})
			}
			if err != nil {
				return false, err.Error()
			}
			for _, o := range list.Items {
				left = append(left, gvr.Resource+" "+o.GetNamespace()+"/"+o.GetName())
			}
		}
		// Unlabelled leftovers in the namespace: anything but Kubernetes' own.
		pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods.Items {
			left = append(left, "pod "+p.Name)
		}
		cms, err := clientset.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cm := range cms.Items {
			if cm.Name != "kube-root-ca.crt" {
				left = append(left, "configmap "+cm.Name)
			}
		}
		secrets, err := clientset.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, s := range secrets.Items {
			left = append(left, "secret "+s.Name)
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
	for _, crd := range []string{"queues.partita.dev", "podgroups.partita.dev", "gpunodes.partita.dev"} {
		if _, err := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}).
			Get(ctx, crd, metav1.GetOptions{}); err != nil {
			t.Errorf("CRD %s after uninstall: %v (helm keeps CRDs)", crd, err)
		}
	}
}
