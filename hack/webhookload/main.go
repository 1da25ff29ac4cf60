// Command webhookload sends AdmissionReviews to a running `partita webhook`
// over HTTPS at a fixed rate from its own process, and prints the latency
// percentiles and the errors: the loopback benchmark of docs/benchmarks.md.
//
//	go run ./hack/webhookload --url https://127.0.0.1:PORT --ca CA.crt --cert client.crt --key client.key --rate 500 --duration 30s
//
// The webhook answers the API server's client certificate only: on the dev
// cluster, --cert and --key are <work-dir>/partita/<cluster>/webhook-client/client.{crt,key}.
//
// Requests alternate between /mutate-pods (a Run:ai fraction pod, as a
// user writes it) and /validate-pods (the same pod in canonical form); an
// error is a transport failure, a status other than 200, or a review that
// does not allow the pod. The schedule is open-loop: a slow answer does not
// delay the next request, so queueing shows in the latency.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

func main() {
	url := flag.String("url", "", "base URL of the webhook, https://127.0.0.1:PORT")
	caFile := flag.String("ca", "", "PEM CA that signed the webhook's certificate")
	rate := flag.Int("rate", 500, "requests per second")
	duration := flag.Duration("duration", 30*time.Second, "how long to send")
	namespace := flag.String("namespace", "default", "namespace of the pods sent")
	queue := flag.String("queue", "default", "queue label of the pods sent (the validating webhook refuses a GPU pod without one; empty: none)")
	http1 := flag.Bool("http1", false, "use HTTP/1.1 with a pool of connections instead of HTTP/2 (kube-apiserver uses HTTP/2)")
	certFile := flag.String("cert", "", "the API server's webhook client certificate, which the webhook requires")
	keyFile := flag.String("key", "", "its key")
	flag.Parse()
	if *certFile == "" || *keyFile == "" {
		fmt.Fprintln(os.Stderr, "webhookload: --cert and --key are required: the webhook answers the API server's client certificate only")
		os.Exit(2)
	}
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "webhookload: client certificate:", err)
		os.Exit(1)
	}
	if err := run(*url, *caFile, *namespace, *queue, *rate, *duration, *http1, cert); err != nil {
		fmt.Fprintln(os.Stderr, "webhookload:", err)
		os.Exit(1)
	}
}

type result struct {
	latency time.Duration
	err     error
}

func run(url, caFile, namespace, queue string, rate int, duration time.Duration, http1 bool, cert tls.Certificate) error {
	if url == "" || caFile == "" || rate <= 0 {
		return errors.New("--url, --ca and a positive --rate are required")
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return fmt.Errorf("no certificate in %s", caFile)
	}
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}},
		MaxIdleConnsPerHost: 256,
		ForceAttemptHTTP2:   !http1,
	}
	if http1 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	client := &http.Client{Transport: tr, Timeout: 3 * time.Second}
	mutate, validate, err := bodies(namespace, queue)
	if err != nil {
		return err
	}
	// Warm the connection pool and the server.
	for range 20 {
		_ = send(context.Background(), client, url+"/mutate-pods", mutate)
	}

	total := int(duration.Seconds() * float64(rate))
	results := make([]result, total)
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			path, body := "/mutate-pods", mutate
			if i%2 == 1 {
				path, body = "/validate-pods", validate
			}
			t0 := time.Now()
			err := send(context.Background(), client, url+path, body)
			results[i] = result{latency: time.Since(t0), err: err}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)

	lat := make([]time.Duration, 0, total)
	errs := map[string]int{}
	for _, r := range results {
		if r.err != nil {
			errs[r.err.Error()]++
			continue
		}
		lat = append(lat, r.latency)
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(float64(len(lat))*p))]
	}
	fmt.Printf("requests: %d in %.1fs (%.0f/s), errors: %d\n", total, elapsed.Seconds(), float64(total)/elapsed.Seconds(), total-len(lat))
	fmt.Printf("latency: p50 %v  p90 %v  p99 %v  p99.9 %v  max %v\n",
		pct(0.50).Round(time.Microsecond), pct(0.90).Round(time.Microsecond), pct(0.99).Round(time.Microsecond),
		pct(0.999).Round(time.Microsecond), pct(1).Round(time.Microsecond))
	for e, n := range errs {
		fmt.Printf("error x%d: %s\n", n, e)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d requests failed", total-len(lat))
	}
	return nil
}

func send(ctx context.Context, c *http.Client, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(b, &out); err != nil {
		return fmt.Errorf("decode review: %w", err)
	}
	if out.Response == nil || !out.Response.Allowed {
		msg := ""
		if out.Response != nil && out.Response.Result != nil {
			msg = out.Response.Result.Message
		}
		return fmt.Errorf("refused: %s", msg)
	}
	return nil
}

// bodies returns the mutate review of a Run:ai fraction pod and the
// validate review of its canonical form.
func bodies(namespace, queue string) ([]byte, []byte, error) {
	user := authenticationv1.UserInfo{Username: "load", Groups: []string{"system:authenticated"}}
	pod := corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "load-", Namespace: namespace, Annotations: map[string]string{"gpu-fraction": "0.5"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "nvcr.io/nvidia/pytorch:24.05-py3"}}},
	}
	canonical := pod.DeepCopy()
	canonical.Annotations["partita.dev/gpu-fraction"] = "0.5"
	canonical.Annotations["partita.dev/gpu-count"] = "1"
	if queue != "" {
		pod.Labels = map[string]string{"partita.dev/queue": queue}
		canonical.Labels = map[string]string{"partita.dev/queue": queue}
	}
	// The webhook's --admission-gate (on by default) adds the gate.
	canonical.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "partita.dev/admission"}}
	c := &canonical.Spec.Containers[0]
	c.Env = []corev1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
		APIVersion: "v1", FieldPath: "metadata.annotations['partita.dev/devices.main']"}}}}
	c.Resources.Limits = corev1.ResourceList{"partita.dev/gpu-milli": *resourceMilli(500)}
	c.Resources.Requests = corev1.ResourceList{"partita.dev/gpu-milli": *resourceMilli(500)}
	review := func(p *corev1.Pod, uid string) ([]byte, error) {
		raw, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		return json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{
				UID: types.UID(uid), Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
				Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: namespace,
				Operation: admissionv1.Create, UserInfo: user, Object: runtime.RawExtension{Raw: raw},
			},
		})
	}
	m, err := review(&pod, "load-mutate")
	if err != nil {
		return nil, nil, err
	}
	v, err := review(canonical, "load-validate")
	return m, v, err
}

func resourceMilli(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.DecimalSI) }
