package extender

import (
	"crypto/tls"
	"net/http"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/partita-dev/partita/internal/clientauth"
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
// handshake verifies the chain, and the handler checks the name
// (internal/clientauth). Probes (/healthz, /readyz) and /metrics need no
// certificate.

// ClientCAs reads the CA bundle that verifies kube-scheduler's client
// certificates (clientauth.CAs).
type ClientCAs = clientauth.CAs

// clientCACheckInterval is how often ClientCAs looks at its file.
const clientCACheckInterval = clientauth.CACheckInterval

// NewClientCAs reads the CA bundle at path; it fails when the file does not
// hold at least one PEM certificate.
func NewClientCAs(path string, c clock.PassiveClock) (*ClientCAs, error) {
	return clientauth.NewCAs(path, c)
}

// TLSConfig is the extender's TLS configuration (clientauth.TLSConfig):
// kube-scheduler's certificate verified when given, HTTP/2 offered.
func TLSConfig(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs *ClientCAs, log logr.Logger) *tls.Config {
	return clientauth.TLSConfig(getCertificate, clientCAs, log)
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
type AuthError = clientauth.Error

// IsAuthError reports whether err is, or wraps, an *AuthError.
func IsAuthError(err error) bool { return clientauth.IsError(err) }

// authHint ends every refusal: what the caller must present.
const authHint = "only kube-scheduler may call the extender: configure its extenders[].tlsConfig with certFile and keyFile " +
	"of a client certificate signed by the extender's --client-ca-file (the chart and partita dev up do; see docs/operations.md)"

// Check returns nil for a request from kube-scheduler, else an *AuthError
// that says what is missing.
func (a ClientAuth) Check(r *http.Request) error {
	return clientauth.Checker{AllowedNames: a.AllowedNames, Hint: authHint, Clock: a.Clock}.Check(r)
}
