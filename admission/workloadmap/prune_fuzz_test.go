package workloadmap

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// FuzzPruneTransform: the owner objects the informers hand the transform
// are written by tenants (a JobSet, a RayCluster of any shape the CRD's
// schema lets through, or none): pruning any of them returns an object or
// an error, never a panic.
func FuzzPruneTransform(f *testing.F) {
	for _, seed := range []string{
		`{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "a", "namespace": "t"}, "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}}]}}`,
		`{"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"}, "spec": {"workerGroupSpecs": [{"minReplicas": 2, "maxReplicas": 6, "template": {"spec": {"containers": "not a list"}}}]}}`,
		`{"apiVersion": "v1", "kind": "X", "metadata": {"annotations": {"partita.dev/queue": "q"}}, "spec": {"template": null, "templates": [1, "a", {"spec": 3}]}}`,
		`{"apiVersion": "v1", "kind": "X", "spec": [1, 2]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		u := &unstructured.Unstructured{}
		if u.UnmarshalJSON(b) != nil {
			return
		}
		out, err := pruneTransform(u)
		if err == nil && out == nil {
			t.Errorf("pruneTransform(%s) = nil, nil", b)
		}
	})
}
