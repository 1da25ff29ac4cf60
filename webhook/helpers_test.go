package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	jsonpatch5 "github.com/evanphx/json-patch/v5"
	"github.com/gin-gonic/gin"
	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/internal/envtestutil"
	"github.com/partita-dev/partita/internal/partitatest"
	"github.com/partita-dev/partita/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// partitaNamespace is Partita's namespace in these tests.
const partitaNamespace = "partita-system"

// testUsers are the requesters a case file can name.
func testUsers() map[string]authenticationv1.UserInfo {
	return map[string]authenticationv1.UserInfo{
		"":      {Username: "alice", Groups: []string{"system:authenticated"}},
		"admin": {Username: "kubernetes-admin", Groups: []string{"system:masters", "system:authenticated"}},
		"node":  {Username: "system:node:gpu-node-0", Groups: []string{"system:nodes", "system:authenticated"}},
		"extender": {Username: "system:serviceaccount:partita-system:partita-extender",
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:partita-system", "system:authenticated"}},
	}
}

// testState is the cluster the cases run against: research (limit 16) with
// leaves team-a (namespace team-a, limit 8) and team-b (namespace team-b),
// and the open queue default; namespace team-a defaults to queue team-a.
func testState(t testing.TB) policy.State {
	t.Helper()
	queues := []v1alpha1.Queue{
		*partitatest.MakeQueue("research").GPU("8", "16", 1).Obj(),
		*partitatest.MakeQueue("team-a").Parent("research").Namespaces("team-a").GPU("4", "8", 1).Obj(),
		*partitatest.MakeQueue("team-b").Parent("research").Namespaces("team-b").GPU("4", "-1", 1).Obj(),
		// The cluster's default queue, as the chart creates it.
		*partitatest.MakeQueue(v1alpha1.DefaultQueueName).Priority(0).GPU("0", "-1", 1).Obj(),
	}
	st, err := policy.BuildState(queues, []policy.NamespaceInfo{
		{Name: "team-a", Labels: map[string]string{v1alpha1.LabelDefaultQueue: "team-a"}},
		{Name: "team-b"},
		{Name: "other"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// testOptions vary the server per case.
type testOptions struct {
	gate          bool
	modes         []v1alpha1.IsolationMode
	schedulerName string
	// requireQueue gives the webhook no default queue (--require-queue).
	requireQueue bool
	// defaultQueue replaces the cluster's default queue.
	defaultQueue string
	// trusted replaces DefaultIdentities(partitaNamespace).
	trusted *Identities
	// policy adds Rego modules to the default bundle.
	policy map[string]string
	// templates, when set, runs the dra GPU backend over it.
	templates *memTemplates
	// claims reads pods' ResourceClaims from testClaims (WithClaims).
	claims bool
	// noModels: the cluster runs no model cache (WithModels(false)).
	noModels bool
}

// testClaims are the claims and templates the cases' pods name: two and one
// NVIDIA GPUs, and a NIC.
func testClaims() partitatest.ClaimSource {
	return partitatest.ClaimSource{
		Claims: []*resourceapi.ResourceClaim{
			partitatest.MakeResourceClaim("two-nvidia-gpus", "team-b").Devices("gpus", "gpu.nvidia.com", 2).Obj(),
			partitatest.MakeResourceClaim("two-nvidia-gpus", "other").Devices("gpus", "gpu.nvidia.com", 2).Obj(),
			partitatest.MakeResourceClaim("a-nic", "team-b").Devices("eth", "nic.example.com", 1).Obj(),
		},
		Templates: []*resourceapi.ResourceClaimTemplate{{
			ObjectMeta: metav1.ObjectMeta{Name: "one-nvidia-gpu", Namespace: "team-a"},
			Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: partitatest.MakeResourceClaim("x", "team-a").Devices("gpu", "gpu.nvidia.com", 1).Obj().Spec},
		}},
	}
}

// memTemplates is a TemplateStore in memory, for the dra backend's cases.
type memTemplates struct {
	lock    sync.Mutex
	byName  map[string]*resourceapi.ResourceClaimTemplate
	creates int
}

func newMemTemplates() *memTemplates {
	return &memTemplates{byName: map[string]*resourceapi.ResourceClaimTemplate{}}
}

func (m *memTemplates) Get(_ context.Context, ns, name string) (*resourceapi.ResourceClaimTemplate, error) {
	m.lock.Lock()
	defer m.lock.Unlock()
	t, ok := m.byName[ns+"/"+name]
	if !ok {
		return nil, apierrors.NewNotFound(resourceapi.Resource("resourceclaimtemplates"), name)
	}
	return t.DeepCopy(), nil
}

func (m *memTemplates) Ensure(ctx context.Context, t *resourceapi.ResourceClaimTemplate) error {
	got, err := m.Get(ctx, t.Namespace, t.Name)
	if apierrors.IsNotFound(err) {
		m.lock.Lock()
		m.byName[t.Namespace+"/"+t.Name] = t.DeepCopy()
		m.creates++
		m.lock.Unlock()
		return nil
	}
	return sameTemplate(got, t)
}

// testObjects are the objects pods and PodGroups name: in team-a, PodGroup
// train-a of queue team-a, PodGroup loose of no queue and PodGroup sharded
// of queue team-a with sub-groups r0 and r1 (2 each) of Topology dc-1
// (zone, block, rack, host); PriorityClasses train (1000) and batch (10);
// Models llama (s3, Secret s3-creds) and mistral (https) in team-a.
func testObjects(t testing.TB) client.Reader {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(
		partitatest.MakePodGroup("train-a", "team-a").MinMember(2).Queue("team-a").Obj(),
		partitatest.MakePodGroup("loose", "team-a").MinMember(2).Obj(),
		partitatest.MakePodGroup("sharded", "team-a").MinMember(4).Queue("team-a").Annotation(v1alpha1.AnnotationTopology, "dc-1").
			SubGroup("r0", 2, "network.example.com/rack", "").SubGroup("r1", 2, "network.example.com/rack", "").Obj(),
		partitatest.MakeTopology("dc-1", "topology.kubernetes.io/zone", "network.example.com/block", "network.example.com/rack", "kubernetes.io/hostname").Obj(),
		&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "train"}, Value: 1000},
		&schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "batch"}, Value: 10},
		&v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "llama"}, Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{
			URI: "s3://models/llama-3-8b", Endpoint: "http://s3.example:8333", SecretRef: &corev1.LocalObjectReference{Name: "s3-creds"}}}},
		&v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "mistral"}, Spec: v1alpha1.ModelSpec{Source: v1alpha1.ModelSource{
			URI: "https://models.example/mistral/model.safetensors"}}},
	).Build()
}

