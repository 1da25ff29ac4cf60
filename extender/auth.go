package extender

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

// DefaultClientName is the common name of kube-scheduler's client
// certificate that the extender accepts unless told otherwise
// (--client-allowed-names): the name the chart gives it.
const DefaultClientName = "partita-scheduler"

// Only kube-scheduler may call the verbs: each carries a pod and, for bind,
// a node, and the extender acts on them with its cluster-wide pods/binding.
// kube-scheduler proves who it is with a client certificate
// (KubeSchedulerConfiguration extenders[].tlsConfig.certFile/keyFile)
// signed by a CA that Partita manages and used for nothing else; the TLS
// handshake verifies the chain, and the handler checks the name. Probes
// (/healthz, /readyz) and /metrics need no certificate, so a client may
// connect without one; then every protected path answers 401.

// ClientCAs reads the CA bundle that verifies client certificates from a
// file, and reads it again when the file changes (a rotated CA from a
// mounted Secret is used without a restart). The file is looked at no more
// than once per check interval. Safe for concurrent use.
type ClientCAs struct {
	path     string
	clock    clock.PassiveClock
	interval time.Duration

	lock      sync.Mutex
	pool      *x509.CertPool
	modTime   time.Time
	size      int64
	checkedAt time.Time
}

// clientCACheckInterval is how often ClientCAs looks at its file; the
// kubelet updates a mounted Secret within about a minute anyway.
const clientCACheckInterval = 10 * time.Second

// NewClientCAs reads the CA bundle at path; it fails when the file does not
// hold at least one PEM certificate.
func NewClientCAs(path string, c clock.PassiveClock) (*ClientCAs, error) {
	if c == nil {
		c = clock.RealClock{}
	}
	cas := &ClientCAs{path: path, clock: c, interval: clientCACheckInterval}
	if _, err := cas.Pool(); err != nil {
		return nil, err
	}
	return cas, nil
}

// Pool returns the current CA pool. A file that changed but no longer reads
// keeps the last good pool (and returns it with the error), so a Secret
// caught mid-update never locks kube-scheduler out.
func (c *ClientCAs) Pool() (*x509.CertPool, error) {
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

// TLSConfig is the extender's TLS configuration: the serving certificate
// from getCertificate (asked at each handshake, so a renewed one is served
// at once), and a client certificate verified against clientCAs when the
// client presents one. A certificate that does not verify fails the
// handshake; a client without one connects, and the protected paths refuse
// it (ClientAuth). Session tickets are off, so that every connection
// verifies its certificate against the CA in force.
//
// It offers HTTP/2 (ALPN h2), which kube-scheduler's extender client
// speaks: every call then shares one connection. Over HTTP/1.1 the client
// keeps two idle connections, and each bind beyond two in flight (binds
// wait on the API server) opened a new one, with a full handshake on both
// sides: 18% of the extender's CPU in the throughput benchmark. The config the
// client gets is the one GetConfigForClient returns, so it says h2 too;
// the server must serve HTTP/2 (net/http's ServeTLS does by default).
func TLSConfig(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs *ClientCAs, log logr.Logger) *tls.Config {
	protos := []string{"h2", "http/1.1"}
	base := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCertificate, SessionTicketsDisabled: true, NextProtos: protos}
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := clientCAs.Pool()
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

// ClientAuth decides whether a request comes from kube-scheduler: the TLS
// handshake verified its client certificate against the client CA, the
// certificate is still valid now, and its common name is allowed.
type ClientAuth struct {
	// AllowedNames are the common names accepted; empty accepts any
	// certificate the client CA signed.
	AllowedNames []string
	// Clock checks the certificate's validity on each request, since a
	// kept-alive connection outlives the handshake; nil is the real clock.
	Clock clock.PassiveClock
}

// AuthError is a request refused because it does not come from
// kube-scheduler; Status is 401 (no valid certificate) or 403 (a
// certificate of another name).
type AuthError struct {
	Status int
	Reason string
}

// Error implements error.
func (e *AuthError) Error() string { return e.Reason }

// IsAuthError reports whether err is, or wraps, an *AuthError.
func IsAuthError(err error) bool {
	var ae *AuthError
	return errors.As(err, &ae)
}

// authHint ends every refusal: what the caller must present.
const authHint = "only kube-scheduler may call the extender: configure its extenders[].tlsConfig with certFile and keyFile " +
	"of a client certificate signed by the extender's --client-ca-file (the chart and partita dev up do; see docs/operations.md)"

// Check returns nil for a request from kube-scheduler, else an *AuthError
// that says what is missing.
func (a ClientAuth) Check(r *http.Request) error {
	if r.TLS == nil {
		return &AuthError{Status: http.StatusUnauthorized, Reason: "not over TLS; " + authHint}
	}
	if len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return &AuthError{Status: http.StatusUnauthorized, Reason: "no client certificate; " + authHint}
	}
	leaf := r.TLS.VerifiedChains[0][0]
	c := a.Clock
	if c == nil {
		c = clock.RealClock{}
	}
	if now := c.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return &AuthError{Status: http.StatusUnauthorized, Reason: fmt.Sprintf("client certificate %q is valid from %s to %s, not now; %s",
			leaf.Subject.CommonName, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), authHint)}
	}
	if len(a.AllowedNames) > 0 && !slices.Contains(a.AllowedNames, leaf.Subject.CommonName) {
		return &AuthError{Status: http.StatusForbidden, Reason: fmt.Sprintf("client certificate %q is not one of the allowed names (%s; --client-allowed-names); %s",
			leaf.Subject.CommonName, strings.Join(a.AllowedNames, ", "), authHint)}
	}
	return nil
}
