package realnode

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/nodeagent/interposer"
	"github.com/partita-dev/partita/webhook"
)

// The tests run in this order; the last ones uninstall the chart and stop
// the cluster.

const (
	ns        = devcluster.PartitaNamespace
	release   = devcluster.ChartRelease
	sampleRef = "localhost/partita/sample:dev"
)

// TestRealNodeJoined: the real node is a real kubelet and containerd of the
// cluster's release, beside the kwok nodes, and the API server reaches it
// (logs, exec) while pods reach the API server and CoreDNS.
func TestRealNodeJoined(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 3*time.Minute)
	node, err := clientset.CoreV1().Nodes().Get(ctx, realnode.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := node.Status.NodeInfo
	if info.KubeletVersion != devcluster.K8sVersion || !strings.HasPrefix(info.ContainerRuntimeVersion, "containerd://2.") {
		t.Errorf("kubelet %q, runtime %q; want %s and containerd 2", info.KubeletVersion, info.ContainerRuntimeVersion, devcluster.K8sVersion)
	}
	if node.Labels[v1alpha1.LabelGPUNode] != "true" || node.Annotations["kwok.x-k8s.io/node"] != "" {
		t.Errorf("real node labels %v, annotations %v: want a GPU node that kwok does not manage", node.Labels, node.Annotations)
	}
	kwokNodes, err := clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: devcluster.SimulatedNodeSelector})
	if err != nil || len(kwokNodes.Items) != simulatedNodes {
		t.Fatalf("simulated nodes: %v (%v), want %d beside the real one", kwokNodes, err, simulatedNodes)
	}
	// The server reports the release too (kubectl version).
	v, err := clientset.Discovery().ServerVersion()
	if err != nil || v.GitVersion != devcluster.K8sVersion {
		t.Errorf("server version %v (%v), want %s", v, err, devcluster.K8sVersion)
	}

	pod := samplePod("joined", nil)
	pod.Spec.Containers[0].Args = []string{"--lookup", "kubernetes.default.svc." + realnode.ClusterDomain}
	pod = createPod(ctx, t, "default", pod)
	waitRunning(ctx, t, pod)
	logs := waitLogLine(ctx, t, pod, "lookup ")
	if want := "lookup kubernetes.default.svc.cluster.local: " + realnode.APIServiceIP; !strings.Contains(logs, want) {
		t.Errorf("the pod's DNS: want %q in its log:\n%s", want, logs)
	}
	if !strings.Contains(logs, "KUBERNETES_SERVICE_HOST="+realnode.APIServiceIP) {
		t.Errorf("the pod's env lacks the kubernetes Service:\n%s", logs)
	}
	// exec goes API server -> kubelet -> containerd.
	out := kubectl(ctx, t, "exec", "-n", "default", pod.Name, "--", "/sample", "--exit")
	if !strings.Contains(out, "HOSTNAME="+pod.Name) {
		t.Errorf("kubectl exec printed:\n%s", out)
	}
}

// TestRealNodeChartInstalled: `dev up --mode chart` installed the release
// as docs/install.md does, every component runs on the real node, and the
// chart's kube-scheduler runs as its own ServiceAccount and leads.
func TestRealNodeChartInstalled(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 3*time.Minute)
	if out := helm(ctx, t, "status", release, "-n", ns); !strings.Contains(out, "STATUS: deployed") {
		t.Errorf("helm status:\n%s", out)
	}
	// interposer: dev up installs the preload test library (an image
	// volume of localhost/partita/interposer-test:dev).
	want := map[string]int{"webhook": 2, "extender": 1, "scheduler": 1, "agent": 1, "interposer": 1}
	for component, n := range want {
		pods := waitComponent(ctx, t, component, n)
		for _, p := range pods {
			if p.Spec.NodeName != realnode.NodeName {
				t.Errorf("%s pod %s on %q, want %s", component, p.Name, p.Spec.NodeName, realnode.NodeName)
			}
		}
	}
	sched := waitComponent(ctx, t, "scheduler", 1)[0]
	if sched.Spec.ServiceAccountName != release+"-scheduler" {
		t.Errorf("kube-scheduler runs as %q, want %s-scheduler", sched.Spec.ServiceAccountName, release)
	}
	waitLeader(ctx, t, release+"-scheduler", sched.Name)
	ext := waitComponent(ctx, t, "extender", 1)[0]
	waitLeader(ctx, t, "partita-extender", ext.Name)
	// The real node's GPUs come from the chart's agent (agent.simulate).
	poll(t, time.Minute, "GPUNode "+realnode.NodeName+" with the simulated devices", func() (bool, string) {
		var gn v1alpha1.GPUNode
		if err := getJSON(ctx, "/apis/partita.dev/v1alpha1/gpunodes/"+realnode.NodeName, &gn); err != nil {
			return false, err.Error()
		}
		return len(gn.Status.Devices) == gpusPerNode, fmt.Sprintf("%d devices", len(gn.Status.Devices))
	})
}

// TestRealNodeGPUPodSeesItsDevices: a GPU pod goes through the chart's
// webhook, its kube-scheduler and its extender's bind to the real node,
// and its container is given exactly the devices on its
// partita.dev/devices.<container> annotation.
func TestRealNodeGPUPodSeesItsDevices(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 3*time.Minute)
	cases := map[string]*corev1.Pod{
		"half a GPU": samplePod("half", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}),
		"two whole GPUs": func() *corev1.Pod {
			p := samplePod("two", nil)
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("2")}
			return p
		}(),
	}
	for name, pod := range cases {
		t.Run(name, func(t *testing.T) {
			checkGPUPod(ctx, t, createPod(ctx, t, "default", pod))
		})
	}
}

// checkGPUPod waits until the pod runs on the real node through Partita's
// scheduler and checks the device env its container printed.
func checkGPUPod(ctx context.Context, t *testing.T, pod *corev1.Pod) {
	t.Helper()
	pod = waitRunning(ctx, t, pod)
	if pod.Spec.SchedulerName != "partita" {
		t.Errorf("schedulerName %q, want partita (the webhook sends GPU pods to the chart's scheduler)", pod.Spec.SchedulerName)
	}
	if pod.Spec.NodeName != realnode.NodeName {
		t.Fatalf("pod on %q, want %s", pod.Spec.NodeName, realnode.NodeName)
	}
	c := pod.Spec.Containers[0].Name
	devices := pod.Annotations[v1alpha1.AnnotationDevicesPrefix+c]
	if devices == "" {
		t.Fatalf("no %s%s annotation: the extender did not bind it; annotations %v", v1alpha1.AnnotationDevicesPrefix, c, pod.Annotations)
	}
	logs := waitLogLine(ctx, t, pod, "NVIDIA_VISIBLE_DEVICES=")
	if got := envFromLog(logs, "NVIDIA_VISIBLE_DEVICES"); got != devices {
		t.Errorf("container %s got NVIDIA_VISIBLE_DEVICES=%q, its annotation says %q; log:\n%s", c, got, devices, logs)
	}
}

