package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/console"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/helm"
	"github.com/partita-dev/partita/internal/browser"
	"github.com/partita-dev/partita/report"
)

// EnvScreenshots names the directory the console tests save their
// screenshots in (default: a new temporary directory, printed).
const envScreenshots = "PARTITA_E2E_SCREENSHOTS"

// screenshotDir is where this run's screenshots go; the test prints it so
// a person can look at them before they go into the docs.
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv(envScreenshots)
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "partita-console-screenshots-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("console screenshots in %s", dir)
	return dir
}

// runConsole starts `partita console` with args and returns the URL it
// printed on its first line; the console stops when the test ends, and
// its log is printed if the test failed.
func runConsole(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, partitaBin, append([]string{"console"}, args...)...)
	var logs safeBuffer
	cmd.Stderr = &logs
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("partita console %s log:\n%s", strings.Join(args, " "), logs.String())
		}
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case url, ok := <-lines:
		if !ok {
			t.Fatalf("partita console exited without a URL:\n%s", logs.String())
		}
		return url
	case <-time.After(90 * time.Second):
		t.Fatalf("partita console printed no URL within 90s:\n%s", logs.String())
	}
	return ""
}

type safeBuffer struct {
	lock sync.Mutex
	buf  bytes.Buffer
}

func (b *safeBuffer) Write(p []byte) (int, error) {
	b.lock.Lock()
	defer b.lock.Unlock()
	return b.buf.Write(p)
}

func (b *safeBuffer) String() string {
	b.lock.Lock()
	defer b.lock.Unlock()
	return b.buf.String()
}

