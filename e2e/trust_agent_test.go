package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/helm"
	"github.com/partita-dev/partita/internal/envtestutil"
)

// The agent's door: a compromised GPU node's agent holds its pod's
// ServiceAccount token, and the agent's RBAC lets that ServiceAccount patch
// every node's status and write every GPUNode. The chart's
// ValidatingAdmissionPolicy ties the writes to the node the token names.

// agentPodOn creates a pod of ServiceAccount sa in Partita's namespace
// (which the webhook never sees), bound to node, as the agent's DaemonSet
// pod would be; kwok runs it.
func agentPodOn(ctx context.Context, t *testing.T, sa, node string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-agent-", Namespace: devcluster.PartitaNamespace},
		Spec: corev1.PodSpec{ServiceAccountName: sa, NodeName: node,
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:  []corev1.Container{{Name: "agent", Image: "registry.k8s.io/pause:3.10"}}},
	}
	created, err := clientset.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create an agent pod on %s: %v", node, err)
	}
	t.Cleanup(func() {
		_ = clientset.CoreV1().Pods(p.Namespace).Delete(context.WithoutCancel(ctx), created.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	return created
}

// tokenConfig is a client configuration that authenticates with a token of
// sa, bound to pod when it is given (as the kubelet's projected token is),
// else bound to nothing (as the dev cluster's fleet agent's is).
func tokenConfig(ctx context.Context, t *testing.T, sa string, pod *corev1.Pod) *rest.Config {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := clientset.CoreV1().ServiceAccounts(devcluster.PartitaNamespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("request a token for %s: %v", sa, err)
	}
	admin, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(admin)
	cfg.BearerToken = tr.Status.Token
	return cfg
}

// twoGPUNodes returns two nodes that have a GPUNode.
func twoGPUNodes(ctx context.Context, t *testing.T, c client.Client) (string, string) {
	t.Helper()
	var gns v1alpha1.GPUNodeList
	if err := c.List(ctx, &gns); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range gns.Items {
		if _, err := clientset.CoreV1().Nodes().Get(ctx, g.Name, metav1.GetOptions{}); err == nil {
			names = append(names, g.Name)
		}
	}
	if len(names) < 2 {
		t.Fatalf("want two nodes with GPUNodes, have %v", names)
	}
	return names[0], names[1]
}

// agentTries are the writes an agent makes, aimed at node target; each
// returns the API server's answer.
func agentTries(ctx context.Context, t *testing.T, cfg *rest.Config, target string) map[string]error {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: envtestutil.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	node, err := clientset.CoreV1().Nodes().Get(ctx, target, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The capacity the node has already: a write that goes through changes
	// nothing the other tests see.
	capacity := node.Status.Capacity[v1alpha1.ResourceGPUMilli]
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"capacity": map[string]string{string(v1alpha1.ResourceGPUMilli): capacity.String()}}})
	out := map[string]error{}
	_, out["patch nodes/status"] = cs.CoreV1().Nodes().Patch(ctx, target, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	gn := &v1alpha1.GPUNode{}
	if err := c.Get(ctx, client.ObjectKey{Name: target}, gn); err != nil {
		t.Fatalf("read GPUNode %s as the agent: %v", target, err)
	}
	out["update gpunodes"] = c.Update(ctx, gn.DeepCopy())
	if err := c.Get(ctx, client.ObjectKey{Name: target}, gn); err == nil {
		out["update gpunodes/status"] = c.Status().Update(ctx, gn.DeepCopy())
	}
	out["delete gpunodes"] = c.Delete(ctx, gn.DeepCopy(), client.DryRunAll)
	out["create gpunodes"] = c.Create(ctx, &v1alpha1.GPUNode{ObjectMeta: metav1.ObjectMeta{Name: "e2e-agent-made-up-" + target}}, client.DryRunAll)
	return out
}

// gpuNodeVersion reads a GPUNode's resourceVersion as the admin.
func gpuNodeVersion(ctx context.Context, t *testing.T, c client.Client, name string) string {
	t.Helper()
	gn := &v1alpha1.GPUNode{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, gn); err != nil {
		t.Fatal(err)
	}
	return gn.ResourceVersion
}

// TestTrustAgentWritesOnlyItsOwnNode: with the token of an agent pod on
// node A (a compromised GPU node), patching node B's status, updating,
// deleting or creating B's GPUNode (or a made-up one) is refused by the API
// server with the reason, and B is untouched; the same writes to A go
// through. The dev cluster's fleet agent, whose token names no node, keeps
// working only because the dev cluster sets agent.simulatedFleet.
func TestTrustAgentWritesOnlyItsOwnNode(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	c := crClient(t)
	a, b := twoGPUNodes(ctx, t, c)
	const sa = devcluster.ChartRelease + "-agent"
	pod := agentPodOn(ctx, t, sa, a)
	cfg := tokenConfig(ctx, t, sa, pod)

	// The token names its node: that is what the policy checks.
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	who, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := who.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != a {
		t.Fatalf("the agent pod's token names node %v, want %s (ServiceAccountTokenPodNodeInfo)", got, a)
	}

	before := gpuNodeVersion(ctx, t, c, b)
	nodeBefore, err := clientset.CoreV1().Nodes().Get(ctx, b, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for what, err := range agentTries(ctx, t, cfg, b) {
		if what == "patch nodes/status" {
			t.Logf("the API server to the agent on %s: %v", a, err)
		}
		want := "may write only its own node and GPUNode"
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(fmt.Sprint(err), want) || !strings.Contains(fmt.Sprint(err), "on node "+a) {
			t.Errorf("agent on %s: %s of %s = %v, want a refusal saying %q", a, what, b, err, want)
		}
	}
	if after := gpuNodeVersion(ctx, t, c, b); after != before {
		t.Errorf("GPUNode %s changed (resourceVersion %s -> %s)", b, before, after)
	}
	if nodeAfter, err := clientset.CoreV1().Nodes().Get(ctx, b, metav1.GetOptions{}); err != nil || nodeAfter.ResourceVersion != nodeBefore.ResourceVersion {
		// The fleet agent's heartbeat may write the node meanwhile; the
		// capacity must be what it was.
		if err != nil || !nodeAfter.Status.Capacity[v1alpha1.ResourceGPUMilli].Equal(nodeBefore.Status.Capacity[v1alpha1.ResourceGPUMilli]) {
			t.Errorf("node %s's capacity changed: %v", b, err)
		}
	}
	for what, err := range agentTries(ctx, t, cfg, a) {
		if what == "create gpunodes" {
			// A GPUNode of another name is never its own.
			if err == nil {
				t.Errorf("agent on %s created a GPUNode for a made-up node", a)
			}
			continue
		}
		if err != nil && !apierrors.IsConflict(err) {
			t.Errorf("agent on %s: %s of its own node = %v, want it allowed", a, what, err)
		}
	}
}

// TestTrustAgentUnboundTokenRefusedByDefault: the chart's policy as a real
// cluster gets it (agent.simulatedFleet off), for a release of its own: a
// token of its agent ServiceAccount that names no node writes nothing; one
// bound to an agent pod on node A writes A.
func TestTrustAgentUnboundTokenRefusedByDefault(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	const release = "e2e-strict"
	ns := devcluster.PartitaNamespace
	manifest, err := helm.Template(ctx, helm.TemplateOptions{
		Helm: helmBin(t), Release: release, Namespace: ns, KubeVersion: devcluster.K8sVersion,
		Args: []string{"--show-only", "templates/agent-policy.yaml", "--set", devcluster.ShowOnlyClientAuth},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	if err := devcluster.Apply(ctx, cfg, manifest); err != nil {
		t.Fatalf("apply the chart's agent policy: %v", err)
	}
	sa := release + "-partita-agent"
	if _, err := clientset.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The agent's permissions, as the chart grants them.
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: devcluster.ChartRelease + "-agent"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}
	if _, err := clientset.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.WithoutCancel(ctx)
		_ = clientset.RbacV1().ClusterRoleBindings().Delete(bg, sa, metav1.DeleteOptions{})
		_ = clientset.CoreV1().ServiceAccounts(ns).Delete(bg, sa, metav1.DeleteOptions{})
		_ = clientset.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(bg, release+"-partita-agent-own-node", metav1.DeleteOptions{})
		_ = clientset.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(bg, release+"-partita-agent-own-node", metav1.DeleteOptions{})
	})
	c := crClient(t)
	a, _ := twoGPUNodes(ctx, t, c)
	unbound := tokenConfig(ctx, t, sa, nil)
	// A policy takes effect within a second or so of its creation.
	poll(t, 30*time.Second, "the policy refuses an unbound token", func() (bool, string) {
		errs := agentTries(ctx, t, unbound, a)
		for what, err := range errs {
			if !strings.Contains(fmt.Sprint(err), "this token names no node") {
				return false, fmt.Sprintf("%s: %v", what, err)
			}
		}
		return true, ""
	})
	bound := tokenConfig(ctx, t, sa, agentPodOn(ctx, t, sa, a))
	for what, err := range agentTries(ctx, t, bound, a) {
		if what != "create gpunodes" && err != nil && !apierrors.IsConflict(err) {
			t.Errorf("bound agent on %s: %s of its own node = %v, want it allowed", a, what, err)
		}
	}
}
