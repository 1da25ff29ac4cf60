package devcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/partita-dev/partita/extender"
)

// WebhookClientName is the common name of the client certificate the dev
// cluster's API server presents to Partita's admission webhooks: the
// webhook's default --client-allowed-names.
const WebhookClientName = "partita-apiserver-client"

// The API server calls admission webhooks with the credentials of its
// admission configuration's kubeconfig (--admission-control-config-file,
// WebhookAdmissionConfiguration kubeConfigFile); the dev cluster gives it a
// client certificate of its own CA, which the webhook (--client-ca-file,
// chart value webhook.clientAuth.caBundle) requires of every caller. Both
// are written before the cluster is created, since kube-apiserver reads
// them when it starts.

// WebhookClientDir holds the API server's webhook client certificate and
// its CA (the extender's dev certificate layout: ca.crt, client.crt,
// client.key; the serving pair there is unused).
func (c *Cluster) WebhookClientDir() string { return filepath.Join(c.stateDir(), "webhook-client") }

// WebhookClientCAFile is the CA the webhook verifies the API server with.
func (c *Cluster) WebhookClientCAFile() string {
	return filepath.Join(c.WebhookClientDir(), extender.DevCAFile)
}

// admissionConfigFile is kube-apiserver's --admission-control-config-file.
func (c *Cluster) admissionConfigFile() string {
	return filepath.Join(c.stateDir(), "admission-configuration.yaml")
}

// webhookKubeconfigFile is the kubeconfig the admission plugins call
// webhooks with.
func (c *Cluster) webhookKubeconfigFile() string {
	return filepath.Join(c.stateDir(), "webhook-client.kubeconfig")
}

// writeWebhookClientAuth writes the API server's webhook client
// certificate (kept while valid for 30 more days), the kubeconfig that
// presents it and the admission configuration that names the kubeconfig.
func (c *Cluster) writeWebhookClientAuth() error {
	if err := extender.EnsureDevCertificates(extender.DevCertificateOptions{
		Dir: c.WebhookClientDir(), IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, ClientName: WebhookClientName, Now: time.Now(),
	}); err != nil {
		return fmt.Errorf("the API server's webhook client certificate: %w", err)
	}
	// "*": every webhook the dev cluster calls gets the certificate when
	// it asks for one; Partita's is registered by URL on a port chosen
	// later (mode host) or as a Service (mode chart), and the addons'
	// webhooks ask for none.
	kubeconfig := `apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: "` + filepath.Join(c.WebhookClientDir(), extender.DevClientCertFile) + `"
    client-key: "` + filepath.Join(c.WebhookClientDir(), extender.DevClientKeyFile) + `"
`
	admission := `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: "` + c.webhookKubeconfigFile() + `"
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: "` + c.webhookKubeconfigFile() + `"
`
	for path, content := range map[string]string{c.webhookKubeconfigFile(): kubeconfig, c.admissionConfigFile(): admission} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// checkWebhookClientAuth refuses an existing cluster whose API server was
// started without a webhook client certificate (created by an older
// partita): Partita's webhook would refuse every call from it.
func (c *Cluster) checkWebhookClientAuth() error {
	b, err := os.ReadFile(filepath.Join(c.Dir(), "kwok.yaml"))
	if err == nil && strings.Contains(string(b), "admission-control-config-file") {
		return nil
	}
	return fmt.Errorf("cluster %q was created without a client certificate for the API server's calls to admission webhooks (an older partita), which Partita's webhook now requires: run 'partita dev down --name %s', then 'partita dev up' again",
		c.opts.Name, c.opts.Name)
}

// webhookClientCA is the PEM of WebhookClientCAFile; "" (which the chart
// refuses, saying why) when it cannot be read.
func (c *Cluster) webhookClientCA() string {
	b, err := os.ReadFile(c.WebhookClientCAFile())
	if err != nil {
		return ""
	}
	return string(b)
}

// WebhookCall posts body to the host webhook's path (mode host) as a
// caller would, over TLS that trusts the webhook's dev CA; withAPIServerCert
// presents the API server's client certificate. It returns the status and
// the body; err is a failure to reach the webhook.
func (c *Cluster) WebhookCall(ctx context.Context, path string, body []byte, withAPIServerCert bool) (int, []byte, error) {
	port, err := c.Port("webhook")
	if err != nil {
		return 0, nil, err
	}
	ca, err := os.ReadFile(filepath.Join(c.Dir(), "partita", "webhook-certs", "ca.crt"))
	if err != nil {
		return 0, nil, fmt.Errorf("the webhook's CA: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if withAPIServerCert {
		pair, err := tls.LoadX509KeyPair(filepath.Join(c.WebhookClientDir(), extender.DevClientCertFile), filepath.Join(c.WebhookClientDir(), extender.DevClientKeyFile))
		if err != nil {
			return 0, nil, fmt.Errorf("the API server's webhook client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("https://127.0.0.1:%d%s", port, path), bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}