// startBrowser starts headless Chromium for the test.
func startBrowser(t *testing.T) *browser.Browser {
	t.Helper()
	b, err := browser.Start(t.Context(), browser.Options{Width: 1500, Height: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// page runs chromedp steps with a timeout, failing the test with what the
// page shows when they do not finish.
func page(t *testing.T, b *browser.Browser, d time.Duration, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatalf("%s: %v; the page shows:\n%s", what, err, pageText(b))
	}
}

func pageText(b *browser.Browser) string {
	ctx, cancel := context.WithTimeout(b.Ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText.slice(0, 3000) : ""`))
	if err != nil {
		return "(cannot read the page: " + err.Error() + ")"
	}
	return s
}

func eval[T any](t *testing.T, b *browser.Browser, expr string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, opts...))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript predicate in the page.
func waitFor(t *testing.T, b *browser.Browser, d time.Duration, what, predicate string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, d+5*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](predicate, chromedp.WithPollingTimeout(d), chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
		t.Fatalf("%s: %v; the page shows:\n%s", what, err, pageText(b))
	}
}

func shot(t *testing.T, b *browser.Browser, dir, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, 30*time.Second)
	defer cancel()
	if err := b.Screenshot(ctx, filepath.Join(dir, name+".png")); err != nil {
		t.Errorf("screenshot %s: %v", name, err)
	}
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// deviceIndex is the index on its node of the device a pod holds.
func deviceIndex(ctx context.Context, t *testing.T, c client.Client, p *corev1.Pod) int32 {
	t.Helper()
	uuids := devicesOf(p)
	if len(uuids) == 0 {
		t.Fatalf("pod %s holds no device", p.Name)
	}
	var gn v1alpha1.GPUNode
	if err := c.Get(ctx, client.ObjectKey{Name: p.Spec.NodeName}, &gn); err != nil {
		t.Fatal(err)
	}
	for _, d := range gn.Status.Devices {
		if d.UUID == uuids[0] {
			return d.Index
		}
	}
	t.Fatalf("pod %s holds %s, which %s does not have", p.Name, uuids[0], p.Spec.NodeName)
	return -1
}

// userKubeconfig writes a kubeconfig for the cluster that authenticates
// with a token of ServiceAccount ns/sa.
func userKubeconfig(ctx context.Context, t *testing.T, ns, sa string) (path, token string) {
	t.Helper()
	tr, err := clientset.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, sa, err)
	}
	admin, err := clientcmd.LoadFromFile(cluster.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	kctx := admin.Contexts[admin.CurrentContext]
	kc := clientcmdapi.NewConfig()
	kc.Clusters["dev"] = admin.Clusters[kctx.Cluster].DeepCopy()
	kc.AuthInfos[sa] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts[sa] = &clientcmdapi.Context{Cluster: "dev", AuthInfo: sa, Namespace: ns}
	kc.CurrentContext = sa
	path = filepath.Join(t.TempDir(), sa+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path, tr.Status.Token
}

// researcher makes an ordinary user: ServiceAccount "researcher" in its own
// namespace, with the view role there and read access to GPUNodes and
// Queues, nothing more.
func researcher(ctx context.Context, t *testing.T) (ns, kubeconfig, token string) {
	t.Helper()
	ns = extNamespace(ctx, t, clientset)
	c := crClient(t)
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "researcher"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-gpu-reader-" + ns}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"gpunodes", "queues"}, Verbs: []string{"get", "list", "watch"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-gpu-reader-" + ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "e2e-gpu-reader-" + ns},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "researcher"}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "researcher"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: "researcher"}}},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
		t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), o) })
	}
	kubeconfig, token = userKubeconfig(ctx, t, ns, "researcher")
	return ns, kubeconfig, token
}

// TestConsole runs `partita console` on the shared cluster as a user does
// and reads it in headless Chromium: every pod on its device on the map, a
// pod created later showing without a reload, a waiting pod's verdict
// equal to `kubectl partita why`'s, a queue edited through the form, and a
// user without rights to a namespace seeing none of its workloads and no
// edit buttons. It saves screenshots for the docs.
func TestConsole(t *testing.T) {
	ctx := testContext(t, 10*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	ns := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	c := crClient(t)
	queue := "console-" + ns
	createQueue(ctx, t, gpuQueue(queue, ns, "4", "8", 1))
	dir := screenshotDir(t)

	// The demo's shapes: notebooks that share GPUs, a whole GPU, and a pod
	// that can never fit (16 GPUs, when a node has 8).
	var pods []*corev1.Pod
	for i, milli := range []int64{500, 250, 250, 500} {
		p := extGPUPod(ns, fmt.Sprintf("notebook-%d", i), milli, 1, gpuNodes)
		p.Labels[v1alpha1.LabelQueue] = queue
		pods = append(pods, p)
	}
	whole := extGPUPod(ns, "trainer", 1000, 1, gpuNodes)
	whole.Labels[v1alpha1.LabelQueue] = queue
	pods = append(pods, whole, extGPUPod(ns, "too-big", 1000, 2*e2eGPUsPerNode, gpuNodes))
	createPods(ctx, t, clientset, pods, 3)
	bound := waitPods(ctx, t, ns, 2*time.Minute, "five pods bound and too-big held", func(ps []corev1.Pod) (bool, string) {
		n := 0
		held := false
		for _, p := range ps {
			if p.Spec.NodeName != "" && len(devicesOf(&p)) > 0 {
				n++
			}
			if c := admissionCondition(&p); p.Name == "too-big" && c != nil && c.Reason == v1alpha1.ReasonWaitingForCapacity {
				held = true
			}
		}
		return n == 5 && held, fmt.Sprintf("%d bound, too-big held %v", n, held)
	})

	url := runConsole(t, "--kubeconfig", cluster.KubeconfigPath())
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.Contains(url, "/#token=") {
		t.Fatalf("first line %q: want http://127.0.0.1:<port>/#token=...", url)
	}
	base := strings.SplitN(url, "#", 2)[0]
	b := startBrowser(t)

	t.Run("the map shows every pod on its devices", func(t *testing.T) {
		page(t, b, time.Minute, "open the map", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(".node")))
		for i := range bound {
			p := &bound[i]
			if p.Spec.NodeName == "" {
				continue
			}
			idx := deviceIndex(ctx, t, c, p)
			sel := fmt.Sprintf(`.gpu[data-node=%s][data-gpu="%d"] .slice[data-pod=%s]`, jsString(p.Spec.NodeName), idx, jsString(ns+"/"+p.Name))
			waitFor(t, b, 30*time.Second, fmt.Sprintf("pod %s on %s GPU %d", p.Name, p.Spec.NodeName, idx), fmt.Sprintf("document.querySelector(%s) !== null", jsString(sel)))
		}
		if n := eval[int](t, b, `document.querySelectorAll(".gpu").length`); n != e2eNodes*e2eGPUsPerNode {
			t.Errorf("the map has %d GPU cells, want %d", n, e2eNodes*e2eGPUsPerNode)
		}
		t.Logf("first render %.0f ms after navigation", eval[float64](t, b, `window.__partita.firstRender`))
		shot(t, b, dir, "map")
	})

	t.Run("a pod created after the page loaded appears without a reload", func(t *testing.T) {
		eval[bool](t, b, `window.__noReload = true`)
		late := extGPUPod(ns, "late", 250, 1, gpuNodes)
		late.Labels[v1alpha1.LabelQueue] = queue
		start := time.Now()
		createPods(ctx, t, clientset, []*corev1.Pod{late}, 1)
		waitFor(t, b, time.Minute, "team's late pod on the map", fmt.Sprintf(`document.querySelector('.slice[data-pod=%s]') !== null`, jsString(ns+"/late")))
		t.Logf("the late pod showed %.1fs after it was created", time.Since(start).Seconds())
		if !eval[bool](t, b, `window.__noReload === true`) {
			t.Errorf("the page reloaded")
		}
		ps := waitPods(ctx, t, ns, time.Minute, "late bound", func(ps []corev1.Pod) (bool, string) {
			for _, p := range ps {
				if p.Name == "late" && len(devicesOf(&p)) > 0 {
					return true, ""
				}
			}
			return false, "late not bound"
		})
		for i := range ps {
			if p := &ps[i]; p.Name == "late" {
				sel := fmt.Sprintf(`.gpu[data-node=%s][data-gpu="%d"] .slice[data-pod=%s]`, jsString(p.Spec.NodeName), deviceIndex(ctx, t, c, p), jsString(ns+"/late"))
				waitFor(t, b, 10*time.Second, "late on its device", fmt.Sprintf("document.querySelector(%s) !== null", jsString(sel)))
			}
		}
	})

	t.Run("a waiting pod's page gives the same reason as why", func(t *testing.T) {
		out, err := partita(ctx, "ctl", "why", "too-big", "-n", ns, "-o", "json", "--kubeconfig", cluster.KubeconfigPath())
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		var want report.WhyReport
		if err := json.Unmarshal([]byte(out), &want); err != nil {
			t.Fatalf("decode why: %v\n%s", err, out)
		}
		page(t, b, time.Minute, "open the pod's page", chromedp.Navigate(base+"pods/"+ns+"/too-big"), chromedp.WaitVisible(chromedp.ID("why-summary")))
		if got := eval[string](t, b, `document.getElementById("why-summary").textContent`); got != want.Summary {
			t.Errorf("the page says\n  %s\nkubectl partita why says\n  %s", got, want.Summary)
		}
		shot(t, b, dir, "why")
		page(t, b, time.Minute, "open the workloads", chromedp.Navigate(base+"workloads"), chromedp.WaitVisible(chromedp.ID("workloads")))
		row := fmt.Sprintf(`document.querySelector('tr[data-workload=%s] .verdict')`, jsString("Pod/"+ns+"/too-big"))
		if got := eval[string](t, b, row+`.textContent`); got != want.Summary {
			t.Errorf("the workload list says\n  %s\nkubectl partita why says\n  %s", got, want.Summary)
		}
		shot(t, b, dir, "workloads")
	})

	t.Run("editing a queue's quota through the form changes the Queue object", func(t *testing.T) {
		row := fmt.Sprintf(`tr[data-queue=%s]`, jsString(queue))
		page(t, b, time.Minute, "open the queues", chromedp.Navigate(base+"queues"), chromedp.WaitVisible(chromedp.CSS(row+` [data-action="edit"]`)))
		shot(t, b, dir, "queues")
		page(t, b, 30*time.Second, "edit the quota",
			chromedp.Click(chromedp.CSS(row+` [data-action="edit"]`)),
			chromedp.WaitVisible(chromedp.CSS(`dialog[open] input[name="gpu.quota"]`)),
			chromedp.SetValue(chromedp.CSS(`dialog[open] input[name="gpu.quota"]`), "6"))
		shot(t, b, dir, "queue-edit")
		page(t, b, 30*time.Second, "save", chromedp.Click(chromedp.ID("queue-save")))
		poll(t, 30*time.Second, "the queue's GPU quota to be 6", func() (bool, string) {
			var q v1alpha1.Queue
			if err := c.Get(ctx, client.ObjectKey{Name: queue}, &q); err != nil {
				return false, err.Error()
			}
			got := q.Spec.Resources.GPU.Quota.String()
			return got == "6", "quota " + got + "; the page shows: " + pageText(b)
		})
		waitFor(t, b, 30*time.Second, "the table shows the new quota", fmt.Sprintf(`(document.querySelector(%s) || {}).textContent === "6"`, jsString(row+` td[data-field="quota"]`)))
	})

	t.Run("utilisation and policy", func(t *testing.T) {
		page(t, b, time.Minute, "open utilisation", chromedp.Navigate(base+"utilization"), chromedp.WaitVisible(chromedp.CSS("#chart-share canvas, #chart-share p")))
		shot(t, b, dir, "utilization")
		page(t, b, time.Minute, "open policy", chromedp.Navigate(base+"policy"), chromedp.WaitVisible(chromedp.ID("policy-version")))
		if v := eval[string](t, b, `document.getElementById("policy-version").textContent`); len(v) != 12 {
			t.Errorf("policy version %q, want the 12-digit digest", v)
		}
		shot(t, b, dir, "policy")
	})

	t.Run("models: where each is held, and its progress", func(t *testing.T) {
		m := &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "llama"},
			Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{URI: "s3://models/llama-3-8b"}}}
		if err := c.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "Model",
			"metadata": map[string]any{"name": "llama", "namespace": ns},
			"status": map[string]any{"nodes": []any{map[string]any{"name": "node-x", "phase": "Fetching", "bytes": int64(4 << 30), "total": int64(16 << 30),
				"message": "waiting for model llama on node-x: 25%"}}},
		}}
		//nolint:staticcheck // as the node's model cache applies it
		if err := c.Status().Patch(ctx, u, client.Apply, client.FieldOwner("partita-model-cache/node-x"), client.ForceOwnership); err != nil {
			t.Fatal(err)
		}
		row := fmt.Sprintf(`tr[data-model="%s/llama"]`, ns)
		page(t, b, time.Minute, "open models", chromedp.Navigate(base+"models"), chromedp.WaitVisible(chromedp.ID("models")))
		waitFor(t, b, 30*time.Second, "the model's row and its node's progress", fmt.Sprintf(
			`!!document.querySelector(%s) && (document.getElementById(%s) || {textContent: ""}).textContent.includes("4Gi of 16Gi (25%%)")`,
			jsString(row), jsString("model-"+ns+"-llama")))
		shot(t, b, dir, "models")
	})

	t.Run("a user without rights to a namespace sees none of its workloads and gets no edit buttons", func(t *testing.T) {
		own, kubeconfig, _ := researcher(ctx, t)
		// Gone before the next test counts the cluster's GPUs: a
		// namespace's deletion leaves its pods for a while.
		t.Cleanup(func() { deletePods(ctx, t, own) })
		mine := extGPUPod(own, "mine", 250, 1, gpuNodes)
		createPods(ctx, t, clientset, []*corev1.Pod{mine}, 1)
		url := runConsole(t, "--kubeconfig", kubeconfig)
		ubase := strings.SplitN(url, "#", 2)[0]
		page(t, b, time.Minute, "open the map as the researcher", chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS(".node")))
		waitFor(t, b, time.Minute, "the researcher's own pod on the map", fmt.Sprintf(`document.querySelector('.slice[data-pod=%s]') !== null`, jsString(own+"/mine")))
		if n := eval[int](t, b, fmt.Sprintf(`document.querySelectorAll('.slice[data-pod^=%s]').length`, jsString(ns+"/"))); n != 0 {
			t.Errorf("the researcher's map names %d slices of %s", n, ns)
		}
		if n := eval[int](t, b, `document.querySelectorAll('.slice.hidden').length`); n == 0 {
			t.Errorf("the researcher's map shows no hidden slices, but %s's pods hold GPUs", ns)
		}
		if strings.Contains(eval[string](t, b, `document.body.innerHTML`), ns+"/") {
			t.Errorf("the researcher's page names %s", ns)
		}
		shot(t, b, dir, "map-researcher")
		page(t, b, time.Minute, "open the workloads as the researcher", chromedp.Navigate(ubase+"workloads"), chromedp.WaitVisible(chromedp.ID("workloads")))
		if n := eval[int](t, b, fmt.Sprintf(`document.querySelectorAll('tr[data-namespace=%s]').length`, jsString(ns))); n != 0 {
			t.Errorf("the researcher sees %d workloads of %s", n, ns)
		}
		if n := eval[int](t, b, fmt.Sprintf(`document.querySelectorAll('tr[data-namespace=%s]').length`, jsString(own))); n != 1 {
			t.Errorf("the researcher sees %d of their own workloads, want 1", n)
		}
		page(t, b, time.Minute, "open the queues as the researcher", chromedp.Navigate(ubase+"queues"), chromedp.WaitVisible(chromedp.ID("queues")))
		if n := eval[int](t, b, `document.querySelectorAll('[data-action="edit"], #new-queue').length`); n != 0 {
			t.Errorf("the researcher gets %d queue edit buttons", n)
		}
		// The API refuses the edit anyway, in the API server's words.
		status := eval[string](t, b, fmt.Sprintf(`(async () => {
			const r = await fetch("/api/v1/queues/%s", {method: "PATCH", headers: {"Content-Type": "application/json", Authorization: "Bearer " + localStorage.getItem("partita-console-token")}, body: JSON.stringify({resources: {gpu: {quota: "1"}}})});
			return r.status + " " + (await r.text());
		})()`, queue), chromedp.EvalAwaitPromise)
		if !strings.HasPrefix(status, "403 ") || !strings.Contains(status, "cannot patch resource") {
			t.Errorf("the researcher's queue edit: %s, want 403 from the API server", status)
		}
		shot(t, b, dir, "queues-researcher")
	})
}

// TestConsoleShared runs the console as the chart does (--mode shared)
// with the chart's own RBAC for its ServiceAccount: callers are known by
// their bearer tokens, see only their namespaces, and every write is made
// as them, so a write the console's own account could not make succeeds
// for a caller who may make it, and one the caller may not is refused.
func TestConsoleShared(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	rbac, err := helm.Template(ctx, helm.TemplateOptions{
		Helm: filepath.Join(devcluster.CacheDir(), "bin", "k8s-"+devcluster.K8sVersion, "helm"), Release: devcluster.ChartRelease,
		Namespace: devcluster.PartitaNamespace, KubeVersion: devcluster.K8sVersion,
		Args: []string{"--show-only", "templates/console-rbac.yaml", "--set", "console.enabled=true", "--set", devcluster.ShowOnlyClientAuth},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := devcluster.Apply(ctx, cfg, rbac); err != nil {
		t.Fatalf("apply the chart's console RBAC: %v", err)
	}
	c := crClient(t)
	t.Cleanup(func() {
		for _, o := range []client.Object{
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "partita-console"}},
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "partita-console"}},
		} {
			_ = c.Delete(context.WithoutCancel(ctx), o)
		}
	})
	t.Run("the console's own account reads and reviews, and writes nothing itself", func(t *testing.T) {
		ns := devcluster.PartitaNamespace
		for _, a := range []access{
			{verb: "list", resource: "pods"}, {verb: "watch", group: "partita.dev", resource: "queues"},
			{verb: "list", group: "batch", resource: "jobs"}, {verb: "list", resource: "events", namespace: "default"},
			{verb: "create", group: "authentication.k8s.io", resource: "tokenreviews"},
			{verb: "create", group: "authorization.k8s.io", resource: "subjectaccessreviews"},
			{verb: "impersonate", resource: "users"}, {verb: "impersonate", resource: "groups"},
			{verb: "list", resource: "configmaps", namespace: ns},
		} {
			if !allowed(ctx, t, "partita-console", a) {
				t.Errorf("partita-console may not %s", a)
			}
		}
		for _, a := range []access{
			{verb: "patch", group: "partita.dev", resource: "queues"}, {verb: "create", resource: "pods", namespace: "default"},
			{verb: "delete", resource: "pods", namespace: "default"}, {verb: "patch", group: "batch", resource: "jobs", namespace: "default"},
			{verb: "get", resource: "secrets", namespace: ns}, {verb: "list", resource: "secrets"},
			{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: ns, name: "partita-extender"},
		} {
			if allowed(ctx, t, "partita-console", a) {
				t.Errorf("partita-console may %s; only the callers it impersonates should", a)
			}
		}
	})
	consoleKC, _ := userKubeconfig(ctx, t, devcluster.PartitaNamespace, "partita-console")
	url := runConsole(t, "--mode", "shared", "--kubeconfig", consoleKC)
	if !strings.HasPrefix(url, "https://127.0.0.1:") {
		t.Fatalf("first line %q, want https://127.0.0.1:<port>/", url)
	}

	own, _, researcherToken := researcher(ctx, t)
	ensureGPUPriorityClass(ctx, t, clientset)
	other := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, own); deletePods(ctx, t, other) })
	createPods(ctx, t, clientset, []*corev1.Pod{extGPUPod(own, "mine", 250, 1, gpuNodes), extGPUPod(other, "theirs", 250, 1, gpuNodes)}, 2)
	queue := "shared-" + own
	createQueue(ctx, t, gpuQueue(queue, own, "2", "4", 1))

	// A queue admin: may change queues, which the console's own account may
	// not, so only impersonation makes the edit work.
	if err := c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: own, Name: "queue-admin"}}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []client.Object{
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-queue-admin-" + own}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"queues", "gpunodes"}, Verbs: []string{"get", "list", "watch", "patch"}}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-queue-admin-" + own},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "e2e-queue-admin-" + own},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: own, Name: "queue-admin"}}},
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.WithoutCancel(ctx), o) })
	}
	_, adminToken := userKubeconfig(ctx, t, own, "queue-admin")

	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the console's self-signed certificate, on loopback
	do := func(method, path, token string, body any) (int, []byte) {
		t.Helper()
		var r io.Reader
		if body != nil {
			data, _ := json.Marshal(body)
			r = bytes.NewReader(data)
		}
		req, _ := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(url, "/")+path, r)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, data
	}

	t.Run("a request without a token is refused", func(t *testing.T) {
		if code, body := do("GET", "/api/v1/map", "", nil); code != http.StatusUnauthorized {
			t.Errorf("no token: %d %s", code, body)
		}
	})
	t.Run("the researcher sees their namespace only", func(t *testing.T) {
		poll(t, 30*time.Second, "the researcher's workload", func() (bool, string) {
			code, body := do("GET", "/api/v1/workloads", researcherToken, nil)
			var wl console.WorkloadsView
			_ = json.Unmarshal(body, &wl)
			var names []string
			for _, w := range wl.Workloads {
				names = append(names, w.Namespace+"/"+w.Name)
				if w.Namespace != own {
					t.Fatalf("the researcher sees %s/%s", w.Namespace, w.Name)
				}
			}
			return code == http.StatusOK && len(wl.Workloads) == 1, fmt.Sprintf("%d %v", code, names)
		})
		_, body := do("GET", "/api/v1/map", researcherToken, nil)
		if strings.Contains(string(body), other) {
			t.Errorf("the researcher's map names %s", other)
		}
	})
	t.Run("writes are the caller's: the researcher is refused, the queue admin is not", func(t *testing.T) {
		edit := map[string]any{"resources": map[string]any{"gpu": map[string]any{"quota": "3"}}}
		code, body := do("PATCH", "/api/v1/queues/"+queue, researcherToken, edit)
		if code != http.StatusForbidden || !strings.Contains(string(body), "system:serviceaccount:"+own+":researcher") {
			t.Errorf("the researcher's edit: %d %s, want 403 naming the researcher", code, body)
		}
		code, body = do("PATCH", "/api/v1/queues/"+queue, adminToken, edit)
		if code != http.StatusOK {
			t.Fatalf("the queue admin's edit: %d %s", code, body)
		}
		var q v1alpha1.Queue
		if err := c.Get(ctx, client.ObjectKey{Name: queue}, &q); err != nil {
			t.Fatal(err)
		}
		if got := q.Spec.Resources.GPU.Quota.String(); got != "3" {
			t.Errorf("quota after the queue admin's edit: %s, want 3", got)
		}
		code, body = do("POST", "/api/v1/workloads", researcherToken, map[string]any{"namespace": other, "image": "pause", "gpuFraction": "0.25"})
		if code != http.StatusForbidden {
			t.Errorf("the researcher submits in %s: %d %s, want 403", other, code, body)
		}
	})
	t.Run("the policy needs read access to Partita's namespace", func(t *testing.T) {
		code, body := do("GET", "/api/v1/policy", adminToken, nil)
		// The queue admin may not list ConfigMaps in Partita's namespace.
		if code != http.StatusForbidden {
			t.Errorf("policy for the queue admin: %d %s, want 403", code, body)
		}
	})
}
