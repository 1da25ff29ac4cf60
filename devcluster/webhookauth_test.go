package devcluster

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// TestWebhookClientAuth: the API server is started with an admission
// configuration whose kubeconfig presents a client certificate of
// WebhookClientName that the CA the webhook is given verifies.
func TestWebhookClientAuth(t *testing.T) {
	c := testCluster(t, Options{Name: "auth"})
	if err := c.writeWebhookClientAuth(); err != nil {
		t.Fatal(err)
	}
	var admission struct {
		APIVersion string `json:"apiVersion"`
		Kind       string
		Plugins    []struct {
			Name          string
			Configuration struct {
				APIVersion     string `json:"apiVersion"`
				Kind           string
				KubeConfigFile string `json:"kubeConfigFile"`
			}
		}
	}
	b, err := os.ReadFile(c.admissionConfigFile())
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, &admission); err != nil {
		t.Fatal(err)
	}
	var plugins []string
	for _, p := range admission.Plugins {
		plugins = append(plugins, p.Name)
		if p.Configuration.Kind != "WebhookAdmissionConfiguration" || p.Configuration.KubeConfigFile != c.webhookKubeconfigFile() {
			t.Errorf("plugin %s: configuration %+v, want WebhookAdmissionConfiguration of %s", p.Name, p.Configuration, c.webhookKubeconfigFile())
		}
	}
	if got := strings.Join(plugins, ","); admission.Kind != "AdmissionConfiguration" || got != "ValidatingAdmissionWebhook,MutatingAdmissionWebhook" {
		t.Errorf("admission configuration %s of plugins %s, want both webhook plugins", admission.Kind, got)
	}
	kc, err := clientcmd.LoadFromFile(c.webhookKubeconfigFile())
	if err != nil {
		t.Fatal(err)
	}
	user, ok := kc.AuthInfos["*"]
	if !ok {
		t.Fatalf("kubeconfig users %v, want \"*\"", kc.AuthInfos)
	}
	pair, err := tls.LoadX509KeyPair(user.ClientCertificate, user.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(c.WebhookClientCAFile())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the client certificate does not verify with the webhook's CA: %v", err)
	}
	if pair.Leaf.Subject.CommonName != WebhookClientName {
		t.Errorf("client certificate of %q, want %q", pair.Leaf.Subject.CommonName, WebhookClientName)
	}
	if c.webhookClientCA() != string(caPEM) {
		t.Error("the chart's caBundle is not the CA file")
	}

	// A cluster whose kube-apiserver started without the configuration is
	// refused, saying what to do.
	if err := os.MkdirAll(c.Dir(), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir(), "kwok.yaml"), []byte("kind: KwokctlConfiguration\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.checkWebhookClientAuth(); err == nil || !strings.Contains(err.Error(), "run 'partita dev down --name auth'") {
		t.Errorf("an older cluster: %v, want a refusal that says to recreate it", err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir(), "kwok.yaml"), []byte(c.kwokctlConfig()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.checkWebhookClientAuth(); err != nil {
		t.Errorf("a cluster created with the configuration: %v", err)
	}
}
