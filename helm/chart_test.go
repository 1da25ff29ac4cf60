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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/extender"
	"github.com/partita-dev/partita/helm"
	"github.com/partita-dev/partita/webhook"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// apiServerCA gives every render the CA of the API server's webhook client
// certificate, without which the chart refuses to install.
var apiServerCA = []string{"--set-file", "webhook.clientAuth.caBundle=" + filepath.Join("testdata", "apiserver-client-ca.crt")}

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
	"mps-in-agent":           {"--set", "agent.isolation=mps", "--set", "agent.mpsKeeper=false"},
	"interposer-copy":        {"--set", "agent.isolation=hami-core", "--set", "agent.interposer.imageVolume=false"},
	"dra":                    {"--set", "gpuBackend=dra", "--set", "agent.isolation=mps"},
	"dra-simulated":          {"--set", "gpuBackend=dra", "--set", "agent.simulate=8xH100-80GB", "--set", "scheduler.mode=default"},
	"monitoring":             {"--set", "monitoring.serviceMonitor.enabled=true", "--set", "monitoring.dashboard.enabled=true"},
	"simulated-no-policy-cm": {"--set", "agent.simulate=8xH100-80GB", "--set", "policy.defaultConfigMap=false", "--set", "webhook.excludeNamespaces={monitoring}"},
	"network-policy-peers": {"--set", "scheduler.mode=default", "--set", "extender.networkPolicy.schedulerFrom[0].ipBlock.cidr=10.0.0.0/24",
		"--set", "extender.networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
		"--set", "extender.debugEndpoints=true",
		"--set", "webhook.networkPolicy.apiServerFrom[0].ipBlock.cidr=10.0.0.0/24"},
	"console": {"--set", "console.enabled=true", "--set", "console.prometheusURL=http://prometheus.monitoring:9090",
		"--set", "console.tls.secretName=partita-console-tls", "--set", "console.authProxy.enabled=true",
		"--set", "console.authProxy.clientCAConfigMap=proxy-ca", "--set", "console.authProxy.allowedNames={oauth2-proxy}"},
}

