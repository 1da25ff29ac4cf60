// Package helm holds Partita's Helm chart (helm/partita) embedded in the
// binary, and renders it with a helm binary. `partita dev up` renders the
// chart's RBAC from here, so the dev cluster's processes run with exactly
// the chart's permissions. It imports nothing else of Partita's.
//
// It runs the helm binary (built into the cluster binaries' cache by `make
// cluster-bins`) rather than Helm's Go SDK: the SDK would pull Helm's large
// dependency tree (OCI registries, containerd, Kubernetes' kubectl
// libraries) into the one binary that also runs in production, for the sake
// of a development command.
package helm

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ChartName is the chart's directory under helm/.
const ChartName = "partita"

//go:embed all:partita
var chartFS embed.FS

// Chart is the chart's files, rooted at the chart's directory.
func Chart() fs.FS {
	sub, err := fs.Sub(chartFS, ChartName)
	if err != nil {
		panic(err) // the embedded directory is there at build time
	}
	return sub
}

// WriteChart writes the embedded chart into dir/partita and returns that path.
func WriteChart(dir string) (string, error) {
	root := filepath.Join(dir, ChartName)
	err := fs.WalkDir(Chart(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(root, filepath.FromSlash(path))
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := fs.ReadFile(Chart(), path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
	if err != nil {
		return "", fmt.Errorf("write chart to %s: %w", root, err)
	}
	return root, nil
}

// TemplateOptions say how to render the chart.
type TemplateOptions struct {
	// Helm is the helm binary.
	Helm string
	// ChartDir is the chart on disk; empty writes the embedded chart to a
	// temporary directory.
	ChartDir string
	// Release and Namespace are the release's name and namespace.
	Release, Namespace string
	// KubeVersion is the Kubernetes version the chart is rendered for
	// (helm's own default is too old for the chart's kubeVersion).
	KubeVersion string
	// Args are further helm template arguments: --set, --show-only, -f.
	Args []string
}

// Template runs `helm template` and returns the rendered manifests.
func Template(ctx context.Context, o TemplateOptions) ([]byte, error) {
	dir := o.ChartDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "partita-chart-")
		if err != nil {
			return nil, fmt.Errorf("create temporary chart directory: %w", err)
		}
		defer func() { _ = os.RemoveAll(tmp) }()
		if dir, err = WriteChart(tmp); err != nil {
			return nil, err
		}
	}
	args := append([]string{"template", o.Release, dir, "--namespace", o.Namespace, "--kube-version", o.KubeVersion}, o.Args...)
	cmd := exec.CommandContext(ctx, o.Helm, args...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out.Bytes(), nil
}