// TestRealNodeNRISetsTheSliceEnv: the real node's containerd serves NRI
// and the chart's agent is its plugin, so the GPUNode says the container
// path is nri, the agent adjusted the slice's container at creation, and
// the env the container started with is the allocation's (the pod spec
// cannot carry hostile device env: the webhook refuses it, so this checks
// the values, not an override).
func TestRealNodeNRISetsTheSliceEnv(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 3*time.Minute)
	poll(t, time.Minute, "GPUNode "+realnode.NodeName+" status.enforcement.containerPath nri", func() (bool, string) {
		path := kubectl(ctx, t, "get", "gpunode", realnode.NodeName, "-o", "jsonpath={.status.enforcement.containerPath}")
		return path == string(v1alpha1.ContainerPathNRI), "containerPath " + path
	})
	if mc := kubectl(ctx, t, "get", "gpunode", realnode.NodeName, "-o", "jsonpath={.status.enforcement.memoryCap}"); mc == "" {
		t.Errorf("GPUNode %s has no status.enforcement.memoryCap", realnode.NodeName)
	}

	pod := createPod(ctx, t, "default", samplePod("nri", map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"}))
	pod = waitRunning(ctx, t, pod)
	c := pod.Spec.Containers[0].Name
	devices := pod.Annotations[v1alpha1.AnnotationDevicesPrefix+c]
	if devices == "" {
		t.Fatalf("no %s%s annotation: the extender did not bind it", v1alpha1.AnnotationDevicesPrefix, c)
	}
	logs := waitLogLine(ctx, t, pod, "NVIDIA_VISIBLE_DEVICES=")
	if got := envFromLog(logs, "NVIDIA_VISIBLE_DEVICES"); got != devices {
		t.Errorf("container %s started with NVIDIA_VISIBLE_DEVICES=%q, its allocation says %q; log:\n%s", c, got, devices, logs)
	}
	mode := kubectl(ctx, t, "get", "gpunode", realnode.NodeName, "-o", "jsonpath={.status.isolation}")
	if mode == string(v1alpha1.IsolationTimeSlicing) || mode == "" {
		for _, k := range []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT"} {
			if v := envFromLog(logs, k); v != "" {
				t.Errorf("a time-slicing slice started with %s=%q: the NRI plugin removes limit env its mode does not use", k, v)
			}
		}
	}
	// The plugin logs each container it gives devices (agent --v=2).
	poll(t, time.Minute, "the agent's NRI plugin adjusted "+pod.Name, func() (bool, string) {
		agentLogs := kubectl(ctx, t, "-n", ns, "logs", "daemonset/"+release+"-agent", "--tail=-1")
		return strings.Contains(agentLogs, "Set a container's devices") && strings.Contains(agentLogs, pod.Name), "no log line for the pod yet"
	})
}

// TestRealNodeNoGPUPodSeesVoid: a pod that asks for no GPU gets
// NVIDIA_VISIBLE_DEVICES=void and no device annotation.
func TestRealNodeNoGPUPodSeesVoid(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 2*time.Minute)
	pod := waitRunning(ctx, t, createPod(ctx, t, "default", samplePod("void", nil)))
	for k := range pod.Annotations {
		if strings.HasPrefix(k, v1alpha1.AnnotationDevicesPrefix) {
			t.Errorf("a pod without a GPU request has %s", k)
		}
	}
	logs := waitLogLine(ctx, t, pod, "NVIDIA_VISIBLE_DEVICES=")
	if got := envFromLog(logs, "NVIDIA_VISIBLE_DEVICES"); got != "void" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want void; log:\n%s", got, logs)
	}
}

// TestRealNodeGangOnTheChart: the chart's PodGroup webhook refuses a
// PodGroup naming a PriorityClass that does not exist; a gang of two
// that names no queue goes to the chart's default Queue, waits whole
// until its second member exists, then both run on the real node.
func TestRealNodeGangOnTheChart(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 3*time.Minute)
	rc := clientset.Discovery().RESTClient()
	create := func(pg string) error {
		return rc.Post().AbsPath("/apis/partita.dev/v1alpha1/namespaces/default/podgroups").
			SetHeader("Content-Type", "application/json").Body([]byte(pg)).Do(ctx).Error()
	}
	err := create(`{"apiVersion":"partita.dev/v1alpha1","kind":"PodGroup","metadata":{"name":"no-class"},"spec":{"minMember":2,"priorityClassName":"no-such-class"}}`)
	if err == nil || !strings.Contains(err.Error(), `PriorityClass "no-such-class" does not exist`) {
		t.Errorf("a PodGroup naming a missing PriorityClass: %v, want the webhook's refusal", err)
	}
	if err := create(`{"apiVersion":"partita.dev/v1alpha1","kind":"PodGroup","metadata":{"name":"pair"},"spec":{"minMember":2}}`); err != nil {
		t.Fatalf("create PodGroup pair: %v", err)
	}
	t.Cleanup(func() {
		_ = rc.Delete().AbsPath("/apis/partita.dev/v1alpha1/namespaces/default/podgroups/pair").Do(context.WithoutCancel(ctx)).Error()
	})
	member := func(name string) *corev1.Pod {
		p := samplePod(name, map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"})
		p.Labels = map[string]string{v1alpha1.LabelPodGroup: "pair"}
		return p
	}
	first := createPod(ctx, t, "default", member("pair-a"))
	// Alone it is held: a gang starts whole or not at all.
	time.Sleep(3 * time.Second)
	if p, err := clientset.CoreV1().Pods("default").Get(ctx, first.Name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("the gang's first member, alone: node %q (%v), want it held", p.Spec.NodeName, err)
	}
	second := createPod(ctx, t, "default", member("pair-b"))
	for _, p := range []*corev1.Pod{first, second} {
		got := waitRunning(ctx, t, p)
		if got.Spec.NodeName != realnode.NodeName || got.Labels[v1alpha1.LabelQueue] != "default" {
			t.Errorf("member %s on %q in queue %q, want %s and the chart's default queue", got.Name, got.Spec.NodeName, got.Labels[v1alpha1.LabelQueue], realnode.NodeName)
		}
	}
	poll(t, time.Minute, "PodGroup pair Running", func() (bool, string) {
		var pg v1alpha1.PodGroup
		if err := getJSON(ctx, "/apis/partita.dev/v1alpha1/namespaces/default/podgroups/pair", &pg); err != nil {
			return false, err.Error()
		}
		return pg.Status.Phase == v1alpha1.PodGroupRunning, fmt.Sprintf("phase %s, %d running", pg.Status.Phase, pg.Status.Running)
	})
}

