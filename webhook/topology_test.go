package webhook

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/partitatest"
)

// podReview is a pod CREATE (old nil) or UPDATE from alice.
func podReview(t testing.TB, pod, old *corev1.Pod) *admissionv1.AdmissionRequest {
	t.Helper()
	req := &admissionv1.AdmissionRequest{
		UID: "topology", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: pod.Namespace,
		Operation: admissionv1.Create, UserInfo: testUsers()[""], Object: runtime.RawExtension{Raw: mustJSON(t, pod)},
	}
	if old != nil {
		req.Operation, req.OldObject = admissionv1.Update, runtime.RawExtension{Raw: mustJSON(t, old)}
	}
	return req
}

// topologyKeys are the topology annotations and sub-group labels of p, in
// every dialect.
func topologyKeys(p *corev1.Pod) (annotations, labels map[string]string) {
	annotations, labels = map[string]string{}, map[string]string{}
	for _, k := range gpu.TopologyAnnotations() {
		if v, ok := p.Annotations[k]; ok {
			annotations[k] = v
		}
	}
	for _, k := range gpu.SubGroupLabels() {
		if v, ok := p.Labels[k]; ok {
			labels[k] = v
		}
	}
	return annotations, labels
}

// TestPodTopologyCanonical: the mutating webhook writes Partita's topology
// keys and sub-group label beside another dialect's, and leaves the pod
// canonical: mutating it again changes nothing, its seal covers them, and
// the validating webhook accepts it. A pod without GPUs is left alone,
// whatever topology keys it has.
func TestPodTopologyCanonical(t *testing.T) {
	gpuPod := func() *partitatest.PodWrapper {
		return partitatest.MakePod("p", "team-a").Container("main").GPUFraction("0.5").Queue("team-a")
	}
	cases := map[string]struct {
		pod             *corev1.Pod
		wantAnnotations map[string]string
		wantLabels      map[string]string
		wantSeal        string
	}{
		"KAI's topology and sub-group": {
			pod: gpuPod().Annotation(v1alpha1.AnnotationKAITopology, "dc-1").
				Annotation(v1alpha1.AnnotationKAITopologyRequired, "network.example.com/block").
				Annotation(v1alpha1.AnnotationKAITopologyPreferred, "network.example.com/rack").
				Label(v1alpha1.LabelKAISubGroup, "r0").Obj(),
			wantAnnotations: map[string]string{
				v1alpha1.AnnotationKAITopology:          "dc-1",
				v1alpha1.AnnotationKAITopologyRequired:  "network.example.com/block",
				v1alpha1.AnnotationKAITopologyPreferred: "network.example.com/rack",
				v1alpha1.AnnotationTopology:             "dc-1",
				v1alpha1.AnnotationTopologyRequired:     "network.example.com/block",
				v1alpha1.AnnotationTopologyPreferred:    "network.example.com/rack",
			},
			wantLabels: map[string]string{v1alpha1.LabelKAISubGroup: "r0", v1alpha1.LabelSubGroup: "r0"},
			wantSeal: "v1;q=team-a;g=;s=;p=;c=main:500;a=partita.dev/gpu-fraction=0.5,partita.dev/gpu-count=1," +
				"partita.dev/topology=dc-1,partita.dev/topology-required=network.example.com/block,partita.dev/topology-preferred=network.example.com/rack," +
				"kai.scheduler/topology=dc-1,kai.scheduler/topology-required-placement=network.example.com/block," +
				"kai.scheduler/topology-preferred-placement=network.example.com/rack;l=partita.dev/sub-group=r0,kai.scheduler/subgroup-name=r0",
		},
		"Kueue's levels": {
			pod: gpuPod().Annotation(v1alpha1.AnnotationKueueTopologyRequired, "cloud.example.com/block").
				Annotation(v1alpha1.AnnotationKueueTopologyPreferred, "kubernetes.io/hostname").Obj(),
			wantAnnotations: map[string]string{
				v1alpha1.AnnotationKueueTopologyRequired:  "cloud.example.com/block",
				v1alpha1.AnnotationKueueTopologyPreferred: "kubernetes.io/hostname",
				v1alpha1.AnnotationTopologyRequired:       "cloud.example.com/block",
				v1alpha1.AnnotationTopologyPreferred:      "kubernetes.io/hostname",
			},
			wantLabels: map[string]string{},
			wantSeal: "v1;q=team-a;g=;s=;p=;c=main:500;a=partita.dev/gpu-fraction=0.5,partita.dev/gpu-count=1," +
				"partita.dev/topology-required=cloud.example.com/block,partita.dev/topology-preferred=kubernetes.io/hostname," +
				"kueue.x-k8s.io/podset-required-topology=cloud.example.com/block,kueue.x-k8s.io/podset-preferred-topology=kubernetes.io/hostname",
		},
		"Partita's own keys stay as written": {
			pod: gpuPod().Annotation(v1alpha1.AnnotationTopologyRequired, "kubernetes.io/hostname").Label(v1alpha1.LabelSubGroup, "r1").Obj(),
			wantAnnotations: map[string]string{
				v1alpha1.AnnotationTopologyRequired: "kubernetes.io/hostname",
			},
			wantLabels: map[string]string{v1alpha1.LabelSubGroup: "r1"},
			wantSeal:   "v1;q=team-a;g=;s=;p=;c=main:500;a=partita.dev/gpu-fraction=0.5,partita.dev/gpu-count=1,partita.dev/topology-required=kubernetes.io/hostname;l=partita.dev/sub-group=r1",
		},
		"no topology: the seal is as before it": {
			pod:             gpuPod().Obj(),
			wantAnnotations: map[string]string{},
			wantLabels:      map[string]string{},
			wantSeal:        "v1;q=team-a;g=;s=;p=;c=main:500;a=partita.dev/gpu-fraction=0.5,partita.dev/gpu-count=1",
		},
		"a pod without GPUs is not touched": {
			pod: partitatest.MakePod("p", "team-a").Container("main").Annotation(v1alpha1.AnnotationKAITopologyRequired, "not a label key!").
				Annotation(v1alpha1.AnnotationTopologyRequired, "other").Label(v1alpha1.LabelKAISubGroup, "r0").Obj(),
			wantAnnotations: map[string]string{v1alpha1.AnnotationKAITopologyRequired: "not a label key!", v1alpha1.AnnotationTopologyRequired: "other"},
			wantLabels:      map[string]string{v1alpha1.LabelKAISubGroup: "r0"},
		},
	}
	h := newTestServer(t, testOptions{})
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.pod.UID = ""
			req := podReview(t, tc.pod, nil)
			first := outcomeOf(t, post(t, h, PathMutatePods, req))
			if !first.Allowed {
				t.Fatalf("mutation refused: %+v", first.Status)
			}
			patched := applyPatch(t, req.Object.Raw, first.Patch)
			got := podOf(t, patched)
			gotAnnotations, gotLabels := topologyKeys(got)
			if diff := cmp.Diff(tc.wantAnnotations, gotAnnotations); diff != "" {
				t.Errorf("topology annotations (-want,+got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLabels, gotLabels); diff != "" {
				t.Errorf("sub-group labels (-want,+got):\n%s", diff)
			}
			if seal := got.Annotations[v1alpha1.AnnotationCanonical]; seal != tc.wantSeal {
				t.Errorf("seal\n got %q\nwant %q", seal, tc.wantSeal)
			}
			again := *req
			again.Object = runtime.RawExtension{Raw: patched}
			if second := outcomeOf(t, post(t, h, PathMutatePods, &again)); !second.Allowed || len(second.Patch) > 0 {
				t.Errorf("second mutation: %+v", second)
			}
			if v := outcomeOf(t, post(t, h, PathValidatePods, &again)); !v.Allowed {
				t.Errorf("validation refused the mutated pod: %+v", v.Status)
			}
		})
	}
}

