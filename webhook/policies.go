package webhook

import (
	"fmt"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
)

// The admission layer that runs inside the API server (issue "trust
// boundaries", failure radius of the webhook): CEL with no process to go
// down. A MutatingAdmissionPolicy writes NVIDIA_VISIBLE_DEVICES=void into
// the containers of pods that ask for no GPU (CUDA base images set "all"
// themselves), and a ValidatingAdmissionPolicy makes the refusals that need
// no Rego and no cluster state, for every pod of the namespaces Partita
// manages. The webhooks then see only the pods that ask for GPUs or carry
// Partita's keys (matchConditions, configurations.go).
//
// A GPU pod that the mutating webhook could not reach (failurePolicy
// Ignore) lacks the canonical form, and the validating policy refuses it
// with a message that says the webhook is unavailable. The API server runs
// mutating policies, then mutating webhooks, then validating policies, then
// validating webhooks, so that message is the one a user reads; a pod that
// forges the canonical form still meets the validating webhook, which fails
// closed.
//
// Requires ValidatingAdmissionPolicy and MutatingAdmissionPolicy in
// admissionregistration.k8s.io/v1 (Kubernetes 1.36 and later);
// ConfigurationOptions.Policies off keeps the older layout, where the
// webhooks see every pod.

// unavailableText is the refusal of a GPU pod that missed the webhook.
const unavailableText = "Partita's admission webhook is unavailable: this pod asks for GPUs but did not get Partita's canonical form " +
	"(partita.dev/gpu-milli and the device env, or with the dra GPU backend its ResourceClaims, and the scheduling gate) from its mutating webhook, so it is refused rather than let past its queue. " +
	"Create it again in a moment; if this persists, check Partita's webhook pods and logs (docs/operations.md, \"When the webhook is down\")"

// Names of the policies' CEL variables that the configuration fills in
// (the chart renders them from values; everything else is constant).
const (
	celVarMPSDir        = "mpsDir"
	celVarAdmissionGate = "admissionGate"
	celVarTrusted       = "trusted"
)

// PodPolicyName and VoidPolicyName are the names of the validating and
// the mutating policy (and of their bindings) for a configuration name.
func PodPolicyName(configuration string) string  { return configuration + "-pods" }
func VoidPolicyName(configuration string) string { return configuration + "-void" }

// SealPolicyName is the name of the MutatingAdmissionPolicy (and binding)
// that removes the seal a pod is created with (seal.go).
func SealPolicyName(configuration string) string { return configuration + "-seal" }

// paramVariables are the variables that depend on the configuration: the
// MPS directory, whether GPU pods carry the admission gate, and who is
// trusted.
func (o ConfigurationOptions) paramVariables() []admissionregistrationv1.Variable {
	dir := o.MPSDir
	if dir == "" {
		dir = DefaultMPSDir
	}
	return []admissionregistrationv1.Variable{
		{Name: celVarMPSDir, Expression: celStr(cleanDir(dir))},
		{Name: celVarAdmissionGate, Expression: strconv.FormatBool(o.AdmissionGate)},
		{Name: celVarTrusted, Expression: celTrusted(o.Trusted)},
	}
}

// AdmissionCEL is the part of the admission objects that does not depend
// on the configuration: what the chart carries as
// files/admission-cel.yaml, generated from here.
type AdmissionCEL struct {
	// PodPolicy is the ValidatingAdmissionPolicy's.
	PodPolicy PolicyCEL `json:"podPolicy"`
	// VoidPolicy is the MutatingAdmissionPolicy's.
	VoidPolicy PolicyCEL `json:"voidPolicy"`
	// SealPolicy is the MutatingAdmissionPolicy's that removes a seal a
	// pod is created with.
	SealPolicy PolicyCEL `json:"sealPolicy"`
	// MutateWebhook and ValidateWebhook are the pod webhooks'
	// matchConditions that do not depend on the configuration, with
	// Policies on and off.
	MutateWebhook           []admissionregistrationv1.MatchCondition `json:"mutateWebhook"`
	ValidateWebhook         []admissionregistrationv1.MatchCondition `json:"validateWebhook"`
	ValidateWebhookNoPolicy []admissionregistrationv1.MatchCondition `json:"validateWebhookNoPolicies"`
}

