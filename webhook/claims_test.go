package webhook

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

// TestDRATemplates: a dry run creates no claim template; a pod whose claim
// names a template of Partita's name with another spec, or a template that
// is not Partita's for its request, is refused.
func TestDRATemplates(t *testing.T) {
	store := newMemTemplates()
	h := newTestServer(t, testOptions{templates: store})
	req := readCase(t, "mutate-partita-fraction")

	dry := *req
	dry.DryRun = ptr.To(true)
	if got := outcomeOf(t, post(t, h, PathMutatePods, &dry)); !got.Allowed || store.creates != 0 {
		t.Fatalf("dry run: allowed %v, templates created %d, want allowed and none", got.Allowed, store.creates)
	}
	got := outcomeOf(t, post(t, h, PathMutatePods, req))
	if !got.Allowed || store.creates != 1 {
		t.Fatalf("create: allowed %v, templates created %d", got.Allowed, store.creates)
	}
	patched := applyPatch(t, req.Object.Raw, got.Patch)
	stored := *req
	stored.Object = runtime.RawExtension{Raw: patched}
	if v := outcomeOf(t, post(t, h, PathValidatePods, &stored)); !v.Allowed {
		t.Fatalf("validate: %+v", v.Status)
	}

	// Someone replaced the template's content under Partita's name.
	for _, tmpl := range store.byName {
		tmpl.Spec.Spec.Devices.Requests[0].FirstAvailable[0].Capacity = nil
	}
	v := outcomeOf(t, post(t, h, PathValidatePods, &stored))
	if v.Allowed || !strings.Contains(v.Status.Message, "not Partita's template for this pod's request") && !strings.Contains(v.Status.Message, "asks for something else") {
		t.Errorf("forged template: allowed %v, %+v", v.Allowed, v.Status)
	}
	if again := outcomeOf(t, post(t, h, PathMutatePods, req)); again.Allowed {
		t.Errorf("a pod was mutated onto a forged template")
	}

	// A pod naming a template that does not exist is refused too.
	pod := podOf(t, patched)
	name := *pod.Spec.ResourceClaims[0].ResourceClaimTemplateName
	missing := strings.Replace(string(patched), name, name[:len(name)-1]+"x", 1)
	stored.Object = runtime.RawExtension{Raw: []byte(missing)}
	if v := outcomeOf(t, post(t, h, PathValidatePods, &stored)); v.Allowed {
		t.Error("a pod naming a missing template was allowed")
	}
}
