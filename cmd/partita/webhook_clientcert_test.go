package main

import (
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/partita-dev/partita/extender"
	"github.com/partita-dev/partita/internal/envtestutil"
	"github.com/partita-dev/partita/webhook"
)

// secretReads records the queries of every list and watch of Secrets.
type secretReads struct {
	lock    sync.Mutex
	queries []string
}

func (r *secretReads) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/secrets") {
			r.lock.Lock()
			r.queries = append(r.queries, req.URL.RawQuery)
			r.lock.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestClientCertRotator: beside the serving certificate's rotation, the
// webhook fills kube-scheduler's client certificate Secret with a CA and a
// client certificate of the extender's allowed name, and reads that Secret
// only by name (the webhook's Role names the two Secrets, nothing else).
func TestClientCertRotator(t *testing.T) {
	cfg, c := envtestutil.Start(t)
	const ns, name = "partita-system", "partita-scheduler-client-cert"
	if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}); err != nil {
		t.Fatal(err)
	}
	reads := &secretReads{}
	unscoped := rest.CopyConfig(cfg)
	unscoped.Wrap(reads.wrap)
	scoped := rest.CopyConfig(unscoped)
	scoped.Wrap(webhook.ScopeSecretReads(ns, "partita-webhook-cert"))
	mgr, err := manager.New(scoped, manager.Options{Scheme: envtestutil.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	f := &clientCertFlags{secretName: name, dir: t.TempDir(), commonName: extender.DefaultClientName}
	if err := addClientCertRotator(mgr, unscoped, ns, f); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(t.Context()) }()

	var s corev1.Secret
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := c.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &s); err == nil && len(s.Data["tls.crt"]) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client certificate Secret was not filled in 30s: %v", s.Data)
		}
		time.Sleep(100 * time.Millisecond)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(s.Data["ca.crt"]) {
		t.Fatalf("ca.crt holds no certificate")
	}
	block, _ := pem.Decode(s.Data["tls.crt"])
	if block == nil {
		t.Fatal("tls.crt is not PEM")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate does not verify as a client certificate against ca.crt: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err == nil {
		t.Error("client certificate could also serve")
	}
	if leaf.Subject.CommonName != extender.DefaultClientName {
		t.Errorf("client certificate names %q, want %q", leaf.Subject.CommonName, extender.DefaultClientName)
	}
	reads.lock.Lock()
	defer reads.lock.Unlock()
	if len(reads.queries) == 0 {
		t.Fatal("no Secret reads recorded")
	}
	for _, q := range reads.queries {
		if !strings.Contains(q, "fieldSelector=metadata.name%3D"+name) {
			t.Errorf("a Secret read was not scoped to %s: ?%s", name, q)
		}
	}
}
