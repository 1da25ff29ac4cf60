package helm_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/extender"
	"github.com/partita-dev/partita/helm"
	"github.com/partita-dev/partita/internal/devcluster"
	"github.com/partita-dev/partita/webhook"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// helmBinary is the helm of the cluster binaries; tests that need it skip
// without it.
func helmBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(devcluster.DefaultOptions().BinDir, "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no helm binary at %s (build it with 'make cluster-bins'): %v", bin, err)
	}
	return bin
}

// goldenCases are the values worth a golden file: the defaults and each
// value that changes which objects exist or how they are wired.
var goldenCases = map[string][]string{
	"default":                {},
	"cert-manager":           {"--set", "certs.mode=cert-manager"},
	"scheduler-default":      {"--set", "scheduler.mode=default"},
	"mps-kill":               {"--set", "agent.isolation=mps", "--set", "agent.enforce=kill"},
	"monitoring":             {"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.dashboard.enabled=true"},
	"simulated-no-policy-cm": {"--set", "agent.simulate=8xH100-80GB", "--set", "policy.defaultConfigMap=false", "--set", "webhook.excludeNamespaces={monitoring}"},
}

func render(t *testing.T, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := helm.Template(ctx, helm.TemplateOptions{
		Helm: helmBinary(t), ChartDir: helm.ChartName, Release: "partita", Namespace: "partita-system",
		KubeVersion: devcluster.K8sVersion, Args: args,
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestChartGolden renders the chart for each case and compares it with
// testdata/<case>.yaml; -update rewrites them.
func TestChartGolden(t *testing.T) {
	for name, args := range goldenCases {
		t.Run(name, func(t *testing.T) {
			got := render(t, args...)
			path := filepath.Join("testdata", name+".yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden file (run with -update to create it): %v", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("helm template differs from %s (-want,+got; run 'go test ./helm/ -update' if the change is intended):\n%s", path, diff)
			}
		})
	}
}

func TestChartLint(t *testing.T) {
	bin := helmBinary(t)
	for name, args := range goldenCases {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin, append([]string{"lint", "--strict", "--kube-version", devcluster.K8sVersion, helm.ChartName}, args...)...)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("helm lint: %v\n%s", err, out)
			}
		})
	}
}

// TestChartRefusesBadValues: values.schema.json catches mistakes before
// anything reaches the cluster.
func TestChartRefusesBadValues(t *testing.T) {
	bin := helmBinary(t)
	cases := map[string]string{
		"unknown enforce":          "agent.enforce=always",
		"unknown scheduler mode":   "scheduler.mode=third",
		"default-scheduler's name": "scheduler.name=default-scheduler",
		"unknown cert mode":        "certs.mode=vault",
		"a typo in a key":          "webhook.replica=3",
		"failure policy":           "webhook.failurePolicy=Never",
	}
	for name, set := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin, "template", "partita", helm.ChartName, "--kube-version", devcluster.K8sVersion, "--set", set)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), "values don't meet the specifications of the schema") {
				t.Errorf("--set %s: err %v, want a schema error:\n%s", set, err, out)
			}
		})
	}
}

// objects decodes a multi-document manifest into ConfigMaps and webhook
// configurations by name, and counts every kind.
type objects struct {
	configMaps  map[string]corev1.ConfigMap
	mutating    []admissionregistrationv1.MutatingWebhookConfiguration
	validating  []admissionregistrationv1.ValidatingWebhookConfiguration
	vaps        []admissionregistrationv1.ValidatingAdmissionPolicy
	vapBindings []admissionregistrationv1.ValidatingAdmissionPolicyBinding
	maps        []admissionregistrationv1.MutatingAdmissionPolicy
	mapBindings []admissionregistrationv1.MutatingAdmissionPolicyBinding
	kinds       map[string]int
}

func decode(t *testing.T, manifest []byte) objects {
	t.Helper()
	o := objects{configMaps: map[string]corev1.ConfigMap{}, kinds: map[string]int{}}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return o
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind == "" {
			continue
		}
		o.kinds[meta.Kind]++
		switch meta.Kind {
		case "ConfigMap":
			var cm corev1.ConfigMap
			if err := yaml.UnmarshalStrict(doc, &cm); err != nil {
				t.Fatal(err)
			}
			o.configMaps[cm.Name] = cm
		case "MutatingWebhookConfiguration":
			var m admissionregistrationv1.MutatingWebhookConfiguration
			if err := yaml.UnmarshalStrict(doc, &m); err != nil {
				t.Fatal(err)
			}
			o.mutating = append(o.mutating, m)
		case "ValidatingWebhookConfiguration":
			var v admissionregistrationv1.ValidatingWebhookConfiguration
			if err := yaml.UnmarshalStrict(doc, &v); err != nil {
				t.Fatal(err)
			}
			o.validating = append(o.validating, v)
		case "ValidatingAdmissionPolicy":
			o.vaps = append(o.vaps, decodeStrict[admissionregistrationv1.ValidatingAdmissionPolicy](t, doc))
		case "ValidatingAdmissionPolicyBinding":
			o.vapBindings = append(o.vapBindings, decodeStrict[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, doc))
		case "MutatingAdmissionPolicy":
			o.maps = append(o.maps, decodeStrict[admissionregistrationv1.MutatingAdmissionPolicy](t, doc))
		case "MutatingAdmissionPolicyBinding":
			o.mapBindings = append(o.mapBindings, decodeStrict[admissionregistrationv1.MutatingAdmissionPolicyBinding](t, doc))
		}
	}
}