// PolicyCEL is a policy's constant CEL.
type PolicyCEL struct {
	MatchConditions []admissionregistrationv1.MatchCondition `json:"matchConditions"`
	// Variables follow the configuration's (mpsDir, admissionGate,
	// trusted), which they may read.
	Variables   []admissionregistrationv1.Variable   `json:"variables"`
	Validations []admissionregistrationv1.Validation `json:"validations,omitempty"`
	Mutations   []admissionregistrationv1.Mutation   `json:"mutations,omitempty"`
}

// Constants returns the constant CEL of every admission object.
func Constants() AdmissionCEL {
	return AdmissionCEL{
		PodPolicy:               podPolicyCEL(),
		VoidPolicy:              voidPolicyCEL(),
		SealPolicy:              sealPolicyCEL(),
		MutateWebhook:           mutateMatchConditions(),
		ValidateWebhook:         validateMatchConditions(true),
		ValidateWebhookNoPolicy: validateMatchConditions(false),
	}
}

func notMirrorPod() admissionregistrationv1.MatchCondition {
	return admissionregistrationv1.MatchCondition{Name: "not-a-mirror-pod", Expression: celNotMirrorPod()}
}

// podPolicyCEL is the ValidatingAdmissionPolicy's CEL: three validations,
// in the order a user should read them (the API server reports the first
// that fails): what a pod may never do, then the webhook's absence, then
// device env.
func podPolicyCEL() PolicyCEL {
	v := func(name, expr string) admissionregistrationv1.Variable {
		return admissionregistrationv1.Variable{Name: name, Expression: expr}
	}
	gate := celStr(v1alpha1.SchedulingGateAdmission)
	hasGate := func(o string) string {
		return o + ".spec.?schedulingGates.orValue([]).exists(g, g.name == " + gate + ")"
	}
	cdi := celStr(cdiAnnotationPrefix)
	sysMessages := "map(k, 'metadata.annotations[' + k + ']: Forbidden: ' + " + celSystemAnnotationMessage("k") + ")"
	cdiMessages := "map(k, 'metadata.annotations[' + k + ']: Forbidden: ' + " + celStr(cdiText) + ")"
	changed := "(!(k in variables.oldAnnotations) || variables.oldAnnotations[k] != variables.annotations[k])"
	vars := []admissionregistrationv1.Variable{
		v("isBinding", "request.?subResource.orValue('') == 'binding'"),
		v("isCreate", "request.operation == 'CREATE' && request.?subResource.orValue('') == ''"),
		v("isUpdate", "request.operation == 'UPDATE' && request.?subResource.orValue('') != 'binding'"),
		v("isEphemeral", "request.operation == 'UPDATE' && request.?subResource.orValue('') == 'ephemeralcontainers'"),
		v("annotations", celAnnotations("object")),
		v("oldAnnotations", "oldObject == null ? {} : "+celAnnotations("oldObject")),
		v("oldEphemeralNames", "oldObject == null ? [] : oldObject.spec.?ephemeralContainers.orValue([]).map(c, c.name)"),
		v("asksGPU", "!variables.isBinding && "+celAsksGPU("object")),
		// Binding: the API server copies its annotations onto the pod.
		v("bindingErrors", "variables.annotations.filter(k, "+celIsSystemAnnotation("k")+").sort()."+
			"map(k, 'metadata.annotations[' + k + ']: Forbidden: ' + "+celSystemAnnotationMessage("k")+" + "+celStr("; "+bindingSystemText)+") + "+
			"variables.annotations.filter(k, k.startsWith("+cdi+")).sort()."+cdiMessages),
		v("createAnnotationErrors", "(variables.trusted ? [] : variables.annotations.filter(k, "+celIsSystemAnnotation("k")+").sort()."+sysMessages+") + "+
			"variables.annotations.filter(k, k.startsWith("+cdi+")).sort()."+cdiMessages),
		v("updateErrors", "variables.trusted ? [] : "+
			"(variables.annotations.filter(k, "+celIsSystemAnnotation("k")+" && "+changed+").sort() + "+
			"variables.oldAnnotations.filter(k, "+celIsSystemAnnotation("k")+" && !(k in variables.annotations)).sort())."+
			"map(k, 'metadata.annotations[' + k + ']: Forbidden: ' + "+celStr(systemAnnotationChangedText)+") + "+
			"(request.?subResource.orValue('') == '' && "+hasGate("oldObject")+" && !"+hasGate("object")+" ? ["+celStr("spec.schedulingGates: Forbidden: "+gateRemovedText)+"] : []) + "+
			"variables.annotations.filter(k, k.startsWith("+cdi+") && "+changed+").sort()."+cdiMessages),
		v("volumes", "object.spec.?volumes.orValue([])"),
		v("volumeErrors", "variables.volumes.transformList(i, v, "+
			"(v.name == "+celStr(MPSVolume)+" && !"+celIsPartitaMPSVolume("v", "variables.mpsDir")+" ? ['spec.volumes[' + string(i) + '].name: Forbidden: ' + "+celStr(mpsVolumeText)+"] : []) + "+
			"(has(v.hostPath) && !"+celIsPartitaMPSVolume("v", "variables.mpsDir")+" ? ["+celNodePath("v.hostPath.path")+"].map(n, "+celHostPathReach("n", "variables.mpsDir")+")"+
			".filter(r, r != '').map(r, 'spec.volumes[' + string(i) + '].hostPath.path: Forbidden: \"' + v.hostPath.path + '\" reaches ' + r + "+celStr(hostPathTail)+") : [])).flatten()"),
		v("specErrors", "(variables.isCreate ? variables.createAnnotationErrors : []) + "+
			"(variables.isCreate && variables.asksGPU ? "+joinLists(podLists(), ctrList.privileged)+" : []) + "+
			"(variables.isEphemeral && variables.asksGPU ? "+joinLists(ephemeralLists(), ctrList.privileged)+" : []) + "+
			"(variables.isCreate ? variables.volumeErrors + "+joinLists(podLists(), ctrList.mountErrors)+" : []) + "+
			"(variables.isEphemeral ? "+joinLists(ephemeralLists(), ctrList.mountErrors)+" : [])"),
		// The canonical form of either GPU backend: partita.dev/gpu-milli
		// with the devices env (extender), or Partita's pod claims from
		// its claim templates (dra; the CDI spec sets the env).
		v("stamped", fmt.Sprintf("object.spec.containers.exists(c, %s) && object.spec.containers.all(c, !%s) && "+
			"(object.spec.containers.all(c, !%s || %s.exists(e, e.name == %s && %s)) || "+
			"object.spec.?resourceClaims.orValue([]).exists(rc, rc.name.startsWith(%s) && rc.?resourceClaimTemplateName.orValue('').startsWith(%s))) && "+
			"(!variables.admissionGate || %s)",
			celIsGPUContainer("c"), celAsksResource("c", celStrs(gpu.ForeignResourceNames())),
			celIsGPUContainer("c"), celEnv("c"), celStr(EnvVisibleDevices), celAnnotationRef("e", "c", v1alpha1.AnnotationDevicesPrefix),
			celStr(v1alpha1.PodClaimPrefix), celStr(dra.TemplatePrefix),
			hasGate("object"))),
		v("envErrors", "(variables.isCreate && !variables.trusted ? "+joinLists(podLists(), ctrList.envErrors)+" : []) + "+
			"(variables.isEphemeral && !variables.trusted ? "+joinLists(ephemeralLists(), ctrList.envErrors)+" : []) + "+
			"(variables.isCreate ? "+joinLists(podLists(), ctrList.voidMissing)+" : []) + "+
			"(variables.isEphemeral ? "+joinLists(ephemeralLists(), ctrList.voidMissing)+" : [])"),
	}
	forbidden := ptr.To(metav1.StatusReasonForbidden)
	return PolicyCEL{
		MatchConditions: []admissionregistrationv1.MatchCondition{notMirrorPod(), {
			// Requests no validation can refuse, which every pod makes: the
			// kubelet's status updates (annotations unchanged) and
			// kube-scheduler's bindings (no annotations). Skipping them
			// spares the API server the policy's evaluation on each.
			Name: "may-be-refused",
			Expression: "!(request.?subResource.orValue('') == 'status' && " + celAnnotations("object") + " == " + celAnnotations("oldObject") + ") && " +
				"!(request.?subResource.orValue('') == 'binding' && " + celAnnotations("object") + ".size() == 0)",
		}},
		Variables: vars,
		Validations: []admissionregistrationv1.Validation{
			{
				Expression: "variables.isBinding ? (variables.trusted || variables.bindingErrors.size() == 0) : " +
					"(variables.isUpdate ? variables.updateErrors.size() == 0 : true) && variables.specErrors.size() == 0",
				MessageExpression: "variables.isBinding ? variables.bindingErrors.join('; ') : " +
					"((variables.isUpdate ? variables.updateErrors : []) + variables.specErrors).join('; ')",
				Message: "the pod reaches GPUs around Partita or sets keys only Partita writes",
				Reason:  forbidden,
			},
			{
				Expression: "!variables.isCreate || !variables.asksGPU || variables.stamped",
				Message:    unavailableText,
				Reason:     forbidden,
			},
			{
				Expression:        "variables.isBinding || variables.envErrors.size() == 0",
				MessageExpression: "variables.envErrors.join('; ')",
				Message:           "the pod sets device env that only Partita writes",
				Reason:            forbidden,
			},
		},
	}
}

