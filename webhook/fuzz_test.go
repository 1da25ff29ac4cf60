package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/partitatest"
)

// FuzzAdmissionReview sends arbitrary bodies to every webhook: the server
// answers 200 with a review, 400 or 413, and never fails (gin's recovery
// would turn a panic into 500).
func FuzzAdmissionReview(f *testing.F) {
	entries, err := os.ReadDir(filepath.Join("testdata", "admission"))
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".yaml")
		// Policy ConfigMap seeds compile Rego on every run and slow the
		// fuzzer tenfold; the ConfigMap path still gets every other body.
		if !ok || strings.HasPrefix(name, "policy-") {
			continue
		}
		req := readCase(f, name)
		body, _ := json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: req})
		f.Add(body)
	}
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"kind":{"kind":"Pod"},"operation":"CREATE","object":null}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"kind":{"kind":"Binding"},"subResource":"binding","operation":"CREATE","object":{"metadata":{"annotations":7}}}}`))
	h := newTestServer(f, testOptions{}, WithMaxRequestBytes(1<<20))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{PathMutatePods, PathValidatePods, PathValidatePolicies, PathValidatePodGroups} {
			rec := do(h, http.MethodPost, path, bytes.NewReader(body))
			switch rec.Code {
			case http.StatusOK:
				var out admissionv1.AdmissionReview
				if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || out.Response == nil {
					t.Fatalf("%s: 200 without a review: %v %s", path, err, rec.Body)
				}
			case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
			default:
				t.Fatalf("%s: status %d: %s", path, rec.Code, rec.Body)
			}
		}
	})
}

// FuzzPodRequest builds pods from fuzzed request values in every dialect.
// Whatever they say, the webhook decides without failing, and a pod it
// admits is canonical: mutating it again changes nothing, the validating
// webhook accepts it, and gpu.ParsePod reads the same request from it.
func FuzzPodRequest(f *testing.F) {
	f.Add("0.5", "", "", "", "", "", "", "")
	f.Add("", "20Gi", "2", "", "", "", "", "")
	f.Add("", "", "", "0.25", "", "", "", "team-a")
	f.Add("", "", "", "", "1", "8000", "30", "")
	f.Add("", "", "", "", "2", "", "", "all")
	f.Add("1.0000001", "1e3", "-1", "NaN", "1.5", "0", "101", "void")
	h := newTestServer(f, testOptions{gate: true})
	f.Fuzz(func(t *testing.T, fraction, memory, count, runai, nvidia, gpumem, cores, env string) {
		w := partitatest.MakePod("fuzz", "team-a").Container("main").Container("sidecar").Label(v1alpha1.LabelQueue, "team-a")
		for k, v := range map[string]string{
			v1alpha1.AnnotationGPUFraction: fraction, v1alpha1.AnnotationGPUMemory: memory,
			v1alpha1.AnnotationGPUCount: count, gpu.AnnotationRunAIGPUFraction: runai,
		} {
			if v != "" {
				w.Annotation(k, v)
			}
		}
		for name, v := range map[corev1.ResourceName]string{gpu.ResourceNVIDIAGPU: nvidia, gpu.ResourceHAMiGPUMem: gpumem, gpu.ResourceHAMiGPUCores: cores} {
			if v == "" {
				continue
			}
			if _, err := resource.ParseQuantity(v); err != nil {
				return // the API server refuses it before any webhook
			}
			w.Limit("main", name, v)
		}
		pod := w.Obj()
		pod.UID = ""
		if env != "" {
			pod.Spec.Containers[1].Env = []corev1.EnvVar{{Name: EnvVisibleDevices, Value: env}}
		}
		raw, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		req := &admissionv1.AdmissionRequest{
			UID: "fuzz", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: "team-a",
			Operation: admissionv1.Create, UserInfo: testUsers()[""], Object: runtime.RawExtension{Raw: raw},
		}
		first := outcomeOf(t, post(t, h, PathMutatePods, req))
		if !first.Allowed {
			if first.Status == nil || first.Status.Message == "" || first.Status.Code == http.StatusInternalServerError {
				t.Fatalf("refused without a reason a user can act on: %+v", first.Status)
			}
			return
		}
		patched := applyPatch(t, raw, first.Patch)
		generic, err := createPatch(raw, podOf(t, raw), podOf(t, patched))
		if err != nil {
			t.Fatal(err)
		}
		if want, have := applyPatch(t, raw, generic), patched; !bytes.Equal(canonicalJSON(t, want), canonicalJSON(t, have)) {
			t.Fatalf("podPatch and createPatch disagree:\n%s\n%s", want, have)
		}
		again := *req
		again.Object = runtime.RawExtension{Raw: patched}
		if second := outcomeOf(t, post(t, h, PathMutatePods, &again)); !second.Allowed || len(second.Patch) > 0 {
			t.Fatalf("second mutation: %+v", second)
		}
		if v := outcomeOf(t, post(t, h, PathValidatePods, &again)); !v.Allowed {
			t.Fatalf("validation refused the mutated pod: %+v", v.Status)
		}
		want, errs := gpu.ParsePod(pod)
		got, errs2 := gpu.ParsePod(podOf(t, patched))
		if len(errs) > 0 || len(errs2) > 0 {
			t.Fatalf("admitted a pod that does not parse: %v %v", errs, errs2)
		}
		if (want == nil) != (got == nil) || (want != nil && (want.Queue != got.Queue || len(want.Containers) != len(got.Containers) ||
			(len(want.Containers) > 0 && want.Containers[0] != got.Containers[0]))) {
			t.Fatalf("the canonical pod asks for %+v, the original for %+v", got, want)
		}
	})
}

func canonicalJSON(t testing.TB, b []byte) []byte {
	t.Helper()
	v, err := decodeGeneric(b)
	if err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
