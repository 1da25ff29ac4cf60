package console

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/partita-dev/partita/api/v1alpha1"
)

func TestLocalAuth(t *testing.T) {
	a := NewLocalAuth("s3cret", UserInfo{Name: "me"})
	cases := map[string]struct {
		header string
		ok     bool
	}{
		"the token":     {"Bearer s3cret", true},
		"no header":     {"", false},
		"another token": {"Bearer guess", false},
		"not bearer":    {"Basic s3cret", false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/api/v1/map", nil)
			if tc.header != "" {
				r.Header.Set("Authorization", tc.header)
			}
			u, err := a.Authenticate(r)
			if tc.ok != (err == nil) || tc.ok && u.Name != "me" {
				t.Errorf("user %+v err %v, want ok %v", u, err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrUnauthenticated) {
				t.Errorf("err %v is not ErrUnauthenticated", err)
			}
		})
	}
}

// certPair makes a CA and a client certificate it signs (or a
// self-signed one when ca is nil).
func certPair(t *testing.T, cn string, ca *x509.Certificate, caKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	parent, signer := tmpl, key
	if ca == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	} else {
		parent, signer = ca, caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c, key
}

func TestProxyAuthTrustsOnlyTheProxysCertificate(t *testing.T) {
	ca, caKey := certPair(t, "proxy-ca", nil, nil)
	other, otherKey := certPair(t, "other-ca", nil, nil)
	proxy, _ := certPair(t, "oauth2-proxy", ca, caKey)
	stranger, _ := certPair(t, "oauth2-proxy", other, otherKey)
	wrongName, _ := certPair(t, "someone", ca, caKey)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	a := NewProxyAuth(ProxyOptions{ClientCA: pool, AllowedNames: []string{"oauth2-proxy"}})
	req := func(cert *x509.Certificate, verified bool) *http.Request {
		r := httptest.NewRequest("GET", "/api/v1/map", nil)
		r.Header.Set("X-Remote-User", "alice")
		r.Header.Add("X-Remote-Group", "team-a")
		r.Header.Add("X-Remote-Group", "devs")
		r.Header.Set("X-Remote-Extra-Scopes", "read")
		if cert != nil {
			r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
			if verified {
				r.TLS.VerifiedChains = [][]*x509.Certificate{{cert, ca}}
			}
		}
		return r
	}
	u, err := a.Authenticate(req(proxy, true))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(UserInfo{Name: "alice", Groups: []string{"team-a", "devs"}, Extra: map[string][]string{"scopes": {"read"}}}, u); diff != "" {
		t.Errorf("user (-want,+got):\n%s", diff)
	}
	for name, r := range map[string]*http.Request{
		"no TLS": req(nil, false),
		"a certificate the server did not verify": req(proxy, false),
		"another CA's certificate":                req(stranger, true),
		"a name that is not the proxy's":          req(wrongName, true),
	} {
		if u, err := a.Authenticate(r); err == nil || !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("%s: user %+v err %v, want a refusal", name, u, err)
		}
	}
}

func TestParseDenials(t *testing.T) {
	in := `# HELP partita_webhook_denials_total Refused requests.
# TYPE partita_webhook_denials_total counter
partita_webhook_denials_total{reason="Policy",webhook="mutate-pods"} 3
partita_webhook_denials_total{reason="Policy",webhook="validate-pods"} 1
partita_webhook_denials_total{reason="SystemKey",webhook="validate-pods"} 2
# TYPE other_total counter
other_total 9
`
	got, err := parseDenials(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]float64{"Policy": 4, "SystemKey": 2}, got); diff != "" {
		t.Errorf("denials (-want,+got):\n%s", diff)
	}
}