// TestPodTopologyRefused: a GPU pod whose topology keys are malformed or
// disagree across dialects is refused with the keys named, by both
// webhooks; one whose sub-group its PodGroup lacks, with the sub-groups it
// has (the validating webhook's check is TestSubGroupMembership's).
func TestPodTopologyRefused(t *testing.T) {
	gpuPod := func() *partitatest.PodWrapper {
		return partitatest.MakePod("p", "team-a").Container("main").GPUFraction("0.5")
	}
	cases := map[string]struct {
		pod        *corev1.Pod
		wantCode   int32
		wantInMsgs []string
		// mutateOnly: the validating webhook refuses the unmutated pod
		// for that first.
		mutateOnly bool
	}{
		"Partita's and KAI's required levels disagree": {
			pod: gpuPod().Annotation(v1alpha1.AnnotationTopologyRequired, "network.example.com/rack").
				Annotation(v1alpha1.AnnotationKAITopologyRequired, "network.example.com/block").Obj(),
			wantCode: 422,
			wantInMsgs: []string{`metadata.annotations[kai.scheduler/topology-required-placement]: Invalid value: "network.example.com/block": ` +
				`names a different required level than metadata.annotations[partita.dev/topology-required]="network.example.com/rack"`},
		},
		"a Kueue level that is no label key": {
			pod:        gpuPod().Annotation(v1alpha1.AnnotationKueueTopologyPreferred, "rack?").Obj(),
			wantCode:   422,
			wantInMsgs: []string{`metadata.annotations[kueue.x-k8s.io/podset-preferred-topology]: Invalid value: "rack?": must be a node label key`},
		},
		"a sub-group the PodGroup lacks": {
			pod:      gpuPod().PodGroup("sharded").Label(v1alpha1.LabelSubGroup, "r9").Obj(),
			wantCode: 403,
			wantInMsgs: []string{`metadata.labels[partita.dev/sub-group]: Invalid value: "r9": is not a sub-group of the pod's PodGroup sharded, ` +
				`whose spec.subGroups are r0, r1; label the pod with one of them, or add "r9" to the PodGroup's spec.subGroups`},
			mutateOnly: true,
		},
		"a sub-group the PodGroup lacks, in KAI's label": {
			pod:        gpuPod().PodGroup("sharded").Label(v1alpha1.LabelKAISubGroup, "r9").Obj(),
			wantCode:   403,
			wantInMsgs: []string{`metadata.labels[kai.scheduler/subgroup-name]: Invalid value: "r9": is not a sub-group of the pod's PodGroup sharded`},
			mutateOnly: true,
		},
	}
	h := newTestServer(t, testOptions{})
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.pod.UID = ""
			paths := []string{PathMutatePods, PathValidatePods}
			if tc.mutateOnly {
				paths = paths[:1]
			}
			for _, path := range paths {
				got := outcomeOf(t, post(t, h, path, podReview(t, tc.pod, nil)))
				if got.Allowed || got.Status == nil {
					t.Fatalf("%s allowed the pod", path)
				}
				if got.Status.Code != tc.wantCode {
					t.Errorf("%s: code %d, want %d (%s)", path, got.Status.Code, tc.wantCode, got.Status.Message)
				}
				for _, want := range tc.wantInMsgs {
					if !strings.Contains(got.Status.Message, want) {
						t.Errorf("%s: message %q\nwant it to contain %q", path, got.Status.Message, want)
					}
				}
			}
		})
	}
}

