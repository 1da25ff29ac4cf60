package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// BenchmarkAdmission measures what one GPU pod costs the webhook in-process,
// through the gin handler: the mutating review (parse, system keys, Rego
// policy, canonical form, patch) and the validating review of the result,
// JSON encoding and decoding included. It reports the p50 and p99 of one
// mutate+validate pair.
//
// spec-policy adds a rule on input.pod.spec, which makes the webhook put
// the pod's spec into the policy's input: what an operator's rule on the
// spec costs (docs/policy.md).
func BenchmarkAdmission(b *testing.B) {
	specRule := map[string]string{"spec.rego": "package partita.admission\n\ndeny contains \"no privileged GPU pods\" if {\n\tsome c in input.pod.spec.containers\n\tc.securityContext.privileged\n}\n"}
	cases := map[string]struct {
		file   string
		policy map[string]string
	}{
		"runai-fraction":             {file: "mutate-runai-fraction"},
		"hami-sidecar":               {file: "mutate-sidecar-and-init"},
		"runai-fraction-spec-policy": {file: "mutate-runai-fraction", policy: specRule},
		"hami-sidecar-spec-policy":   {file: "mutate-sidecar-and-init", policy: specRule},
	}
	for name, tc := range cases {
		b.Run(name, func(b *testing.B) {
			h := newTestServer(b, testOptions{gate: true, policy: tc.policy})
			req := readCase(b, tc.file)
			mutateBody := reviewBody(b, req)
			resp := post(b, h, PathMutatePods, req)
			mutated := *req
			mutated.Object = runtime.RawExtension{Raw: mustApply(b, req.Object.Raw, resp.Patch)}
			validateBody := reviewBody(b, &mutated)
			var lat []time.Duration
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				start := time.Now()
				for _, c := range []struct {
					path string
					body []byte
				}{{PathMutatePods, mutateBody}, {PathValidatePods, validateBody}} {
					rec := do(h, http.MethodPost, c.path, bytes.NewReader(c.body))
					if rec.Code != http.StatusOK {
						b.Fatalf("%s: %d", c.path, rec.Code)
					}
				}
				lat = append(lat, time.Since(start))
			}
			b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(len(lat)), "cpu-µs/op")
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

func reviewBody(b testing.TB, req *admissionv1.AdmissionRequest) []byte {
	b.Helper()
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// cpuTime is the CPU time (user and system, all threads, GC included) the
// process has used: on a shared machine it measures the work, where the
// wall clock also measures the neighbours.
func cpuTime(b testing.TB) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