func render(t *testing.T, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := helm.Template(ctx, helm.TemplateOptions{
		Helm: helmBinary(t), ChartDir: helm.ChartName, Release: "partita", Namespace: "partita-system",
		KubeVersion: devcluster.K8sVersion, Args: append(append([]string{}, apiServerCA...), args...),
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
			cmd := exec.CommandContext(t.Context(), bin, append(append([]string{"lint", "--strict", "--kube-version", devcluster.K8sVersion, helm.ChartName}, apiServerCA...), args...)...)
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
		"plain HTTP extender URL":  "scheduler.extenderURL=http://10.0.0.7:8080",
		"no client certificate":    "scheduler.extenderClientCertFile=",
		"no default queue":         "webhook.defaultQueue=",
		"a default queue's name":   "webhook.defaultQueue=Team_A",
		"console service type":     "console.service.type=Ingress",
		"console prometheus URL":   "console.prometheusURL=prometheus:9090",
		"unknown GPU backend":      "gpuBackend=device-plugin",
		"negative usage weight":    "extender.admission.fairShareUsage.weight=-1",
		"zero usage half-life":     "extender.admission.fairShareUsage.halfLife=0",
		"unknown usage window":     "extender.admission.fairShareUsage.windowType=rolling",
	}
	for name, set := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin, append([]string{"template", "partita", helm.ChartName, "--kube-version", devcluster.K8sVersion, "--set", set}, apiServerCA...)...)
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
			// The agent's and the model cache's own-node policies have tests
			// of their own (TestChartAgentPolicy, the real node's); these are
			// the pod admission policies.
			if v := decodeStrict[admissionregistrationv1.ValidatingAdmissionPolicy](t, doc); !ownNodePolicy(v.Name) {
				o.vaps = append(o.vaps, v)
			}
		case "ValidatingAdmissionPolicyBinding":
			if v := decodeStrict[admissionregistrationv1.ValidatingAdmissionPolicyBinding](t, doc); !ownNodePolicy(v.Name) {
				o.vapBindings = append(o.vapBindings, v)
			}
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
	second.ClientCertFile, second.ClientKeyFile = "/etc/partita/scheduler-client/tls.crt", "/etc/partita/scheduler-client/tls.key"
	second.SchedulerName, second.LeaseName, second.LeaseNamespace = "partita", "partita-scheduler", "partita-system"
	def := extender.DefaultSchedulerConfigOptions()
	custom := def
	custom.URL, custom.CAFile, custom.Weight, custom.HTTPTimeout, custom.QPS, custom.Burst = "https://10.0.0.7:8443", "/srv/ca.pem", 3, 2*time.Second, 150, 300
	custom.ClientCertFile, custom.ClientKeyFile = "/srv/client.pem", "/srv/client-key.pem"
	// The serving certificate names the Service, not the address.
	custom.ServerName = "partita-extender.partita-system.svc"
	named := custom
	named.ServerName = "extender.example.com"
	cases := map[string]struct {
		args []string
		want extender.SchedulerConfigOptions
	}{
		"second scheduler":  {want: second},
		"default scheduler": {args: []string{"--set", "scheduler.mode=default"}, want: def},
		"default scheduler, custom": {args: []string{"--set", "scheduler.mode=default", "--set", "scheduler.extenderURL=https://10.0.0.7:8443",
			"--set", "scheduler.extenderCAFile=/srv/ca.pem", "--set", "scheduler.extenderClientCertFile=/srv/client.pem",
			"--set", "scheduler.extenderClientKeyFile=/srv/client-key.pem", "--set", "scheduler.weight=3", "--set", "scheduler.httpTimeout=2s",
			"--set", "scheduler.qps=150", "--set", "scheduler.burst=300"}, want: custom},
		"default scheduler, custom, server name": {args: []string{"--set", "scheduler.mode=default", "--set", "scheduler.extenderURL=https://10.0.0.7:8443",
			"--set", "scheduler.extenderCAFile=/srv/ca.pem", "--set", "scheduler.extenderClientCertFile=/srv/client.pem",
			"--set", "scheduler.extenderClientKeyFile=/srv/client-key.pem", "--set", "scheduler.weight=3", "--set", "scheduler.httpTimeout=2s",
			"--set", "scheduler.qps=150", "--set", "scheduler.burst=300", "--set", "scheduler.extenderServerName=extender.example.com"}, want: named},
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
			if len(objs.vaps) != 1 || len(objs.vapBindings) != 1 || len(objs.maps) != 2 || len(objs.mapBindings) != 2 {
				t.Fatalf("got %d, %d, %d, %d validating and mutating policies and bindings, want 1, 1, 2, 2", len(objs.vaps), len(objs.vapBindings), len(objs.maps), len(objs.mapBindings))
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
				{"the seal's MutatingAdmissionPolicy", webhook.SealPolicy(o).Name, objs.maps[1].Name, webhook.SealPolicy(o).Spec, objs.maps[1].Spec},
				{"the seal's MutatingAdmissionPolicyBinding", webhook.SealPolicyBinding(o).Name, objs.mapBindings[1].Name, webhook.SealPolicyBinding(o).Spec, objs.mapBindings[1].Spec},
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

// find decodes the manifest's object of kind and name into out, and reports
// whether there is one.
func find(t *testing.T, manifest []byte, kind, name string, out any) bool {
	t.Helper()
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			Kind     string
			Metadata struct{ Name string }
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil || meta.Kind != kind || meta.Metadata.Name != name {
			continue
		}
		if err := yaml.Unmarshal(doc, out); err != nil {
			t.Fatalf("decode %s %s: %v", kind, name, err)
		}
		return true
	}
}

func container(t *testing.T, d *appsv1.Deployment, name string) *corev1.Container {
	t.Helper()
	for i := range d.Spec.Template.Spec.Containers {
		if d.Spec.Template.Spec.Containers[i].Name == name {
			return &d.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("deployment %s has no container %s", d.Name, name)
	return nil
}

// secretVolume returns the Secret and keys a volume mounted at path in c
// comes from (nil keys: the whole Secret).
func secretVolume(t *testing.T, d *appsv1.Deployment, c *corev1.Container, path string) (string, []string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				var keys []string
				for _, it := range v.Secret.Items {
					keys = append(keys, it.Key)
				}
				return v.Secret.SecretName, keys
			}
		}
	}
	t.Fatalf("container %s mounts no Secret at %s", c.Name, path)
	return "", nil
}

// TestChartExtenderTrust: only kube-scheduler reaches the extender. The
// extender requires its client certificate (the CA of a Secret of its own,
// without the CA's key), the chart's scheduler Deployment presents that
// certificate and its configuration names it, the webhook rotates it (or
// cert-manager issues it), and a NetworkPolicy lets only the scheduler's
// pods reach the port.
// TestChartFairShareUsage: time-based fair share is off by default (no
// flag reaches the extender) and the values pass all four flags when a
// weight is set, --set's string weights included. cmd/partita's
// TestExtenderTakesTheChartsUsageFlags checks the extender accepts them.
func TestChartFairShareUsage(t *testing.T) {
	args := func(set ...string) []string {
		var ext appsv1.Deployment
		if !find(t, render(t, set...), "Deployment", "partita-extender", &ext) {
			t.Fatal("no extender Deployment")
		}
		var out []string
		for _, a := range container(t, &ext, "extender").Args {
			if strings.HasPrefix(a, "--fair-share-usage-") {
				out = append(out, a)
			}
		}
		return out
	}
	if got := args(); got != nil {
		t.Errorf("default values pass %v, want no usage flag", got)
	}
	want := []string{"--fair-share-usage-weight=0.5", "--fair-share-usage-half-life=1h", "--fair-share-usage-window=24h", "--fair-share-usage-window-type=tumbling"}
	got := args("--set", "extender.admission.fairShareUsage.weight=0.5", "--set", "extender.admission.fairShareUsage.halfLife=1h",
		"--set", "extender.admission.fairShareUsage.window=24h", "--set", "extender.admission.fairShareUsage.windowType=tumbling")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("usage flags (-want +got):\n%s", diff)
	}
}