// TestSubGroupMembership: which members a PodGroup's sub-groups let in.
func TestSubGroupMembership(t *testing.T) {
	cases := map[string]struct {
		pod     *corev1.Pod
		allowed bool
	}{
		"one of its sub-groups": {
			pod:     partitatest.MakePod("p", "team-a").GPUFraction("0.5").PodGroup("sharded").Label(v1alpha1.LabelSubGroup, "r0").Obj(),
			allowed: true,
		},
		"one of its sub-groups, in KAI's label": {
			pod:     partitatest.MakePod("p", "team-a").GPUFraction("0.5").PodGroup("sharded").Label(v1alpha1.LabelKAISubGroup, "r1").Obj(),
			allowed: true,
		},
		"no sub-group": {
			pod:     partitatest.MakePod("p", "team-a").GPUFraction("0.5").PodGroup("sharded").Obj(),
			allowed: true,
		},
		"a PodGroup without sub-groups takes any": {
			pod:     partitatest.MakePod("p", "team-a").GPUFraction("0.5").PodGroup("train-a").Label(v1alpha1.LabelSubGroup, "r9").Obj(),
			allowed: true,
		},
		"a PodGroup that does not exist yet": {
			pod:     partitatest.MakePod("p", "team-a").GPUFraction("0.5").PodGroup("later").Label(v1alpha1.LabelSubGroup, "r9").Obj(),
			allowed: true,
		},
		"no PodGroup at all (a mapped workload)": {
			pod:     partitatest.MakePod("p", "team-a").GPUFraction("0.5").Label(v1alpha1.LabelSubGroup, "r9").Obj(),
			allowed: true,
		},
		"another sub-group": {
			pod: partitatest.MakePod("p", "team-a").GPUFraction("0.5").PodGroup("sharded").Label(v1alpha1.LabelSubGroup, "R0").Obj(),
		},
	}
	h := newTestServer(t, testOptions{gate: true})
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.pod.UID = ""
			req := podReview(t, tc.pod, nil)
			got := outcomeOf(t, post(t, h, PathMutatePods, req))
			if got.Allowed != tc.allowed {
				t.Fatalf("allowed %v, want %v: %+v", got.Allowed, tc.allowed, got.Status)
			}
			if !got.Allowed {
				if !strings.Contains(got.Status.Message, "is not a sub-group of the pod's PodGroup") {
					t.Errorf("message %q does not say why", got.Status.Message)
				}
				return
			}
			again := *req
			again.Object = runtime.RawExtension{Raw: applyPatch(t, req.Object.Raw, got.Patch)}
			if v := outcomeOf(t, post(t, h, PathValidatePods, &again)); !v.Allowed {
				t.Errorf("validation refused the mutated member: %+v", v.Status)
			}
		})
	}
	t.Run("a later webhook's sub-group is refused by the validating webhook", func(t *testing.T) {
		pod := partitatest.MakePod("p", "team-a").GPUFraction("0.5").PodGroup("sharded").Label(v1alpha1.LabelSubGroup, "r0").Obj()
		pod.UID = ""
		req := podReview(t, pod, nil)
		got := outcomeOf(t, post(t, h, PathMutatePods, req))
		if !got.Allowed {
			t.Fatalf("mutation refused: %+v", got.Status)
		}
		later := podOf(t, applyPatch(t, req.Object.Raw, got.Patch))
		later.Labels[v1alpha1.LabelSubGroup] = "r9"
		v := outcomeOf(t, post(t, h, PathValidatePods, podReview(t, later, nil)))
		if v.Allowed || !strings.Contains(v.Status.Message, `metadata.labels[partita.dev/sub-group]: Invalid value: "r9": is not a sub-group of the pod's PodGroup sharded`) {
			t.Errorf("validation of a member moved to sub-group r9: %+v", v)
		}
	})
}

