package extender

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/partita-dev/partita/internal/httpserver"
	"github.com/partita-dev/partita/internal/partitatest"
)

// testCA is a certificate authority for tests.
type testCA = partitatest.CA

func newTestCA(t testing.TB, name string) *testCA { return partitatest.NewCA(t, name) }

// schedulerConn is the TLS state of a connection from kube-scheduler, as
// crypto/tls leaves it after verifying its certificate: tests of the
// handlers put it on their requests.
func schedulerConn(t testing.TB) *tls.ConnectionState {
	t.Helper()
	ca := newTestCA(t, "scheduler-ca")
	c := ca.Client(t, DefaultClientName)
	return &tls.ConnectionState{HandshakeComplete: true, PeerCertificates: []*x509.Certificate{c.Leaf},
		VerifiedChains: [][]*x509.Certificate{{c.Leaf, ca.Cert}}}
}

func TestClientAuthCheck(t *testing.T) {
	ca := newTestCA(t, "scheduler-ca")
	now := time.Now()
	conn := func(c tls.Certificate) *tls.ConnectionState {
		return &tls.ConnectionState{PeerCertificates: []*x509.Certificate{c.Leaf}, VerifiedChains: [][]*x509.Certificate{{c.Leaf, ca.Cert}}}
	}
	cases := map[string]struct {
		auth       ClientAuth
		tls        *tls.ConnectionState
		wantStatus int // 0: allowed
		wantReason string
	}{
		"kube-scheduler": {auth: ClientAuth{AllowedNames: []string{DefaultClientName}}, tls: conn(ca.Client(t, DefaultClientName))},
		"plain HTTP": {auth: ClientAuth{AllowedNames: []string{DefaultClientName}},
			wantStatus: 401, wantReason: "not over TLS"},
		"no certificate": {auth: ClientAuth{AllowedNames: []string{DefaultClientName}}, tls: &tls.ConnectionState{},
			wantStatus: 401, wantReason: "no client certificate; only kube-scheduler may call the extender"},
		"a certificate the handshake did not verify": {auth: ClientAuth{}, tls: &tls.ConnectionState{PeerCertificates: []*x509.Certificate{ca.Client(t, DefaultClientName).Leaf}},
			wantStatus: 401, wantReason: "no client certificate"},
		"another name": {auth: ClientAuth{AllowedNames: []string{DefaultClientName}}, tls: conn(ca.Client(t, "mallory")),
			wantStatus: 403, wantReason: `client certificate "mallory" is not one of the allowed names (partita-scheduler; --client-allowed-names)`},
		"any name when none is set": {auth: ClientAuth{}, tls: conn(ca.Client(t, "whoever"))},
		"expired since the handshake": {
			auth:       ClientAuth{AllowedNames: []string{DefaultClientName}, Clock: clocktesting.NewFakePassiveClock(now.Add(48 * time.Hour))},
			tls:        conn(ca.Client(t, DefaultClientName)),
			wantStatus: 401, wantReason: `client certificate "partita-scheduler" is valid from`,
		},
		"not yet valid": {
			auth:       ClientAuth{AllowedNames: []string{DefaultClientName}},
			tls:        conn(ca.Issue(t, DefaultClientName, x509.ExtKeyUsageClientAuth, now.Add(time.Hour), now.Add(2*time.Hour))),
			wantStatus: 401, wantReason: "not now",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/bind", nil)
			r.TLS = tc.tls
			err := tc.auth.Check(r)
			if tc.wantStatus == 0 {
				if err != nil {
					t.Fatalf("Check() = %v, want allowed", err)
				}
				return
			}
			var ae *AuthError
			if !errors.As(err, &ae) || !IsAuthError(err) {
				t.Fatalf("Check() = %v, want an *AuthError", err)
			}
			if ae.Status != tc.wantStatus || !strings.Contains(ae.Reason, tc.wantReason) {
				t.Errorf("Check() = %d %q, want %d containing %q", ae.Status, ae.Reason, tc.wantStatus, tc.wantReason)
			}
		})
	}
}

