package extender

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// TestDevCertificates: the dev cluster's certificates let a client that
// holds client.crt (kube-scheduler) call a verb over TLS, verified against
// ca.crt both ways; they are kept while valid and renewed near the end.
func TestDevCertificates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	now := time.Now()
	o := DevCertificateOptions{Dir: dir, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: now}
	if err := EnsureDevCertificates(o); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{DevServingKeyFile, DevClientKeyFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	caBefore, _ := os.ReadFile(filepath.Join(dir, DevCAFile))
	if err := EnsureDevCertificates(o); err != nil {
		t.Fatal(err)
	}
	if caAgain, _ := os.ReadFile(filepath.Join(dir, DevCAFile)); !bytes.Equal(caBefore, caAgain) {
		t.Error("valid certificates were replaced")
	}

	cw, err := certwatcher.New(filepath.Join(dir, DevServingCertFile), filepath.Join(dir, DevServingKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	cas, err := NewClientCAs(filepath.Join(dir, DevCAFile), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(testServer{synced: true, leader: true}.handler(t))
	srv.TLS = TLSConfig(cw.GetCertificate, cas, testr.New(t))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caBefore)
	client, err := tls.LoadX509KeyPair(filepath.Join(dir, DevClientCertFile), filepath.Join(dir, DevClientKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{client}, MinVersion: tls.VersionTLS12}}}
	resp, err := c.Post(srv.URL+"/filter", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatalf("kube-scheduler's call: %v", err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("kube-scheduler's call answered %d, want 400 (authenticated, then an empty request)", resp.StatusCode)
	}

	// Twenty days before the end they are renewed.
	o.Now = now.Add(devCertValidity - 20*24*time.Hour)
	if err := EnsureDevCertificates(o); err != nil {
		t.Fatal(err)
	}
	if caAfter, _ := os.ReadFile(filepath.Join(dir, DevCAFile)); bytes.Equal(caBefore, caAfter) {
		t.Error("certificates about to expire were kept")
	}
}
