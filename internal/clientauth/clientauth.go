// Package clientauth authenticates the callers of Partita's HTTPS
// endpoints by their client certificates: kube-scheduler calling the
// extender, and kube-apiserver calling the admission webhooks. Each server
// verifies the chain in the TLS handshake against a CA bundle read from a
// file (and read again when the file changes), and each protected handler
// checks that the certificate is valid now and names an allowed caller.
// Probes (/healthz, /readyz) need no certificate, so a client may connect
// without one; then every protected path answers 401.
package clientauth

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// CAs reads the CA bundle that verifies client certificates from a file,
// and reads it again when the file changes (a rotated CA from a mounted
// Secret or ConfigMap is used without a restart). The file is looked at no
// more than once per CACheckInterval. Safe for concurrent use.
type CAs struct {
	path     string
	clock    clock.PassiveClock
	interval time.Duration

	lock      sync.Mutex
	pool      *x509.CertPool
	modTime   time.Time
	size      int64
	checkedAt time.Time
}

// CACheckInterval is how often CAs looks at its file; the kubelet updates
// a mounted Secret within about a minute anyway.
const CACheckInterval = 10 * time.Second

// NewCAs reads the CA bundle at path; it fails when the file does not hold
// at least one PEM certificate.
func NewCAs(path string, c clock.PassiveClock) (*CAs, error) {
	if c == nil {
		c = clock.RealClock{}
	}
	cas := &CAs{path: path, clock: c, interval: CACheckInterval}
	if _, err := cas.Pool(); err != nil {
		return nil, err
	}
	return cas, nil
}

// Pool returns the current CA pool. A file that changed but no longer reads
// keeps the last good pool (and returns it with the error), so a Secret
// caught mid-update never locks the caller out.
func (c *CAs) Pool() (*x509.CertPool, error) {
	c.lock.Lock()
	defer c.lock.Unlock()
	now := c.clock.Now()
	if c.pool != nil && now.Sub(c.checkedAt) < c.interval {
		return c.pool, nil
	}
	c.checkedAt = now
	st, err := os.Stat(c.path)
	if err != nil {
		return c.pool, fmt.Errorf("read client CA file %s: %w", c.path, err)
	}
	if c.pool != nil && st.ModTime().Equal(c.modTime) && st.Size() == c.size {
		return c.pool, nil
	}
	b, err := os.ReadFile(c.path)
	if err != nil {
		return c.pool, fmt.Errorf("read client CA file %s: %w", c.path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return c.pool, fmt.Errorf("client CA file %s holds no PEM certificate", c.path)
	}
	c.pool, c.modTime, c.size = pool, st.ModTime(), st.Size()
	return pool, nil
}

// TLSConfig is a server's TLS configuration: the serving certificate from
// getCertificate (asked at each handshake, so a renewed one is served at
// once), and a client certificate verified against cas when the client
// presents one. A certificate that does not verify fails the handshake; a
// client without one connects, and the protected paths refuse it
// (Checker). Session tickets are off, so that every connection verifies
// its certificate against the CA in force.
//
// It offers HTTP/2 (ALPN h2), which kube-scheduler's extender client and
// the API server's webhook client speak: every call then shares one
// connection. Over HTTP/1.1 a client keeps two idle connections, and each
// call beyond two in flight opened a new one, with a full handshake on
// both sides (18% of the extender's CPU in the throughput benchmark). The
// config the client gets is the one GetConfigForClient returns, so it says
// h2 too; the server must serve HTTP/2 (net/http's ServeTLS does by
// default).
func TLSConfig(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), cas *CAs, log logr.Logger) *tls.Config {
	protos := []string{"h2", "http/1.1"}
	base := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCertificate, SessionTicketsDisabled: true, NextProtos: protos}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := cas.Pool()
		if err != nil {
			if pool == nil {
				return nil, err
			}
			log.Error(err, "Could not reload the client CA; verifying with the last good one")
		}
		return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCertificate, SessionTicketsDisabled: true,
			NextProtos: protos, ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool}, nil
	}
	return base
}

// Checker decides whether a request comes from the one caller a server
// serves: the TLS handshake verified its client certificate against the
// client CA, the certificate is still valid now, and its common name is
// allowed.
type Checker struct {
	// AllowedNames are the common names accepted; empty accepts any
	// certificate the client CA signed.
	AllowedNames []string
	// Hint ends every refusal: who may call and what they must present.
	Hint string
	// Clock checks the certificate's validity on each request, since a
	// kept-alive connection outlives the handshake; nil is the real clock.
	Clock clock.PassiveClock
}

// Error is a request refused because it does not come from the allowed
// caller; Status is 401 (no valid certificate) or 403 (a certificate of
// another name).
type Error struct {
	Status int
	Reason string
}

// Error implements error.
func (e *Error) Error() string { return e.Reason }

// IsError reports whether err is, or wraps, an *Error.
func IsError(err error) bool {
	var ae *Error
	return errors.As(err, &ae)
}

// Check returns nil for a request from the allowed caller, else an *Error
// that says what is missing.
func (a Checker) Check(r *http.Request) error {
	if r.TLS == nil {
		return &Error{Status: http.StatusUnauthorized, Reason: "not over TLS; " + a.Hint}
	}
	if len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return &Error{Status: http.StatusUnauthorized, Reason: "no client certificate; " + a.Hint}
	}
	leaf := r.TLS.VerifiedChains[0][0]
	c := a.Clock
	if c == nil {
		c = clock.RealClock{}
	}
	if now := c.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return &Error{Status: http.StatusUnauthorized, Reason: fmt.Sprintf("client certificate %q is valid from %s to %s, not now; %s",
			leaf.Subject.CommonName, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), a.Hint)}
	}
	if len(a.AllowedNames) > 0 && !slices.Contains(a.AllowedNames, leaf.Subject.CommonName) {
		return &Error{Status: http.StatusForbidden, Reason: fmt.Sprintf("client certificate %q is not one of the allowed names (%s; --client-allowed-names); %s",
			leaf.Subject.CommonName, strings.Join(a.AllowedNames, ", "), a.Hint)}
	}
	return nil
}
