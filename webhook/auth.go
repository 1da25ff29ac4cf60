package webhook

import (
	"errors"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/go-logr/logr"

	"github.com/partita-dev/partita/internal/clientauth"
)

// DefaultClientName is the common name of the API server's client
// certificate that the webhook accepts unless told otherwise
// (--client-allowed-names): the name partita dev up gives it and
// docs/install.md asks for.
const DefaultClientName = "partita-apiserver-client"

// Only the API server may send AdmissionReviews: a review is a claim about
// who asked for what, and answering one has side effects (a Rego module
// compiled for /validate-policies, ResourceClaimTemplates created in the
// pod's namespace under the webhook's own ServiceAccount with the dra
// backend). The API server proves who it is with the client certificate
// of its admission configuration's kubeconfig
// (WebhookAdmissionConfiguration kubeConfigFile), signed by the CA of the
// webhook's --client-ca-file; the TLS handshake verifies the chain, and
// requireCaller checks the name before a byte of the review is read.
// Probes and /metrics need no certificate.

// callerHint ends every refusal: what the caller must present.
const callerHint = "only kube-apiserver may call the admission webhooks: give it a client certificate signed by the webhook's --client-ca-file " +
	"through its admission configuration's kubeconfig (partita dev up does; docs/install.md says how on other clusters)"

// CallerCheck is the check of the webhook's callers: the API server's
// client certificate with one of allowedNames (any the CA signed when
// empty).
func CallerCheck(allowedNames []string) clientauth.Checker {
	return clientauth.Checker{AllowedNames: allowedNames, Hint: callerHint}
}

// WithCallerCheck, when on, makes every admission path refuse, with 401 or
// 403 and the reason but no AdmissionReview, a request that check refuses.
// Off (unit tests, --allow-unauthenticated-callers) any caller is
// answered.
func WithCallerCheck(check clientauth.Checker, on bool) ServerOption {
	return func(s *Server) {
		if on {
			s.callers = &check
		}
	}
}

// requireCaller refuses a request that does not come from the API server,
// and counts it.
func (s *Server) requireCaller(c *gin.Context) {
	if s.callers == nil {
		c.Next()
		return
	}
	err := s.callers.Check(c.Request)
	if err == nil {
		c.Next()
		return
	}
	var ae *clientauth.Error
	if !errors.As(err, &ae) {
		ae = &clientauth.Error{Status: http.StatusUnauthorized, Reason: err.Error()}
	}
	reason := badRequestUnauthenticated
	if ae.Status == http.StatusForbidden {
		reason = badRequestForbidden
	}
	s.metrics.badRequest(reason)
	// V(1): whoever can reach the port could otherwise fill the log.
	logr.FromContextOrDiscard(c.Request.Context()).V(1).Info("Refused a request without the API server's certificate",
		"path", c.Request.URL.Path, "remote", c.ClientIP(), "status", ae.Status, "reason", ae.Reason)
	c.String(ae.Status, "%s\n", ae.Reason)
	c.Abort()
}
