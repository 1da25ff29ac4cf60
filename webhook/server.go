package webhook

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/partita-dev/partita/internal/clientauth"
	"github.com/partita-dev/partita/internal/httpserver"
)

// Paths the webhook serves.
const (
	PathMutatePods        = "/mutate-pods"
	PathValidatePods      = "/validate-pods"
	PathValidatePolicies  = "/validate-policies"
	PathValidatePodGroups = "/validate-podgroups"
	PathHealthz           = httpserver.PathHealthz
	PathReadyz            = httpserver.PathReadyz
	PathMetrics           = httpserver.PathMetrics
)

// DefaultMaxRequestBytes bounds an AdmissionReview's body. The API server
// takes objects of up to 3 MiB and an UPDATE review carries two of them,
// so 7 MiB leaves room for both and the envelope while a larger body is
// refused before it is read.
const DefaultMaxRequestBytes int64 = 7 << 20

// Server serves the admission webhooks over HTTP with gin.
type Server struct {
	pods           *PodAdmission
	policies       *PolicyAdmission
	podGroups      *PodGroupAdmission
	metrics        *Metrics
	metricsHandler http.Handler
	ready          func() error
	maxBytes       int64
	clock          clock.PassiveClock
	callers        *clientauth.Checker
	log            logr.Logger
}

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithMetrics records metrics in m and serves h (the registry's handler) at
// /metrics.
func WithMetrics(m *Metrics, h http.Handler) ServerOption {
	return func(s *Server) { s.metrics, s.metricsHandler = m, h }
}

// WithReady makes /readyz answer 503 with the reason while ready returns an
// error.
func WithReady(ready func() error) ServerOption { return func(s *Server) { s.ready = ready } }

// WithMaxRequestBytes bounds the body of a request (DefaultMaxRequestBytes
// by default).
func WithMaxRequestBytes(n int64) ServerOption { return func(s *Server) { s.maxBytes = n } }

// WithPolicyAdmission serves the policy ConfigMap webhook.
func WithPolicyAdmission(p *PolicyAdmission) ServerOption { return func(s *Server) { s.policies = p } }

// WithPodGroupAdmission serves the PodGroup webhook.
func WithPodGroupAdmission(p *PodGroupAdmission) ServerOption {
	return func(s *Server) { s.podGroups = p }
}

// WithServerClock sets the clock that times requests.
func WithServerClock(c clock.PassiveClock) ServerOption { return func(s *Server) { s.clock = c } }

// NewServer returns the webhook server; log receives the access log and the
// decisions, and reaches handlers through the request's context.
func NewServer(log logr.Logger, pods *PodAdmission, opts ...ServerOption) *Server {
	s := &Server{pods: pods, maxBytes: DefaultMaxRequestBytes, clock: clock.RealClock{}, log: log,
		ready: func() error { return nil }}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Handler returns the gin engine. gin's mode is process-wide; cmd/partita
// sets release mode once at start.
func (s *Server) Handler() http.Handler {
	r := httpserver.NewEngine(httpserver.EngineOptions{Log: s.log, AccessLogV: 3, Clock: s.clock, Ready: s.ready, Metrics: s.metricsHandler})
	r.POST(PathMutatePods, s.requireCaller, s.review("mutate-pods", s.pods.Mutate, decodePodReview))
	r.POST(PathValidatePods, s.requireCaller, s.review("validate-pods", s.pods.Validate, decodePodReview))
	if s.policies != nil {
		r.POST(PathValidatePolicies, s.requireCaller, s.review("validate-policies", s.policies.Validate, decodeReview))
	}
	if s.podGroups != nil {
		r.POST(PathValidatePodGroups, s.requireCaller, s.review("validate-podgroups", s.podGroups.Validate, decodeReview))
	}
	return r
}

// reviewFunc decides one admission request.
type reviewFunc func(ctx context.Context, req *admissionv1.AdmissionRequest) Result

// review reads an AdmissionReview with decode, decides it with fn, and
// writes the response review.
func (s *Server) review(name string, fn reviewFunc, decode func([]byte) (*admissionv1.AdmissionReview, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := s.clock.Now()
		ctx := c.Request.Context()
		log := logr.FromContextOrDiscard(ctx)
		ar, code, err := s.readReview(c, decode)
		if err != nil {
			reason := badRequestDecode
			if code == http.StatusRequestEntityTooLarge {
				reason = badRequestTooLarge
			}
			s.metrics.badRequest(reason)
			log.V(1).Info("Refused request", "webhook", name, "status", code, "err", err.Error())
			c.String(code, "%v\n", err)
			return
		}
		req := ar.Request
		res := fn(ctx, req)
		resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: res.Err == nil}
		switch de, isDenial := asDenial(res.Err); {
		case res.Err == nil && len(res.Patch) > 0:
			patch, err := json.Marshal(res.Patch)
			if err != nil {
				res.Err = fmt.Errorf("marshal patch: %w", err)
				resp.Allowed = false
				resp.Result = internalStatus(res.Err)
				break
			}
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType = patch, &pt
		case isDenial:
			resp.Result = de.status()
		case res.Err != nil:
			resp.Result = internalStatus(res.Err)
		}
		out := admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
			Response: resp,
		}
		c.JSON(http.StatusOK, &out)
		s.metrics.observe(name, string(req.Operation), s.clock.Since(start), res)
		logDecision(log, name, req, res)
	}
}

