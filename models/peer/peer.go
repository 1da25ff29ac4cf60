// Package peer lets a node's model cache fetch a model from another node's
// cache instead of its source, so that the source serves each model version
// about once per cluster. Each cache serves its complete entries over HTTPS
// (GET and HEAD with ranges, /v1/entries/VERSION/PATH) with a certificate it
// makes at start, whose SHA-256 it publishes in its Model status entries
// (status.nodes[].peer); a caller presents its ServiceAccount token (audience
// Audience), which the server checks with a TokenReview and compares with
// the model caches' ServiceAccount. A caller pins the certificate it read
// from the Model's status, so that no one else can pose as a peer and
// collect tokens.
package peer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/utils/clock"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/models/cache"
	"github.com/partita-dev/partita/models/fetch"
)

// Audience is the audience of the tokens peers present.
const Audience = "models.partita.dev"

// PathPrefix starts the URL of an entry's file.
const PathPrefix = "/v1/entries/"

// Certificate makes the server's self-signed certificate for ip and
// returns it with its SHA-256 (DER, hex), which peers pin.
func Certificate(ip string) (tls.Certificate, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return tls.Certificate{}, "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "partita-model-cache"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if parsed := net.ParseIP(ip); parsed != nil {
		tmpl.IPAddresses = []net.IP{parsed}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, "", err
	}
	sum := sha256.Sum256(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, hex.EncodeToString(sum[:]), nil
}

// Authenticator says whether a bearer token is a model cache's.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) error
}

// TokenReviewer checks tokens with the API server (TokenReview) and keeps
// the answer a minute.
type TokenReviewer struct {
	Client authenticationclient.TokenReviewsGetter
	// Allowed is the username a peer's token must have:
	// system:serviceaccount:NAMESPACE:NAME of the model caches.
	Allowed string
	Clock   clock.PassiveClock

	mu   sync.Mutex
	seen map[[32]byte]time.Time
}

// ErrUnauthorized says the caller is not a model cache.
var ErrUnauthorized = errors.New("not a model cache")

// Authenticate implements Authenticator.
func (r *TokenReviewer) Authenticate(ctx context.Context, token string) error {
	if token == "" {
		return fmt.Errorf("%w: no bearer token", ErrUnauthorized)
	}
	key := sha256.Sum256([]byte(token))
	now := r.Clock.Now()
	r.mu.Lock()
	if until, ok := r.seen[key]; ok && now.Before(until) {
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()
	tr, err := r.Client.TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{Audience}}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("review the token: %w", err)
	}
	st := tr.Status
	switch {
	case !st.Authenticated:
		return fmt.Errorf("%w: %s", ErrUnauthorized, st.Error)
	case st.User.Username != r.Allowed:
		return fmt.Errorf("%w: the token is %s's", ErrUnauthorized, st.User.Username)
	}
	r.mu.Lock()
	if r.seen == nil || len(r.seen) > 10_000 {
		r.seen = map[[32]byte]time.Time{}
	}
	r.seen[key] = now.Add(time.Minute)
	r.mu.Unlock()
	return nil
}

// Server serves a cache's complete entries to authenticated peers.
type Server struct {
	Cache *cache.Cache
	Auth  Authenticator
	Log   logr.Logger
	// Served counts the bytes sent to peers (nil: not counted).
	Served func(n int64)
}

// ServeHTTP answers GET and HEAD of /v1/entries/VERSION/PATH, with ranges.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "GET or HEAD only", http.StatusMethodNotAllowed)
		return
	}
	token, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if err := s.Auth.Authenticate(r.Context(), token); err != nil {
		s.Log.V(1).Info("Refused a peer", "remote", r.RemoteAddr, "error", err.Error())
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, PathPrefix)
	key, rel, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || !fs.ValidPath(rel) || rel == "." || !s.Cache.Has(key) {
		http.NotFound(w, r)
		return
	}
	// A served entry is not evicted under the reader.
	s.Cache.Pin(key)
	defer s.Cache.Unpin(key)
	root, err := os.OpenRoot(s.Cache.Path(key))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer func() { _ = root.Close() }()
	f, err := root.Open(rel)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	cw := &countingWriter{ResponseWriter: w}
	http.ServeContent(cw, r, fi.Name(), fi.ModTime(), f)
	if s.Served != nil {
		s.Served(cw.n)
	}
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// Source reads one peer's copy of an entry: a fetch.Source over HTTPS with
// the peer's certificate pinned and the caller's token.
type Source struct {
	*fetch.HTTP
	base string
}

// NewSource returns the source for key at p, presenting token.
func NewSource(p v1alpha1.ModelPeer, key, token string) (*Source, error) {
	u, err := url.Parse(p.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("peer %q: not an https URL", p.URL)
	}
	want, err := hex.DecodeString(p.CertSHA256)
	if err != nil || len(want) != sha256.Size {
		return nil, fmt.Errorf("peer %q: certificate digest %q is not a SHA-256", p.URL, p.CertSHA256)
	}
	tlsConfig := &tls.Config{
		MinVersion: tls.VersionTLS13,
		// The certificate is checked against the digest the peer published
		// in the Model's status, not against a CA.
		InsecureSkipVerify: true, //nolint:gosec // pinned in VerifyPeerCertificate
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("the peer sent no certificate")
			}
			got := sha256.Sum256(raw[0])
			if !bytes.Equal(got[:], want) {
				return fmt.Errorf("the peer's certificate is not the one its Model status names (sha256 %x)", got)
			}
			return nil
		},
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, MaxIdleConnsPerHost: 16}, Timeout: 5 * time.Minute}
	return &Source{
		HTTP: &fetch.HTTP{Client: client, Header: http.Header{"Authorization": {"Bearer " + token}}},
		base: strings.TrimSuffix(p.URL, "/") + PathPrefix + url.PathEscape(key) + "/",
	}, nil
}

// Name is the URL of the entry's file at path.
func (s *Source) Name(path string) string {
	segs := strings.Split(path, "/")
	for i, p := range segs {
		segs[i] = url.PathEscape(p)
	}
	return s.base + strings.Join(segs, "/")
}