// tlsServer serves the extender's handler with TLSConfig over a real
// listener, with the serving certificate from servingCA and client
// certificates verified against the CA file it returns.
func tlsServer(t *testing.T, servingCA, clientCA *testCA, clk *clocktesting.FakeClock) (*httptest.Server, string) {
	t.Helper()
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(caFile, clientCA.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cas, err := NewClientCAs(caFile, clk)
	if err != nil {
		t.Fatal(err)
	}
	serving := servingCA.Issue(t, "partita-extender", x509.ExtKeyUsageServerAuth, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), net.IPv4(127, 0, 0, 1))
	srv := httptest.NewUnstartedServer(testServer{synced: true, leader: true}.handler(t))
	srv.TLS = TLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &serving, nil }, cas, testr.New(t))
	// TLSConfig offers h2, which the binary's server speaks.
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, caFile
}

// call GETs or POSTs path with the client certificate cert (none when nil)
// and returns the status, or the error of the connection.
func call(t *testing.T, srv *httptest.Server, servingCA *testCA, cert *tls.Certificate, method, path string) (int, string, error) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(servingCA.Cert)
	cfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	if cert != nil {
		// Sent whatever CAs the server names: Go's client would otherwise
		// send none that the server's CA did not sign, and a hostile
		// client sends what it likes.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestTLSClientCertificates plays the callers over real TLS connections:
// probes reach /healthz without a certificate, nobody reaches a verb
// without kube-scheduler's, and a certificate of another CA, or a serving
// certificate of the right CA, does not even complete the handshake.
func TestTLSClientCertificates(t *testing.T) {
	servingCA, clientCA, otherCA := newTestCA(t, "serving-ca"), newTestCA(t, "client-ca"), newTestCA(t, "other-ca")
	clk := clocktesting.NewFakeClock(time.Now())
	srv, caFile := tlsServer(t, servingCA, clientCA, clk)
	scheduler := clientCA.Client(t, DefaultClientName)
	otherName := clientCA.Client(t, "someone")
	foreign := otherCA.Client(t, DefaultClientName)
	servingAsClient := clientCA.Issue(t, DefaultClientName, x509.ExtKeyUsageServerAuth, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	cases := map[string]struct {
		cert         *tls.Certificate
		method, path string
		wantStatus   int
		wantBody     string
		wantConnErr  bool
	}{
		"probe without a certificate":   {method: http.MethodGet, path: "/healthz", wantStatus: 200},
		"readiness without certificate": {method: http.MethodGet, path: "/readyz", wantStatus: 200},
		"bind without a certificate":    {method: http.MethodPost, path: "/bind", wantStatus: 401, wantBody: "no client certificate"},
		"filter without a certificate":  {method: http.MethodPost, path: "/filter", wantStatus: 401, wantBody: "no client certificate"},
		"bind as someone else":          {cert: &otherName, method: http.MethodPost, path: "/bind", wantStatus: 403, wantBody: `"someone" is not one of the allowed names`},
		"bind with another CA's cert":   {cert: &foreign, method: http.MethodPost, path: "/bind", wantConnErr: true},
		"bind with a serving cert":      {cert: &servingAsClient, method: http.MethodPost, path: "/bind", wantConnErr: true},
		// Past authentication, the body "{}" is read as a request
		// without a pod.
		"bind as kube-scheduler":   {cert: &scheduler, method: http.MethodPost, path: "/bind", wantStatus: 400, wantBody: "PodName and PodNamespace are required"},
		"filter as kube-scheduler": {cert: &scheduler, method: http.MethodPost, path: "/filter", wantStatus: 400, wantBody: "no pod"},
		"debug is off":             {cert: &scheduler, method: http.MethodGet, path: PathDebugLedger, wantStatus: 404},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			status, body, err := call(t, srv, servingCA, tc.cert, tc.method, tc.path)
			if tc.wantConnErr {
				if err == nil {
					t.Fatalf("%s %s answered %d %q, want the handshake to fail", tc.method, tc.path, status, body)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s %s: %v", tc.method, tc.path, err)
			}
			if status != tc.wantStatus || !strings.Contains(body, tc.wantBody) {
				t.Errorf("%s %s = %d %q, want %d containing %q", tc.method, tc.path, status, body, tc.wantStatus, tc.wantBody)
			}
		})
	}

	// The CA rotates: the file changes, and once the check interval has
	// passed the new CA's certificates are accepted and the old one's not.
	rotated := newTestCA(t, "client-ca-2")
	if err := os.WriteFile(caFile, rotated.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	// A Secret's files change with a new modification time; make sure it
	// differs even on a coarse file system clock.
	if err := os.Chtimes(caFile, time.Now().Add(time.Minute), time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	clk.Step(clientCACheckInterval)
	renewed := rotated.Client(t, DefaultClientName)
	if status, body, err := call(t, srv, servingCA, &renewed, http.MethodPost, "/filter"); err != nil || status != 400 {
		t.Errorf("after the rotation, the new CA's certificate: %d %q %v, want through to the verb (400)", status, body, err)
	}
	if _, _, err := call(t, srv, servingCA, &scheduler, http.MethodPost, "/filter"); err == nil {
		t.Errorf("after the rotation, the old CA's certificate was accepted")
	}

	// A file that stops reading keeps the last good CA.
	if err := os.WriteFile(caFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(caFile, time.Now().Add(2*time.Minute), time.Now().Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	clk.Step(clientCACheckInterval)
	if status, body, err := call(t, srv, servingCA, &renewed, http.MethodPost, "/filter"); err != nil || status != 400 {
		t.Errorf("with a broken CA file, the last good CA's certificate: %d %q %v, want through to the verb (400)", status, body, err)
	}
}

func TestNewClientCAsRefusesAnEmptyFile(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(empty, []byte("# nothing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"no PEM certificate": empty, "no file": filepath.Join(dir, "missing.crt")} {
		t.Run(name, func(t *testing.T) {
			if _, err := NewClientCAs(path, nil); err == nil || !strings.Contains(err.Error(), path) {
				t.Errorf("NewClientCAs(%s) = %v, want an error naming the file", path, err)
			}
		})
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// TestKubeSchedulerCallsShareOneConnection serves the extender as the
// binary does (httpserver.ServeTLSConfig with TLSConfig) and calls it with
// the transport kube-scheduler builds for an extender (rest.TLSConfigFor,
// utilnet.SetTransportDefaults), many calls at once, as concurrent binds
// are. They go over HTTP/2 on one connection: over HTTP/1.1 the client
// keeps two idle connections and every call beyond them paid a new TLS
// handshake on both sides.
func TestKubeSchedulerCallsShareOneConnection(t *testing.T) {
	servingCA, clientCA := newTestCA(t, "serving-ca"), newTestCA(t, "client-ca")
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(caFile, clientCA.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cas, err := NewClientCAs(caFile, clocktesting.NewFakeClock(time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	serving := servingCA.Issue(t, "partita-extender", x509.ExtKeyUsageServerAuth, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), net.IPv4(127, 0, 0, 1))
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &countingListener{Listener: inner}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() {
		served <- httpserver.ServeTLSConfig(ctx, l, testServer{synced: true, leader: true}.handler(t),
			TLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &serving, nil }, cas, testr.New(t)), "extender")
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	client := clientCA.Client(t, DefaultClientName)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: client.Certificate[0]})
	keyDER, err := x509.MarshalECPrivateKey(client.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	tlsCfg, err := rest.TLSConfigFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CertData: certPEM, KeyData: keyPEM, CAData: servingCA.PEM}})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: utilnet.SetTransportDefaults(&http.Transport{TLSClientConfig: tlsCfg}), Timeout: 10 * time.Second}

	post := func() (string, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+inner.Addr().String()+"/bind", strings.NewReader("{}"))
		if err != nil {
			return "", err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return "", err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		// The body "{}" names no pod: 400 is past authentication.
		return fmt.Sprintf("%s %d", resp.Proto, resp.StatusCode), nil
	}
	// The first call opens the connection (calls made before it is up
	// would each dial); then many at once, as concurrent binds are.
	if p, err := post(); err != nil || p != "HTTP/2.0 400" {
		t.Fatalf("the first call answered %q, %v; want HTTP/2.0 400", p, err)
	}
	const calls = 16
	protos := make(chan string, calls)
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			p, err := post()
			if err != nil {
				p = err.Error()
			}
			protos <- p
		})
	}
	wg.Wait()
	close(protos)
	for p := range protos {
		if p != "HTTP/2.0 400" {
			t.Errorf("a call answered %q, want HTTP/2.0 400", p)
		}
	}
	if n := l.accepted.Load(); n != 1 {
		t.Errorf("%d calls opened %d connections, want 1", calls+1, n)
	}
}