// voidPolicyCEL is the MutatingAdmissionPolicy's CEL: a JSON patch that
// adds NVIDIA_VISIBLE_DEVICES=void to every container without the variable
// (and to each new ephemeral container, whatever the pod), as
// injectEnv and mutateEphemeral do in the webhook.
func voidPolicyCEL() PolicyCEL {
	patch := func(list, path string, newOnly bool) string {
		filter := "!" + celEnv("c") + ".exists(e, e.name == " + celStr(EnvVisibleDevices) + ")"
		if newOnly {
			filter = "!(c.name in variables.oldEphemeralNames) && " + filter
		}
		env := "{'name': " + celStr(EnvVisibleDevices) + ", 'value': " + celStr(VisibleDevicesVoid) + "}"
		return fmt.Sprintf("%s.transformList(i, c, %s, has(c.env) ? JSONPatch{op: 'add', path: %s + string(i) + '/env/-', value: %s} : JSONPatch{op: 'add', path: %s + string(i) + '/env', value: [%s]})",
			list, filter, celStr(path), env, celStr(path), env)
	}
	return PolicyCEL{
		MatchConditions: []admissionregistrationv1.MatchCondition{
			notMirrorPod(),
			// GPU pods get their env, void included, from the webhook.
			{Name: "asks-for-no-gpu", Expression: "request.?subResource.orValue('') == 'ephemeralcontainers' || !" + celAsksGPU("object")},
		},
		Variables: []admissionregistrationv1.Variable{
			{Name: "oldEphemeralNames", Expression: "oldObject == null ? [] : oldObject.spec.?ephemeralContainers.orValue([]).map(c, c.name)"},
		},
		Mutations: []admissionregistrationv1.Mutation{{
			PatchType: admissionregistrationv1.PatchTypeJSONPatch,
			JSONPatch: &admissionregistrationv1.JSONPatch{Expression: "request.?subResource.orValue('') == 'ephemeralcontainers' ? " +
				patch("object.spec.?ephemeralContainers.orValue([])", "/spec/ephemeralContainers/", true) + " : " +
				patch("object.spec.containers", "/spec/containers/", false) + " + " +
				patch(celInitContainers("object"), "/spec/initContainers/", false)},
		}},
	}
}