func TestChartExtenderTrust(t *testing.T) {
	const clientSecret = "partita-scheduler-client-cert"
	manifest := render(t)
	var ext, wh, sched appsv1.Deployment
	if !find(t, manifest, "Deployment", "partita-extender", &ext) || !find(t, manifest, "Deployment", "partita-webhook", &wh) ||
		!find(t, manifest, "Deployment", "partita-scheduler", &sched) {
		t.Fatal("no extender, webhook or scheduler Deployment")
	}
	e := container(t, &ext, "extender")
	for _, want := range []string{"--client-ca-file=/etc/partita/client-ca/ca.crt", "--client-allowed-names=partita-scheduler"} {
		if !slices.Contains(e.Args, want) {
			t.Errorf("extender args %v lack %s", e.Args, want)
		}
	}
	if slices.Contains(e.Args, "--debug-endpoints") {
		t.Errorf("extender serves /debug/* by default: %v", e.Args)
	}
	if s, keys := secretVolume(t, &ext, e, "/etc/partita/client-ca"); s != clientSecret || !slices.Equal(keys, []string{"ca.crt"}) {
		t.Errorf("extender's client CA from %s %v, want %s [ca.crt]", s, keys, clientSecret)
	}
	ks := container(t, &sched, "kube-scheduler")
	if s, keys := secretVolume(t, &sched, ks, "/etc/partita/scheduler-client"); s != clientSecret || !slices.Equal(keys, []string{"tls.crt", "tls.key"}) {
		t.Errorf("scheduler's client certificate from %s %v, want %s [tls.crt tls.key]", s, keys, clientSecret)
	}
	if s, keys := secretVolume(t, &sched, ks, "/etc/partita/extender-ca"); s != "partita-webhook-cert" || !slices.Equal(keys, []string{"ca.crt"}) {
		t.Errorf("scheduler's extender CA from %s %v, want partita-webhook-cert [ca.crt]", s, keys)
	}
	// The configuration it reads calls the extender's Service with that CA
	// and that certificate.
	var cm corev1.ConfigMap
	if !find(t, manifest, "ConfigMap", "partita-scheduler-config", &cm) {
		t.Fatal("no scheduler ConfigMap")
	}
	for _, want := range []string{
		`urlPrefix: "https://partita-extender.partita-system.svc:443"`,
		`enableHTTPS: true`,
		`caFile: "/etc/partita/extender-ca/ca.crt"`,
		`certFile: "/etc/partita/scheduler-client/tls.crt"`,
		`keyFile: "/etc/partita/scheduler-client/tls.key"`,
	} {
		if !strings.Contains(cm.Data["config.yaml"], want) {
			t.Errorf("scheduler configuration lacks %q:\n%s", want, cm.Data["config.yaml"])
		}
	}
	w := container(t, &wh, "webhook")
	for _, want := range []string{"--client-cert-secret-name=" + clientSecret, "--client-cert-common-name=partita-scheduler"} {
		if !slices.Contains(w.Args, want) {
			t.Errorf("webhook args %v lack %s", w.Args, want)
		}
	}
	if s, keys := secretVolume(t, &wh, w, "/etc/partita/scheduler-client"); s != clientSecret || keys != nil {
		t.Errorf("webhook mounts %s %v at its client-cert dir, want the whole %s", s, keys, clientSecret)
	}
	var secret corev1.Secret
	if !find(t, manifest, "Secret", clientSecret, &secret) {
		t.Errorf("no Secret %s for the webhook to fill", clientSecret)
	}
	var role rbacv1.Role
	if !find(t, manifest, "Role", "partita-webhook", &role) {
		t.Fatal("no webhook Role")
	}
	named := false
	for _, r := range role.Rules {
		named = named || (slices.Contains(r.Resources, "secrets") && slices.Contains(r.ResourceNames, clientSecret) && slices.Contains(r.Verbs, "update"))
	}
	if !named {
		t.Errorf("the webhook's Role does not let it update %s: %+v", clientSecret, role.Rules)
	}

	var np networkingv1.NetworkPolicy
	if !find(t, manifest, "NetworkPolicy", "partita-extender", &np) {
		t.Fatal("no NetworkPolicy for the extender")
	}
	extenderPods := map[string]string{"app.kubernetes.io/name": "partita", "app.kubernetes.io/instance": "partita", "app.kubernetes.io/component": "extender"}
	if diff := cmp.Diff(extenderPods, np.Spec.PodSelector.MatchLabels); diff != "" {
		t.Errorf("NetworkPolicy selects (-extender pods,+got):\n%s", diff)
	}
	// The scheduler Deployment's pods are what the policy admits, and
	// those are the pods its selector matches.
	if diff := cmp.Diff(sched.Spec.Selector.MatchLabels, sched.Spec.Template.Labels); diff != "" {
		t.Errorf("scheduler pods' labels differ from its selector (-selector,+labels):\n%s", diff)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector == nil ||
		np.Spec.Ingress[0].From[0].NamespaceSelector != nil || len(np.Spec.Ingress[0].Ports) != 1 {
		t.Fatalf("NetworkPolicy ingress = %+v, want one peer (the scheduler's pods in the release's namespace) on one port", np.Spec.Ingress)
	}
	if diff := cmp.Diff(sched.Spec.Template.Labels, np.Spec.Ingress[0].From[0].PodSelector.MatchLabels); diff != "" {
		t.Errorf("NetworkPolicy admits (-scheduler pods,+got):\n%s", diff)
	}
	if cmp.Equal(extenderPods, np.Spec.Ingress[0].From[0].PodSelector.MatchLabels) {
		t.Error("NetworkPolicy admits the extender's own pods, which run no scheduler")
	}

	// The cluster's own scheduler: no policy unless told where it is.
	if find(t, render(t, "--set", "scheduler.mode=default"), "NetworkPolicy", "partita-extender", &np) {
		t.Error("scheduler.mode=default without schedulerFrom renders a NetworkPolicy that would cut the scheduler off")
	}

	// cert-manager issues the client certificate instead.
	var cert struct {
		Spec struct {
			SecretName string   `json:"secretName"`
			CommonName string   `json:"commonName"`
			Usages     []string `json:"usages"`
		} `json:"spec"`
	}
	if !find(t, render(t, "--set", "certs.mode=cert-manager"), "Certificate", clientSecret, &cert) {
		t.Fatal("cert-manager mode has no Certificate for the scheduler's client certificate")
	}
	if cert.Spec.SecretName != clientSecret || cert.Spec.CommonName != "partita-scheduler" || !slices.Contains(cert.Spec.Usages, "client auth") {
		t.Errorf("client Certificate = %+v", cert.Spec)
	}
}

// TestChartAgentPolicy: the policy that ties agents to their nodes ships
// by default, for the agent's ServiceAccount only, and lets a token that
// names no node through only with agent.simulatedFleet (partita dev up).
// agentPolicyName is the ValidatingAdmissionPolicy (and binding) that ties
// each agent to its node in the default release.
const (
	agentPolicyName      = "partita-agent-own-node"
	modelCachePolicyName = "partita-model-cache-own-node"
)

func ownNodePolicy(name string) bool { return name == agentPolicyName || name == modelCachePolicyName }

func TestChartAgentPolicy(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"by default":      {want: "variables.node != '' && variables.target == variables.node"},
		"simulated fleet": {args: []string{"--set", "agent.simulatedFleet=true"}, want: "variables.node == '' || variables.target == variables.node"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			manifest := render(t, tc.args...)
			var vap admissionregistrationv1.ValidatingAdmissionPolicy
			var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
			if !find(t, manifest, "ValidatingAdmissionPolicy", "partita-agent-own-node", &vap) ||
				!find(t, manifest, "ValidatingAdmissionPolicyBinding", "partita-agent-own-node", &binding) {
				t.Fatal("no agent policy and binding")
			}
			if len(vap.Spec.Validations) != 1 || vap.Spec.Validations[0].Expression != tc.want {
				t.Errorf("validations = %+v, want the expression %q", vap.Spec.Validations, tc.want)
			}
			if len(vap.Spec.MatchConditions) != 1 || !strings.Contains(vap.Spec.MatchConditions[0].Expression, `"system:serviceaccount:partita-system:partita-agent"`) {
				t.Errorf("match conditions = %+v, want the agent's ServiceAccount alone", vap.Spec.MatchConditions)
			}
			if fp := vap.Spec.FailurePolicy; fp == nil || *fp != admissionregistrationv1.Fail {
				t.Errorf("failurePolicy = %v, want Fail", fp)
			}
			if binding.Spec.PolicyName != vap.Name || !slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
				t.Errorf("binding = %+v, want Deny for %s", binding.Spec, vap.Name)
			}
		})
	}
	if find(t, render(t, "--set", "agent.enabled=false"), "ValidatingAdmissionPolicy", "partita-agent-own-node", &admissionregistrationv1.ValidatingAdmissionPolicy{}) {
		t.Error("the agent policy is rendered without an agent")
	}
}

