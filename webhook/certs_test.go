package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

func TestEnsureDevCertificates(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := DevCertificateOptions{Dir: dir, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}, Now: now}
	ca1, err := EnsureDevCertificates(o)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		change  func(*DevCertificateOptions)
		wantNew bool
	}{
		"same names: kept":             {change: func(*DevCertificateOptions) {}},
		"a month later: kept":          {change: func(o *DevCertificateOptions) { o.Now = now.Add(30 * 24 * time.Hour) }},
		"close to expiry: renewed":     {change: func(o *DevCertificateOptions) { o.Now = now.Add(340 * 24 * time.Hour) }, wantNew: true},
		"another address: regenerated": {change: func(o *DevCertificateOptions) { o.IPs = []net.IP{net.IPv4(10, 0, 0, 1)} }, wantNew: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o2 := o
			tc.change(&o2)
			ca, err := EnsureDevCertificates(o2)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(ca) != string(ca1); got != tc.wantNew {
				t.Errorf("new CA = %v, want %v", got, tc.wantNew)
			}
			if tc.wantNew {
				// Put the first generation back for the next case.
				if _, err := EnsureDevCertificates(o); err != nil {
					t.Fatal(err)
				}
				ca1, _ = os.ReadFile(filepath.Join(dir, CAFile))
			}
		})
	}
}

// TestServeTLSReloadsCertificate: a renewed certificate is served without a
// restart.
func TestServeTLSReloadsCertificate(t *testing.T) {
	dir := t.TempDir()
	o := DevCertificateOptions{Dir: dir, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Now: time.Now()}
	ca1, err := EnsureDevCertificates(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	cw, err := WatchCertificates(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- ServeTLS(ctx, l, newTestServer(t, testOptions{}), cw.GetCertificate, nil, logr.Discard())
	}()
	url := "https://" + l.Addr().String() + PathHealthz
	get := func(ca []byte) error {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
		resp, err := c.Get(url)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}
	if err := get(ca1); err != nil {
		t.Fatalf("first certificate: %v", err)
	}
	// Renew: new CA and certificate, files replaced by rename.
	o.IPs = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	ca2, err := EnsureDevCertificates(o)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for get(ca2) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the renewed certificate was not served within 20s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
