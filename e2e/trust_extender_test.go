package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/extender"
)

// The extender's doors, tried as a tenant on the host would: with curl,
// against the port kube-scheduler calls. Only kube-scheduler's client
// certificate (in the cluster's state directory, readable by its owner
// only) opens the verbs, and even it binds nothing that kube-scheduler
// itself would not.

// extenderCertDir is where `partita dev up` keeps the extender's serving
// certificate, kube-scheduler's client certificate and their CA.
func extenderCertDir() string { return filepath.Join(cluster.StateDir(), "extender-certs") }

// extenderURL is the dev cluster's extender, as kube-scheduler reaches it.
func extenderURL(t *testing.T) string {
	t.Helper()
	port, err := cluster.Port("extender")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("https://127.0.0.1:%d", port)
}

// extenderHTTPClient trusts the extender's CA and, with scheduler, presents
// kube-scheduler's client certificate.
func extenderHTTPClient(t *testing.T, scheduler bool) *http.Client {
	t.Helper()
	dir := extenderCertDir()
	ca, err := os.ReadFile(filepath.Join(dir, extender.DevCAFile))
	if err != nil {
		t.Fatalf("read the extender's CA: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if scheduler {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, extender.DevClientCertFile), filepath.Join(dir, extender.DevClientKeyFile))
		if err != nil {
			t.Fatalf("read kube-scheduler's client certificate: %v", err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
}

// curlResult is what curl says about one request.
type curlResult struct {
	code string // the HTTP status, "000" when no answer came
	body string
	exit int // curl's exit status: 0, or why the connection failed
	out  string
}

// curl calls the extender with curl and the given extra arguments, POSTing
// body to path (GET when body is empty).
func curl(ctx context.Context, t *testing.T, url, path, body string, args ...string) curlResult {
	t.Helper()
	bodyFile := filepath.Join(t.TempDir(), "body")
	full := append([]string{"-sS", "--max-time", "10", "-o", bodyFile, "-w", "%{http_code}"}, args...)
	if body != "" {
		full = append(full, "-X", "POST", "-H", "Content-Type: application/json", "--data-binary", body)
	}
	full = append(full, url+path)
	cmd := exec.CommandContext(ctx, "curl", full...)
	out, err := cmd.CombinedOutput()
	res := curlResult{out: string(out)}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.exit = ee.ExitCode()
	case err != nil:
		t.Fatalf("run curl: %v", err)
	}
	res.code = strings.TrimSpace(string(out))
	if i := strings.LastIndexByte(res.code, '\n'); i >= 0 {
		res.code = res.code[i+1:]
	}
	if len(res.code) > 3 {
		res.code = res.code[len(res.code)-3:]
	}
	b, _ := os.ReadFile(bodyFile)
	res.body = string(b)
	return res
}

// writeForeignClientCert writes a client certificate that claims
// kube-scheduler's name, signed by a CA of the tenant's own making.
func writeForeignClientCert(t *testing.T) (certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "partita-dev-extender-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign,
		BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: extender.DefaultClientName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "mallory.crt"), filepath.Join(dir, "mallory.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// unboundPod is a pod that no scheduler binds: its schedulerName names no
// scheduler, or nothing matches its nodeSelector.
func unboundPod(ns, name string, gpu bool, nodeSelector map[string]string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{NodeSelector: nodeSelector,
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if gpu {
		p = extGPUPod(ns, name, 500, 1, nodeSelector)
	}
	return p
}

// assertUnbound re-reads the pods and fails for any that is bound or
// carries a device annotation.
func assertUnbound(ctx context.Context, t *testing.T, ns string, names ...string) {
	t.Helper()
	for _, n := range names {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("read pod %s: %v", n, err)
		}
		if p.Spec.NodeName != "" {
			t.Errorf("pod %s was bound to %s", n, p.Spec.NodeName)
		}
		for k := range p.Annotations {
			if strings.HasPrefix(k, v1alpha1.AnnotationDevicesPrefix) {
				t.Errorf("pod %s carries %s=%s", n, k, p.Annotations[k])
			}
		}
	}
}

func bindBody(t *testing.T, p *corev1.Pod, node string) string {
	t.Helper()
	b, err := json.Marshal(&extenderv1.ExtenderBindingArgs{PodName: p.Name, PodNamespace: p.Namespace, PodUID: p.UID, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTrustExtenderRefusesCallersWithoutSchedulerCert: a tenant on the host
// calls the extender's bind with curl to put a pending pod (one asking for no
// GPU, one whose nodeSelector matches no node, one asking for half a GPU)
// on a node of their choosing: without kube-scheduler's certificate, with
// a certificate of their own that claims its name, with the extender's own
// serving certificate, over plain HTTP. Every try is refused and no pod is
// bound; the probes still answer, and /debug/ledger is not served.
func TestTrustExtenderRefusesCallersWithoutSchedulerCert(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	ns := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	nowhere := map[string]string{"e2e.partita.dev/pool": "nowhere"}
	var pods []*corev1.Pod
	for _, p := range []*corev1.Pod{unboundPod(ns, "plain", false, nowhere), unboundPod(ns, "no-gpu-nowhere", false, nowhere), unboundPod(ns, "half-nowhere", true, nowhere)} {
		created, err := clientset.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
		pods = append(pods, created)
	}
	nodes, err := clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
	if err != nil || len(nodes.Items) == 0 {
		t.Fatalf("list GPU nodes: %v (%d)", err, len(nodes.Items))
	}
	node := nodes.Items[0].Name
	url := extenderURL(t)
	dir := extenderCertDir()
	malloryCert, malloryKey := writeForeignClientCert(t)

	for _, p := range pods {
		body := bindBody(t, p, node)
		t.Run(p.Name, func(t *testing.T) {
			// No certificate: the TLS handshake completes (probes need
			// it), the verb answers 401 and says who may call.
			r := curl(ctx, t, url, "/"+extender.VerbBind, body, "-k")
			if r.code != "401" || !strings.Contains(r.body, "only kube-scheduler may call the extender") {
				t.Errorf("bind without a certificate: %s %q (%s), want 401 and the reason", r.code, r.body, r.out)
			}
			// A certificate of the tenant's own CA, named like kube-scheduler's.
			r = curl(ctx, t, url, "/"+extender.VerbBind, body, "-k", "--cert", malloryCert, "--key", malloryKey)
			if r.exit == 0 || r.code != "000" {
				t.Errorf("bind with a foreign certificate: %s %q (exit %d, %s), want a failed handshake", r.code, r.body, r.exit, r.out)
			}
			// The extender's own serving certificate, signed by the right
			// CA (were it readable): not a client certificate.
			r = curl(ctx, t, url, "/"+extender.VerbBind, body, "--cacert", filepath.Join(dir, extender.DevCAFile),
				"--cert", filepath.Join(dir, extender.DevServingCertFile), "--key", filepath.Join(dir, extender.DevServingKeyFile))
			if r.exit == 0 || r.code != "000" {
				t.Errorf("bind with the serving certificate: %s %q (exit %d, %s), want a failed handshake", r.code, r.body, r.exit, r.out)
			}
			// Plain HTTP: not served.
			r = curl(ctx, t, strings.Replace(url, "https://", "http://", 1), "/"+extender.VerbBind, body)
			if r.code == "200" || strings.Contains(r.body, `"Error":""`) {
				t.Errorf("bind over plain HTTP: %s %q, want no bind", r.code, r.body)
			}
		})
	}
	filterBody, err := json.Marshal(&extenderv1.ExtenderArgs{Pod: pods[2], NodeNames: &[]string{node}})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/" + extender.VerbFilter, "/" + extender.VerbPrioritize, "/" + extender.VerbPreempt} {
		if r := curl(ctx, t, url, path, string(filterBody), "-k"); r.code != "401" {
			t.Errorf("%s without a certificate: %s %q, want 401", path, r.code, r.body)
		}
	}
	// The probes answer anyone; /debug/* is off without --debug-endpoints,
	// even to kube-scheduler.
	if r := curl(ctx, t, url, "/healthz", "", "-k"); r.code != "200" {
		t.Errorf("/healthz: %s %q, want 200", r.code, r.body)
	}
	if r := curl(ctx, t, url, extender.PathDebugLedger, "", "-k"); r.code != "404" {
		t.Errorf("/debug/ledger without a certificate: %s %q, want 404", r.code, r.body)
	}
	if r := curl(ctx, t, url, extender.PathDebugLedger, "", "--cacert", filepath.Join(dir, extender.DevCAFile),
		"--cert", filepath.Join(dir, extender.DevClientCertFile), "--key", filepath.Join(dir, extender.DevClientKeyFile)); r.code != "404" {
		t.Errorf("/debug/ledger with kube-scheduler's certificate: %s %q, want 404 (off)", r.code, r.body)
	}

	// Nothing was bound, and the refusals were counted.
	assertUnbound(ctx, t, ns, "plain", "no-gpu-nowhere", "half-nowhere")
	checkClusterLedger(ctx, t)
	if n := extenderMetric(ctx, t, `partita_extender_unauthenticated_requests_total{reason="Unauthenticated"}`); n < 1 {
		t.Errorf("refusals without a certificate counted %v times, want at least one", n)
	}
}

// TestTrustExtenderBindsOnlyWhatSchedulerWould: even with kube-scheduler's
// certificate (stolen, or a scheduler with a bug), bind refuses a pod that
// asks for no GPU, a GPU pod still held by its admission gate, and a GPU
// pod on a node its nodeSelector does not pick, or on a node that does not
// exist. The pod it may bind, on its own node, binds with its devices.
func TestTrustExtenderBindsOnlyWhatSchedulerWould(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	ensureGPUPriorityClass(ctx, t, clientset)
	ns := extNamespace(ctx, t, clientset)
	t.Cleanup(func() { deletePods(ctx, t, ns) })
	nowhere := map[string]string{"e2e.partita.dev/pool": "nowhere"}
	nodes, err := clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
	if err != nil || len(nodes.Items) < 2 {
		t.Fatalf("list GPU nodes: %v (%d, want 2)", err, len(nodes.Items))
	}
	own, other := nodes.Items[0].Name, nodes.Items[1].Name
	plain := unboundPod(ns, "plain", false, nowhere)
	gated := unboundPod(ns, "gated", true, nowhere)
	// Admitted by the admission loop onto its node, but no scheduler has
	// this name: it stays unbound until someone binds it.
	admitted := unboundPod(ns, "admitted", true, map[string]string{corev1.LabelHostname: own})
	admitted.Spec.SchedulerName = "e2e-nobody"
	for _, p := range []*corev1.Pod{plain, gated, admitted} {
		created, err := clientset.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
		*p = *created
	}
	poll(t, time.Minute, "the admission loop admits pod admitted", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(ns).Get(ctx, admitted.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		*admitted = *p
		return len(p.Spec.SchedulingGates) == 0, fmt.Sprintf("gates %v", p.Spec.SchedulingGates)
	})
	url := extenderURL(t)
	dir := extenderCertDir()
	asScheduler := []string{"--cacert", filepath.Join(dir, extender.DevCAFile),
		"--cert", filepath.Join(dir, extender.DevClientCertFile), "--key", filepath.Join(dir, extender.DevClientKeyFile)}
	cases := map[string]struct {
		pod  *corev1.Pod
		node string
		want string
	}{
		"a pod without GPUs":                   {pod: plain, node: own, want: "it requests no partita.dev/gpu-milli"},
		"a GPU pod still gated":                {pod: gated, node: own, want: "still held by the scheduling gates " + v1alpha1.SchedulingGateAdmission},
		"a GPU pod on a node it does not pick": {pod: admitted, node: other, want: "the pod's nodeSelector or required node affinity does not match the node"},
		"a GPU pod on no such node":            {pod: admitted, node: "e2e-no-such-node", want: "there is no such node"},
		"a GPU pod, node left blank":           {pod: admitted, node: "", want: "Node is required"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := curl(ctx, t, url, "/"+extender.VerbBind, bindBody(t, tc.pod, tc.node), asScheduler...)
			if !strings.Contains(r.body, tc.want) {
				t.Errorf("bind %s to %q: %s %q (%s), want a refusal saying %q", tc.pod.Name, tc.node, r.code, r.body, r.out, tc.want)
			}
		})
	}
	assertUnbound(ctx, t, ns, plain.Name, gated.Name, admitted.Name)

	// The one bind kube-scheduler would make goes through, with devices.
	resp, err := extenderHTTPClient(t, true).Post(url+"/"+extender.VerbBind, "application/json", strings.NewReader(bindBody(t, admitted, own)))
	if err != nil {
		t.Fatal(err)
	}
	var res extenderv1.ExtenderBindingResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || res.Error != "" {
		t.Fatalf("bind admitted to %s: %v %q", own, err, res.Error)
	}
	_ = resp.Body.Close()
	p, err := clientset.CoreV1().Pods(ns).Get(ctx, admitted.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != own || p.Annotations[v1alpha1.AnnotationDevicesPrefix+"main"] == "" {
		t.Errorf("pod admitted is on %q with devices %q, want %s with a device", p.Spec.NodeName, p.Annotations[v1alpha1.AnnotationDevicesPrefix+"main"], own)
	}
	checkClusterLedger(ctx, t)
	if n := extenderMetric(ctx, t, `partita_extender_binds_total{result="Refused"}`); n < 4 {
		t.Errorf("refused binds counted %v times, want at least 4", n)
	}
}

// extenderMetric returns the value of one series of the extender's
// /metrics (name with its labels, as exposed), -1 when absent.
func extenderMetric(ctx context.Context, t *testing.T, series string) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, extenderURL(t)+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := extenderHTTPClient(t, false).Do(req)
	if err != nil {
		t.Fatalf("read the extender's metrics: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", line, err)
			}
			return f
		}
	}
	return -1
}
