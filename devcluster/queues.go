package devcluster

import (
	"context"
	"fmt"
	"path/filepath"

	"k8s.io/client-go/rest"

	"github.com/partita-dev/partita/helm"
)

// DefaultQueueManifest renders the chart's default Queue (where GPU pods go
// that name no queue) with the cached helm binary, so that the dev cluster
// has the same object a chart install creates.
func (c *Cluster) DefaultQueueManifest(ctx context.Context) ([]byte, error) {
	return helm.Template(ctx, helm.TemplateOptions{
		Helm: filepath.Join(c.opts.BinDir, "helm"), Release: ChartRelease, Namespace: PartitaNamespace,
		KubeVersion: K8sVersion, Args: []string{"--show-only", "templates/default-queue.yaml",
			// Only the Queue is kept; the chart renders nothing without
			// a webhook client setting.
			"--set", ShowOnlyClientAuth},
	})
}

// ShowOnlyClientAuth (a --set value) satisfies the chart's required webhook client setting
// in renders that keep objects other than the webhook's (--show-only).
const ShowOnlyClientAuth = "webhook.clientAuth.allowUnauthenticated=true"

// ensureDefaultQueue creates (or restores) the chart's default Queue.
func (c *Cluster) ensureDefaultQueue(ctx context.Context, cfg *rest.Config) error {
	manifest, err := c.DefaultQueueManifest(ctx)
	if err != nil {
		return fmt.Errorf("render the chart's default queue: %w", err)
	}
	if err := Apply(ctx, cfg, manifest); err != nil {
		return fmt.Errorf("create the default queue: %w", err)
	}
	return nil
}