// TestChartSchedulerConfig: the chart's KubeSchedulerConfiguration is,
// byte for byte, what `partita extender --print-scheduler-config` prints for
// the same options, so the two cannot drift.
func TestChartSchedulerConfig(t *testing.T) {
	second := extender.DefaultSchedulerConfigOptions()
	second.URL = "https://partita-extender.partita-system.svc:443"
	second.CAFile = "/etc/partita/extender-ca/ca.crt"
	second.SchedulerName, second.LeaseName, second.LeaseNamespace = "partita", "partita-scheduler", "partita-system"
	def := extender.DefaultSchedulerConfigOptions()
	def.CAFile = "/etc/kubernetes/partita/ca.crt"
	custom := def
	custom.URL, custom.CAFile, custom.Weight, custom.HTTPTimeout, custom.QPS, custom.Burst = "https://10.0.0.7:8443", "", 3, 2*time.Second, 150, 300
	cases := map[string]struct {
		args []string
		want extender.SchedulerConfigOptions
	}{
		"second scheduler":  {want: second},
		"default scheduler": {args: []string{"--set", "scheduler.mode=default"}, want: def},
		"default scheduler, custom": {args: []string{"--set", "scheduler.mode=default", "--set", "scheduler.extenderURL=https://10.0.0.7:8443",
			"--set", "scheduler.extenderCAFile=", "--set", "scheduler.weight=3", "--set", "scheduler.httpTimeout=2s",
			"--set", "scheduler.qps=150", "--set", "scheduler.burst=300"}, want: custom},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			want, err := extender.SchedulerConfig(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			cm, ok := decode(t, render(t, tc.args...)).configMaps["partita-scheduler-config"]
			if !ok {
				t.Fatal("no ConfigMap partita-scheduler-config")
			}
			if diff := cmp.Diff(string(want), cm.Data["config.yaml"]); diff != "" {
				t.Errorf("chart's scheduler configuration differs from extender.SchedulerConfig (-go,+chart):\n%s", diff)
			}
		})
	}
}

