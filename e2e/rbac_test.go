package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/partita-dev/partita/devcluster"
)

// access is one request a component makes, or must not be able to make.
type access struct {
	verb, group, resource, subresource, namespace, name string
}

func (a access) String() string {
	r := a.resource
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.group != "" {
		r += "." + a.group
	}
	where := "cluster-wide"
	if a.namespace != "" {
		where = "in " + a.namespace
	}
	if a.name != "" {
		r += " " + a.name
	}
	return fmt.Sprintf("%s %s %s", a.verb, r, where)
}

// allowed asks the API server (SubjectAccessReview) whether the chart's
// ServiceAccount sa may do a.
func allowed(ctx context.Context, t *testing.T, sa string, a access) bool {
	t.Helper()
	ns := devcluster.PartitaNamespace
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   "system:serviceaccount:" + ns + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: a.verb, Group: a.group, Resource: a.resource,
			Subresource: a.subresource, Namespace: a.namespace, Name: a.name},
	}}
	got, err := clientset.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview for %s: %v", sa, err)
	}
	return got.Status.Allowed
}

// TestComponentPermissions checks the chart's RBAC, which the dev cluster's
// processes run with (partita dev up applies it and gives each process its
// ServiceAccount's token): each component may do what its code does, and
// nothing on a sample of what it must not, Secrets above all.
func TestComponentPermissions(t *testing.T) {
	ctx := testContext(t, time.Minute)
	const ns = devcluster.PartitaNamespace
	const cert = "partita-webhook-cert"
	// kube-scheduler's client certificate for the extender: whoever reads
	// it may call the extender's verbs.
	const clientCert = "partita-scheduler-client-cert"
	// Nobody reads Secrets it does not own, nor touches the cluster's
	// workloads or RBAC.
	forbiddenToAll := []access{
		{verb: "get", resource: "secrets", namespace: "kube-system"},
		{verb: "list", resource: "secrets", namespace: "kube-system"},
		{verb: "list", resource: "secrets"},
		{verb: "list", resource: "secrets", namespace: ns},
		{verb: "get", resource: "secrets", namespace: ns, name: "sh.helm.release.v1.partita.v1"},
		{verb: "create", resource: "secrets", namespace: ns},
		{verb: "delete", resource: "pods", namespace: "default"},
		{verb: "create", resource: "pods", namespace: "kube-system"},
		{verb: "delete", resource: "nodes"},
		{verb: "create", group: "rbac.authorization.k8s.io", resource: "clusterrolebindings"},
		{verb: "escalate", group: "rbac.authorization.k8s.io", resource: "clusterroles"},
		{verb: "create", group: "apps", resource: "deployments", namespace: "default"},
		{verb: "delete", group: "apiextensions.k8s.io", resource: "customresourcedefinitions"},
		{verb: "create", resource: "serviceaccounts", subresource: "token", namespace: ns, name: "partita-extender"},
		{verb: "impersonate", resource: "serviceaccounts", namespace: ns},
		{verb: "delete", group: "partita.dev", resource: "queues"},
	}
	cases := map[string]struct {
		may, mayNot []access
	}{
		"partita-webhook": {
			may: []access{
				{verb: "list", resource: "namespaces"}, {verb: "watch", group: "partita.dev", resource: "queues"},
				{verb: "list", group: "partita.dev", resource: "gpunodes"},
				{verb: "watch", resource: "configmaps", namespace: ns}, {verb: "patch", resource: "configmaps", namespace: ns},
				{verb: "create", group: "events.k8s.io", resource: "events", namespace: ns},
				{verb: "get", resource: "secrets", namespace: ns, name: cert}, {verb: "update", resource: "secrets", namespace: ns, name: cert},
				{verb: "list", resource: "secrets", namespace: ns, name: cert},
				{verb: "get", resource: "secrets", namespace: ns, name: clientCert}, {verb: "update", resource: "secrets", namespace: ns, name: clientCert},
				{verb: "watch", resource: "secrets", namespace: ns, name: clientCert},
				{verb: "watch", group: "admissionregistration.k8s.io", resource: "mutatingwebhookconfigurations"},
				{verb: "update", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "partita"},
				// A member's PodGroup, a PodGroup's PriorityClass.
				{verb: "watch", group: "partita.dev", resource: "podgroups"}, {verb: "get", group: "partita.dev", resource: "podgroups", namespace: "default"},
				{verb: "list", group: "scheduling.k8s.io", resource: "priorityclasses"},
				// What a pod's ResourceClaims ask for (read live).
				{verb: "get", group: "resource.k8s.io", resource: "resourceclaims", namespace: "default"},
				{verb: "list", group: "resource.k8s.io", resource: "deviceclasses"},
			},
			mayNot: []access{
				{verb: "update", group: "admissionregistration.k8s.io", resource: "validatingwebhookconfigurations", name: "someone-elses"},
				{verb: "create", group: "resource.k8s.io", resource: "resourceclaims", namespace: "default"},
				{verb: "list", resource: "pods"},
				{verb: "create", resource: "pods", subresource: "binding", namespace: "default"},
				{verb: "patch", resource: "configmaps", namespace: "kube-system"},
				{verb: "update", group: "partita.dev", resource: "queues", subresource: "status"},
				{verb: "update", group: "partita.dev", resource: "podgroups", namespace: "default"},
				{verb: "patch", group: "partita.dev", resource: "podgroups", subresource: "status", namespace: "default"},
				{verb: "create", group: "scheduling.k8s.io", resource: "priorityclasses"},
				{verb: "get", resource: "pods", namespace: "default"},
			},
		},
		"partita-extender": {
			may: []access{
				{verb: "watch", resource: "pods"}, {verb: "get", resource: "pods", namespace: "default"},
				{verb: "patch", resource: "pods", namespace: "default"},
				{verb: "create", resource: "pods", subresource: "binding", namespace: "default"},
				{verb: "create", resource: "pods", subresource: "eviction", namespace: "default"},
				{verb: "watch", group: "policy", resource: "poddisruptionbudgets"},
				{verb: "list", resource: "nodes"}, {verb: "list", group: "scheduling.k8s.io", resource: "priorityclasses"},
				{verb: "watch", group: "partita.dev", resource: "gpunodes"}, {verb: "watch", group: "partita.dev", resource: "podgroups"},
				{verb: "update", group: "partita.dev", resource: "queues", subresource: "status"},
				{verb: "patch", group: "partita.dev", resource: "podgroups", subresource: "status"},
				{verb: "create", resource: "events", namespace: "default"}, {verb: "patch", group: "events.k8s.io", resource: "events", namespace: "default"},
				{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: ns, name: "partita-extender"},
				{verb: "list", resource: "configmaps", namespace: ns}, {verb: "patch", resource: "configmaps", namespace: ns},
				{verb: "patch", resource: "pods", subresource: "status", namespace: "default"},
				// Pods that hold GPUs through claims, and their simulation.
				{verb: "watch", group: "resource.k8s.io", resource: "resourceclaims"}, {verb: "watch", group: "resource.k8s.io", resource: "resourceslices"},
				{verb: "watch", group: "resource.k8s.io", resource: "resourceclaimtemplates"}, {verb: "watch", group: "resource.k8s.io", resource: "deviceclasses"},
				// The workload map: the owners its built-in rules name, new
				// CRDs, and the PodGroup of each mapped workload.
				{verb: "watch", group: "batch", resource: "jobs"}, {verb: "list", group: "apps", resource: "statefulsets"},
				{verb: "watch", group: "jobset.x-k8s.io", resource: "jobsets"}, {verb: "list", group: "leaderworkerset.x-k8s.io", resource: "leaderworkersets"},
				{verb: "watch", group: "ray.io", resource: "rayclusters"}, {verb: "watch", group: "ray.io", resource: "rayjobs"},
				{verb: "list", group: "trainer.kubeflow.org", resource: "trainjobs"}, {verb: "watch", group: "kubeflow.org", resource: "pytorchjobs"},
				{verb: "list", group: "kubeflow.org", resource: "mpijobs"}, {verb: "watch", group: "scheduling.k8s.io", resource: "workloads"},
				{verb: "watch", group: "scheduling.k8s.io", resource: "podgroups"},
				{verb: "watch", group: "apiextensions.k8s.io", resource: "customresourcedefinitions"},
				{verb: "create", group: "partita.dev", resource: "podgroups", namespace: "default"},
				{verb: "patch", group: "partita.dev", resource: "podgroups", namespace: "default"},
			},
			mayNot: []access{
				{verb: "delete", resource: "pods", namespace: "default"},
				{verb: "create", group: "batch", resource: "jobs", namespace: "default"},
				{verb: "patch", group: "jobset.x-k8s.io", resource: "jobsets", namespace: "default"},
				{verb: "delete", group: "partita.dev", resource: "podgroups", namespace: "default"},
				{verb: "update", group: "apiextensions.k8s.io", resource: "customresourcedefinitions"},
				{verb: "create", resource: "pods", namespace: "default"},
				{verb: "update", group: "partita.dev", resource: "queues"},
				{verb: "update", group: "coordination.k8s.io", resource: "leases", namespace: "kube-system", name: "kube-scheduler"},
				{verb: "list", resource: "configmaps", namespace: "kube-system"},
				{verb: "patch", resource: "nodes", subresource: "status"},
				{verb: "get", resource: "secrets", namespace: ns, name: clientCert},
				{verb: "get", resource: "secrets", namespace: ns, name: cert},
			},
		},
		"partita-agent": {
			may: []access{
				{verb: "watch", resource: "nodes"}, {verb: "patch", resource: "nodes", subresource: "status"},
				{verb: "list", resource: "pods"},
				{verb: "create", group: "partita.dev", resource: "gpunodes"}, {verb: "delete", group: "partita.dev", resource: "gpunodes"},
				{verb: "update", group: "partita.dev", resource: "gpunodes", subresource: "status"},
				{verb: "create", group: "events.k8s.io", resource: "events", namespace: "kube-system"},
				// Other DRA drivers' slices of its nodes.
				{verb: "watch", group: "resource.k8s.io", resource: "resourceslices"},
			},
			mayNot: []access{
				{verb: "patch", resource: "nodes"},
				{verb: "create", group: "resource.k8s.io", resource: "resourceslices"},
				{verb: "patch", resource: "pods", namespace: "default"},
				{verb: "create", resource: "pods", subresource: "binding", namespace: "default"},
				{verb: "list", group: "partita.dev", resource: "queues"},
				{verb: "list", resource: "configmaps", namespace: ns},
				{verb: "get", resource: "secrets", namespace: ns, name: clientCert},
			},
		},
	}
	for sa, tc := range cases {
		t.Run(sa, func(t *testing.T) {
			for _, a := range tc.may {
				if !allowed(ctx, t, sa, a) {
					t.Errorf("%s may not %s, which its code does", sa, a)
				}
			}
			for _, a := range append(tc.mayNot, forbiddenToAll...) {
				if allowed(ctx, t, sa, a) {
					t.Errorf("%s may %s, which it must not", sa, a)
				}
			}
		})
	}
}

