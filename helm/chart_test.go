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
	configMaps map[string]corev1.ConfigMap
	mutating   []admissionregistrationv1.MutatingWebhookConfiguration
	validating []admissionregistrationv1.ValidatingWebhookConfiguration
	kinds      map[string]int
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

// TestChartWebhookConfigurations: the chart's webhook configurations are
// those the webhook package generates (docs/operations.md), bar labels,
// annotations and the CA that cert-controller or cert-manager injects.
func TestChartWebhookConfigurations(t *testing.T) {
	objs := decode(t, render(t, "--set", "webhook.excludeNamespaces={monitoring}"))
	if len(objs.mutating) != 1 || len(objs.validating) != 1 {
		t.Fatalf("got %d mutating and %d validating configurations, want 1 each", len(objs.mutating), len(objs.validating))
	}
	port := int32(443)
	o := webhook.ConfigurationOptions{Name: "partita", Namespace: "partita-system", ExcludedNamespaces: []string{"monitoring"},
		Service: &admissionregistrationv1.ServiceReference{Name: "partita-webhook", Namespace: "partita-system", Port: &port}}
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
		cmd := exec.CommandContext(t.Context(), bin, "template", "partita", helm.ChartName, "--kube-version", version)
		out, err := cmd.CombinedOutput()
		switch {
		case wantOK && err != nil:
			t.Errorf("Kubernetes %s refused: %v\n%s", version, err, out)
		case !wantOK && (err == nil || !strings.Contains(string(out), "Partita needs Kubernetes 1.30 or newer (scheduling gates); this cluster runs "+version)):
			t.Errorf("Kubernetes %s: %v, want the chart to refuse it:\n%s", version, err, out)
		}
	}
}
