package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/internal/clientauth"
	"github.com/partita-dev/partita/internal/partitatest"
)

// countingPolicies counts the policy ConfigMaps the webhook compiles and
// refuses each, naming its modules.
type countingPolicies struct{ compiled atomic.Int32 }

func (c *countingPolicies) CheckConfigMap(_ context.Context, cm *corev1.ConfigMap) error {
	c.compiled.Add(1)
	names := make([]string, 0, len(cm.Data))
	for k := range cm.Data {
		names = append(names, k)
	}
	return fmt.Errorf("compile %s: not rego", strings.Join(names, ", "))
}

// TestOnlyTheAPIServerIsAnswered serves the webhooks as the binary does,
// with the API server's CA, and calls them as the API server and as others
// would: only a caller with the API server's certificate gets an
// AdmissionReview back, and a forged review from anyone else has no side
// effect (its Rego is never compiled).
func TestOnlyTheAPIServerIsAnswered(t *testing.T) {
	dir := t.TempDir()
	serving, err := EnsureDevCertificates(DevCertificateOptions{Dir: dir, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	apiserverCA, otherCA := partitatest.NewCA(t, "apiserver-client-ca"), partitatest.NewCA(t, "other-ca")
	caFile := filepath.Join(dir, "client-ca.crt")
	if err := os.WriteFile(caFile, apiserverCA.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cas, err := clientauth.NewCAs(caFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cw, err := WatchCertificates(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	policies := &countingPolicies{}
	h := newTestServer(t, testOptions{}, WithPolicyAdmission(NewPolicyAdmission(policies, partitaNamespace)),
		WithCallerCheck(CallerCheck([]string{DefaultClientName}), true))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ServeTLS(ctx, l, h, cw.GetCertificate, cas, logr.Discard()) }()

	// A policy ConfigMap whose Rego does not compile: answered, the review
	// denies it; refused before it is read, nothing compiles.
	policyReview := createReview(t, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: partitaNamespace, Labels: map[string]string{"partita.dev/policy": "rego"}},
		Data:       map[string]string{"bad.rego": "package partita.admission\nthis is not rego"},
	}, "ConfigMap")
	podReview := createReview(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team-a"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "x"}}}}, "Pod")
	cases := map[string]struct {
		cert       *tls.Certificate
		path       string
		body       []byte
		wantStatus int
		wantBody   string
		wantReview bool
	}{
		"probe without a certificate": {path: PathHealthz, wantStatus: http.StatusOK},
		"pod review without a certificate": {path: PathMutatePods, body: podReview, wantStatus: http.StatusUnauthorized,
			wantBody: "no client certificate; only kube-apiserver may call the admission webhooks"},
		"forged policy review without a certificate": {path: PathValidatePolicies, body: policyReview, wantStatus: http.StatusUnauthorized,
			wantBody: "no client certificate"},
		"a certificate of another name": {cert: ptr.To(apiserverCA.Client(t, "someone")), path: PathValidatePods, body: podReview,
			wantStatus: http.StatusForbidden, wantBody: `"someone" is not one of the allowed names (` + DefaultClientName},
		// Go's client offers no certificate that the server's list of
		// acceptable CAs does not name: it connects without one.
		"a certificate of another CA": {cert: ptr.To(otherCA.Client(t, DefaultClientName)), path: PathValidatePods, body: podReview,
			wantStatus: http.StatusUnauthorized, wantBody: "no client certificate"},
		"the API server's pod review": {cert: ptr.To(apiserverCA.Client(t, DefaultClientName)), path: PathMutatePods, body: podReview,
			wantStatus: http.StatusOK, wantReview: true},
		"the API server's policy review": {cert: ptr.To(apiserverCA.Client(t, DefaultClientName)), path: PathValidatePolicies, body: policyReview,
			wantStatus: http.StatusOK, wantReview: true, wantBody: "bad.rego"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			status, body, err := callWebhook(t, l.Addr().String(), serving, tc.cert, tc.path, tc.body)
			if err != nil {
				t.Fatalf("%s: %v", tc.path, err)
			}
			if status != tc.wantStatus || !strings.Contains(body, tc.wantBody) {
				t.Errorf("%s = %d %q, want %d containing %q", tc.path, status, body, tc.wantStatus, tc.wantBody)
			}
			var review admissionv1.AdmissionReview
			gotReview := json.Unmarshal([]byte(body), &review) == nil && review.Response != nil
			if gotReview != tc.wantReview {
				t.Errorf("%s answered an AdmissionReview: %v, want %v (body %q)", tc.path, gotReview, tc.wantReview, body)
			}
		})
	}
	if got := policies.compiled.Load(); got != 1 {
		t.Errorf("policy ConfigMaps compiled: %d, want 1 (the API server's review only)", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// createReview is an AdmissionReview of a CREATE of obj.
func createReview(t *testing.T, obj runtime.Object, kind string) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	meta, ok := obj.(metav1.Object)
	if !ok {
		t.Fatalf("%T has no metadata", obj)
	}
	return reviewBody(t, &admissionv1.AdmissionRequest{UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: kind},
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: strings.ToLower(kind) + "s"}, Operation: admissionv1.Create,
		Name: meta.GetName(), Namespace: meta.GetNamespace(), Object: runtime.RawExtension{Raw: raw}})
}

// callWebhook posts body to path (GET without a body) over TLS, trusting
// servingCA, with cert as the client certificate when set.
func callWebhook(t *testing.T, addr string, servingCA []byte, cert *tls.Certificate, path string, body []byte) (int, string, error) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(servingCA)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	method := http.MethodGet
	if body != nil {
		method = http.MethodPost
	}
	req, err := http.NewRequestWithContext(t.Context(), method, "https://"+addr+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}
