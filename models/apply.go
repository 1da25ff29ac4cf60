package models

import (
	"context"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// ApplyStatus server-side applies status (the fields the manager owns) to
// the Model key's status. Each writer of a Model's status (a node's cache,
// the leader's summary, a prefetch request) is a field manager of its own,
// so that none removes another's fields; force takes over fields another
// manager set.
func ApplyStatus(ctx context.Context, c client.Client, key types.NamespacedName, manager string, status map[string]any, force bool) error {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       "Model",
		"metadata":   map[string]any{"name": key.Name, "namespace": key.Namespace},
		"status":     status,
	}}
	opts := []client.SubResourcePatchOption{client.FieldOwner(manager)}
	if force {
		opts = append(opts, client.ForceOwnership)
	}
	//nolint:staticcheck // client.Apply with an unstructured object: Partita's API has no generated apply configurations.
	return c.Status().Patch(ctx, u, client.Apply, opts...)
}