func internalStatus(err error) *metav1.Status {
	return &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusInternalServerError,
		Reason: metav1.StatusReasonInternalError, Message: "Partita's webhook failed: " + err.Error()}
}

// readReview reads and decodes the body. Bodies over the limit are refused
// with 413 before they are read whole, so memory stays bounded whatever a
// client sends.
func (s *Server) readReview(c *gin.Context, decode func([]byte) (*admissionv1.AdmissionReview, error)) (*admissionv1.AdmissionReview, int, error) {
	body, err := httpserver.ReadBody(c, s.maxBytes)
	var tl *httpserver.TooLargeError
	switch {
	case errors.As(err, &tl) && tl.Length > 0:
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body of %d bytes is over the webhook's limit of %d bytes (--max-request-bytes)", tl.Length, tl.Limit)
	case errors.As(err, &tl):
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("request body is over the webhook's limit of %d bytes (--max-request-bytes)", tl.Limit)
	case err != nil:
		return nil, http.StatusBadRequest, fmt.Errorf("read request body: %w", err)
	}
	ar, err := decode(body)
	if err != nil {
		return nil, http.StatusBadRequest, err
	}
	return ar, http.StatusOK, nil
}

// decodeReview reads an AdmissionReview v1 with a request.
func decodeReview(body []byte) (*admissionv1.AdmissionReview, error) {
	ar := &admissionv1.AdmissionReview{}
	if err := json.Unmarshal(body, ar); err != nil {
		return nil, fmt.Errorf("decode AdmissionReview: %w", err)
	}
	if ar.APIVersion != admissionv1.SchemeGroupVersion.String() || ar.Kind != "AdmissionReview" {
		return nil, fmt.Errorf("expected an admission.k8s.io/v1 AdmissionReview, got apiVersion %q kind %q (the webhook configuration must list admissionReviewVersions: [v1])", ar.APIVersion, ar.Kind)
	}
	if ar.Request == nil {
		return nil, errors.New("the AdmissionReview has no request")
	}
	return ar, nil
}

// logDecision logs each decision at V(2); failures as errors.
func logDecision(log logr.Logger, webhook string, req *admissionv1.AdmissionRequest, res Result) {
	if res.Err == nil && !log.V(2).Enabled() {
		// Most requests: nothing to log, and nothing to build.
		return
	}
	kv := []any{"webhook", webhook, "operation", req.Operation, "kind", req.Kind.Kind,
		"object", klog.KRef(req.Namespace, req.Name), "user", req.UserInfo.Username}
	if req.SubResource != "" {
		kv = append(kv, "subresource", req.SubResource)
	}
	if res.Dialect != "" {
		kv = append(kv, "dialect", res.Dialect)
	}
	de, isDenial := asDenial(res.Err)
	switch {
	case res.Err == nil:
		log.V(2).Info("Admitted", append(kv, "patchOps", len(res.Patch))...)
	case isDenial:
		log.V(2).Info("Denied", append(kv, "reason", de.Reason, "message", shortenMessage(de.Error()))...)
	default:
		log.Error(res.Err, "Failed to decide", kv...)
	}
}

func shortenMessage(s string) string {
	const max = 512
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// ServeTLS serves h on l with TLS until ctx ends. getCertificate is asked
// for the certificate at each handshake, so a renewed certificate is used
// without a restart (see WatchCertificates). With callerCAs, a client
// certificate is verified against them when the caller presents one (the
// API server's; WithCallerCheck refuses callers without one); nil asks
// for none.
func ServeTLS(ctx context.Context, l net.Listener, h http.Handler, getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error),
	callerCAs *clientauth.CAs, log logr.Logger) error {
	if getCertificate == nil {
		return errors.New("serve admission webhooks: no certificate; the API server calls webhooks over TLS only")
	}
	if callerCAs == nil {
		return httpserver.Serve(ctx, l, h, getCertificate, "admission webhooks")
	}
	return httpserver.ServeTLSConfig(ctx, l, h, clientauth.TLSConfig(getCertificate, callerCAs, log), "admission webhooks")
}