// TestChartConsoleProxyNeedsItsCA: the console never trusts identity
// headers without the proxy's CA, so the chart refuses the proxy without
// one rather than render a console that would refuse every request.
func TestChartConsoleProxyNeedsItsCA(t *testing.T) {
	bin := helmBinary(t)
	cmd := exec.CommandContext(t.Context(), bin, append([]string{"template", "partita", helm.ChartName, "--kube-version", devcluster.K8sVersion,
		"--set", "console.enabled=true", "--set", "console.authProxy.enabled=true"}, apiServerCA...)...)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "console.authProxy.clientCAConfigMap") {
		t.Errorf("authProxy without its CA: err %v, want a refusal naming clientCAConfigMap:\n%s", err, out)
	}
}

// TestChartWebhookCallers: the webhook answers the API server's client
// certificate only; the chart refuses to install without its CA unless
// told in so many words to answer anyone, and never with both.
func TestChartWebhookCallers(t *testing.T) {
	bin := helmBinary(t)
	caFile := filepath.Join("testdata", "apiserver-client-ca.crt")
	cases := map[string]struct {
		args       []string
		wantErr    string
		wantArgs   []string
		wantNoArgs []string
		wantCA     bool
	}{
		"neither": {wantErr: "webhook.clientAuth.caBundle is empty"},
		"both": {args: []string{"--set-file", "webhook.clientAuth.caBundle=" + caFile, "--set", "webhook.clientAuth.allowUnauthenticated=true"},
			wantErr: "give caBundle or allowUnauthenticated, not both"},
		"the API server's CA": {args: []string{"--set-file", "webhook.clientAuth.caBundle=" + caFile},
			wantArgs:   []string{"--client-ca-file=/etc/partita/apiserver-client/ca.crt", "--client-allowed-names=" + webhook.DefaultClientName},
			wantNoArgs: []string{"--allow-unauthenticated-callers"}, wantCA: true},
		"anyone": {args: []string{"--set", "webhook.clientAuth.allowUnauthenticated=true"},
			wantArgs: []string{"--allow-unauthenticated-callers"}, wantNoArgs: []string{"--client-ca-file=/etc/partita/apiserver-client/ca.crt"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), bin, append([]string{"template", "partita", helm.ChartName, "--namespace", "partita-system",
				"--kube-version", devcluster.K8sVersion}, tc.args...)...)
			out, err := cmd.Output()
			if tc.wantErr != "" {
				var ee *exec.ExitError
				if err == nil || !errors.As(err, &ee) || !strings.Contains(string(ee.Stderr), tc.wantErr) {
					t.Fatalf("err %v, want a refusal saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var wh appsv1.Deployment
			if !find(t, out, "Deployment", "partita-webhook", &wh) {
				t.Fatal("no webhook Deployment")
			}
			args := container(t, &wh, "webhook").Args
			for _, want := range tc.wantArgs {
				if !slices.Contains(args, want) {
					t.Errorf("webhook args %v lack %s", args, want)
				}
			}
			for _, unwanted := range tc.wantNoArgs {
				if slices.Contains(args, unwanted) {
					t.Errorf("webhook args %v have %s", args, unwanted)
				}
			}
			var cm corev1.ConfigMap
			ok := find(t, out, "ConfigMap", "partita-webhook-apiserver-client-ca", &cm)
			if ok != tc.wantCA {
				t.Fatalf("ConfigMap partita-webhook-apiserver-client-ca rendered: %v, want %v", ok, tc.wantCA)
			}
			if want, _ := os.ReadFile(caFile); ok && cm.Data["ca.crt"] != string(want) {
				t.Errorf("its ca.crt = %q, want the file's %q", cm.Data["ca.crt"], want)
			}
		})
	}
}

// workloads is what TestChartIdentities reads of a rendering: each pod
// template's ServiceAccount and containers, the ServiceAccounts, and the
// roles each ServiceAccount is bound to.
type workloads struct {
	podAccounts map[string]string   // workload kind/name -> serviceAccountName
	containers  map[string][]string // workload kind/name -> container names
	accounts    map[string]bool
	bound       map[string][]string // ServiceAccount -> "ClusterRole/x", "Role/ns/x"
}

func decodeWorkloads(t *testing.T, manifest []byte) workloads {
	t.Helper()
	w := workloads{podAccounts: map[string]string{}, containers: map[string][]string{}, accounts: map[string]bool{}, bound: map[string][]string{}}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return w
		}
		if err != nil {
			t.Fatal(err)
		}
		var obj struct {
			Kind     string
			Metadata struct{ Name, Namespace string }
			Spec     struct {
				Template struct {
					Spec corev1.PodSpec
				}
			}
			RoleRef  struct{ Kind, Name string }
			Subjects []struct{ Kind, Name, Namespace string }
		}
		if err := yaml.Unmarshal(doc, &obj); err != nil || obj.Kind == "" {
			continue
		}
		switch obj.Kind {
		case "Deployment", "DaemonSet":
			key := obj.Kind + "/" + obj.Metadata.Name
			w.podAccounts[key] = obj.Spec.Template.Spec.ServiceAccountName
			for _, c := range obj.Spec.Template.Spec.Containers {
				w.containers[key] = append(w.containers[key], c.Name)
			}
		case "ServiceAccount":
			w.accounts[obj.Metadata.Name] = true
		case "ClusterRoleBinding", "RoleBinding":
			role := obj.RoleRef.Kind + "/" + obj.RoleRef.Name
			if obj.Kind == "RoleBinding" {
				role = obj.RoleRef.Kind + "/" + obj.Metadata.Namespace + "/" + obj.RoleRef.Name
			}
			for _, s := range obj.Subjects {
				if s.Kind == "ServiceAccount" {
					w.bound[s.Name] = append(w.bound[s.Name], role)
				}
			}
		}
	}
}

