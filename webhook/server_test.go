package webhook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
)

func do(h http.Handler, method, path string, body io.Reader) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, body))
	return rec
}

func TestServerEndpoints(t *testing.T) {
	reg := prometheus.NewRegistry()
	notReady := errors.New("the policy has not seen the cluster state yet")
	ready := notReady
	h := newTestServer(t, testOptions{},
		WithMetrics(NewMetrics(reg), promhttp.HandlerFor(reg, promhttp.HandlerOpts{})),
		WithReady(func() error { return ready }))

	if rec := do(h, http.MethodGet, PathHealthz, nil); rec.Code != http.StatusOK {
		t.Errorf("healthz = %d", rec.Code)
	}
	if rec := do(h, http.MethodGet, PathReadyz, nil); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), notReady.Error()) {
		t.Errorf("readyz before ready = %d %q", rec.Code, rec.Body)
	}
	ready = nil
	if rec := do(h, http.MethodGet, PathReadyz, nil); rec.Code != http.StatusOK {
		t.Errorf("readyz = %d", rec.Code)
	}
	post(t, h, PathMutatePods, readCase(t, "mutate-partita-fraction"))
	post(t, h, PathMutatePods, readCase(t, "deny-spoofed-devices"))
	do(h, http.MethodPost, PathMutatePods, strings.NewReader("{"))
	rec := do(h, http.MethodGet, PathMetrics, nil)
	for _, want := range []string{
		`partita_webhook_admission_duration_seconds_count{operation="CREATE",webhook="mutate-pods"} 2`,
		`partita_webhook_admission_requests_total{operation="CREATE",result="allowed",webhook="mutate-pods"} 1`,
		`partita_webhook_denials_total{reason="SystemKey",webhook="mutate-pods"} 1`,
		`partita_webhook_bad_requests_total{reason="decode"} 1`,
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestServerBadRequests(t *testing.T) {
	review := func(apiVersion string, req *admissionv1.AdmissionRequest) string {
		b, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: apiVersion, Kind: "AdmissionReview"}, Request: req})
		return string(b)
	}
	cases := map[string]struct {
		body     io.Reader
		length   int64
		wantCode int
		wantBody string
	}{
		"not JSON":          {body: strings.NewReader("<xml/>"), wantCode: http.StatusBadRequest, wantBody: "decode AdmissionReview"},
		"v1beta1":           {body: strings.NewReader(review("admission.k8s.io/v1beta1", &admissionv1.AdmissionRequest{})), wantCode: http.StatusBadRequest, wantBody: "admissionReviewVersions: [v1]"},
		"no request":        {body: strings.NewReader(review("admission.k8s.io/v1", nil)), wantCode: http.StatusBadRequest, wantBody: "has no request"},
		"declared too long": {body: strings.NewReader("{}"), length: 8 << 20, wantCode: http.StatusRequestEntityTooLarge, wantBody: "over the webhook's limit"},
		"streams too long":  {body: io.MultiReader(strings.NewReader(`{"x":"`), &endless{}), length: -1, wantCode: http.StatusRequestEntityTooLarge, wantBody: "over the webhook's limit"},
	}
	h := newTestServer(t, testOptions{}, WithMaxRequestBytes(1<<20))
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, PathMutatePods, tc.body)
			if tc.length != 0 {
				req.ContentLength = tc.length
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.wantCode || !strings.Contains(rec.Body.String(), tc.wantBody) {
				t.Errorf("got %d %q, want %d containing %q", rec.Code, rec.Body, tc.wantCode, tc.wantBody)
			}
		})
	}
}

// endless is a body that never ends.
type endless struct{}

func (*endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

// TestServerLargeObject: a pod of 3 MiB (the API server's limit) is decided
// with memory bounded by a small multiple of its size.
func TestServerLargeObject(t *testing.T) {
	h := newTestServer(t, testOptions{})
	req := readCase(t, "mutate-partita-fraction")
	pod := podOf(t, req.Object.Raw)
	pod.Annotations["notes"] = strings.Repeat("x", 3<<20)
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	req.Object = k8sruntime.RawExtension{Raw: raw}
	body, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})

	measure := func(path string, body []byte) *httptest.ResponseRecorder {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		rec := do(h, http.MethodPost, path, bytes.NewReader(body))
		runtime.ReadMemStats(&after)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", path, rec.Code, rec.Body)
		}
		allocated := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d MiB allocated for a %d MiB request", path, allocated>>20, len(body)>>20)
		if limit := uint64(16 * len(body)); allocated > limit {
			t.Errorf("%s allocated %d bytes for a %d-byte request, want at most %d", path, allocated, len(body), limit)
		}
		return rec
	}
	rec := measure(PathMutatePods, body)
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || !out.Response.Allowed {
		t.Fatalf("large pod: %v %s", err, fmt.Sprint(out.Response))
	}
	var ops []jsonpatch.Operation
	if err := json.Unmarshal(out.Response.Patch, &ops); err != nil {
		t.Fatal(err)
	}
	req.Object = k8sruntime.RawExtension{Raw: applyPatch(t, raw, ops)}
	body, _ = json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	rec = measure(PathValidatePods, body)
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || !out.Response.Allowed {
		t.Fatalf("large pod, validated: %v %s", err, fmt.Sprint(out.Response))
	}
}