func decodeStrict[T any](t *testing.T, doc []byte) T {
	t.Helper()
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestChartWebhookConfigurations: the chart's webhook configurations and
// admission policies are those the webhook package generates (and `partita
// dev up` registers; docs/operations.md), bar labels, annotations and the CA
// that cert-controller or cert-manager injects.
func TestChartWebhookConfigurations(t *testing.T) {
	port := int32(443)
	base := webhook.ConfigurationOptions{Name: "partita", Namespace: "partita-system", ExcludedNamespaces: []string{"gpu-operator"},
		Service:  &admissionregistrationv1.ServiceReference{Name: "partita-webhook", Namespace: "partita-system", Port: &port},
		Policies: true, AdmissionGate: true, MPSDir: "/run/partita/mps",
		Trusted: webhook.Identities{Users: []string{"system:serviceaccount:partita-system:partita-extender"}}}
	with := func(f func(*webhook.ConfigurationOptions)) webhook.ConfigurationOptions {
		o := base
		f(&o)
		return o
	}
	cases := map[string]struct {
		args []string
		want webhook.ConfigurationOptions
	}{
		"defaults": {want: base},
		"more namespaces, labels, another MPS dir, no gate": {
			args: []string{"--set", "webhook.excludeNamespaces={gpu-operator,monitoring}", "--set", "webhook.namespaceSelector.matchLabels.gpu=yes",
				"--set", "agent.mpsDir=/var/lib/mps/", "--set", "webhook.admissionGate=false"},
			want: with(func(o *webhook.ConfigurationOptions) {
				o.ExcludedNamespaces = []string{"gpu-operator", "monitoring"}
				o.NamespaceLabels = map[string]string{"gpu": "yes"}
				o.MPSDir, o.AdmissionGate = "/var/lib/mps", false
			}),
		},
		"no admission policies, failing open": {
			args: []string{"--set", "admissionPolicies.enabled=false", "--set", "webhook.failurePolicy=Ignore"},
			want: with(func(o *webhook.ConfigurationOptions) {
				o.Policies = false
				o.FailurePolicy = ptrTo(admissionregistrationv1.Ignore)
			}),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			objs := decode(t, render(t, tc.args...))
			if len(objs.mutating) != 1 || len(objs.validating) != 1 {
				t.Fatalf("got %d mutating and %d validating configurations, want 1 each", len(objs.mutating), len(objs.validating))
			}
			o := tc.want
			wantM, wantV := webhook.MutatingConfiguration(o), webhook.ValidatingConfiguration(o)
			gotM, gotV := objs.mutating[0], objs.validating[0]
			if gotM.Name != wantM.Name || gotV.Name != wantV.Name {
				t.Errorf("names %q, %q; want %q", gotM.Name, gotV.Name, wantM.Name)
			}
			if diff := cmp.Diff(wantM.Webhooks, gotM.Webhooks); diff != "" {
				t.Errorf("mutating webhooks (-webhook package,+chart):\n%s", diff)
			}
			if diff := cmp.Diff(wantV.Webhooks, gotV.Webhooks); diff != "" {
				t.Errorf("validating webhooks (-webhook package,+chart):\n%s", diff)
			}
			if !o.Policies {
				if n := len(objs.vaps) + len(objs.vapBindings) + len(objs.maps) + len(objs.mapBindings); n != 0 {
					t.Errorf("%d admission policies and bindings rendered with admissionPolicies.enabled=false", n)
				}
				return
			}
			if len(objs.vaps) != 1 || len(objs.vapBindings) != 1 || len(objs.maps) != 1 || len(objs.mapBindings) != 1 {
				t.Fatalf("got %d, %d, %d, %d policies and bindings, want one each", len(objs.vaps), len(objs.vapBindings), len(objs.maps), len(objs.mapBindings))
			}
			for _, c := range []struct {
				what              string
				wantName, gotName string
				want, got         any
			}{
				{"ValidatingAdmissionPolicy", webhook.ValidatingPolicy(o).Name, objs.vaps[0].Name, webhook.ValidatingPolicy(o).Spec, objs.vaps[0].Spec},
				{"ValidatingAdmissionPolicyBinding", webhook.ValidatingPolicyBinding(o).Name, objs.vapBindings[0].Name, webhook.ValidatingPolicyBinding(o).Spec, objs.vapBindings[0].Spec},
				{"MutatingAdmissionPolicy", webhook.MutatingPolicy(o).Name, objs.maps[0].Name, webhook.MutatingPolicy(o).Spec, objs.maps[0].Spec},
				{"MutatingAdmissionPolicyBinding", webhook.MutatingPolicyBinding(o).Name, objs.mapBindings[0].Name, webhook.MutatingPolicyBinding(o).Spec, objs.mapBindings[0].Spec},
			} {
				if c.gotName != c.wantName {
					t.Errorf("%s is named %q, want %q", c.what, c.gotName, c.wantName)
				}
				if diff := cmp.Diff(c.want, c.got); diff != "" {
					t.Errorf("%s (-webhook package,+chart):\n%s", c.what, diff)
				}
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// admissionCELFile is the chart's copy of the admission objects' constant
// CEL (webhook.Constants), which its templates read.
const admissionCELFile = "partita/files/admission-cel.yaml"

// admissionCELHeader heads the generated file.
const admissionCELHeader = `# Generated from webhook.Constants by 'make chart-sync'; do not edit.
# The constant CEL of the admission policies and the webhooks'
# matchConditions: templates/admission-policies.yaml and
# templates/webhook-configurations.yaml add what depends on values.
`

// TestChartAdmissionCEL: the chart's CEL is the webhook package's (make
// chart-sync writes it, as -update does).
func TestChartAdmissionCEL(t *testing.T) {
	b, err := yaml.Marshal(webhook.Constants())
	if err != nil {
		t.Fatal(err)
	}
	want := admissionCELHeader + string(b)
	if *update {
		if err := os.WriteFile(admissionCELFile, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(admissionCELFile)
	if err != nil || string(got) != want {
		t.Errorf("%s is not webhook.Constants() (%v): run 'make chart-sync'", admissionCELFile, err)
	}
}

// TestChartCopies: the chart's CRDs and default policy are the repository's
// (make chart-sync copies them; make verify-generated checks it too).
func TestChartCopies(t *testing.T) {
	for src, dst := range map[string]string{"../crds/*.yaml": "partita/crds", "../policy/rego/*.rego": "partita/files/policy"} {
		files, err := filepath.Glob(src)
		if err != nil || len(files) == 0 {
			t.Fatalf("glob %s: %v", src, err)
		}
		copies := 0
		for _, f := range files {
			if strings.HasSuffix(f, "_test.rego") {
				continue
			}
			copies++
			want, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join(dst, filepath.Base(f)))
			if err != nil || !bytes.Equal(got, want) {
				t.Errorf("%s/%s is not a copy of %s (%v): run 'make chart-sync'", dst, filepath.Base(f), f, err)
			}
		}
		if have, _ := filepath.Glob(filepath.Join(dst, "*"+filepath.Ext(src))); len(have) != copies {
			t.Errorf("%s has %d files, %s %d: run 'make chart-sync'", dst, len(have), src, copies)
		}
	}
}

// TestEmbeddedChart: the binary carries the whole chart.
func TestEmbeddedChart(t *testing.T) {
	dir, err := helm.WriteChart(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"Chart.yaml", "values.yaml", "values.schema.json", "templates/rbac.yaml", "crds/partita.dev_queues.yaml", "files/policy/admission.rego", "files/dashboard.json", ".helmignore"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("embedded chart lacks %s: %v", f, err)
		}
	}
}