// TestChartIdentities: every pod runs under a ServiceAccount of the
// chart, every ServiceAccount of the chart is some pod's, and
// kube-scheduler runs under the scheduler's own ServiceAccount, which holds
// system:kube-scheduler and may take the scheduler's Lease. (The scheduler
// once ran inside the extender's pod, as the extender, and could never
// become leader.)
func TestChartIdentities(t *testing.T) {
	cases := map[string]struct {
		args          []string
		wantScheduler bool
	}{
		"second scheduler":  {wantScheduler: true},
		"default scheduler": {args: []string{"--set", "scheduler.mode=default"}},
		"no agent":          {args: []string{"--set", "agent.enabled=false"}, wantScheduler: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			w := decodeWorkloads(t, render(t, tc.args...))
			used := map[string]bool{}
			for wl, sa := range w.podAccounts {
				if !w.accounts[sa] {
					t.Errorf("%s runs as ServiceAccount %q, which the chart does not create", wl, sa)
				}
				used[sa] = true
			}
			for sa := range w.accounts {
				if !used[sa] {
					t.Errorf("ServiceAccount %s belongs to no pod (bindings: %v)", sa, w.bound[sa])
				}
			}
			var schedulers []string
			for wl, cs := range w.containers {
				for _, c := range cs {
					if c == "kube-scheduler" {
						schedulers = append(schedulers, wl)
					}
				}
			}
			if !tc.wantScheduler {
				if len(schedulers) > 0 {
					t.Errorf("kube-scheduler runs in %v, want none with scheduler.mode=default", schedulers)
				}
				return
			}
			if diff := cmp.Diff([]string{"Deployment/partita-scheduler"}, schedulers); diff != "" {
				t.Errorf("workloads running kube-scheduler (-want,+got):\n%s", diff)
			}
			if got := w.podAccounts["Deployment/partita-scheduler"]; got != "partita-scheduler" {
				t.Errorf("kube-scheduler runs as %q, want its own ServiceAccount partita-scheduler", got)
			}
			if got := w.containers["Deployment/partita-extender"]; !cmp.Equal(got, []string{"extender"}) {
				t.Errorf("extender pod containers %v, want the extender alone", got)
			}
			for _, role := range []string{"ClusterRole/system:kube-scheduler", "ClusterRole/system:volume-scheduler",
				"Role/kube-system/extension-apiserver-authentication-reader", "Role/partita-system/partita-scheduler"} {
				if !slices.Contains(w.bound["partita-scheduler"], role) {
					t.Errorf("ServiceAccount partita-scheduler is not bound to %s (bound: %v)", role, w.bound["partita-scheduler"])
				}
			}
		})
	}
}