// sealPolicyCEL is the seal policy's CEL: a JSON patch that removes
// partita.dev/canonical from a pod created with it, before any mutating
// webhook runs, so that only Partita's webhook can have written the seal
// the validating webhook's matchCondition trusts (seal.go).
func sealPolicyCEL() PolicyCEL {
	return PolicyCEL{
		MatchConditions: []admissionregistrationv1.MatchCondition{
			notMirrorPod(),
			{Name: "carries-a-seal", Expression: celStr(v1alpha1.AnnotationCanonical) + " in " + celAnnotations("object")},
		},
		Mutations: []admissionregistrationv1.Mutation{{
			PatchType: admissionregistrationv1.PatchTypeJSONPatch,
			JSONPatch: &admissionregistrationv1.JSONPatch{Expression: "[JSONPatch{op: 'remove', path: " +
				celStr("/metadata/annotations/"+strings.ReplaceAll(v1alpha1.AnnotationCanonical, "/", "~1")) + "}]"},
		}},
	}
}

// mutateMatchConditions select, with Policies on, the pods the mutating
// webhook sees: those that ask for GPUs, carry Partita's keys, or use
// ResourceClaims (which may ask for GPUs of another DRA driver).
func mutateMatchConditions() []admissionregistrationv1.MatchCondition {
	return []admissionregistrationv1.MatchCondition{{Name: "gpu-or-partita-keys", Expression: celTouchesPartita("object") + " || " + celUsesClaims("object")}}
}