// TestPodTopologyImmutable: a GPU pod's topology request and sub-group are
// fixed once it exists, in any dialect's key; an update that restates them
// in another dialect, or touches other keys, passes, and a pod without
// GPUs may change them freely.
func TestPodTopologyImmutable(t *testing.T) {
	// created is a GPU pod as the mutating webhook leaves it.
	created := func() *partitatest.PodWrapper {
		return partitatest.MakePod("p", "team-a").GPUFraction("0.5").GPUCount(1).Queue("team-a").
			Resource("main", v1alpha1.ResourceGPUMilli, "500").
			Annotation(v1alpha1.AnnotationKAITopologyRequired, "network.example.com/rack").
			Annotation(v1alpha1.AnnotationTopologyRequired, "network.example.com/rack").
			Label(v1alpha1.LabelSubGroup, "r0")
	}
	plain := func() *partitatest.PodWrapper {
		return partitatest.MakePod("p", "team-a").Annotation(v1alpha1.AnnotationTopologyRequired, "network.example.com/rack")
	}
	cases := map[string]struct {
		old, pod *corev1.Pod
		// wantMsg is the refusal's message, empty when allowed.
		wantMsg string
	}{
		"labels and annotations of no topology": {
			old: created().Obj(),
			pod: created().Label("app", "x").Annotation("note", "y").Obj(),
		},
		"the same level restated in Kueue's key": {
			old: created().Obj(),
			pod: created().Annotation(v1alpha1.AnnotationKueueTopologyRequired, "network.example.com/rack").Obj(),
		},
		"another required level": {
			old: created().Obj(),
			pod: created().Annotation(v1alpha1.AnnotationKAITopologyRequired, "network.example.com/block").
				Annotation(v1alpha1.AnnotationTopologyRequired, "network.example.com/block").Obj(),
			wantMsg: `a pod's GPU request, queue, pod group, placement, topology and sub-group are fixed when it is created ` +
				`(topology was "partita.dev/topology-required=network.example.com/rack", now "partita.dev/topology-required=network.example.com/block"); ` +
				`delete the pod and create it again`,
		},
		"a Topology added": {
			old:     created().Obj(),
			pod:     created().Annotation(v1alpha1.AnnotationTopology, "dc-1").Obj(),
			wantMsg: `(topology was "partita.dev/topology-required=network.example.com/rack", now "partita.dev/topology=dc-1 partita.dev/topology-required=network.example.com/rack")`,
		},
		"a preferred level added in KAI's key": {
			old:     created().Obj(),
			pod:     created().Annotation(v1alpha1.AnnotationKAITopologyPreferred, "kubernetes.io/hostname").Obj(),
			wantMsg: `now "partita.dev/topology-preferred=kubernetes.io/hostname partita.dev/topology-required=network.example.com/rack"`,
		},
		"another sub-group": {
			old:     created().Obj(),
			pod:     created().Label(v1alpha1.LabelSubGroup, "r1").Obj(),
			wantMsg: `(sub-group was "r0", now "r1")`,
		},
		"a sub-group added in KAI's label": {
			old:     partitatest.MakePod("p", "team-a").GPUFraction("0.5").GPUCount(1).Queue("team-a").Resource("main", v1alpha1.ResourceGPUMilli, "500").Obj(),
			pod:     partitatest.MakePod("p", "team-a").GPUFraction("0.5").GPUCount(1).Queue("team-a").Resource("main", v1alpha1.ResourceGPUMilli, "500").Label(v1alpha1.LabelKAISubGroup, "r1").Obj(),
			wantMsg: `(sub-group was "", now "r1")`,
		},
		"a foreign key that disagrees": {
			old:     created().Obj(),
			pod:     created().Annotation(v1alpha1.AnnotationKueueTopologyRequired, "network.example.com/block").Obj(),
			wantMsg: `metadata.annotations[kueue.x-k8s.io/podset-required-topology]: Invalid value: "network.example.com/block": names a different required level`,
		},
		"a pod without GPUs": {
			old: plain().Obj(),
			pod: plain().Annotation(v1alpha1.AnnotationTopologyRequired, "network.example.com/block").Label(v1alpha1.LabelSubGroup, "x").Obj(),
		},
	}
	h := newTestServer(t, testOptions{})
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := outcomeOf(t, post(t, h, PathValidatePods, podReview(t, tc.pod, tc.old)))
			if tc.wantMsg == "" {
				if !got.Allowed {
					t.Fatalf("refused: %+v", got.Status)
				}
				return
			}
			if got.Allowed {
				t.Fatal("allowed")
			}
			if !strings.Contains(got.Status.Message, tc.wantMsg) {
				t.Errorf("message %q\nwant it to contain %q", got.Status.Message, tc.wantMsg)
			}
		})
	}
}
