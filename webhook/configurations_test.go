package webhook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// TestConfigurations keeps the webhook configurations and admission
// policies in golden files that docs/operations.md quotes: the in-cluster
// form (Service, CA injected by cert-controller), the dev cluster's (url,
// CA bundle), and the layout for clusters without admission policies.
func TestConfigurations(t *testing.T) {
	extender := Identities{Users: []string{"system:serviceaccount:partita-system:partita-extender"}}
	svc := &admissionregistrationv1.ServiceReference{Namespace: "partita-system", Name: "partita-webhook", Port: ptr.To[int32](443)}
	cases := map[string]ConfigurationOptions{
		"in-cluster": {Namespace: "partita-system", Service: svc, ExcludedNamespaces: DefaultExcludedNamespaces(),
			Policies: true, AdmissionGate: true, Trusted: extender},
		"no-policies": {Namespace: "partita-system", Service: svc, ExcludedNamespaces: DefaultExcludedNamespaces(), AdmissionGate: true, Trusted: extender},
		"dev": {Namespace: "partita-system", URL: "https://127.0.0.1:40123", CABundle: []byte("-----BEGIN CERTIFICATE-----\n...\n"),
			ExcludedNamespaces: []string{"kube-system", "local-path-storage"}, Policies: true, AdmissionGate: true, Trusted: extender},
	}
	for name, o := range cases {
		t.Run(name, func(t *testing.T) {
			objs := []any{MutatingConfiguration(o), ValidatingConfiguration(o)}
			if o.Policies {
				objs = append(objs, ValidatingPolicy(o), ValidatingPolicyBinding(o), MutatingPolicy(o), MutatingPolicyBinding(o))
			}
			var docs []string
			for _, obj := range objs {
				b, err := yaml.Marshal(obj)
				if err != nil {
					t.Fatal(err)
				}
				docs = append(docs, string(b))
			}
			got := strings.Join(docs, "---\n")
			path := filepath.Join("testdata", "configurations-"+name+".yaml")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden file (run with -update to create it): %v", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("configurations differ from %s (-want,+got):\n%s", path, diff)
			}
		})
	}
}

func TestRegister(t *testing.T) {
	cs := fake.NewClientset()
	o := ConfigurationOptions{Namespace: "partita-system", URL: "https://127.0.0.1:1", Policies: true}
	if err := Register(t.Context(), cs, o); err != nil {
		t.Fatal(err)
	}
	o.URL = "https://127.0.0.1:2"
	if err := Register(t.Context(), cs, o); err != nil {
		t.Fatalf("register again: %v", err)
	}
	m, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(t.Context(), DefaultConfigurationName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := *m.Webhooks[0].ClientConfig.URL; got != "https://127.0.0.1:2"+PathMutatePods {
		t.Errorf("mutating url = %s", got)
	}
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(t.Context(), DefaultConfigurationName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Webhooks) != 3 {
		t.Errorf("validating webhooks = %d, want 3 (pods, policies, podgroups)", len(v.Webhooks))
	}
	if _, err := cs.CoreV1().Namespaces().Get(t.Context(), "partita-system", metav1.GetOptions{}); err != nil {
		t.Errorf("namespace not created: %v", err)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Get(t.Context(), VoidPolicyName(DefaultConfigurationName), metav1.GetOptions{}); err != nil {
		t.Errorf("mutating policy not created: %v", err)
	}
	// Turned off, the policies go.
	o.Policies = false
	if err := Register(t.Context(), cs, o); err != nil {
		t.Fatalf("register without policies: %v", err)
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(t.Context(), PodPolicyName(DefaultConfigurationName), metav1.GetOptions{}); err == nil {
		t.Error("the validating policy is still there without Policies")
	}
}
