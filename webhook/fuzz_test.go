package webhook

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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

// FuzzPodRequest builds pods from fuzzed request values in every dialect,
// topology keys (Partita's, KAI's, Kueue's) and sub-group included.
// Whatever they say, the webhook decides without failing, and a pod it
// admits is canonical: mutating it again changes nothing, the validating
// webhook accepts it, and gpu.ParsePod reads the same request from it, as
// the admission loop's readers of any dialect do.
func FuzzPodRequest(f *testing.F) {
	f.Add("0.5", "", "", "", "", "", "", "", "", "", "", "", "")
	f.Add("", "20Gi", "2", "", "", "", "", "", "", "", "", "", "")
	f.Add("", "", "", "0.25", "", "", "", "team-a", "", "", "", "", "")
	f.Add("", "", "", "", "1", "8000", "30", "", "", "", "", "", "")
	f.Add("", "", "", "", "2", "", "", "all", "", "", "", "", "")
	f.Add("1.0000001", "1e3", "-1", "NaN", "1.5", "0", "101", "void", "", "", "", "", "")
	f.Add("0.5", "", "", "", "", "", "", "", "dc-1", "network.example.com/rack", "network.example.com/rack", "kubernetes.io/hostname", "r0")
	f.Add("", "", "", "", "1", "", "", "", "DC_1", "rack", "block", "a/b/c", "-r0")
	h := newTestServer(f, testOptions{gate: true})
	f.Fuzz(func(t *testing.T, fraction, memory, count, runai, nvidia, gpumem, cores, env, topology, required, kaiRequired, kueuePreferred, kaiSubGroup string) {
		w := partitatest.MakePod("fuzz", "team-a").Container("main").Container("sidecar").Label(v1alpha1.LabelQueue, "team-a")
		for k, v := range map[string]string{
			v1alpha1.AnnotationGPUFraction: fraction, v1alpha1.AnnotationGPUMemory: memory,
			v1alpha1.AnnotationGPUCount: count, gpu.AnnotationRunAIGPUFraction: runai,
			v1alpha1.AnnotationTopology: topology, v1alpha1.AnnotationTopologyRequired: required,
			v1alpha1.AnnotationKAITopologyRequired: kaiRequired, v1alpha1.AnnotationKueueTopologyPreferred: kueuePreferred,
		} {
			if v != "" {
				w.Annotation(k, v)
			}
		}
		if kaiSubGroup != "" {
			w.Label(v1alpha1.LabelKAISubGroup, kaiSubGroup)
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
			(len(want.Containers) > 0 && want.Containers[0] != got.Containers[0]) || want.Topology != got.Topology || want.SubGroup != got.SubGroup)) {
			t.Fatalf("the canonical pod asks for %+v, the original for %+v", got, want)
		}
		if got != nil {
			mutated := podOf(t, patched)
			if read := v1alpha1.TopologyRequestOf(mutated.Annotations); read != got.Topology {
				t.Fatalf("the admission loop would read topology %+v from the canonical pod, ParsePod %+v", read, got.Topology)
			}
			if read := v1alpha1.SubGroupOf(mutated.Labels); read != got.SubGroup {
				t.Fatalf("the admission loop would read sub-group %q from the canonical pod, ParsePod %q", read, got.SubGroup)
			}
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

// FuzzPodReviewDecode checks that the pod webhooks' one-pass decoding
// (decodePodReview) reads every body as the generic envelope and the
// object's own decode do: the same request, and the same pod, Binding or
// error.
func FuzzPodReviewDecode(f *testing.F) {
	entries, err := os.ReadDir(filepath.Join("testdata", "admission"))
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".yaml"); ok && !strings.HasPrefix(name, "policy-") {
			body, _ := json.Marshal(admissionv1.AdmissionReview{
				TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}, Request: readCase(f, name)})
			f.Add(body)
		}
	}
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"kind":"Binding"},"subResource":"binding","operation":"CREATE","object":{"metadata":{"name":"p","annotations":{"a":"b"}},"target":{"kind":"Node","name":"n"}}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"1","kind":{"kind":"Pod"},"operation":"UPDATE","object":{"spec":{"containers":[{"name":"a"}]}},"oldObject":{"spec":{"containers":7}}}}`))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","Request":{"UID":"1","kind":{"kind":"Pod"},"object":{}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		want, wantErr := decodeReview(body)
		got, gotErr := decodePodReview(body)
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("decodeReview: %v; decodePodReview: %v", wantErr, gotErr)
		}
		if wantErr != nil {
			if wantErr.Error() != gotErr.Error() {
				t.Fatalf("errors differ: %q and %q", wantErr, gotErr)
			}
			return
		}
		w, g := *want.Request, *got.Request
		w.Object, w.OldObject, g.Object, g.OldObject = runtime.RawExtension{}, runtime.RawExtension{}, runtime.RawExtension{}, runtime.RawExtension{}
		if d := cmp.Diff(w, g); d != "" || want.TypeMeta != got.TypeMeta {
			t.Fatalf("requests differ (-generic +one pass):\n%s", d)
		}
		for _, o := range []struct {
			what      string
			want, got runtime.RawExtension
		}{{"object", want.Request.Object, got.Request.Object}, {"old object", want.Request.OldObject, got.Request.OldObject}} {
			if want.Request.Kind.Kind == "Binding" {
				var wb, gb corev1.Binding
				we, ge := decodeInto(o.want, o.what, &wb), decodeInto(o.got, o.what, &gb)
				if fmt.Sprint(we) != fmt.Sprint(ge) || !equality.Semantic.DeepEqual(wb, gb) {
					t.Fatalf("%s: bindings differ: %v %v\n%+v\n%+v", o.what, we, ge, wb, gb)
				}
				continue
			}
			wp, we := decodePod(o.want, want.Request.Namespace, o.what)
			gp, ge := decodePod(o.got, got.Request.Namespace, o.what)
			if fmt.Sprint(we) != fmt.Sprint(ge) || !equality.Semantic.DeepEqual(wp, gp) {
				t.Fatalf("%s: pods differ: %v %v\n%+v\n%+v", o.what, we, ge, wp, gp)
			}
		}
	})
}
