package devcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/dra"
)

// Mode says where Partita's own components run in the dev cluster.
type Mode string

const (
	// ModeHost runs the agent, the webhook and the extender as processes
	// on the host (the default).
	ModeHost Mode = "host"
	// ModeChart installs Partita's Helm chart (release ChartRelease in
	// PartitaNamespace, as docs/install.md does) on the real node.
	ModeChart Mode = "chart"
)

// Settings are what a cluster was created with and keeps: `up` without
// --real-node or --mode keeps them.
type Settings struct {
	RealNode   bool        `json:"realNode"`
	Mode       Mode        `json:"mode"`
	GPUBackend dra.Backend `json:"gpuBackend,omitempty"`
	// ExtenderReplicas is how many extender replicas run on the host
	// (mode host); up without --extender-replicas keeps it.
	ExtenderReplicas int `json:"extenderReplicas,omitempty"`
}

func (c *Cluster) settingsPath() string { return filepath.Join(c.stateDir(), "settings.json") }

// SavedSettings returns the settings the cluster was brought up with; ok is
// false for a cluster that was never brought up (or predates them).
func (c *Cluster) SavedSettings() (s Settings, ok bool) {
	b, err := os.ReadFile(c.settingsPath())
	if err != nil || json.Unmarshal(b, &s) != nil {
		return Settings{Mode: ModeHost, GPUBackend: dra.BackendExtender, ExtenderReplicas: 1}, false
	}
	if s.ExtenderReplicas < 1 {
		s.ExtenderReplicas = 1
	}
	if s.Mode == "" {
		s.Mode = ModeHost
	}
	if s.GPUBackend == "" {
		s.GPUBackend = dra.BackendExtender
	}
	return s, true
}

func (c *Cluster) saveSettings() error {
	if err := os.MkdirAll(c.stateDir(), 0o755); err != nil {
		return err
	}
	b, err := json.Marshal(Settings{RealNode: c.opts.RealNode, Mode: c.opts.Mode, GPUBackend: c.Backend(), ExtenderReplicas: c.opts.ExtenderReplicas})
	if err != nil {
		return err
	}
	return os.WriteFile(c.settingsPath(), b, 0o644)
}

// checkSettings refuses a change the running cluster cannot make: where
// Partita runs is fixed when the cluster is created (the control plane's
// kube-scheduler is configured for it), and a real node stays until down.
func (c *Cluster) checkSettings() error {
	saved, ok := c.SavedSettings()
	if !ok || !c.exists() {
		return nil
	}
	if saved.Mode != c.opts.Mode {
		return fmt.Errorf("cluster %q runs Partita in mode %s, not %s: the mode is chosen when a cluster is created; run 'partita dev down --name %s' first",
			c.opts.Name, saved.Mode, c.opts.Mode, c.opts.Name)
	}
	if saved.GPUBackend != c.Backend() {
		return fmt.Errorf("cluster %q runs the %s GPU backend, not %s: the backend is chosen when a cluster is created; run 'partita dev down --name %s' first (docs/design.md says how a real cluster migrates without evicting work)",
			c.opts.Name, saved.GPUBackend, c.Backend(), c.opts.Name)
	}
	if saved.RealNode && !c.opts.RealNode {
		return fmt.Errorf("cluster %q has a real node (%s); it stays until 'partita dev down --name %s'", c.opts.Name, realnode.NodeName, c.opts.Name)
	}
	return nil
}

// realNodeDir is the real node's directory (configuration, containerd's
// and kubelet's state), beside the cluster's other state.
func (c *Cluster) realNodeDir() string { return filepath.Join(c.stateDir(), "real-node") }

// RealNode returns the cluster's real node (which may not run).
func (c *Cluster) RealNode() *realnode.Node {
	pki := filepath.Join(c.Dir(), "pki")
	server := ""
	if kc, err := clientcmd.LoadFromFile(c.KubeconfigPath()); err == nil {
		if ctx, ok := kc.Contexts[kc.CurrentContext]; ok {
			if cl, ok := kc.Clusters[ctx.Cluster]; ok {
				server = cl.Server
			}
		}
	}
	model := GPUModels[c.opts.GPUModel]
	return realnode.New(realnode.Config{
		Cluster: c.opts.Name, Dir: c.realNodeDir(), LogsDir: c.LogsDir(), BinDir: c.opts.BinDir, ImagesDir: c.opts.ImagesDir,
		Server: server, CACert: filepath.Join(pki, "ca.crt"), CAKey: filepath.Join(pki, "ca.key"),
		// A GPU node like the simulated ones, with GPU Feature
		// Discovery's labels: the agent (the host's in mode host, the
		// chart's with agent.simulate in mode chart) simulates its GPUs.
		Labels: map[string]string{
			v1alpha1.LabelGPUNode:          "true",
			v1alpha1.LabelNVIDIAGPUCount:   strconv.Itoa(c.opts.GPUsPerNode),
			v1alpha1.LabelNVIDIAGPUProduct: model.Product,
			v1alpha1.LabelNVIDIAGPUMemory:  strconv.FormatInt(model.MemoryMiB, 10),
		},
		Apply: func(ctx context.Context, manifest []byte) error {
			cfg, err := c.RESTConfig()
			if err != nil {
				return err
			}
			return Apply(ctx, cfg, manifest)
		},
		Out: c.opts.Out,
	})
}