// validateMatchConditions select the requests the validating pod webhook
// sees: bindings that carry system or CDI annotations, status updates that
// change labels or annotations (the kubelet's never do), and, with
// policies, pod writes that touch Partita's keys before or after (without,
// every pod write).
func validateMatchConditions(policies bool) []admissionregistrationv1.MatchCondition {
	pods := "true"
	var sealed []admissionregistrationv1.MatchCondition
	if policies {
		pods = celTouchesPartita("object") + " || (oldObject != null && " + celTouchesPartita("oldObject") + ")"
		// Only with the seal policy, which removes a seal the pod was
		// created with.
		sealed = append(sealed, sealedCreateMatchCondition())
	}
	return append([]admissionregistrationv1.MatchCondition{{
		Name: "gpu-or-partita-keys",
		Expression: "request.?subResource.orValue('') == 'binding' ? " + celAnnotations("object") + ".exists(k, " + celIsSystemAnnotation("k") + " || k.startsWith(" + celStr(cdiAnnotationPrefix) + ")) : " +
			"request.?subResource.orValue('') == 'status' ? (" + celAnnotations("object") + " != " + celAnnotations("oldObject") + " || " + celLabels("object") + " != " + celLabels("oldObject") + ") : " +
			pods,
	}}, sealed...)
}

// notTrusted is the matchCondition that spares Partita's own identities
// the validating webhook: it would allow them anyway, and the admission
// loop keeps pinning and ungating pods while the webhook is down.
func (o ConfigurationOptions) notTrusted() []admissionregistrationv1.MatchCondition {
	if len(o.Trusted.Users) == 0 && len(o.Trusted.Groups) == 0 {
		return nil
	}
	return []admissionregistrationv1.MatchCondition{{Name: "not-partita", Expression: "!" + celTrusted(o.Trusted)}}
}

// trustedWritesPass is the validating policy's matchCondition that spares
// it the requests of Partita's own identities that none of its
// validations can refuse: pod updates (the admission loop's release,
// which removes the gate), status updates and bindings (the extender's,
// with the devices). Their creates and ephemeral containers are still
// checked: the rules on privileged GPU containers, host paths and mounts
// hold for everyone. The webhooks' not-partita condition spares the same
// identities the validating webhook.
func (o ConfigurationOptions) trustedWritesPass() []admissionregistrationv1.MatchCondition {
	if len(o.Trusted.Users) == 0 && len(o.Trusted.Groups) == 0 {
		return nil
	}
	return []admissionregistrationv1.MatchCondition{{Name: "not-a-partita-update", Expression: celNotTrustedUpdate(celTrusted(o.Trusted))}}
}

// celNotTrustedUpdate is trustedWritesPass's expression for the CEL of
// who is trusted.
func celNotTrustedUpdate(trusted string) string {
	return "!(" + trusted + " && (request.?subResource.orValue('') == 'binding' || " +
		"(request.operation == 'UPDATE' && request.?subResource.orValue('') != 'ephemeralcontainers')))"
}

// podPolicyRules are the requests the validating policy sees.
func podPolicyRules() []admissionregistrationv1.NamedRuleWithOperations {
	return []admissionregistrationv1.NamedRuleWithOperations{
		podRule(admissionregistrationv1.Create, "pods", "pods/binding"),
		podRule(admissionregistrationv1.Update, "pods", "pods/status", "pods/ephemeralcontainers"),
	}
}

func (o ConfigurationOptions) policyMatch(rules []admissionregistrationv1.NamedRuleWithOperations) *admissionregistrationv1.MatchResources {
	return &admissionregistrationv1.MatchResources{
		NamespaceSelector: o.podNamespaceSelector(),
		ObjectSelector:    &metav1.LabelSelector{},
		ResourceRules:     rules,
		MatchPolicy:       ptr.To(admissionregistrationv1.Equivalent),
	}
}

func policyMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "partita"}}
}

