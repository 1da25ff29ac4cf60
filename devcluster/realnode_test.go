package devcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/helm"
)

func testCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	def := DefaultOptions()
	if opts.WorkDir == "" {
		opts.WorkDir = t.TempDir()
	}
	if opts.GPUModel == "" {
		opts.GPUModel = def.GPUModel
	}
	opts.BinDir = def.BinDir
	c, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNewMode(t *testing.T) {
	cases := map[string]struct {
		opts    Options
		wantErr string
	}{
		"default is host":           {opts: Options{}},
		"chart with a real node":    {opts: Options{Mode: ModeChart, RealNode: true}},
		"chart without a real node": {opts: Options{Mode: ModeChart}, wantErr: "--mode chart runs the chart's containers, which need a real node: add --real-node"},
		"unknown mode":              {opts: Options{Mode: "pods"}, wantErr: `--mode "pods": use host`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.opts.GPUModel = "H100-80GB"
			_, err := New(tc.opts)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("New: %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestSettingsAreKept: where Partita runs and the real node are fixed
// when the cluster is created; up refuses to change them with a way out.
func TestSettingsAreKept(t *testing.T) {
	c := testCluster(t, Options{Name: "kept", RealNode: true, Mode: ModeChart})
	if _, ok := c.SavedSettings(); ok {
		t.Fatal("settings before the first up")
	}
	if err := c.saveSettings(); err != nil {
		t.Fatal(err)
	}
	got, ok := c.SavedSettings()
	if diff := cmp.Diff(Settings{RealNode: true, Mode: ModeChart, GPUBackend: dra.BackendExtender, ExtenderReplicas: 1}, got); !ok || diff != "" {
		t.Errorf("saved settings (-want,+got):\n%s", diff)
	}
	cases := map[string]struct {
		saved, asked Options
		wantErr      string
	}{
		"same":         {saved: Options{RealNode: true, Mode: ModeChart}, asked: Options{RealNode: true, Mode: ModeChart}},
		"add a node":   {saved: Options{Mode: ModeHost}, asked: Options{RealNode: true, Mode: ModeHost}},
		"other mode":   {saved: Options{RealNode: true, Mode: ModeChart}, asked: Options{RealNode: true, Mode: ModeHost}, wantErr: `runs Partita in mode chart, not host: the mode is chosen when a cluster is created; run 'partita dev down --name kept' first`},
		"no real node": {saved: Options{RealNode: true, Mode: ModeHost}, asked: Options{Mode: ModeHost}, wantErr: "has a real node (real-node-0); it stays until 'partita dev down --name kept'"},
		"other backend": {saved: Options{Mode: ModeHost}, asked: Options{Mode: ModeHost, GPUBackend: dra.BackendDRA},
			wantErr: "runs the extender GPU backend, not dra: the backend is chosen when a cluster is created"},
		"same backend": {saved: Options{Mode: ModeHost, GPUBackend: dra.BackendDRA}, asked: Options{Mode: ModeHost, GPUBackend: dra.BackendDRA}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			work := t.TempDir()
			tc.saved.Name, tc.saved.WorkDir = "kept", work
			saved := testCluster(t, tc.saved)
			if err := saved.saveSettings(); err != nil {
				t.Fatal(err)
			}
			// checkSettings looks only at clusters that exist.
			if err := os.MkdirAll(saved.Dir(), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(saved.Dir(), "kwok.yaml"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			tc.asked.Name, tc.asked.WorkDir = "kept", work
			err := testCluster(t, tc.asked).checkSettings()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("checkSettings: %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestKwokctlConfig(t *testing.T) {
	c := testCluster(t, Options{Name: "cfg"})
	var cfg struct {
		APIVersion string `json:"apiVersion"`
		Kind       string
		Options    struct {
			KubeApiserverCertSANs []string `json:"kubeApiserverCertSANs"`
		}
		ComponentsPatches []struct {
			Name      string
			ExtraArgs []struct {
				Key, Value string
				Override   bool
			} `json:"extraArgs"`
		} `json:"componentsPatches"`
	}
	if err := yaml.UnmarshalStrict([]byte(c.kwokctlConfig()), &cfg); err != nil {
		t.Fatalf("%v\n%s", err, c.kwokctlConfig())
	}
	args := map[string]string{}
	for _, p := range cfg.ComponentsPatches {
		for _, a := range p.ExtraArgs {
			args[p.Name+" --"+a.Key] = a.Value
		}
	}
	pki := filepath.Join(c.Dir(), "pki")
	want := map[string]string{
		"kwok-controller --manage-all-nodes":                      "false",
		"kwok-controller --manage-nodes-with-annotation-selector": "kwok.x-k8s.io/node=fake",
		"kube-apiserver --kubelet-client-certificate":             filepath.Join(pki, "admin.crt"),
		"kube-apiserver --kubelet-client-key":                     filepath.Join(pki, "admin.key"),
		"kube-apiserver --kubelet-preferred-address-types":        "InternalIP,Hostname",
		"kube-apiserver --service-cluster-ip-range":               realnode.ServiceCIDR,
		"kube-apiserver --enable-admission-plugins":               "NodeRestriction",
		"kube-apiserver --requestheader-client-ca-file":           filepath.Join(pki, "ca.crt"),
		"kube-apiserver --requestheader-allowed-names":            "kwok-admin",
		"kube-apiserver --requestheader-username-headers":         "X-Remote-User",
		"kube-apiserver --requestheader-group-headers":            "X-Remote-Group",
		"kube-apiserver --requestheader-extra-headers-prefix":     "X-Remote-Extra-",
		"kube-apiserver --admission-control-config-file":          c.admissionConfigFile(),
	}
	if diff := cmp.Diff(want, args); diff != "" {
		t.Errorf("component arguments (-want,+got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{realnode.APIServiceIP}, cfg.Options.KubeApiserverCertSANs); diff != "" {
		t.Errorf("API server SANs (-want,+got):\n%s", diff)
	}
	// Simulated nodes carry the annotation kwok is told to manage.
	if SimulatedGPUNode(0, 1, GPUModels["T4"]).Annotations[kwokNodeAnnotation] != "fake" {
		t.Error("simulated nodes lack the annotation kwok manages")
	}
}

// TestChartValues renders the chart with the dev cluster's values: every
// workload lands on the real node, runs the local image, and the agent
// simulates the real node's GPUs.
func TestChartValues(t *testing.T) {
	c := testCluster(t, Options{Name: "vals", RealNode: true, Mode: ModeChart, GPUsPerNode: 4, GPUModel: "A100-40GB"})
	bin := filepath.Join(c.BinDir(), "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no helm at %s (make cluster-bins)", bin)
	}
	// The API server's webhook client CA, as dev up writes it before the
	// cluster starts.
	if err := c.writeWebhookClientAuth(); err != nil {
		t.Fatal(err)
	}
	values, err := yaml.Marshal(c.ChartValues())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, values, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	out, err := helm.Template(ctx, helm.TemplateOptions{Helm: bin, Release: ChartRelease, Namespace: PartitaNamespace, KubeVersion: K8sVersion, Args: []string{"--values", path}})
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	seen := map[string]bool{}
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var obj struct {
			Kind     string
			Metadata struct{ Name string }
			Spec     struct{ Template struct{ Spec corev1.PodSpec } }
		}
		if err := yaml.Unmarshal(doc, &obj); err != nil || (obj.Kind != "Deployment" && obj.Kind != "DaemonSet") {
			continue
		}
		seen[obj.Metadata.Name] = true
		spec := obj.Spec.Template.Spec
		if spec.NodeSelector["kubernetes.io/hostname"] != realnode.NodeName {
			t.Errorf("%s %s: nodeSelector %v, want the real node", obj.Kind, obj.Metadata.Name, spec.NodeSelector)
		}
		for _, ctr := range spec.Containers {
			wantImage := realnode.ImagePartita.Ref
			if ctr.Name == "kube-scheduler" {
				wantImage = realnode.ImageKubeScheduler.Ref
			}
			if ctr.Image != wantImage {
				t.Errorf("%s container %s: image %s, want %s (loaded into the real node)", obj.Metadata.Name, ctr.Name, ctr.Image, wantImage)
			}
			if obj.Metadata.Name == "partita-agent" && !strings.Contains(strings.Join(ctr.Args, " "), "--simulate=4xA100-40GB") {
				t.Errorf("agent args %v, want --simulate=4xA100-40GB", ctr.Args)
			}
		}
		if spec.RuntimeClassName != nil {
			t.Errorf("%s: runtimeClassName %s; the real node has no NVIDIA runtime", obj.Metadata.Name, *spec.RuntimeClassName)
		}
		if obj.Metadata.Name == "partita-interposer" {
			var got []string
			for _, v := range spec.Volumes {
				switch {
				case v.Image != nil:
					got = append(got, "image "+v.Image.Reference)
				case v.HostPath != nil:
					got = append(got, "hostPath "+v.HostPath.Path)
				}
			}
			want := []string{"image " + realnode.ImageInterposerTest.Ref, "hostPath " + c.RealNode().InterposerDir()}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the interposer's volumes (-want,+got):\n%s", diff)
			}
		}
	}
	want := map[string]bool{"partita-webhook": true, "partita-extender": true, "partita-scheduler": true, "partita-agent": true, "partita-interposer": true, "partita-model-cache": true}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("workloads (-want,+got):\n%s", diff)
	}
}
