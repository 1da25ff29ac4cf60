package webhook

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/internal/envtestutil"
	"github.com/partita-dev/partita/internal/partitatest"
)

// mayUse is the oracle of the fuzz test below: whether namespace ns may
// name queue q in testState, written out apart from the policy. research
// has children, so nobody may use it; team-a and team-b list their
// namespaces; default lists none and is open to all.
func mayUse(ns, q string) bool {
	switch q {
	case "":
		return true
	case "team-a", "team-b":
		return ns == q
	case v1alpha1.DefaultQueueName:
		return true
	}
	return false
}

// FuzzPodGroupAdmission sends PodGroups with fuzzed queues, classes and
// statuses, created or updated, through the PodGroup webhook and then a
// member pod through the pod webhooks. Whatever they say:
//
//   - the webhook answers with a refusal a user can act on, never a
//     failure of its own;
//   - an admitted PodGroup names a queue its namespace may use (the oracle
//     mayUse agrees with the policy) and a PriorityClass that exists, or
//     one it already named;
//   - an update never moves the queue of a gang whose status shows an
//     admission;
//   - an admitted member ends in its PodGroup's queue when the PodGroup
//     names one: a member that names another is refused with both names;
//   - an admitted PodGroup's topology keys (Partita's Topology, KAI's
//     required level, Kueue's preferred level) parse, its sub-group (s0)
//     fits in minMember, and with Topology dc-1 (testObjects) its levels
//     are dc-1's, none broader than the required one;
//   - a member whose sub-group (in KAI's label) the PodGroup lacks is
//     refused with its name; an admitted one carries Partita's label too.
//
// Seeds are in testdata/fuzz/FuzzPodGroupAdmission.
func FuzzPodGroupAdmission(f *testing.F) {
	f.Add("team-a", "team-a", "train", int32(4), false, "", "", int32(0), "", "", "", "", "", int32(0), "")
	f.Add("other", "team-a", "", int32(4), false, "", "", int32(0), "", "", "", "", "", int32(0), "")
	f.Add("team-a", "team-a", "", int32(2), true, "default", "Admitted", int32(2), "", "", "", "", "", int32(0), "")
	f.Add("team-a", "research", "nope", int32(1), false, "", "", int32(0), "team-b", "", "", "", "", int32(0), "")
	f.Add("team-b", "", "", int32(3), true, "team-b", "Pending", int32(0), "team-b", "", "", "", "", int32(0), "")
	f.Add("team-a", "team-a", "deleted", int32(1), true, "team-a", "Running", int32(0), "default", "", "", "", "", int32(0), "")
	f.Add("team-a", "team-a", "", int32(8), false, "", "", int32(0), "", "dc-1", "network.example.com/block", "network.example.com/rack", "network.example.com/rack", int32(4), "s0")
	f.Add("team-a", "team-a", "", int32(8), true, "team-a", "", int32(0), "", "dc-1", "network.example.com/rack", "topology.kubernetes.io/zone", "network.example.com/block", int32(9), "s1")
	f.Add("team-a", "", "", int32(2), false, "", "", int32(0), "", "", "example.com/any", "rack!", "", int32(1), "-")
	h := newTestServer(f, testOptions{gate: true})
	engine := newTestEngine(f)
	f.Fuzz(func(t *testing.T, ns, queue, class string, minMember int32, update bool, oldQueue, oldPhase string, oldAdmitted int32, memberQueue string,
		topology, required, preferred, subLevel string, subMin int32, memberSubGroup string) {
		for _, s := range []string{ns, queue, class, oldQueue, memberQueue} {
			if len(s) > 63 || strings.ContainsAny(s, "\x00/\"\\") {
				return // not a name the API server stores
			}
		}
		if ns == "" || minMember < 1 {
			return // the API server and the CRD schema refuse these
		}
		w := partitatest.MakePodGroup("train", ns).MinMember(minMember).Queue(queue).PriorityClassName(class)
		for k, v := range map[string]string{
			v1alpha1.AnnotationTopology: topology, v1alpha1.AnnotationKAITopologyRequired: required, v1alpha1.AnnotationKueueTopologyPreferred: preferred,
		} {
			if v != "" {
				w.Annotation(k, v)
			}
		}
		if subMin >= 1 { // the CRD schema's minimum
			w.SubGroup("s0", subMin, subLevel, "")
		}
		pg := w.Obj()
		req := &admissionv1.AdmissionRequest{
			UID: "fuzz", Kind: metav1.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Kind: "PodGroup"},
			Resource:  metav1.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "podgroups"},
			Namespace: ns, Operation: admissionv1.Create, UserInfo: testUsers()[""], Object: runtime.RawExtension{Raw: mustJSON(t, pg)},
		}
		var old *v1alpha1.PodGroup
		if update {
			old = partitatest.MakePodGroup("train", ns).MinMember(minMember).Queue(oldQueue).PriorityClassName("deleted").Obj()
			old.Status.Phase, old.Status.Admitted = v1alpha1.PodGroupPhase(oldPhase), oldAdmitted
			req.Operation, req.OldObject = admissionv1.Update, runtime.RawExtension{Raw: mustJSON(t, old)}
		}
		got := outcomeOf(t, post(t, h, PathValidatePodGroups, req))
		if !got.Allowed {
			if got.Status == nil || got.Status.Message == "" || got.Status.Code == http.StatusInternalServerError {
				t.Fatalf("refused without a reason a user can act on: %+v", got.Status)
			}
			return
		}
		unchanged := old != nil && old.Spec.Queue == queue && old.Spec.PriorityClassName == class && len(pg.Annotations) == 0 && len(pg.Spec.SubGroups) == 0
		if unchanged {
			return // metadata-only updates pass whatever the spec names
		}
		checkAdmittedTopology(t, pg)
		if !mayUse(ns, queue) {
			t.Fatalf("namespace %s may not use queue %q, yet its PodGroup was admitted", ns, queue)
		}
		known := class == "" || class == "train" || class == "batch" || (old != nil && class == old.Spec.PriorityClassName)
		if !known {
			t.Fatalf("PriorityClass %q does not exist, yet the PodGroup was admitted", class)
		}
		if old != nil && old.Spec.Queue != queue && memberAdmitted(old) {
			t.Fatalf("the queue of an admitted gang moved from %q to %q", old.Spec.Queue, queue)
		}
		checkMember(t, engine, ns, pg, memberQueue, memberSubGroup)
	})
}

