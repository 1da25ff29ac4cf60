package devcluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/helm"
)

// ChartValues are the values `partita dev up --mode chart` installs the
// chart with over its defaults (docs/real-node.md lists them): the locally
// built image, every component on the real node (the kwok nodes run no
// containers), the agent simulating the real node's GPUs, the hami-core
// interposer from the preload test image, and the host processes' log
// levels and short eviction shelter.
func (c *Cluster) ChartValues() map[string]any {
	onNode := map[string]any{"kubernetes.io/hostname": realnode.NodeName}
	repo, tag, _ := strings.Cut(realnode.ImagePartita.Ref, ":")
	agent := map[string]any{
		"simulate":     fmt.Sprintf("%dx%s", c.opts.GPUsPerNode, c.opts.GPUModel),
		"nodeSelector": map[string]any{"partita.dev/gpu-node": "true", "kubernetes.io/hostname": realnode.NodeName},
		"logLevel":     2,
		// The host's agent of the simulated nodes writes them with a
		// token bound to no node; the chart's agent pod, whose token
		// names real-node-0, still writes only that node.
		"simulatedFleet": true,
	}
	n := c.RealNode()
	// hami-core: the project's preload test library stands in for
	// HAMi-core (no HAMi image, no GPU), installed under the node's
	// directory.
	agent["interposer"] = map[string]any{
		"enabled":     true,
		"image":       realnode.ImageInterposerTest.Ref,
		"libraryPath": realnode.InterposerTestLibrary,
		"hostDir":     n.InterposerDir(),
	}
	if c.DRA() {
		// The real node's kubelet and containerd keep their directories
		// under the cluster's (dev down removes them).
		agent["kubeletDir"] = n.KubeletRootDir()
		agent["cdiDir"] = n.CDIDir()
	} else {
		// The agent is the real node's NRI plugin, on containerd's socket
		// under the node's directory; on: a node that lost NRI fails loudly.
		agent["nri"] = map[string]any{"enabled": "on", "socket": n.NRISocket()}
	}
	// The model cache on the real node, under the node's directory (dev
	// down removes it), reading file:// Models from ModelFilesDir.
	modelCache := map[string]any{
		"nodeSelector": onNode,
		"kubeletDir":   n.KubeletRootDir(),
		"cacheDir":     filepath.Join(n.ModelCacheDir(), "cache"),
		"stateDir":     filepath.Join(n.ModelCacheDir(), "state"),
		"fileRoots":    []string{n.ModelFilesDir()},
		"cacheSize":    "2Gi",
		"logLevel":     2,
	}
	return map[string]any{
		"gpuBackend": string(c.Backend()),
		"modelCache": modelCache,
		"image":      map[string]any{"repository": repo, "tag": tag, "pullPolicy": "IfNotPresent"},
		"webhook": map[string]any{"nodeSelector": onNode, "logLevel": 2,
			// The API server's client certificate (writeWebhookClientAuth).
			"clientAuth": map[string]any{"caBundle": c.webhookClientCA(), "allowedNames": []string{WebhookClientName}}},
		"extender": map[string]any{"nodeSelector": onNode, "logLevel": 2,
			"admission": map[string]any{"preemptMinRuntime": "5s"}},
		"scheduler": map[string]any{"nodeSelector": onNode},
		"agent":     agent,
	}
}

// ChartDir is where the embedded chart is written for helm.
func (c *Cluster) ChartDir() string { return filepath.Join(c.stateDir(), "chart", helm.ChartName) }

// ChartValuesFile is the values file of ChartValues.
func (c *Cluster) ChartValuesFile() string { return filepath.Join(c.stateDir(), "chart-values.yaml") }

// installChart installs or upgrades the release as a user would (helm
// upgrade --install --wait) from the chart this binary embeds.
func (c *Cluster) installChart(ctx context.Context) error {
	if c.opts.GPUsPerNode < 1 {
		return fmt.Errorf("--mode chart: the real node's agent simulates --gpus-per-node GPUs; give at least 1")
	}
	if err := os.RemoveAll(filepath.Dir(c.ChartDir())); err != nil {
		return err
	}
	if _, err := helm.WriteChart(filepath.Dir(c.ChartDir())); err != nil {
		return err
	}
	values, err := yaml.Marshal(c.ChartValues())
	if err != nil {
		return err
	}
	if err := os.WriteFile(c.ChartValuesFile(), values, 0o644); err != nil {
		return fmt.Errorf("write chart values: %w", err)
	}
	start := time.Now()
	c.printf("Installing the chart (release %s in %s) on %s", ChartRelease, PartitaNamespace, realnode.NodeName)
	args := []string{"upgrade", "--install", ChartRelease, c.ChartDir(), "--namespace", PartitaNamespace, "--create-namespace",
		"--values", c.ChartValuesFile(), "--wait", "--timeout", "5m"}
	for _, kv := range c.opts.ChartSet {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("--set %q: want key=value, as helm's --set", kv)
		}
		args = append(args, "--set", kv)
	}
	out, err := c.Helm(ctx, args...)
	if err != nil {
		cs, cerr := c.Clientset()
		detail := ""
		if cerr == nil {
			detail = DescribePods(context.WithoutCancel(ctx), cs, PartitaNamespace, "app.kubernetes.io/instance="+ChartRelease)
		}
		return fmt.Errorf("install the chart: %w\n%s\n%s", err, lastLines(out, 20), detail)
	}
	c.printf("Chart installed in %.1fs", time.Since(start).Seconds())
	return nil
}

// Helm runs the cached helm with the cluster's admin kubeconfig.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	args = append([]string{"--kubeconfig", c.KubeconfigPath()}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(c.opts.BinDir, "helm"), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("helm %s: %w", strings.Join(args, " "), err)
	}
	return out.String(), nil
}