// TestRealNodeSchedulerCallsExtenderOverMTLS: the chart's kube-scheduler
// (Deployment partita-scheduler, its own pod) calls the extender's verbs
// over TLS with its client certificate, and nothing else may: a GPU pod
// binds, the extender counts the filter and bind calls and no refusal; a
// request without a certificate, from a pod of another namespace, reaches
// the port (the real node's CNI enforces no NetworkPolicy) and is refused;
// the certificate of the chart's Secret is accepted.
func TestRealNodeSchedulerCallsExtenderOverMTLS(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 4*time.Minute)
	ext := waitComponent(ctx, t, "extender", 1)[0]
	waitLeader(ctx, t, "partita-extender", ext.Name)
	sched := waitComponent(ctx, t, "scheduler", 1)[0]
	// The scheduler's certificate is mounted in its own pod, the
	// extender's pod has only the CA.
	mounted := map[string]string{}
	for _, v := range sched.Spec.Volumes {
		if v.Secret != nil {
			mounted[v.Name] = v.Secret.SecretName
		}
	}
	if mounted["scheduler-client"] != release+"-scheduler-client-cert" {
		t.Errorf("scheduler pod's Secret volumes %v, want scheduler-client from %s-scheduler-client-cert", mounted, release)
	}
	for _, c := range ext.Spec.Containers {
		if c.Name == "kube-scheduler" {
			t.Errorf("the extender's pod runs kube-scheduler too")
		}
	}
	noCert := extenderTLS(ctx, t, nil)
	scrape := func() map[string]float64 {
		status, body := extenderRequest(ctx, t, ext.Status.PodIP, http.MethodGet, "/metrics", noCert)
		if status != http.StatusOK {
			t.Fatalf("the extender's /metrics: %d %s", status, body)
		}
		return metrics(body)
	}
	const (
		filters       = `partita_extender_request_duration_seconds_count{verb="filter"}`
		binds         = `partita_extender_binds_total{result="Bound"}`
		unauthentic   = `partita_extender_unauthenticated_requests_total{reason="Unauthenticated"}`
		forbiddenName = `partita_extender_unauthenticated_requests_total{reason="Forbidden"}`
	)
	before := scrape()
	checkGPUPod(ctx, t, createPod(ctx, t, "default", samplePod("mtls", map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"})))
	after := scrape()
	if after[filters] <= before[filters] || after[binds] <= before[binds] {
		t.Errorf("the extender answered no filter or bind for the pod: filter %v -> %v, bound %v -> %v", before[filters], after[filters], before[binds], after[binds])
	}
	if after[unauthentic] != before[unauthentic] || after[forbiddenName] != before[forbiddenName] {
		t.Errorf("the extender refused calls while the pod was scheduled: unauthenticated %v -> %v, forbidden %v -> %v",
			before[unauthentic], after[unauthentic], before[forbiddenName], after[forbiddenName])
	}
	logs, err := clientset.CoreV1().Pods(ns).GetLogs(sched.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// "code 401" is how kube-scheduler reports an extender's refusal
	// (failed <verb> with extender at URL <url>, code 401); a bare "401"
	// also matches the microseconds of a log line's timestamp.
	for _, bad := range []string{"x509", "bad certificate", "code 401", "certificate required"} {
		if strings.Contains(string(logs), bad) {
			t.Errorf("kube-scheduler's log mentions %q:\n%s", bad, lastLinesOf(string(logs), 20))
		}
	}

	// From a pod in namespace default, which the NetworkPolicy does not
	// admit: the bridge CNI lets the connection through, the extender
	// refuses the verb for want of a certificate.
	url := "https://" + release + "-extender." + ns + ".svc/filter"
	out := sampleOutput(ctx, t, "no-cert", nil, "--get", url, "--method", "POST", "--insecure")
	if status, body := getResult(t, out, url); status != http.StatusUnauthorized || !strings.Contains(body, "no client certificate") {
		t.Errorf("POST /filter without a certificate from a pod: %d %q, want 401 no client certificate", status, body)
	}
	if got := scrape()[unauthentic]; got != after[unauthentic]+1 {
		t.Errorf("refusals without a certificate: %v, want %v", got, after[unauthentic]+1)
	}
	// The certificate of the chart's Secret is kube-scheduler's: past the
	// check (the empty body is then a bad request, not a refusal).
	cert := schedulerClientCert(ctx, t)
	if status, body := extenderRequest(ctx, t, ext.Status.PodIP, http.MethodPost, "/filter", extenderTLS(ctx, t, &cert)); status == http.StatusUnauthorized || status == http.StatusForbidden {
		t.Errorf("POST /filter with the scheduler's certificate: %d %s", status, body)
	}
}

// TestRealNodeWebhookAnswersOnlyTheAPIServer: the chart's webhook, given
// the CA of the dev API server's client certificate (dev up's chart
// values), answers every pod the API server sends it (every other test's
// pods went through it) and no one else: a pod that posts to the webhook's
// Service gets 401 and no AdmissionReview.
func TestRealNodeWebhookAnswersOnlyTheAPIServer(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 3*time.Minute)
	wh := waitComponent(ctx, t, "webhook", 2)[0]
	var args []string
	for _, c := range wh.Spec.Containers {
		if c.Name == "webhook" {
			args = c.Args
		}
	}
	if !slices.Contains(args, "--client-ca-file=/etc/partita/apiserver-client/ca.crt") || slices.Contains(args, "--allow-unauthenticated-callers") {
		t.Errorf("the webhook's args %v: want --client-ca-file and not --allow-unauthenticated-callers", args)
	}
	for _, path := range []string{"/validate-policies", "/mutate-pods"} {
		url := "https://" + release + "-webhook." + ns + ".svc" + path
		out := sampleOutput(ctx, t, "forger", nil, "--get", url, "--method", "POST", "--insecure")
		if status, body := getResult(t, out, url); status != http.StatusUnauthorized || !strings.Contains(body, "only kube-apiserver may call the admission webhooks") {
			t.Errorf("POST %s from a pod: %d %q, want 401 and the reason", path, status, body)
		}
	}
}

// TestRealNodeNetworkPolicyAdmitsTheScheduler: the extender's
// NetworkPolicy selects the extender's pods and admits, on its port, the
// pods of the scheduler Deployment and no other pod of the release. The
// real node's CNI (the bridge plugin) enforces no NetworkPolicy, so this
// checks the policy's selectors against the running pods, not packets;
// the scheduler reaching the extender through it is shown by every GPU
// pod binding.
func TestRealNodeNetworkPolicyAdmitsTheScheduler(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 2*time.Minute)
	np, err := clientset.NetworkingV1().NetworkPolicies(ns).Get(ctx, release+"-extender", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ext := waitComponent(ctx, t, "extender", 1)
	sched := waitComponent(ctx, t, "scheduler", 1)
	if got, want := podsMatching(ctx, t, ns, &np.Spec.PodSelector), []string{ext[0].Name}; !cmp.Equal(got, want) {
		t.Errorf("the policy guards pods %v, want the extender's %v", got, want)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port == nil ||
		np.Spec.Ingress[0].Ports[0].Port.String() != "https" {
		t.Fatalf("ingress %+v, want one rule on port https", np.Spec.Ingress)
	}
	var admitted []string
	for _, peer := range np.Spec.Ingress[0].From {
		if peer.NamespaceSelector != nil || peer.IPBlock != nil || peer.PodSelector == nil {
			t.Errorf("peer %+v admits more than pods of the release's namespace", peer)
			continue
		}
		admitted = append(admitted, podsMatching(ctx, t, ns, peer.PodSelector)...)
	}
	if want := []string{sched[0].Name}; !cmp.Equal(admitted, want) {
		t.Errorf("the policy admits pods %v, want the scheduler's %v\n%s", admitted, want, describeAll(ctx))
	}
	// The named port is the extender container's.
	found := false
	for _, p := range ext[0].Spec.Containers[0].Ports {
		found = found || (p.Name == "https" && p.ContainerPort == 8443)
	}
	if !found {
		t.Errorf("the extender's container has no port https 8443: %+v", ext[0].Spec.Containers[0].Ports)
	}
	t.Log("the real node's CNI (bridge) does not enforce NetworkPolicy: selectors checked, packets not filtered")
}

// TestRealNodeAgentWritesOnlyItsOwnNode: the chart's agent on real-node-0
// writes its node and GPUNode through the own-node policy (its token, bound
// to its pod, names the node), and the same token is refused for any other
// node (dry runs: admission runs, nothing is stored).
func TestRealNodeAgentWritesOnlyItsOwnNode(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 2*time.Minute)
	agent := waitComponent(ctx, t, "agent", 1)[0]
	// Its writes went through: the GPUNode has its devices, and its log
	// has no refusal.
	var gn v1alpha1.GPUNode
	if err := getJSON(ctx, "/apis/partita.dev/v1alpha1/gpunodes/"+realnode.NodeName, &gn); err != nil || len(gn.Status.Devices) != gpusPerNode {
		t.Fatalf("GPUNode %s: %d devices (%v), want %d from the chart's agent", realnode.NodeName, len(gn.Status.Devices), err, gpusPerNode)
	}
	logs, err := clientset.CoreV1().Pods(ns).GetLogs(agent.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(logs), "may write only") || strings.Contains(string(logs), "Forbidden") {
		t.Errorf("the agent's writes were refused:\n%s", lastLinesOf(string(logs), 20))
	}

	cs, cfg := clientsetWithToken(t, podToken(t, &agent))
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u := review.Status.UserInfo
	if u.Username != "system:serviceaccount:"+ns+":"+release+"-agent" || !slices.Equal(u.Extra["authentication.kubernetes.io/node-name"], []string{realnode.NodeName}) {
		t.Fatalf("the agent pod's token is %s with extra %v, want the agent's ServiceAccount bound to %s", u.Username, u.Extra, realnode.NodeName)
	}
	kwokNodes, err := clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: devcluster.SimulatedNodeSelector})
	if err != nil || len(kwokNodes.Items) == 0 {
		t.Fatalf("no simulated node to write (%v)", err)
	}
	other := kwokNodes.Items[0].Name
	dryRun := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	nodePatch := []byte(`{"metadata":{"annotations":{"partita.dev/e2e-probe":"x"}}}`)
	raw, err := rest.RESTClientFor(withGroup(cfg))
	if err != nil {
		t.Fatal(err)
	}
	// The agent updates GPUNode status (RBAC: update, not patch): read it
	// and write it back, as the agent would.
	gpuNodeWrite := func(name string) error {
		b, err := raw.Get().AbsPath("/apis/partita.dev/v1alpha1/gpunodes", name).DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("read GPUNode %s as the agent: %w", name, err)
		}
		return raw.Put().AbsPath("/apis/partita.dev/v1alpha1/gpunodes", name, "status").
			Param("dryRun", "All").Body(b).Do(ctx).Error()
	}
	for _, tc := range []struct {
		what string
		err  error
		own  bool
	}{
		{"node status of " + realnode.NodeName, patchNodeStatus(ctx, cs, realnode.NodeName, nodePatch, dryRun), true},
		{"GPUNode status of " + realnode.NodeName, gpuNodeWrite(realnode.NodeName), true},
		{"node status of " + other, patchNodeStatus(ctx, cs, other, nodePatch, dryRun), false},
		{"GPUNode status of " + other, gpuNodeWrite(other), false},
	} {
		switch {
		case tc.own && tc.err != nil:
			t.Errorf("the agent's token may not write its own %s: %v", tc.what, tc.err)
		case !tc.own && (!apierrors.IsForbidden(tc.err) || !strings.Contains(tc.err.Error(), "may write only its own node")):
			t.Errorf("the agent's token writing %s: %v, want Forbidden by the own-node policy", tc.what, tc.err)
		}
	}
}