// checkAdmittedTopology is the topology oracle of an admitted PodGroup,
// written out apart from the webhook: testObjects' dc-1 has levels zone,
// block, rack, host.
func checkAdmittedTopology(t *testing.T, pg *v1alpha1.PodGroup) {
	t.Helper()
	topo, errs := gpu.ParseTopology(pg.Annotations, field.NewPath("metadata", "annotations"))
	if len(errs) > 0 {
		t.Fatalf("admitted a PodGroup whose topology does not parse: %v", errs)
	}
	sum := int32(0)
	for _, sg := range pg.Spec.SubGroups {
		sum += sg.MinMember
		if len(gpu.ValidateLevel(sg.TopologyRequired, field.NewPath("l"))) > 0 {
			t.Fatalf("admitted sub-group level %q, no label key", sg.TopologyRequired)
		}
	}
	if sum > pg.Spec.MinMember {
		t.Fatalf("admitted sub-groups of %d members in a gang of %d", sum, pg.Spec.MinMember)
	}
	if topo.Topology != "dc-1" {
		return
	}
	dc1 := []string{"topology.kubernetes.io/zone", "network.example.com/block", "network.example.com/rack", "kubernetes.io/hostname"}
	index := func(l string) int {
		for i, d := range dc1 {
			if d == l {
				return i
			}
		}
		t.Fatalf("admitted level %q, not one of dc-1's", l)
		return -1
	}
	floor := -1
	if topo.Required != "" {
		floor = index(topo.Required)
	}
	if topo.Preferred != "" && index(topo.Preferred) < floor {
		t.Fatalf("admitted preferred level %s, broader than the required %s", topo.Preferred, topo.Required)
	}
	for _, sg := range pg.Spec.SubGroups {
		if sg.TopologyRequired != "" && index(sg.TopologyRequired) < floor {
			t.Fatalf("admitted sub-group level %s, broader than the gang's %s", sg.TopologyRequired, topo.Required)
		}
	}
}