func TestSubmitPod(t *testing.T) {
	cases := map[string]struct {
		in      SubmitInput
		wantErr string
		want    map[string]string
	}{
		"a fraction": {in: SubmitInput{Namespace: "a", Image: "img", GPUFraction: "0.25", Queue: "q"},
			want: map[string]string{v1alpha1.AnnotationGPUFraction: "0.25"}},
		"memory":       {in: SubmitInput{Namespace: "a", Image: "img", GPUMemory: "20Gi"}, want: map[string]string{v1alpha1.AnnotationGPUMemory: "20Gi"}},
		"whole GPUs":   {in: SubmitInput{Namespace: "a", Image: "img", GPUs: 2}, want: map[string]string{v1alpha1.AnnotationGPUCount: "2"}},
		"no GPU":       {in: SubmitInput{Namespace: "a", Image: "img"}, wantErr: "exactly one of"},
		"two amounts":  {in: SubmitInput{Namespace: "a", Image: "img", GPUs: 1, GPUFraction: "0.5"}, wantErr: "exactly one of"},
		"no image":     {in: SubmitInput{Namespace: "a", GPUs: 1}, wantErr: "image is required"},
		"bad fraction": {in: SubmitInput{Namespace: "a", Image: "img", GPUFraction: "2"}, wantErr: "not valid"},
		"bad name":     {in: SubmitInput{Namespace: "a", Image: "img", GPUs: 1, Name: "Bad_Name"}, wantErr: "name"},
		"bad cpu":      {in: SubmitInput{Namespace: "a", Image: "img", GPUs: 1, CPU: "lots"}, wantErr: "not a quantity"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := submitPod(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, p.Annotations); diff != "" {
				t.Errorf("annotations (-want,+got):\n%s", diff)
			}
			if p.Labels[v1alpha1.LabelQueue] != tc.in.Queue || p.Spec.RestartPolicy != "Never" {
				t.Errorf("pod %+v", p)
			}
		})
	}
}

func TestHistoryKeepsTheWindow(t *testing.T) {
	h := NewHistory(time.Minute, 3*time.Minute)
	t0 := time.Unix(1000, 0)
	for i := range 6 {
		h.Add(Sample{Time: t0.Add(time.Duration(i) * time.Minute), CapacityMilli: 8000, AllocatedMilli: int64(i) * 1000, Queues: map[string]int64{"a": int64(i) * 1000, "secret": 1}})
	}
	u := h.Series(t0, t0.Add(10*time.Minute), func(q string) bool { return q != "secret" })
	if diff := cmp.Diff([]int64{1120, 1180, 1240, 1300}, u.Times); diff != "" {
		t.Errorf("times (-want,+got):\n%s", diff)
	}
	if len(u.Queues) != 1 || u.Queues[0].Queue != "a" || *u.Queues[0].GPUs[3] != 5 || *u.Share[3] != 0.625 {
		t.Errorf("series %+v", u)
	}
}

func TestCheckLoopback(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:0": true, "localhost:8080": true, "[::1]:0": true, "0.0.0.0:8080": false, ":8080": false, "10.0.0.1:80": false} {
		if err := CheckLocalAddr(addr); (err == nil) != ok {
			t.Errorf("%s: err %v, want ok %v", addr, err, ok)
		}
	}
}

// TestVendoredUPlotIsWhatTheScriptFetched: the embedded plotting library
// matches the checksums hack/vendor-uplot.sh recorded, so it is npm's file
// and no hand edit.
func TestVendoredUPlotIsWhatTheScriptFetched(t *testing.T) {
	sums, err := webFiles.ReadFile("web/vendor/VENDOR.txt")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(sums), "\n") {
		sum, name, ok := strings.Cut(line, "  ")
		if !ok || len(sum) != 64 {
			continue
		}
		b, err := webFiles.ReadFile("web/vendor/" + name)
		if err != nil {
			t.Fatal(err)
		}
		got := sha256.Sum256(b)
		if hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s: sha256 %x, VENDOR.txt says %s: run make console-vendor", name, got, sum)
		}
		n++
	}
	if n != 3 {
		t.Errorf("VENDOR.txt lists %d files, want 3", n)
	}
}