func patchNodeStatus(ctx context.Context, cs kubernetes.Interface, node string, patch []byte, opts metav1.PatchOptions) error {
	_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, opts, "status")
	return err
}

// withGroup is cfg for raw requests to partita.dev/v1alpha1.
func withGroup(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.GroupVersion
	c.APIPath = "/apis"
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	return c
}

// TestRealNodeMPSClientSeesOnlyItsPipe: with real-node-0's GPUNode in mps
// mode (the chart's agent runs its simulated control daemons), an MPS
// client container sees its own device's pipe directory at
// webhook.MPSPipeMountPath and nothing else of the MPS directory: the
// kubelet resolves the mount's subPathExpr from the allocation annotation
// written at bind. The container prints its own /proc/self/mountinfo.
func TestRealNodeMPSClientSeesOnlyItsPipe(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 4*time.Minute)
	switchIsolation(ctx, t, v1alpha1.IsolationMPS)
	var gn v1alpha1.GPUNode
	// With the chart's default values (agent.isolation empty) the switch
	// works, and status says whether the daemons really run.
	poll(t, time.Minute, "GPUNode "+realnode.NodeName+" to tell whether its MPS daemons run", func() (bool, string) {
		if err := getJSON(ctx, "/apis/partita.dev/v1alpha1/gpunodes/"+realnode.NodeName, &gn); err != nil {
			return false, err.Error()
		}
		for _, c := range gn.Status.Conditions {
			if c.Type == v1alpha1.ConditionMPSReady {
				return c.Status == metav1.ConditionTrue, fmt.Sprintf("%s=%s (%s: %s)", c.Type, c.Status, c.Reason, c.Message)
			}
		}
		return false, fmt.Sprintf("no %s condition in %+v", v1alpha1.ConditionMPSReady, gn.Status.Conditions)
	})
	pod := samplePod("mps-client", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"})
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.Containers[0].Args = []string{"--print-file", "/proc/self/mountinfo", "--exit"}
	poll(t, time.Minute, "the webhook to wire MPS clients", func() (bool, string) {
		p, err := clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
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
	created := createPod(ctx, t, "default", pod)
	var done *corev1.Pod
	poll(t, 2*time.Minute, "the MPS client to run to completion", func() (bool, string) {
		p, err := clientset.CoreV1().Pods("default").Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		done = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, describePod(ctx, p)
	})
	// An MPS client's container may wait for its daemon's limit (the NRI
	// plugin, at most 1.5 s, then the kubelet retries): say so when it did.
	for _, e := range devcluster.PodEvents(ctx, clientset, done, 20) {
		if e.Reason == "Failed" {
			t.Logf("event on the MPS client: %s: %s", e.Reason, e.Message)
		}
	}
	devices := strings.Split(done.Annotations[v1alpha1.AnnotationDevicesPrefix+"main"], ",")
	if done.Status.Phase != corev1.PodSucceeded || done.Spec.NodeName != realnode.NodeName || len(devices) != 1 || devices[0] == "" {
		t.Fatalf("the MPS client ended %s on %q with devices %v: %+v", done.Status.Phase, done.Spec.NodeName, devices, done.Status.ContainerStatuses)
	}
	b, err := clientset.CoreV1().Pods("default").GetLogs(created.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs: %v", err)
	}
	logs := string(b)
	if got := envFromLog(logs, webhook.EnvMPSPipeDirectory); got != webhook.MPSPipeMountPath {
		t.Errorf("%s=%q, want %s", webhook.EnvMPSPipeDirectory, got, webhook.MPSPipeMountPath)
	}
	// mountinfo: ID parent major:minor root mount-point options ...; a
	// bind mount's root is the path inside the source filesystem.
	var mps []string
	lines := fileLines(t, logs, "/proc/self/mountinfo")
	for _, l := range lines {
		f := strings.Fields(l)
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
		t.Errorf("MPS mounts in the container: %v, want exactly one, its own device's pipe (…%s)\nmountinfo:\n%s", mps, want, strings.Join(lines, "\n"))
	}

	// A slice over two devices, which one MPS daemon per device cannot
	// serve, is capped by the interposer the chart installed.
	if err := interposer.Check(cluster.RealNode().InterposerDir()); err != nil {
		t.Fatalf("the chart's interposer is not installed: %v", err)
	}
	two := samplePod("mps-two", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5", v1alpha1.AnnotationGPUCount: "2"})
	two.Spec.Containers[0].Image = realnode.ImageInterposerTest.Ref
	spans := waitRunning(ctx, t, createPod(ctx, t, "default", two))
	if got := strings.Split(spans.Annotations[v1alpha1.AnnotationDevicesPrefix+"main"], ","); len(got) != 2 {
		t.Fatalf("the two-device slice holds devices %v", got)
	}
	probe := func(args ...string) (string, error) {
		return kubectlOutput(ctx, append([]string{"exec", "-n", spans.Namespace, spans.Name, "--", realnode.InterposerTestProbe}, args...)...)
	}
	if got, err := probe("cat", interposer.ContainerPreload); err != nil || got != interposer.PreloadContent {
		t.Errorf("%s in the two-device slice: %q (%v), want %q", interposer.ContainerPreload, got, err, interposer.PreloadContent)
	}
	if out, err := probe("loaded", interposer.ContainerLibrary); err != nil {
		t.Errorf("a process in the two-device slice does not map %s: %v\n%s", interposer.ContainerLibrary, err, out)
	}
}

// TestRealNodeHAMiCoreSliceGetsThePreload: with real-node-0's GPUNode in
// hami-core mode, a slice container gets the node's interposer as the
// chart installed it (dev up installs the project's preload test library,
// localhost/partita/interposer-test:dev, in place of HAMi-core): its
// /etc/ld.so.preload names /usr/local/partita/interposer/libvgpu.so, that
// file exists in the container, the library is mapped into the
// container's first process and into a process exec'd later, and the
// container, as root, can neither change nor remove nor unmount the
// preload file or the library. A container with no GPU gets none of it.
// The agent's NRI hook adds the two read-only mounts (host
// <hostDir>/ld.so.preload over /etc/ld.so.preload, <hostDir> at
// /usr/local/partita/interposer).
func TestRealNodeHAMiCoreSliceGetsThePreload(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 5*time.Minute)
	hostDir := cluster.RealNode().InterposerDir()
	poll(t, 2*time.Minute, "the chart's interposer installed in "+hostDir, func() (bool, string) {
		if err := interposer.Check(hostDir); err != nil {
			return false, err.Error() + "\n" + describeAll(ctx)
		}
		return true, ""
	})
	switchIsolation(ctx, t, v1alpha1.IsolationHAMiCore)

	root := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Containers[0].Image = realnode.ImageInterposerTest.Ref
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptrTo[int64](0), RunAsGroup: ptrTo[int64](0)}
		return p
	}
	slice := waitRunning(ctx, t, createPod(ctx, t, "default", root(samplePod("hami-core", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}))))
	if slice.Spec.NodeName != realnode.NodeName {
		t.Fatalf("the slice runs on %q, want %s", slice.Spec.NodeName, realnode.NodeName)
	}
	probe := func(pod *corev1.Pod, args ...string) (string, error) {
		return kubectlOutput(ctx, append([]string{"exec", "-n", pod.Namespace, pod.Name, "--", realnode.InterposerTestProbe}, args...)...)
	}

	if got, err := probe(slice, "cat", interposer.ContainerPreload); err != nil || got != interposer.PreloadContent {
		t.Errorf("%s in the slice: %q (%v), want %q", interposer.ContainerPreload, got, err, interposer.PreloadContent)
	}
	if out, err := probe(slice, "loaded", interposer.ContainerLibrary); err != nil {
		t.Errorf("a process exec'd in the slice does not map %s (it must exist and be preloaded): %v\n%s", interposer.ContainerLibrary, err, out)
	}
	// The container's own first process, read from the host.
	pid := containerPID(ctx, t, slice, "main")
	maps, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "maps"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(maps), interposer.ContainerLibrary) {
		t.Errorf("the slice's first process (host pid %d) does not map %s:\n%s", pid, interposer.ContainerLibrary, maps)
	}

	out, err := probe(slice, "tamper")
	if err != nil || !strings.Contains(out, "uid 0 ") || !strings.Contains(out, "every try refused") {
		t.Errorf("root in the slice changed the interposer (or the probe did not run as root): %v\n%s", err, out)
	}
	if got, err := probe(slice, "cat", interposer.ContainerPreload); err != nil || got != interposer.PreloadContent {
		t.Errorf("after the tries, %s in the slice: %q (%v), want %q", interposer.ContainerPreload, got, err, interposer.PreloadContent)
	}
	if err := interposer.Check(hostDir); err != nil {
		t.Errorf("after the tries, the host's interposer: %v", err)
	}

	// No GPU, no interposer.
	plain := waitRunning(ctx, t, createPod(ctx, t, "default", root(samplePod("no-gpu", nil))))
	if got, err := probe(plain, "cat", interposer.ContainerPreload); err == nil {
		t.Errorf("a container with no GPU has %s: %q", interposer.ContainerPreload, got)
	}
	if out, err := probe(plain, "loaded", interposer.ContainerLibrary); err == nil {
		t.Errorf("a container with no GPU maps %s:\n%s", interposer.ContainerLibrary, out)
	}
}

