package webhook

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// TestAdmission sends each case of testdata/admission through the HTTP
// handler and compares the response with its golden file: the JSON patch
// of an admitted request, or the status of a refused one. Every admitted
// pod CREATE is also checked twice more: mutating the patched pod again
// (reinvocation) adds nothing, and the validating webhook accepts it.
func TestAdmission(t *testing.T) {
	cases := map[string]struct {
		path string
		opts testOptions
		// input names the request file when it is another case's.
		input string
	}{
		"mutate-partita-fraction":    {path: PathMutatePods},
		"mutate-partita-memory":      {path: PathMutatePods},
		"mutate-partita-whole":       {path: PathMutatePods},
		"mutate-runai-fraction":      {path: PathMutatePods},
		"mutate-runai-memory":        {path: PathMutatePods},
		"mutate-kai-queue":           {path: PathMutatePods},
		"mutate-kai-topology":        {path: PathMutatePods},
		"mutate-kueue-topology":      {path: PathMutatePods},
		"mutate-hami-gpumem":         {path: PathMutatePods},
		"mutate-hami-percentage":     {path: PathMutatePods},
		"mutate-nvidia-whole":        {path: PathMutatePods},
		"mutate-coscheduling-gang":   {path: PathMutatePods},
		"mutate-sidecar-and-init":    {path: PathMutatePods},
		"mutate-no-gpu":              {path: PathMutatePods},
		"mutate-default-queue":       {path: PathMutatePods},
		"mutate-admission-gate":      {path: PathMutatePods, opts: testOptions{gate: true}},
		"mutate-scheduler-name":      {path: PathMutatePods, opts: testOptions{schedulerName: "partita"}},
		"mutate-scheduler-name-cpu":  {path: PathMutatePods, opts: testOptions{schedulerName: "partita"}},
		"mutate-isolation-modes":     {path: PathMutatePods, opts: testOptions{modes: []v1alpha1.IsolationMode{v1alpha1.IsolationHAMiCore, v1alpha1.IsolationMPS}}},
		"mutate-trusted-identity":    {path: PathMutatePods},
		"mutate-ephemeral-container": {path: PathMutatePods},
		"mutate-mirror-pod":          {path: PathMutatePods},
		"mutate-model":               {path: PathMutatePods},
		"mutate-model-no-gpu":        {path: PathMutatePods},
		"deny-model-missing":         {path: PathMutatePods},
		"deny-model-other-namespace": {path: PathMutatePods},
		"deny-model-no-cache":        {path: PathMutatePods, input: "mutate-model", opts: testOptions{noModels: true}},

		"mutate-cluster-default-queue":         {path: PathMutatePods},
		"mutate-member-takes-podgroup-queue":   {path: PathMutatePods},
		"mutate-member-podgroup-missing":       {path: PathMutatePods},
		"mutate-member-podgroup-without-queue": {path: PathMutatePods},
		"deny-member-queue-conflict":           {path: PathMutatePods},
		"deny-member-sub-group-unknown":        {path: PathMutatePods},
		"deny-topology-dialects-disagree":      {path: PathMutatePods},
		"deny-no-queue-required":               {path: PathMutatePods, opts: testOptions{requireQueue: true}},
		"deny-cluster-default-queue-missing":   {path: PathMutatePods, opts: testOptions{defaultQueue: "shared"}},

		"deny-fraction-too-large":     {path: PathMutatePods},
		"deny-fraction-syntax":        {path: PathMutatePods},
		"deny-conflicting-dialects":   {path: PathMutatePods},
		"deny-canonical-disagrees":    {path: PathMutatePods},
		"deny-gpu-milli-alone":        {path: PathMutatePods},
		"deny-init-container-gpu":     {path: PathMutatePods},
		"deny-queue-names-disagree":   {path: PathMutatePods},
		"deny-spoofed-devices":        {path: PathMutatePods},
		"deny-spoofed-node":           {path: PathMutatePods},
		"deny-visible-devices-all":    {path: PathMutatePods},
		"deny-visible-devices-no-gpu": {path: PathMutatePods},
		"deny-mps-env":                {path: PathMutatePods},
		"deny-mps-volume":             {path: PathMutatePods},
		"deny-queue-missing":          {path: PathMutatePods},
		"deny-queue-not-leaf":         {path: PathMutatePods},
		"deny-namespace-not-allowed":  {path: PathMutatePods},
		"deny-over-queue-limit":       {path: PathMutatePods},
		"deny-malformed-object":       {path: PathMutatePods},
		"deny-fake-mirror-pod":        {path: PathMutatePods},
		"deny-privileged-gpu":         {path: PathMutatePods},
		"deny-hostpath-mps":           {path: PathMutatePods},

		"validate-create-canonical":             {path: PathValidatePods},
		"validate-create-not-mutated":           {path: PathValidatePods},
		"deny-model-not-mutated":                {path: PathValidatePods},
		"validate-update-spoof-devices":         {path: PathValidatePods},
		"validate-update-remove-node":           {path: PathValidatePods},
		"validate-update-extender":              {path: PathValidatePods},
		"validate-update-ungate-extender":       {path: PathValidatePods},
		"validate-update-ungate-spoofed":        {path: PathValidatePods},
		"validate-update-queue":                 {path: PathValidatePods},
		"validate-update-topology":              {path: PathValidatePods},
		"validate-update-labels":                {path: PathValidatePods},
		"validate-binding-spoofed":              {path: PathValidatePods},
		"validate-binding-extender":             {path: PathValidatePods},
		"validate-binding-plain":                {path: PathValidatePods},
		"validate-ephemeral-all":                {path: PathValidatePods},
		"validate-ephemeral-not-mutated":        {path: PathValidatePods},
		"validate-ephemeral-void":               {path: PathValidatePods},
		"validate-create-no-queue":              {path: PathValidatePods},
		"validate-create-member-queue-conflict": {path: PathValidatePods},
		"validate-status-spoof":                 {path: PathValidatePods},
		"validate-binding-cdi":                  {path: PathValidatePods},

		"podgroup-create-own-queue":              {path: PathValidatePodGroups},
		"podgroup-create-foreign-queue":          {path: PathValidatePodGroups},
		"podgroup-create-missing-queue":          {path: PathValidatePodGroups},
		"podgroup-create-missing-priority-class": {path: PathValidatePodGroups},
		"podgroup-create-no-queue":               {path: PathValidatePodGroups},
		"podgroup-update-queue-admitted":         {path: PathValidatePodGroups},
		"podgroup-update-queue-pending":          {path: PathValidatePodGroups},
		"podgroup-update-queue-foreign":          {path: PathValidatePodGroups},
		"podgroup-update-metadata-only":          {path: PathValidatePodGroups},
		"podgroup-create-topology-level":         {path: PathValidatePodGroups},
		"podgroup-create-sub-groups":             {path: PathValidatePodGroups},
		"podgroup-create-sub-groups-too-large":   {path: PathValidatePodGroups},

		// The dra GPU backend: the same requests become claims.
		"mutate-dra-partita-fraction":  {path: PathMutatePods, input: "mutate-partita-fraction", opts: testOptions{templates: newMemTemplates(), gate: true}},
		"mutate-dra-runai-memory":      {path: PathMutatePods, input: "mutate-runai-memory", opts: testOptions{templates: newMemTemplates()}},
		"mutate-dra-hami-percentage":   {path: PathMutatePods, input: "mutate-hami-percentage", opts: testOptions{templates: newMemTemplates()}},
		"mutate-dra-nvidia-whole":      {path: PathMutatePods, input: "mutate-nvidia-whole", opts: testOptions{templates: newMemTemplates()}},
		"mutate-dra-sidecar-and-init":  {path: PathMutatePods, input: "mutate-sidecar-and-init", opts: testOptions{templates: newMemTemplates()}},
		"deny-dra-visible-devices-all": {path: PathMutatePods, input: "deny-visible-devices-all", opts: testOptions{templates: newMemTemplates()}},
		"validate-dra-not-mutated":     {path: PathValidatePods, input: "validate-create-not-mutated", opts: testOptions{templates: newMemTemplates()}},

		// Pods that hold GPUs through another driver's ResourceClaims.
		"mutate-claims-gpu":                 {path: PathMutatePods, opts: testOptions{gate: true, claims: true}},
		"mutate-claims-namespace-default":   {path: PathMutatePods, opts: testOptions{gate: true, claims: true}},
		"mutate-claims-nic":                 {path: PathMutatePods, opts: testOptions{gate: true, claims: true}},
		"mutate-claims-missing":             {path: PathMutatePods, opts: testOptions{gate: true, claims: true}},
		"deny-claims-namespace-not-allowed": {path: PathMutatePods, opts: testOptions{gate: true, claims: true}},
		"validate-update-claims-queue":      {path: PathValidatePods, opts: testOptions{claims: true}},

		"policy-valid":  {path: PathValidatePolicies},
		"policy-broken": {path: PathValidatePolicies},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h := newTestServer(t, tc.opts)
			input := name
			if tc.input != "" {
				input = tc.input
			}
			req := readCase(t, input)
			got := outcomeOf(t, post(t, h, tc.path, req))
			checkGolden(t, name, got)

			if tc.path != PathMutatePods || !got.Allowed || req.Operation != admissionv1.Create {
				return
			}
			patched := applyPatch(t, req.Object.Raw, got.Patch)
			again := *req
			again.Object = runtime.RawExtension{Raw: patched}
			if second := outcomeOf(t, post(t, h, PathMutatePods, &again)); len(second.Patch) > 0 {
				t.Errorf("a second mutation changed the pod again (not idempotent):\n%s", cmp.Diff(outcome{Allowed: true}, second))
			}
			if v := outcomeOf(t, post(t, h, PathValidatePods, &again)); !v.Allowed {
				t.Errorf("the validating webhook refused the mutated pod: %+v", v.Status)
			}
			if m := tc.opts.templates; m != nil && hasGPU(podOf(t, patched)) && len(m.byName) == 0 {
				t.Error("the dra backend made no claim template")
			}
		})
	}
}

func hasGPU(p *corev1.Pod) bool { return len(p.Spec.ResourceClaims) > 0 }
