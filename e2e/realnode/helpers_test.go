package realnode

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
)

// realNodeDir is the real node's directory in the cluster's state.
func realNodeDir() string {
	return filepath.Join(devcluster.DefaultOptions().WorkDir, "partita", clusterName, "real-node")
}

// podToken is the ServiceAccount token kubelet projected into a pod on
// the real node (its kube-api-access volume), read from the host: exactly
// the credential the pod's containers use.
func podToken(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	pattern := filepath.Join(realNodeDir(), "kubelet", "root", "pods", string(pod.UID), "volumes", "kubernetes.io~projected", "kube-api-access-*", "token")
	matches, err := filepath.Glob(pattern)
	if err != nil || len(matches) != 1 {
		t.Fatalf("the token of pod %s: %v (%v)", pod.Name, matches, err)
	}
	b, err := os.ReadFile(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// clientsetWithToken is a client of the cluster that authenticates with
// token alone (no admin certificate).
func clientsetWithToken(t *testing.T, token string) (kubernetes.Interface, *rest.Config) {
	t.Helper()
	admin, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(admin)
	cfg.BearerToken = token
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs, cfg
}

// podsMatching lists the pods of namespace that a NetworkPolicy peer's pod
// selector selects, by name.
func podsMatching(ctx context.Context, t *testing.T, namespace string, sel *metav1.LabelSelector) []string {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	pods, err := clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && s.Matches(labels.Set(p.Labels)) {
			names = append(names, p.Name)
		}
	}
	return names
}

// extenderTLS is a TLS configuration that verifies the extender's serving
// certificate as kube-scheduler does (the chart's CA, the Service's name)
// and presents cert, if any.
func extenderTLS(ctx context.Context, t *testing.T, cert *tls.Certificate) *tls.Config {
	t.Helper()
	s, err := clientset.CoreV1().Secrets(ns).Get(ctx, release+"-webhook-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.Data["ca.crt"]) {
		t.Fatalf("no CA in %s", s.Name)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: release + "-extender." + ns + ".svc"}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}

// extenderRequest makes one request to the extender pod at podIP from this
// host (pod IPs are routed through the node's bridge) and returns its
// status and body.
func extenderRequest(ctx context.Context, t *testing.T, podIP, method, path string, cfg *tls.Config) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	req, err := http.NewRequestWithContext(ctx, method, "https://"+net.JoinHostPort(podIP, "8443")+path, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s on the extender: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}

// metrics parses a Prometheus text exposition into "name{labels}" -> value.
func metrics(body string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// schedulerClientCert reads kube-scheduler's client certificate from the
// chart's Secret, checks what it is (signed by the Secret's CA, for client
// auth, the scheduler's name) and returns it for a TLS client.
func schedulerClientCert(ctx context.Context, t *testing.T) tls.Certificate {
	t.Helper()
	s, err := clientset.CoreV1().Secrets(ns).Get(ctx, release+"-scheduler-client-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(s.Data["tls.crt"], s.Data["tls.key"])
	if err != nil {
		t.Fatalf("the scheduler's client certificate in %s: %v", s.Name, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(s.Data["ca.crt"])
	if block == nil {
		t.Fatalf("no CA in %s", s.Name)
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the scheduler's client certificate does not verify against its CA for client auth: %v", err)
	}
	if leaf.Subject.CommonName != release+"-scheduler" {
		t.Errorf("the scheduler's client certificate is %q, want %s-scheduler", leaf.Subject.CommonName, release)
	}
	return pair
}

// sampleOutput runs the sample image once in namespace default with args
// (it prints and exits), waits until it ends and returns its log.
func sampleOutput(ctx context.Context, t *testing.T, prefix string, mutate func(*corev1.Pod), args ...string) string {
	t.Helper()
	pod := samplePod(prefix, nil)
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pod.Spec.Containers[0].Args = append(args, "--exit")
	if mutate != nil {
		mutate(pod)
	}
	pod = createPod(ctx, t, "default", pod)
	var done *corev1.Pod
	poll(t, 2*time.Minute, "pod "+pod.Name+" to run to completion", func() (bool, string) {
		p, err := clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		done = p
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, describePod(ctx, p)
	})
	b, err := clientset.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s: %v", pod.Name, err)
	}
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s ended %s:\n%s", pod.Name, done.Status.Phase, b)
	}
	return string(b)
}

// getResult is what the sample printed for --get URL: the status, or -1
// and the error, and the body.
func getResult(t *testing.T, logs, url string) (int, string) {
	t.Helper()
	var status = -1
	var body string
	for _, l := range strings.Split(logs, "\n") {
		if v, ok := strings.CutPrefix(l, "get "+url+": "); ok {
			if n, err := strconv.Atoi(v); err == nil {
				status = n
			} else {
				body = v
			}
		}
		if v, ok := strings.CutPrefix(l, "body: "); ok {
			body = v
		}
	}
	if status == -1 && body == "" {
		t.Fatalf("the sample printed nothing for --get %s:\n%s", url, logs)
	}
	return status, body
}

// fileLines is what the sample printed for --print-file path.
func fileLines(t *testing.T, logs, path string) []string {
	t.Helper()
	start, end := "file "+path+":", "end of file "+path
	var lines []string
	in := false
	for _, l := range strings.Split(logs, "\n") {
		switch {
		case l == start:
			in = true
		case l == end:
			return lines
		case in:
			lines = append(lines, l)
		}
	}
	t.Fatalf("the sample did not print %s whole:\n%s", path, logs)
	return nil
}

// describeAll is every pod of Partita's namespace, for failure messages.
func describeAll(ctx context.Context) string {
	return fmt.Sprint(devcluster.DescribePods(ctx, clientset, ns, ""))
}

// admissionProbe sends GPU pods to admission as a server-side dry run
// (both pod webhooks and the policies run, nothing is stored) every 300ms
// and records each one refused or admitted without the webhook's
// canonical form.
type admissionProbe struct {
	done     chan struct{}
	quit     chan struct{}
	lock     sync.Mutex
	failures []string
	calls    int
}

func startAdmissionProbe(ctx context.Context) *admissionProbe {
	p := &admissionProbe{done: make(chan struct{}), quit: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.quit:
				return
			case <-time.After(300 * time.Millisecond):
			}
			pod := samplePod("dry", map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"})
			got, err := clientset.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			p.lock.Lock()
			p.calls++
			switch {
			case err != nil:
				p.failures = append(p.failures, time.Now().Format(time.RFC3339Nano)+" "+err.Error())
			case got.Annotations[v1alpha1.AnnotationGPUCount] == "":
				p.failures = append(p.failures, "a pod was admitted without the webhook's canonical annotations")
			}
			p.lock.Unlock()
		}
	}()
	return p
}

// stop ends the probe and returns its failures and how many it sent.
func (p *admissionProbe) stop() ([]string, int) {
	close(p.quit)
	<-p.done
	p.lock.Lock()
	defer p.lock.Unlock()
	return p.failures, p.calls
}