// ValidatingPolicy is the ValidatingAdmissionPolicy: the pure refusals for
// every pod of the namespaces Partita manages, and the refusal of GPU pods
// that missed the webhook.
func ValidatingPolicy(o ConfigurationOptions) *admissionregistrationv1.ValidatingAdmissionPolicy {
	c := podPolicyCEL()
	meta := policyMeta(PodPolicyName(o.name()))
	return &admissionregistrationv1.ValidatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicy"},
		ObjectMeta: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy:    ptr.To(admissionregistrationv1.Fail),
			MatchConstraints: o.policyMatch(podPolicyRules()),
			MatchConditions:  append(c.MatchConditions, o.trustedWritesPass()...),
			Variables:        append(o.paramVariables(), c.Variables...),
			Validations:      c.Validations,
		},
	}
}

// ValidatingPolicyBinding binds ValidatingPolicy, denying.
func ValidatingPolicyBinding(o ConfigurationOptions) *admissionregistrationv1.ValidatingAdmissionPolicyBinding {
	meta := policyMeta(PodPolicyName(o.name()))
	return &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "ValidatingAdmissionPolicyBinding"},
		ObjectMeta: meta,
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        meta.Name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
}

// MutatingPolicy is the MutatingAdmissionPolicy that writes
// NVIDIA_VISIBLE_DEVICES=void into pods that ask for no GPU, reinvoked
// when a later webhook adds a container (a sidecar injector).
func MutatingPolicy(o ConfigurationOptions) *admissionregistrationv1.MutatingAdmissionPolicy {
	return o.mutatingPolicy(VoidPolicyName(o.name()), voidPolicyCEL(), admissionregistrationv1.IfNeededReinvocationPolicy,
		podRule(admissionregistrationv1.Create, "pods"), podRule(admissionregistrationv1.Update, "pods/ephemeralcontainers"))
}

// MutatingPolicyBinding binds MutatingPolicy.
func MutatingPolicyBinding(o ConfigurationOptions) *admissionregistrationv1.MutatingAdmissionPolicyBinding {
	return mutatingPolicyBinding(VoidPolicyName(o.name()))
}

// SealPolicy is the MutatingAdmissionPolicy that removes the seal a pod
// is created with (seal.go). It runs before the mutating webhooks and is
// never reinvoked: run again after them, it would remove Partita's own.
func SealPolicy(o ConfigurationOptions) *admissionregistrationv1.MutatingAdmissionPolicy {
	return o.mutatingPolicy(SealPolicyName(o.name()), sealPolicyCEL(), admissionregistrationv1.NeverReinvocationPolicy,
		podRule(admissionregistrationv1.Create, "pods"))
}

// SealPolicyBinding binds SealPolicy.
func SealPolicyBinding(o ConfigurationOptions) *admissionregistrationv1.MutatingAdmissionPolicyBinding {
	return mutatingPolicyBinding(SealPolicyName(o.name()))
}

// podRule is one operation on pod (sub)resources.
func podRule(op admissionregistrationv1.OperationType, resources ...string) admissionregistrationv1.NamedRuleWithOperations {
	return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
		Operations: []admissionregistrationv1.OperationType{op},
		Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: resources,
			Scope: ptr.To(admissionregistrationv1.NamespacedScope)},
	}}
}

// mutatingPolicy is a MutatingAdmissionPolicy of Partita's, failing
// closed, on the managed namespaces' pods.
func (o ConfigurationOptions) mutatingPolicy(name string, c PolicyCEL, reinvocation admissionregistrationv1.ReinvocationPolicyType,
	rules ...admissionregistrationv1.NamedRuleWithOperations) *admissionregistrationv1.MutatingAdmissionPolicy {
	return &admissionregistrationv1.MutatingAdmissionPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicy"},
		ObjectMeta: policyMeta(name),
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			FailurePolicy:      ptr.To(admissionregistrationv1.Fail),
			MatchConstraints:   o.policyMatch(rules),
			MatchConditions:    c.MatchConditions,
			Variables:          c.Variables,
			Mutations:          c.Mutations,
			ReinvocationPolicy: reinvocation,
		},
	}
}

// mutatingPolicyBinding binds the MutatingAdmissionPolicy name.
func mutatingPolicyBinding(name string) *admissionregistrationv1.MutatingAdmissionPolicyBinding {
	meta := policyMeta(name)
	return &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "admissionregistration.k8s.io/v1", Kind: "MutatingAdmissionPolicyBinding"},
		ObjectMeta: meta,
		Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: meta.Name},
	}
}