// TestRealNodeGPUContainerWaitsForTheAgent: with the runtime's NRI default
// validator on (the real node's containerd has it), a GPU container is not
// created while the agent, Partita's NRI plugin, is down: the webhook names
// the plugin as required for every GPU container. A pod without a GPU starts
// meanwhile; the GPU pod starts once the agent is back.
func TestRealNodeGPUContainerWaitsForTheAgent(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 5*time.Minute)
	ds := "daemonset/" + release + "-agent"
	const away = `{"spec":{"template":{"spec":{"nodeSelector":{"e2e.partita.dev/agent-away":"true"}}}}}`
	const back = `{"spec":{"template":{"spec":{"nodeSelector":{"e2e.partita.dev/agent-away":null}}}}}`
	agentBack := func(ctx context.Context) {
		kubectl(ctx, t, "-n", ns, "patch", ds, "--type", "merge", "-p", back)
		kubectl(ctx, t, "-n", ns, "rollout", "status", ds, "--timeout", "2m")
	}
	kubectl(ctx, t, "-n", ns, "patch", ds, "--type", "merge", "-p", away)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		agentBack(ctx)
	})
	poll(t, 2*time.Minute, "the agent gone from "+realnode.NodeName, func() (bool, string) {
		out := kubectl(ctx, t, "-n", ns, "get", "pods", "-l", "app.kubernetes.io/component=agent", "--field-selector", "spec.nodeName="+realnode.NodeName, "-o", "name")
		return strings.TrimSpace(out) == "", "agent pods: " + out
	})

	plain := waitRunning(ctx, t, createPod(ctx, t, "default", samplePod("no-gpu-agent-away", nil)))
	if plain.Spec.NodeName != realnode.NodeName {
		t.Fatalf("the pod without a GPU runs on %q, want %s", plain.Spec.NodeName, realnode.NodeName)
	}
	gpuPod := createPod(ctx, t, "default", samplePod("gpu-agent-away", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}))
	poll(t, 2*time.Minute, "the runtime to refuse the GPU container for want of Partita's NRI plugin", func() (bool, string) {
		p, err := clientset.CoreV1().Pods("default").Get(ctx, gpuPod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Status.Phase == corev1.PodRunning {
			t.Fatalf("the GPU pod runs while the agent is down: %s", describePod(ctx, p))
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && strings.Contains(w.Message, "required plugin") && strings.Contains(w.Message, "partita") {
				t.Logf("container %s waits: %s: %s", cs.Name, w.Reason, w.Message)
				return true, ""
			}
		}
		return false, describePod(ctx, p)
	})

	agentBack(ctx)
	waitRunning(ctx, t, gpuPod)
}