// TestComponentTokens: the processes really authenticate as their
// ServiceAccounts, and the API server enforces the scoping the webhook
// relies on (a Secret list narrowed to one name by a field selector).
func TestComponentTokens(t *testing.T) {
	ctx := testContext(t, time.Minute)
	for _, sa := range []string{"partita-webhook", "partita-extender", "partita-agent"} {
		t.Run(sa, func(t *testing.T) {
			cfg, err := clientcmd.BuildConfigFromFlags("", cluster.ServiceAccountKubeconfig(sa))
			if err != nil {
				t.Fatal(err)
			}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("whoami: %v", err)
			}
			if want := "system:serviceaccount:" + devcluster.PartitaNamespace + ":" + sa; review.Status.UserInfo.Username != want {
				t.Errorf("authenticated as %q, want %q", review.Status.UserInfo.Username, want)
			}
			for _, g := range review.Status.UserInfo.Groups {
				if g == "system:masters" {
					t.Errorf("%s is in system:masters", sa)
				}
			}
			if _, err := cs.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
				t.Errorf("listing kube-system's Secrets: %v, want Forbidden", err)
			}
			_, err = cs.CoreV1().Secrets(devcluster.PartitaNamespace).List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=partita-webhook-cert"})
			if sa == "partita-webhook" && err != nil {
				t.Errorf("listing its own certificate Secret by name: %v", err)
			}
			if sa != "partita-webhook" && !apierrors.IsForbidden(err) {
				t.Errorf("listing the webhook's certificate Secret: %v, want Forbidden", err)
			}
			if _, err := cs.CoreV1().Secrets(devcluster.PartitaNamespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
				t.Errorf("listing every Secret of %s: %v, want Forbidden", devcluster.PartitaNamespace, err)
			}
		})
	}
	// The processes' command lines name these kubeconfigs, not the admin's.
	for _, p := range []string{"agent", "webhook", "extender"} {
		args := processArgs(t, p)
		if !strings.Contains(args, "kubeconfig-partita-"+p+".yaml") || strings.Contains(args, " --as") {
			t.Errorf("partita %s runs with %q, want its ServiceAccount's kubeconfig and no impersonation", p, args)
		}
	}
}

// processArgs is the command line of the dev cluster's host process name.
func processArgs(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(cluster.Dir(), "partita", name+".pid"))
	if err != nil {
		t.Fatalf("pid file of %s: %v", name, err)
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strings.TrimSpace(string(b)), "cmdline"))
	if err != nil {
		t.Fatalf("command line of %s: %v", name, err)
	}
	return strings.ReplaceAll(string(cmdline), "\x00", " ")
}