// kwokctlConfig is the configuration every cluster is created with, so
// that a real node can join it: kwok manages only the nodes it is meant to
// (kwokctl's binary runtime would have it take over every node, the real
// one too), and the API server reaches kubelets (client certificate,
// InternalIP first), serves the kubernetes Service's IP to pods, and
// publishes the front proxy's CA as kubeadm's clusters do (in-cluster
// servers such as the chart's kube-scheduler read it from
// kube-system/extension-apiserver-authentication).
func (c *Cluster) kwokctlConfig() string {
	pki := filepath.Join(c.Dir(), "pki")
	return `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  kubeApiserverCertSANs: ["` + realnode.APIServiceIP + `"]
componentsPatches:
- name: kwok-controller
  extraArgs:
  - {key: manage-all-nodes, value: "false", override: true}
  - {key: manage-nodes-with-annotation-selector, value: "` + kwokNodeAnnotation + `=fake"}
- name: kube-apiserver
  extraArgs:
  - {key: kubelet-client-certificate, value: "` + filepath.Join(pki, "admin.crt") + `"}
  - {key: kubelet-client-key, value: "` + filepath.Join(pki, "admin.key") + `"}
  - {key: kubelet-preferred-address-types, value: "InternalIP,Hostname"}
  - {key: service-cluster-ip-range, value: "` + realnode.ServiceCIDR + `"}
  - {key: enable-admission-plugins, value: NodeRestriction}
  - {key: requestheader-client-ca-file, value: "` + filepath.Join(pki, "ca.crt") + `"}
  - {key: requestheader-allowed-names, value: kwok-admin}
  - {key: requestheader-username-headers, value: X-Remote-User}
  - {key: requestheader-group-headers, value: X-Remote-Group}
  - {key: requestheader-extra-headers-prefix, value: X-Remote-Extra-}
  - {key: admission-control-config-file, value: "` + c.admissionConfigFile() + `"}
`
}

func (c *Cluster) writeKwokctlConfig() (string, error) {
	if strings.ContainsAny(c.Dir(), "\"\\\n") {
		return "", fmt.Errorf("work directory %q: no quotes, backslashes or newlines", c.opts.WorkDir)
	}
	if err := os.MkdirAll(c.stateDir(), 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", c.stateDir(), err)
	}
	if err := c.writeWebhookClientAuth(); err != nil {
		return "", err
	}
	path := filepath.Join(c.stateDir(), "kwokctl.yaml")
	if err := os.WriteFile(path, []byte(c.kwokctlConfig()), 0o644); err != nil {
		return "", fmt.Errorf("write kwokctl configuration: %w", err)
	}
	return path, nil
}

// supportsRealNode reports whether the cluster was created with
// kwokctlConfig (clusters of older partita versions were not).
func (c *Cluster) supportsRealNode() bool {
	b, err := os.ReadFile(filepath.Join(c.Dir(), "kwok.yaml"))
	return err == nil && strings.Contains(string(b), "manage-nodes-with-annotation-selector")
}

// upRealNode brings the real node up (or repairs it).
func (c *Cluster) upRealNode(ctx context.Context) error {
	if !c.supportsRealNode() {
		return fmt.Errorf("cluster %q was created without real-node support (an older partita): run 'partita dev down --name %s', then 'partita dev up --name %s --real-node'",
			c.opts.Name, c.opts.Name, c.opts.Name)
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	return c.RealNode().Up(ctx, cs)
}

// downRealNode stops the real node and restores the host; it does nothing
// for a cluster without one.
func (c *Cluster) downRealNode(ctx context.Context) error {
	if err := c.RealNode().Down(ctx); err != nil {
		if left := realnode.MountsUnder(c.realNodeDir()); len(left) > 0 {
			// Never remove a directory with something still mounted in it.
			return fmt.Errorf("%w\nthe cluster's files are kept while %d mounts remain under %s; run 'partita dev down --name %s' again",
				err, len(left), c.realNodeDir(), c.opts.Name)
		}
		return err
	}
	return nil
}