// newTestServer returns a server with a real policy engine over testState,
// on an H100 80GB cluster in time-slicing mode unless opts say otherwise.
func newTestServer(t testing.TB, opts testOptions, serverOpts ...ServerOption) http.Handler {
	t.Helper()
	engine := newTestEngine(t)
	if opts.policy != nil {
		if _, err := engine.Load(context.Background(), policy.DefaultBundle().Overlay(opts.policy), "test"); err != nil {
			t.Fatal(err)
		}
	}
	trusted := DefaultIdentities(partitaNamespace)
	if opts.trusted != nil {
		trusted = *opts.trusted
	}
	modes := opts.modes
	if modes == nil {
		modes = []v1alpha1.IsolationMode{v1alpha1.IsolationTimeSlicing}
	}
	refs := NewReferences(testObjects(t), nil)
	defaultQueue := v1alpha1.DefaultQueueName
	if opts.defaultQueue != "" {
		defaultQueue = opts.defaultQueue
	}
	if opts.requireQueue {
		defaultQueue = ""
	}
	popts := []PodOption{WithAdmissionGate(opts.gate), WithSchedulerName(opts.schedulerName), WithTrusted(trusted),
		WithReferences(refs), WithDefaultQueue(defaultQueue), WithModels(!opts.noModels)}
	if opts.templates != nil {
		popts = append(popts, WithGPUBackend(dra.BackendDRA, opts.templates))
	}
	if opts.claims {
		src := testClaims()
		popts = append(popts, WithClaims(func(p *corev1.Pod) dra.Demand { return dra.PodDemand(p, src, dra.DefaultGPUClasses, nil) }))
	}
	pods := NewPodAdmission(engine, StaticView{MemoryMiB: 81559, Modes: modes, Sizes: []int64{23034, 81559}}, popts...)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cl := fake.NewClientBuilder().WithScheme(scheme).Build()
	loader := policy.NewConfigMapLoader(cl, cl, engine, nil, partitaNamespace, policy.DefaultBatchInterval, clock.RealClock{})
	opt := append([]ServerOption{
		WithPolicyAdmission(NewPolicyAdmission(loader, partitaNamespace)),
		WithPodGroupAdmission(NewPodGroupAdmission(engine, refs)),
	}, serverOpts...)
	return NewServer(logr.Discard(), pods, opt...).Handler()
}

// newTestEngine is the default policy over testState.
func newTestEngine(t testing.TB) *policy.Engine {
	t.Helper()
	ctx := context.Background()
	engine, err := policy.NewEngine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.SetState(ctx, testState(t)); err != nil {
		t.Fatal(err)
	}
	return engine
}

// caseFile is a readable AdmissionRequest: testdata/admission/<name>.yaml.
type caseFile struct {
	Operation   admissionv1.Operation `json:"operation"`
	SubResource string                `json:"subResource"`
	Kind        string                `json:"kind"`
	Namespace   string                `json:"namespace"`
	User        string                `json:"user"`
	Object      json.RawMessage       `json:"object"`
	OldObject   json.RawMessage       `json:"oldObject"`
}