// checkMember sends a member of pg naming memberQueue and, in KAI's label,
// memberSubGroup through the pod webhooks, with pg known to them.
func checkMember(t *testing.T, engine PolicyEvaluator, ns string, pg *v1alpha1.PodGroup, memberQueue, memberSubGroup string) {
	t.Helper()
	refs := NewReferences(fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(pg.DeepCopy()).Build(), nil)
	a := NewPodAdmission(engine, StaticView{MemoryMiB: 81559}, WithReferences(refs), WithAdmissionGate(true))
	w := partitatest.MakePod("member", ns).PodGroup(pg.Name).GPUFraction("0.5")
	if memberQueue != "" {
		w.Label(v1alpha1.LabelQueue, memberQueue)
	}
	if memberSubGroup != "" {
		w.Label(v1alpha1.LabelKAISubGroup, memberSubGroup)
	}
	pod := w.Obj()
	pod.UID = ""
	req := &admissionv1.AdmissionRequest{
		UID: "fuzz-member", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
		Resource: metav1.GroupVersionResource{Version: "v1", Resource: "pods"}, Namespace: ns,
		Operation: admissionv1.Create, UserInfo: testUsers()[""], Object: runtime.RawExtension{Raw: mustJSON(t, pod)},
	}
	res := a.Mutate(t.Context(), req)
	conflict := memberQueue != "" && pg.Spec.Queue != "" && memberQueue != pg.Spec.Queue
	subConflict := memberSubGroup != "" && len(validation.IsValidLabelValue(memberSubGroup)) == 0 &&
		len(pg.Spec.SubGroups) > 0 && memberSubGroup != pg.Spec.SubGroups[0].Name
	if de, denied := asDenial(res.Err); denied {
		switch {
		case subConflict && (de.Reason != ReasonSubGroupConflict || !strings.Contains(de.Error(), memberSubGroup)):
			t.Fatalf("a member of sub-group %q in a PodGroup of sub-groups %v was refused without its name: %v", memberSubGroup, pg.Spec.SubGroups, de)
		case !subConflict && conflict && (de.Reason != ReasonQueueConflict || !strings.Contains(de.Error(), memberQueue) || !strings.Contains(de.Error(), pg.Spec.Queue)):
			t.Fatalf("a member naming %q in a PodGroup of %q was refused without both names: %v", memberQueue, pg.Spec.Queue, de)
		}
		return
	}
	if res.Err != nil {
		t.Fatalf("member: %v", res.Err)
	}
	if conflict {
		t.Fatalf("a member naming %q was admitted into a PodGroup of queue %q", memberQueue, pg.Spec.Queue)
	}
	if subConflict {
		t.Fatalf("a member of sub-group %q was admitted into a PodGroup of sub-groups %v", memberSubGroup, pg.Spec.SubGroups)
	}
	mutated := podOf(t, applyPatch(t, req.Object.Raw, res.Patch))
	if got := mutated.Labels[v1alpha1.LabelSubGroup]; got != memberSubGroup {
		t.Fatalf("the member of sub-group %q in KAI's label has Partita's label %q", memberSubGroup, got)
	}
	q := mutated.Labels[v1alpha1.LabelQueue]
	switch {
	case pg.Spec.Queue != "" && q != pg.Spec.Queue:
		t.Fatalf("the member ended in queue %q, its PodGroup names %q", q, pg.Spec.Queue)
	case q == "":
		t.Fatal("an admitted GPU pod has no queue")
	case !mayUse(ns, q):
		t.Fatalf("the member ended in queue %q, which namespace %s may not use", q, ns)
	}
	again := *req
	again.Object = runtime.RawExtension{Raw: mustJSON(t, mutated)}
	if v := a.Validate(t.Context(), &again); v.Err != nil {
		t.Fatalf("validation refused the mutated member: %v", v.Err)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
