package webhook

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/partita-dev/partita/api/v1alpha1"
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
//     names one: a member that names another is refused with both names.
//
// Seeds are in testdata/fuzz/FuzzPodGroupAdmission.
func FuzzPodGroupAdmission(f *testing.F) {
	f.Add("team-a", "team-a", "train", int32(4), false, "", "", int32(0), "")
	f.Add("other", "team-a", "", int32(4), false, "", "", int32(0), "")
	f.Add("team-a", "team-a", "", int32(2), true, "default", "Admitted", int32(2), "")
	f.Add("team-a", "research", "nope", int32(1), false, "", "", int32(0), "team-b")
	f.Add("team-b", "", "", int32(3), true, "team-b", "Pending", int32(0), "team-b")
	f.Add("team-a", "team-a", "deleted", int32(1), true, "team-a", "Running", int32(0), "default")
	h := newTestServer(f, testOptions{gate: true})
	engine := newTestEngine(f)
	f.Fuzz(func(t *testing.T, ns, queue, class string, minMember int32, update bool, oldQueue, oldPhase string, oldAdmitted int32, memberQueue string) {
		for _, s := range []string{ns, queue, class, oldQueue, memberQueue} {
			if len(s) > 63 || strings.ContainsAny(s, "\x00/\"\\") {
				return // not a name the API server stores
			}
		}
		if ns == "" || minMember < 1 {
			return // the API server and the CRD schema refuse these
		}
		pg := partitatest.MakePodGroup("train", ns).MinMember(minMember).Queue(queue).PriorityClassName(class).Obj()
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
		unchanged := old != nil && old.Spec.Queue == queue && old.Spec.PriorityClassName == class
		if unchanged {
			return // metadata-only updates pass whatever the spec names
		}
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
		checkMember(t, engine, ns, pg, memberQueue)
	})
}

// checkMember sends a member of pg naming memberQueue through the pod
// webhooks, with pg known to them.
func checkMember(t *testing.T, engine PolicyEvaluator, ns string, pg *v1alpha1.PodGroup, memberQueue string) {
	t.Helper()
	refs := NewReferences(fake.NewClientBuilder().WithScheme(envtestutil.Scheme()).WithObjects(pg.DeepCopy()).Build(), nil)
	a := NewPodAdmission(engine, StaticView{MemoryMiB: 81559}, WithReferences(refs), WithAdmissionGate(true))
	w := partitatest.MakePod("member", ns).PodGroup(pg.Name).GPUFraction("0.5")
	if memberQueue != "" {
		w.Label(v1alpha1.LabelQueue, memberQueue)
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
	if de, denied := asDenial(res.Err); denied {
		if conflict && (de.Reason != ReasonQueueConflict || !strings.Contains(de.Error(), memberQueue) || !strings.Contains(de.Error(), pg.Spec.Queue)) {
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
	mutated := podOf(t, applyPatch(t, req.Object.Raw, res.Patch))
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
