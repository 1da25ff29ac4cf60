package dra

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// Served reports whether the API server cfg reaches serves every one of
// resources of resource.k8s.io/v1 (Kubernetes 1.34+): a cluster without
// them has no other DRA driver to make room for and no claims to read, and
// an informer of a resource that is not served never syncs.
func Served(cfg *rest.Config, resources ...string) (bool, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, fmt.Errorf("create discovery client: %w", err)
	}
	list, err := dc.ServerResourcesForGroupVersion(resourceapi.SchemeGroupVersion.String())
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("discover %s: %w", resourceapi.SchemeGroupVersion, err)
	}
	for _, r := range resources {
		if !slices.ContainsFunc(list.APIResources, func(a metav1.APIResource) bool { return a.Name == r }) {
			return false, nil
		}
	}
	return true, nil
}