// TestProxyHeadersOverTLS: over a real handshake with the shared mode's
// TLS settings, the proxy's client certificate makes its headers count;
// a client without one, or with another CA's, is not the proxy.
func TestProxyHeadersOverTLS(t *testing.T) {
	ca, caKey := certPair(t, "proxy-ca", nil, nil)
	other, otherKey := certPair(t, "other-ca", nil, nil)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	proxy := ProxyOptions{ClientCA: pool, AllowedNames: []string{"oauth2-proxy"}}
	cfg := Config{Proxy: &proxy}
	cfg.defaults()
	tlsConfig, err := servingTLS(cfg)
	if err != nil {
		t.Fatal(err)
	}
	auth := NewProxyAuth(proxy)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := auth.Authenticate(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(u.Name))
	}))
	srv.TLS = tlsConfig
	srv.StartTLS()
	defer srv.Close()
	client := func(cert *x509.Certificate, key *ecdsa.PrivateKey) *http.Client {
		tc := &tls.Config{InsecureSkipVerify: true} //nolint:gosec // the test server's self-signed certificate
		if cert != nil {
			tc.Certificates = []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key}}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
	}
	get := func(c *http.Client) (int, string) {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL, nil)
		req.Header.Set("X-Remote-User", "alice")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		var b strings.Builder
		buf := make([]byte, 512)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	proxyCert, proxyKey := certPair(t, "oauth2-proxy", ca, caKey)
	if code, body := get(client(proxyCert, proxyKey)); code != http.StatusOK || body != "alice" {
		t.Errorf("the proxy: %d %q, want alice", code, body)
	}
	if code, _ := get(client(nil, nil)); code != http.StatusUnauthorized {
		t.Errorf("no certificate: %d, want 401", code)
	}
	// A certificate of another CA fails the handshake itself or is not
	// verified: either way the headers do not count.
	strangerCert, strangerKey := certPair(t, "oauth2-proxy", other, otherKey)
	req, _ := http.NewRequestWithContext(t.Context(), "GET", srv.URL, nil)
	req.Header.Set("X-Remote-User", "alice")
	if resp, err := client(strangerCert, strangerKey).Do(req); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("another CA's certificate made the headers count")
		}
	}
}

func TestBuildWait(t *testing.T) {
	const coalesce, minInterval = 100 * time.Millisecond, 300 * time.Millisecond
	cases := map[string]struct {
		sinceLast, want time.Duration
	}{
		"a change after a quiet spell waits coalesce only": {sinceLast: time.Minute, want: coalesce},
		"just past the interval":                           {sinceLast: minInterval, want: coalesce},
		"under churn, the rest of the interval":            {sinceLast: 50 * time.Millisecond, want: 250 * time.Millisecond},
		"right after a build":                              {sinceLast: 0, want: minInterval},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := buildWait(coalesce, minInterval, tc.sinceLast); got != tc.want {
				t.Errorf("buildWait(%s since the last build) = %s, want %s", tc.sinceLast, got, tc.want)
			}
		})
	}
}

// TestUntakeKeepsChangesPending: changes a build took but did not build
// (its read failed, say a reader's request was cancelled) stay pending,
// dated by the first of them.
func TestUntakeKeepsChangesPending(t *testing.T) {
	clk := testingclock.NewFakePassiveClock(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	s := &Source{opts: SourceOptions{Clock: clk}, changes: make(chan struct{}, 1)}
	s.mark()
	first := clk.Now()
	taken := s.Take()
	if s.Pending() {
		t.Fatal("pending after Take")
	}
	clk.SetTime(first.Add(time.Second))
	s.mark()
	s.Untake(taken)
	if !s.Pending() {
		t.Fatal("not pending after Untake")
	}
	if got := s.Take(); !got.Equal(first) {
		t.Errorf("Take after Untake = %s, want the first change's %s", got, first)
	}
	s.Untake(time.Time{})
	if s.Pending() {
		t.Error("Untake of nothing made a change pending")
	}
}