// switchIsolation sets real-node-0's GPUNode spec.isolation to mode, waits
// until the chart's agent runs the node in it, and puts the old mode back
// when the test ends.
func switchIsolation(ctx context.Context, t *testing.T, mode v1alpha1.IsolationMode) {
	t.Helper()
	set := func(ctx context.Context, mode v1alpha1.IsolationMode) {
		patch := fmt.Sprintf(`{"spec":{"isolation":%q}}`, mode)
		if mode == "" {
			patch = `{"spec":{"isolation":null}}`
		}
		if err := clientset.Discovery().RESTClient().Patch(types.MergePatchType).AbsPath("/apis/partita.dev/v1alpha1/gpunodes", realnode.NodeName).
			Body([]byte(patch)).Do(ctx).Error(); err != nil {
			t.Fatalf("set the isolation of GPUNode %s: %v", realnode.NodeName, err)
		}
	}
	var gn v1alpha1.GPUNode
	if err := getJSON(ctx, "/apis/partita.dev/v1alpha1/gpunodes/"+realnode.NodeName, &gn); err != nil {
		t.Fatal(err)
	}
	was := gn.Spec.Isolation
	set(ctx, mode)
	t.Cleanup(func() {
		// t.Context() has ended by now.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		set(ctx, was)
		poll(t, time.Minute, "the chart's agent to leave "+string(mode)+" mode", func() (bool, string) {
			if err := getJSON(ctx, "/apis/partita.dev/v1alpha1/gpunodes/"+realnode.NodeName, &gn); err != nil {
				return false, err.Error()
			}
			return gn.Status.Isolation != mode, "status.isolation " + string(gn.Status.Isolation)
		})
	})
	poll(t, time.Minute, "the chart's agent to run "+realnode.NodeName+" in "+string(mode)+" mode", func() (bool, string) {
		if err := getJSON(ctx, "/apis/partita.dev/v1alpha1/gpunodes/"+realnode.NodeName, &gn); err != nil {
			return false, err.Error()
		}
		return gn.Status.Isolation == mode, "status.isolation " + string(gn.Status.Isolation)
	})
}

// TestRealNodeConsole: the chart's console (console.enabled=true) starts on
// the real node, becomes Ready, and answers, from a pod inside the
// cluster, a request with that pod's ServiceAccount token as that account
// (TokenReview), and refuses one without a token.
func TestRealNodeConsole(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 5*time.Minute)
	start := time.Now()
	helm(ctx, t, "upgrade", release, cluster.ChartDir(), "-n", ns, "--reuse-values", "--set", "console.enabled=true", "--wait", "--timeout", "3m")
	console := waitComponent(ctx, t, "console", 1)[0]
	t.Logf("console Ready %s after helm upgrade started", time.Since(start).Round(100*time.Millisecond))
	if console.Spec.NodeName != realnode.NodeName {
		t.Errorf("console on %q, want %s", console.Spec.NodeName, realnode.NodeName)
	}
	url := "https://" + release + "-console." + ns + ".svc/api/v1/whoami"
	// The console's certificate is self-signed (console.tls.secretName
	// unset): --insecure.
	out := sampleOutput(ctx, t, "console-token", nil, "--get", url, "--insecure", "--token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token")
	status, body := getResult(t, out, url)
	var who struct {
		User struct {
			Name  string              `json:"name"`
			Extra map[string][]string `json:"extra"`
		} `json:"user"`
		Mode string `json:"mode"`
	}
	if status != http.StatusOK || json.Unmarshal([]byte(body), &who) != nil || who.User.Name != "system:serviceaccount:default:default" ||
		who.Mode != "shared" || !slices.Equal(who.User.Extra["authentication.kubernetes.io/node-name"], []string{realnode.NodeName}) {
		t.Errorf("GET whoami with the pod's token: %d %s, want 200, shared mode, system:serviceaccount:default:default bound to %s", status, body, realnode.NodeName)
	}
	out = sampleOutput(ctx, t, "console-anonymous", func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = ptrTo(false) }, "--get", url, "--insecure")
	if status, body := getResult(t, out, url); status != http.StatusUnauthorized {
		t.Errorf("GET whoami without a token: %d %s, want 401", status, body)
	}
}