func readCase(t testing.TB, name string) *admissionv1.AdmissionRequest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "admission", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cf caseFile
	if err := yaml.Unmarshal(b, &cf); err != nil {
		t.Fatalf("read case %s: %v", name, err)
	}
	user, ok := testUsers()[cf.User]
	if !ok {
		t.Fatalf("case %s: unknown user %q", name, cf.User)
	}
	kind := cf.Kind
	if kind == "" {
		kind = "Pod"
	}
	gvk := metav1.GroupVersionKind{Version: "v1", Kind: kind}
	gvr := metav1.GroupVersionResource{Version: "v1", Resource: "pods"}
	switch kind {
	case "ConfigMap":
		gvr.Resource = "configmaps"
	case "PodGroup":
		gvk.Group, gvk.Version = v1alpha1.GroupVersion.Group, v1alpha1.GroupVersion.Version
		gvr = metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: "podgroups"}
	}
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	_ = json.Unmarshal(cf.Object, &meta)
	req := &admissionv1.AdmissionRequest{
		UID:         types.UID("uid-" + name),
		Kind:        gvk,
		Resource:    gvr,
		SubResource: cf.SubResource,
		Name:        meta.Metadata.Name,
		Namespace:   cf.Namespace,
		Operation:   cf.Operation,
		UserInfo:    user,
		Object:      runtime.RawExtension{Raw: cf.Object},
	}
	if len(cf.OldObject) > 0 {
		req.OldObject = runtime.RawExtension{Raw: cf.OldObject}
	}
	return req
}

// post sends req to path as an AdmissionReview and returns the response.
func post(t testing.TB, h http.Handler, path string, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
	if rec.Code != http.StatusOK {
		t.Fatalf("POST %s: status %d: %s", path, rec.Code, rec.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("decode response: %v", err)
	}
	if out.Response == nil || out.Response.UID != req.UID {
		t.Fatalf("response %+v does not answer request %s", out.Response, req.UID)
	}
	return out.Response
}

// outcome is what a response says, for comparisons.
type outcome struct {
	Allowed bool                  `json:"allowed"`
	Patch   []jsonpatch.Operation `json:"patch,omitempty"`
	Status  *metav1.Status        `json:"status,omitempty"`
}

func outcomeOf(t testing.TB, resp *admissionv1.AdmissionResponse) outcome {
	t.Helper()
	o := outcome{Allowed: resp.Allowed, Status: resp.Result}
	if len(resp.Patch) > 0 {
		if err := json.Unmarshal(resp.Patch, &o.Patch); err != nil {
			t.Fatalf("decode patch: %v", err)
		}
	}
	return o
}

// golden is the readable form of an outcome: the patch as YAML, a refusal
// as its code, reason and message on one line each (the API server shows
// the message as it is).
func golden(t testing.TB, o outcome) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "allowed: %v\n", o.Allowed)
	if st := o.Status; st != nil {
		fmt.Fprintf(&b, "status: %d %s\n", st.Code, st.Reason)
		fmt.Fprintf(&b, "message: |-\n  %s\n", strings.ReplaceAll(st.Message, "\n", "\n  "))
	}
	if len(o.Patch) > 0 {
		y, err := yaml.Marshal(map[string]any{"patch": o.Patch})
		if err != nil {
			t.Fatal(err)
		}
		b.Write(y)
	}
	return b.String()
}

// checkGolden compares got with testdata/admission/<name>.golden, or writes
// it with -update.
func checkGolden(t *testing.T, name string, got outcome) {
	t.Helper()
	text := golden(t, got)
	path := filepath.Join("testdata", "admission", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (run with -update to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), text); diff != "" {
		t.Errorf("response differs from %s (-want,+got); run with -update if the change is intended:\n%s", path, diff)
	}
}

// applyPatch applies a response's patch to the request's object.
func applyPatch(t testing.TB, obj []byte, ops []jsonpatch.Operation) []byte {
	t.Helper()
	if len(ops) == 0 {
		return obj
	}
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	return mustApply(t, obj, raw)
}

// podOf decodes a pod.
func podOf(t testing.TB, raw []byte) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	if err := json.Unmarshal(raw, pod); err != nil {
		t.Fatal(err)
	}
	return pod
}

func mustApply(t testing.TB, obj, patch []byte) []byte {
	t.Helper()
	p, err := jsonpatch5.DecodePatch(patch)
	if err != nil {
		t.Fatalf("decode patch: %v", err)
	}
	out, err := p.Apply(obj)
	if err != nil {
		t.Fatalf("apply patch %s: %v", patch, err)
	}
	return out
}

func TestMain(m *testing.M) {
	// gin's mode is process-wide; test mode keeps its route listing quiet.
	gin.SetMode(gin.TestMode)
	os.Exit(m.Run())
}
