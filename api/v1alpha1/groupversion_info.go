// Package v1alpha1 holds Partita's API types (group partita.dev, version
// v1alpha1): Queue, PodGroup, GPUNode, Topology and Model, plus the annotation, label and
// resource names that form the contract between the webhook, the extender and
// the node agent. It imports only Kubernetes API machinery.
//
// +kubebuilder:object:generate=true
// +groupName=partita.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of Partita's API.
var GroupVersion = schema.GroupVersion{Group: "partita.dev", Version: "v1alpha1"}

// AddToScheme adds the types of this package to a scheme. The API package
// depends on apimachinery alone, so every part can import it cheaply.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&Queue{}, &QueueList{},
		&PodGroup{}, &PodGroupList{},
		&GPUNode{}, &GPUNodeList{},
		&Topology{}, &TopologyList{},
		&Model{}, &ModelList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