// lastLinesOf is the last n lines of s.
func lastLinesOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestRealNodeWebhookRotatesItsCertificate: the webhook's cert-controller
// renews its serving certificate (here forced by removing it from the
// Secret) under the same CA; both webhook pods pick the new one up from
// their Secret volume, and the API server keeps reaching the webhook all
// along.
func TestRealNodeWebhookRotatesItsCertificate(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 4*time.Minute)
	secretName := release + "-webhook-cert"
	old, err := clientset.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	oldCert := certID(t, old.Data["tls.crt"])
	webhooks := waitComponent(ctx, t, "webhook", 2)
	for _, p := range webhooks {
		if got := servingCert(t, p.Status.PodIP); got != oldCert {
			t.Fatalf("webhook pod %s serves certificate %s, the Secret holds %s", p.Name, got, oldCert)
		}
	}

	probe := startAdmissionProbe(ctx)

	patch := []byte(`[{"op":"remove","path":"/data/tls.crt"},{"op":"remove","path":"/data/tls.key"}]`)
	if _, err := clientset.CoreV1().Secrets(ns).Patch(ctx, secretName, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	var newCert string
	poll(t, time.Minute, "the webhook to write a new serving certificate into "+secretName, func() (bool, string) {
		s, err := clientset.CoreV1().Secrets(ns).Get(ctx, secretName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if len(s.Data["tls.crt"]) == 0 {
			return false, "no tls.crt yet"
		}
		if string(s.Data["ca.crt"]) != string(old.Data["ca.crt"]) {
			t.Errorf("the CA changed too; a renewal keeps it (the API server trusts it through the injected caBundle)")
		}
		newCert = certID(t, s.Data["tls.crt"])
		return newCert != oldCert, "still " + newCert
	})
	for _, p := range webhooks {
		poll(t, 2*time.Minute, "webhook pod "+p.Name+" to serve the new certificate", func() (bool, string) {
			got := servingCert(t, p.Status.PodIP)
			return got == newCert, "serves " + got + ", want " + newCert
		})
	}
	time.Sleep(time.Second)
	if failures, calls := probe.stop(); len(failures) > 0 || calls < 5 {
		t.Errorf("%d of %d admission requests failed during the rotation (want none):\n%s", len(failures), calls, strings.Join(failures, "\n"))
	}
	mwc, err := clientset.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, release, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(mwc.Webhooks[0].ClientConfig.CABundle) != string(old.Data["ca.crt"]) {
		t.Errorf("the mutating webhook's caBundle is not the Secret's CA")
	}
}

// TestRealNodeExtenderFailover: the extender's leader dies, twice: its
// process is killed with SIGKILL (the Lease is not released; kubelet
// restarts the container), then its pod is deleted (the Deployment makes a
// new one). Each time a new leader takes the Lease and a GPU pod created
// afterwards still binds.
func TestRealNodeExtenderFailover(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 5*time.Minute)
	pod := waitComponent(ctx, t, "extender", 1)[0]
	waitLeader(ctx, t, "partita-extender", pod.Name)
	before := leaseHolder(ctx, t, "partita-extender")

	start := time.Now()
	pid := containerPID(ctx, t, &pod, "extender")
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the extender (pid %d): %v", pid, err)
	}
	poll(t, 2*time.Minute, "a new extender process to take the Lease", func() (bool, string) {
		h := leaseHolder(ctx, t, "partita-extender")
		return h != before && h != "", "held by " + h
	})
	t.Logf("after kill -9 the Lease changed hands in %s", time.Since(start).Round(100*time.Millisecond))
	waitComponent(ctx, t, "extender", 1)
	checkGPUPod(ctx, t, createPod(ctx, t, "default", samplePod("after-kill", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"})))

	start = time.Now()
	if err := clientset.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var newPod corev1.Pod
	poll(t, 2*time.Minute, "a new extender pod, Ready", func() (bool, string) {
		pods := componentPods(ctx, t, "extender")
		var seen []string
		for _, p := range pods {
			seen = append(seen, p.Name+" "+string(p.Status.Phase))
			if p.Name != pod.Name && p.DeletionTimestamp == nil && podReady(&p) {
				newPod = p
				return true, ""
			}
		}
		return false, strings.Join(seen, ", ")
	})
	waitLeader(ctx, t, "partita-extender", newPod.Name)
	t.Logf("after deleting the pod the new pod led in %s", time.Since(start).Round(100*time.Millisecond))
	checkGPUPod(ctx, t, createPod(ctx, t, "default", samplePod("after-failover", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"})))
}

// leaseHolder is a Lease's whole holder identity.
func leaseHolder(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	l, err := clientset.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// containerPID is the host pid of a pod's container, from containerd.
func containerPID(ctx context.Context, t *testing.T, pod *corev1.Pod, container string) int {
	t.Helper()
	p, err := clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != container {
			continue
		}
		id := strings.TrimPrefix(cs.ContainerID, "containerd://")
		var info struct {
			Info struct {
				Pid int `json:"pid"`
			} `json:"info"`
		}
		out := crictl(ctx, t, "inspect", id)
		if err := json.Unmarshal([]byte(out), &info); err != nil || info.Info.Pid == 0 {
			t.Fatalf("crictl inspect %s: %v\n%s", id, err, out)
		}
		return info.Info.Pid
	}
	t.Fatalf("pod %s has no container %s", pod.Name, container)
	return 0
}

// TestRealNodeChartUpgrade: helm upgrade rolls the components on the real
// node, and GPU pods keep working. The upgrade also turns time-based fair
// share on: the extender starts with the chart's usage flags and writes
// the queues' usage.
func TestRealNodeChartUpgrade(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 6*time.Minute)
	oldWebhooks := map[string]bool{}
	for _, p := range waitComponent(ctx, t, "webhook", 2) {
		oldWebhooks[p.Name] = true
	}
	// GPU pods are admitted all through the rollout: each old webhook pod
	// keeps serving while the Service drops it (preStop), so the API
	// server never meets a closed port, which the admission policies
	// would turn into a refused pod.
	probe := startAdmissionProbe(ctx)
	start := time.Now()
	helm(ctx, t, "upgrade", release, cluster.ChartDir(), "-n", ns, "--reuse-values",
		"--set", "webhook.logLevel=3", "--set", "extender.placement=spread",
		// Time-based fair share on, with the chart's flags for it.
		"--set", "extender.admission.fairShareUsage.weight=1", "--set", "extender.admission.fairShareUsage.windowType=tumbling",
		"--wait", "--timeout", "4m")
	t.Logf("helm upgrade --wait took %s", time.Since(start).Round(time.Millisecond))
	// The old pods end after helm returns: keep asking until they have.
	poll(t, time.Minute, "the old webhook pods gone", func() (bool, string) {
		pods := componentPods(ctx, t, "webhook")
		var old []string
		for _, p := range pods {
			if oldWebhooks[p.Name] {
				old = append(old, p.Name)
			}
		}
		return len(old) == 0, fmt.Sprint(old)
	})
	time.Sleep(2 * time.Second)
	if failures, calls := probe.stop(); len(failures) > 0 || calls < 5 {
		t.Errorf("%d of %d admission requests failed during the upgrade (want none):\n%s", len(failures), calls, strings.Join(failures, "\n"))
	}
	for _, p := range waitComponent(ctx, t, "webhook", 2) {
		if oldWebhooks[p.Name] {
			t.Errorf("webhook pod %s survived an upgrade that changed its arguments", p.Name)
		}
	}
	ext := waitComponent(ctx, t, "extender", 1)[0]
	if !strings.Contains(strings.Join(ext.Spec.Containers[0].Args, " "), "--placement=spread") {
		t.Errorf("extender args %v, want --placement=spread", ext.Spec.Containers[0].Args)
	}
	waitLeader(ctx, t, "partita-extender", ext.Name)
	// The leader counts queues' usage and writes it to their status.
	poll(t, 90*time.Second, "the default queue's status.usage", func() (bool, string) {
		got := kubectl(ctx, t, "get", "queues.partita.dev", v1alpha1.DefaultQueueName, "-o", "jsonpath={.status.usage.windowType} {.status.usage.halfLife}")
		return got == "tumbling 24h0m0s", fmt.Sprintf("status.usage windowType and halfLife %q", got)
	})
	checkGPUPod(ctx, t, createPod(ctx, t, "default", samplePod("after-upgrade", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"})))
}

// TestRealNodeChartUninstall: helm uninstall removes every object of the
// release and stops its containers on the node; pods created under
// Partita run on.
func TestRealNodeChartUninstall(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 4*time.Minute)
	survivor := waitRunning(ctx, t, createPod(ctx, t, "default", samplePod("survivor", map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"})))
	helm(ctx, t, "uninstall", release, "-n", ns, "--wait", "--timeout", "3m")
	instance := "app.kubernetes.io/instance=" + release
	poll(t, 2*time.Minute, "nothing of the release left", func() (bool, string) {
		var left []string
		add := func(kind string, n int, err error) {
			if err != nil {
				left = append(left, kind+": "+err.Error())
			}
			if n > 0 {
				left = append(left, fmt.Sprintf("%d %s", n, kind))
			}
		}
		pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		add("pods", len(pods.Items), err)
		deps, err := clientset.AppsV1().Deployments(ns).List(ctx, metav1.ListOptions{LabelSelector: instance})
		add("deployments", len(deps.Items), err)
		dss, err := clientset.AppsV1().DaemonSets(ns).List(ctx, metav1.ListOptions{LabelSelector: instance})
		add("daemonsets", len(dss.Items), err)
		sas, err := clientset.CoreV1().ServiceAccounts(ns).List(ctx, metav1.ListOptions{LabelSelector: instance})
		add("serviceaccounts", len(sas.Items), err)
		// The dev cluster's own Secrets (the S3 addon's partita-system/s3)
		// are not the release's.
		secrets, err := clientset.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of!=partita-dev"})
		add("secrets", len(secrets.Items), err)
		leases, err := clientset.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
		add("leases", len(leases.Items), err)
		crbs, err := clientset.RbacV1().ClusterRoleBindings().List(ctx, metav1.ListOptions{LabelSelector: instance})
		add("clusterrolebindings", len(crbs.Items), err)
		rbs, err := clientset.RbacV1().RoleBindings("kube-system").List(ctx, metav1.ListOptions{LabelSelector: instance})
		add("rolebindings in kube-system", len(rbs.Items), err)
		_, err = clientset.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, release, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("mutating webhook configuration: %v", err))
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
	// The release's containers are gone from the node too.
	poll(t, time.Minute, "no container of the release on "+realnode.NodeName, func() (bool, string) {
		out := crictl(ctx, t, "ps", "--label", "io.kubernetes.pod.namespace="+ns, "-q")
		return strings.TrimSpace(out) == "", out
	})
	got, err := clientset.CoreV1().Pods("default").Get(ctx, survivor.Name, metav1.GetOptions{})
	if err != nil || got.Status.Phase != corev1.PodRunning {
		t.Errorf("a GPU pod after uninstall: %v (%v), want it Running", got.Status.Phase, err)
	}
}

// TestRealNodeDownRestoresHost: after a kill -9 of kubelet and containerd,
// `partita dev down` still ends every process, unmounts everything, removes
// the iptables rules, the bridge and the cgroups, and restores the sysctls
// and directories: the host is as the tests found it.
func TestRealNodeDownRestoresHost(t *testing.T) {
	needCluster(t)
	ctx := testContext(t, 3*time.Minute)
	nodeDir := realNodeDir()
	during, err := realnode.TakeHostSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(during.Kubepods) == 0 || len(realnode.MountsUnder(nodeDir)) == 0 {
		t.Fatalf("the real node does not seem to run (cgroups %v, mounts under %s: %v)", during.Kubepods, nodeDir, realnode.MountsUnder(nodeDir))
	}
	for _, c := range []string{"kubelet", "containerd"} {
		b, err := os.ReadFile(filepath.Join(nodeDir, "pids", c+".pid"))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %s (%d): %v", c, pid, err)
		}
	}
	containers := realnode.KubepodsProcesses()
	if len(containers) == 0 {
		t.Fatal("no container processes in the pods' cgroups")
	}
	out, err := partita(ctx, "dev", "down", "--name", clusterName)
	down = true
	if err != nil {
		t.Fatalf("dev down after kill -9: %v\n%s", err, out)
	}
	after, err := realnode.TakeHostSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("the host after dev down differs from before dev up (-before,+after):\n%s", diff)
	}
	if left := realnode.ProcessesUsing(nodeDir, realnode.RunDir, cluster.Dir()); len(left) > 0 {
		t.Errorf("processes of the cluster still run: %v", left)
	}
	for _, pid := range containers {
		if syscall.Kill(pid, 0) == nil && !zombie(pid) {
			t.Errorf("container process %d still runs", pid)
		}
	}
	if owned, err := realnode.OwnedIPTablesRules(ctx); err != nil || len(owned) > 0 {
		t.Errorf("iptables rules of a node left (%v):\n%s", err, strings.Join(owned, "\n"))
	}
	for _, d := range []string{nodeDir, cluster.Dir()} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still exists (%v)", d, err)
		}
	}
}

// samplePod is a pod of the sample image on the real node.
func samplePod(prefix string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-", Annotations: annotations},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": realnode.NodeName},
			TerminationGracePeriodSeconds: ptrTo[int64](2),
			Containers:                    []corev1.Container{{Name: "main", Image: sampleRef}},
		},
	}
}

func ptrTo[T any](v T) *T { return &v }

func createPod(ctx context.Context, t *testing.T, namespace string, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	got, err := clientset.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", pod.GenerateName, err)
	}
	t.Cleanup(func() {
		_ = clientset.CoreV1().Pods(namespace).Delete(context.WithoutCancel(ctx), got.Name, metav1.DeleteOptions{GracePeriodSeconds: ptrTo[int64](0)})
	})
	return got
}

// waitRunning waits until the pod's containers run and returns it.
func waitRunning(ctx context.Context, t *testing.T, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	poll(t, 2*time.Minute, "pod "+pod.Name+" Running", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got = p
		return p.Status.Phase == corev1.PodRunning, describePod(ctx, p)
	})
	return got
}

func describePod(ctx context.Context, p *corev1.Pod) string {
	s := devcluster.DescribePods(ctx, clientset, p.Namespace, "")
	var mine []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, p.Name) || strings.HasPrefix(strings.TrimSpace(l), "event") {
			mine = append(mine, l)
		}
	}
	var waiting []string
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Waiting != nil {
			waiting = append(waiting, cs.Name+": "+cs.State.Waiting.Reason+" "+cs.State.Waiting.Message)
		}
	}
	return fmt.Sprintf("phase %s on %q %v\n%s", p.Status.Phase, p.Spec.NodeName, waiting, strings.Join(mine, "\n"))
}

