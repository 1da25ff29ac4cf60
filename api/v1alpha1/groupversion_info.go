// Package v1alpha1 holds Partita's API types (group partita.dev, version
// v1alpha1): Queue, PodGroup and GPUNode, plus the annotation, label and
// resource names that form the contract between the webhook, the extender and
// the node agent. It imports only Kubernetes API machinery.
//
// +kubebuilder:object:generate=true
// +groupName=partita.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of Partita's API.
	GroupVersion = schema.GroupVersion{Group: "partita.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types of this package with a runtime scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
