package devcluster

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// TestAddonVersionsMatchBuildScript: the versions dev up looks for are the
// ones e2e/clusterbins/build.sh builds.
func TestAddonVersionsMatchBuildScript(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	script, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "e2e", "clusterbins", "build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range Addons() {
		re := regexp.MustCompile(strings.ToUpper(a.Name) + `_VERSION=\$\{` + strings.ToUpper(a.Name) + `_VERSION:-(v[0-9.]+)\}`)
		m := re.FindSubmatch(script)
		if m == nil {
			t.Errorf("build.sh sets no %s_VERSION", strings.ToUpper(a.Name))
			continue
		}
		if string(m[1]) != a.Version {
			t.Errorf("addon %s: dev up wants %s, build.sh builds %s", a.Name, a.Version, m[1])
		}
	}
}

// TestAddonWebhooksPointAtTheHost: a release's webhook configurations,
// written for a Service, are rewritten for the controller on loopback:
// named after the addon, called at the host URL with the CA bundle, and the
// pod webhooks limited to the addon's pods.
func TestAddonWebhooksPointAtTheHost(t *testing.T) {
	release := `---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-jobset-x-k8s-io-v1alpha2-jobset}
  failurePolicy: Fail
  name: mjobset.kb.io
  rules:
  - {apiGroups: [jobset.x-k8s.io], apiVersions: [v1alpha2], operations: [CREATE], resources: [jobsets]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  sideEffects: None
`
	a, _ := addon("jobset")
	out, err := addonWebhooks([]byte(release), a, "https://127.0.0.1:9443", []byte("CA"))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := yaml.Unmarshal([]byte(strings.TrimPrefix(string(out), "---\n")), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
		"metadata": map[string]any{"name": "jobset-mutating-webhook-configuration"},
		"webhooks": []any{
			map[string]any{
				"admissionReviewVersions": []any{"v1"}, "failurePolicy": "Fail", "name": "mjobset.kb.io", "sideEffects": "None",
				"clientConfig": map[string]any{"url": "https://127.0.0.1:9443/mutate-jobset-x-k8s-io-v1alpha2-jobset", "caBundle": "Q0E="},
				"rules":        []any{map[string]any{"apiGroups": []any{"jobset.x-k8s.io"}, "apiVersions": []any{"v1alpha2"}, "operations": []any{"CREATE"}, "resources": []any{"jobsets"}}},
			},
			map[string]any{
				"admissionReviewVersions": []any{"v1"}, "failurePolicy": "Fail", "name": "mpod.kb.io", "sideEffects": "None",
				"clientConfig":   map[string]any{"url": "https://127.0.0.1:9443/mutate--v1-pod", "caBundle": "Q0E="},
				"objectSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}}},
				"rules":          []any{map[string]any{"apiGroups": []any{""}, "apiVersions": []any{"v1"}, "operations": []any{"CREATE"}, "resources": []any{"pods"}}},
			},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rewritten webhooks (-want +got):\n%s", diff)
	}
}

func TestNewRefusesBadFeatureGates(t *testing.T) {
	cases := map[string]struct {
		gates, runtime string
		wantErr        string
	}{
		"none":           {},
		"gates":          {gates: "GenericWorkload=true,WorkloadWithJob=true", runtime: "scheduling.k8s.io/v1beta1=true"},
		"no value":       {gates: "GenericWorkload", wantErr: `--feature-gates "GenericWorkload": "GenericWorkload" is not key=value`},
		"a space inside": {runtime: "scheduling.k8s.io/v1beta1=true, x=y", wantErr: `--runtime-config`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			opts := DefaultOptions()
			opts.FeatureGates, opts.RuntimeConfig = tc.gates, tc.runtime
			_, err := New(opts)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("New: %v, want an error with %q", err, tc.wantErr)
			}
		})
	}
}

func TestCheckAddonsSaysHowToBuild(t *testing.T) {
	opts := DefaultOptions()
	opts.AddonsDir = t.TempDir()
	opts.Addons = []string{"jobset", "kuberay"}
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	err = c.checkAddons()
	if err == nil || !strings.Contains(err.Error(), "jobset, kuberay") || !strings.Contains(err.Error(), "make cluster-bins") {
		t.Errorf("checkAddons: %v, want both named with the command that builds them", err)
	}
	opts.Addons = []string{"volcano"}
	c, _ = New(opts)
	if err := c.checkAddons(); err == nil || !strings.Contains(err.Error(), "known: jobset, lws, kuberay") {
		t.Errorf("checkAddons: %v, want the known addons", err)
	}
}