// TestChartRefusesOldKubernetes: before 1.30 scheduling gates are not GA;
// the chart says so instead of installing a webhook that gates pods
// forever.
func TestChartRefusesOldKubernetes(t *testing.T) {
	bin := helmBinary(t)
	for version, wantOK := range map[string]bool{"v1.29.9": false, "v1.30.0": true, devcluster.K8sVersion: true, "v0.0.0-master": true} {
		cmd := exec.CommandContext(t.Context(), bin, append([]string{"template", "partita", helm.ChartName, "--kube-version", version}, apiServerCA...)...)
		out, err := cmd.CombinedOutput()
		switch {
		case wantOK && err != nil:
			t.Errorf("Kubernetes %s refused: %v\n%s", version, err, out)
		case !wantOK && (err == nil || !strings.Contains(string(out), "Partita needs Kubernetes 1.30 or newer (scheduling gates); this cluster runs "+version)):
			t.Errorf("Kubernetes %s: %v, want the chart to refuse it:\n%s", version, err, out)
		}
	}
}

// TestChartDRA: with gpuBackend dra the chart's DeviceClass is the one
// package dra defines, and the agent and webhook run the dra backend.
func TestChartDRA(t *testing.T) {
	out := render(t, "--set", "gpuBackend=dra")
	var dc resourceapi.DeviceClass
	if !find(t, out, "DeviceClass", dra.DeviceClassName, &dc) {
		t.Fatalf("no DeviceClass %s", dra.DeviceClassName)
	}
	if diff := cmp.Diff(dra.DeviceClasses()[0].Spec, dc.Spec); diff != "" {
		t.Errorf("DeviceClass spec (-package dra,+chart):\n%s", diff)
	}
	var ds appsv1.DaemonSet
	if !find(t, out, "DaemonSet", "partita-agent", &ds) {
		t.Fatal("no agent DaemonSet")
	}
	args := strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " ")
	for _, want := range []string{"--gpu-backend=dra", "--kubelet-dir=/var/lib/kubelet", "--cdi-dir=/var/run/cdi"} {
		if !strings.Contains(args, want) {
			t.Errorf("agent args %q lack %s", args, want)
		}
	}
	var d appsv1.Deployment
	if !find(t, out, "Deployment", "partita-webhook", &d) || !slices.Contains(container(t, &d, "webhook").Args, "--gpu-backend=dra") {
		t.Error("the webhook does not run the dra backend")
	}
	if find(t, render(t), "DeviceClass", dra.DeviceClassName, &dc) {
		t.Error("the extender backend renders a DeviceClass")
	}
}