// waitLogLine waits until the pod's log (through the API server and
// kubelet, as kubectl logs) has a line with substr, and returns the log.
func waitLogLine(ctx context.Context, t *testing.T, pod *corev1.Pod, substr string) string {
	t.Helper()
	var logs string
	poll(t, time.Minute, "a line with "+substr+" in the log of "+pod.Name, func() (bool, string) {
		b, err := clientset.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, err.Error()
		}
		logs = string(b)
		return strings.Contains(logs, substr), logs
	})
	return logs
}

// envFromLog returns the value the sample printed for key.
func envFromLog(logs, key string) string {
	for _, l := range strings.Split(logs, "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return v
		}
	}
	return ""
}

func componentPods(ctx context.Context, t *testing.T, component string) []corev1.Pod {
	t.Helper()
	pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component=" + component})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

// waitComponent waits until the component has exactly n Ready pods and no
// terminating one, and returns them.
func waitComponent(ctx context.Context, t *testing.T, component string, n int) []corev1.Pod {
	t.Helper()
	var ready []corev1.Pod
	poll(t, 3*time.Minute, fmt.Sprintf("%d Ready %s pods", n, component), func() (bool, string) {
		pods := componentPods(ctx, t, component)
		ready = ready[:0]
		var seen []string
		for _, p := range pods {
			seen = append(seen, fmt.Sprintf("%s %s ready=%v on %q", p.Name, p.Status.Phase, podReady(&p), p.Spec.NodeName))
			if p.DeletionTimestamp == nil && podReady(&p) {
				ready = append(ready, p)
			}
		}
		return len(ready) == n && len(pods) == n, strings.Join(seen, "; ")
	})
	return ready
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitLeader waits until the named Lease is held by the pod.
func waitLeader(ctx context.Context, t *testing.T, lease, pod string) {
	t.Helper()
	poll(t, 2*time.Minute, "Lease "+lease+" held by "+pod, func() (bool, string) {
		l, err := clientset.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return holder(l) == pod, "held by " + holder(l)
	})
}

// holder is the pod name in a Lease's holder identity ("<pod>_<uuid>").
func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	name, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return name
}

// certID names a certificate by its SHA-256 fingerprint (cert-controller
// gives every certificate serial 1) and its validity start.
func certID(t *testing.T, certPEM []byte) string {
	t.Helper()
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatalf("no PEM certificate in %q", certPEM)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return fingerprint(c)
}

func fingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return hex.EncodeToString(sum[:8]) + " (from " + c.NotBefore.UTC().Format(time.RFC3339) + ")"
}

// servingCert names the certificate a webhook pod serves, read from this
// host (pod IPs are routed through the node's bridge).
func servingCert(t *testing.T, podIP string) string {
	t.Helper()
	d := &net.Dialer{Timeout: 3 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", net.JoinHostPort(podIP, "9443"), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reading the certificate only
	if err != nil {
		return "unreachable: " + err.Error()
	}
	defer func() { _ = conn.Close() }()
	return fingerprint(conn.ConnectionState().PeerCertificates[0])
}

func getJSON(ctx context.Context, path string, into any) error {
	b, err := clientset.Discovery().RESTClient().Get().AbsPath(path).DoRaw(ctx)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}

// crictl asks the node's containerd directly.
func crictl(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := execCommand(ctx, filepath.Join(cluster.BinDir(), "crictl"), append([]string{"--runtime-endpoint", "unix://" + filepath.Join(realnode.RunDir, "containerd.sock")}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("crictl %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func zombie(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}
