package extender

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/gin-gonic/gin"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/partita-dev/partita/internal/httpserver"
)

// Paths the server answers besides the verbs ("/" + Verb...).
const (
	PathHealthz     = httpserver.PathHealthz
	PathReadyz      = httpserver.PathReadyz
	PathMetrics     = httpserver.PathMetrics
	PathDebugLedger = "/debug/ledger"
)

// DefaultMaxRequestBytes bounds a request body: a filter request carries the
// pod (the API server takes objects up to 3 MiB) and up to a few thousand
// node names.
const DefaultMaxRequestBytes int64 = 8 << 20

// Server serves the extender's verbs over HTTP with gin.
type Server struct {
	ext            *Extender
	log            logr.Logger
	metricsHandler http.Handler
	ready          func() error
	maxBytes       int64
	profiling      bool
	debug          bool
	auth           ClientAuth
	clock          clock.PassiveClock
}

// ServerOption configures a Server.
type ServerOption func(*Server)

// WithMetricsHandler serves h (the registry's handler) at /metrics.
func WithMetricsHandler(h http.Handler) ServerOption { return func(s *Server) { s.metricsHandler = h } }

// WithReady makes /readyz answer 503 with the reason while ready returns an
// error.
func WithReady(ready func() error) ServerOption { return func(s *Server) { s.ready = ready } }

// WithMaxRequestBytes bounds a request's body (DefaultMaxRequestBytes).
func WithMaxRequestBytes(n int64) ServerOption { return func(s *Server) { s.maxBytes = n } }

// WithProfiling serves Go's profiler at /debug/pprof/, to kube-scheduler's
// client certificate only, like the verbs.
func WithProfiling(on bool) ServerOption { return func(s *Server) { s.profiling = on } }

// WithDebugEndpoints serves /debug/ledger, to kube-scheduler's client
// certificate only, like the verbs. Off by default: the ledger names every
// pod that holds a GPU.
func WithDebugEndpoints(on bool) ServerOption { return func(s *Server) { s.debug = on } }

// WithClientAuth sets who may call the verbs and the debug endpoints (by
// default a client certificate named DefaultClientName, verified by the
// TLS handshake; see TLSConfig).
func WithClientAuth(a ClientAuth) ServerOption { return func(s *Server) { s.auth = a } }

// WithServerClock sets the clock that times requests for the access log.
func WithServerClock(c clock.PassiveClock) ServerOption { return func(s *Server) { s.clock = c } }

// NewServer returns the HTTP server of ext; log receives the access log and
// reaches the verbs through each request's context.
func NewServer(log logr.Logger, ext *Extender, opts ...ServerOption) *Server {
	s := &Server{ext: ext, log: log, maxBytes: DefaultMaxRequestBytes, clock: clock.RealClock{},
		ready: func() error { return nil }, auth: ClientAuth{AllowedNames: []string{DefaultClientName}}}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Handler returns the gin engine. /healthz, /readyz and /metrics answer
// anyone (probes and Prometheus; the chart's NetworkPolicy limits who
// reaches the port); the verbs and /debug/* answer kube-scheduler's client
// certificate only. gin's mode is process-wide; cmd/partita sets release
// mode once at start.
func (s *Server) Handler() http.Handler {
	// The access log at V(5): kube-scheduler calls for every pod.
	r := httpserver.NewEngine(httpserver.EngineOptions{Log: s.log, AccessLogV: 5, Clock: s.clock, Ready: s.ready, Metrics: s.metricsHandler})
	g := r.Group("/", s.requireClient)
	g.POST("/"+VerbFilter, s.filter)
	g.POST("/"+VerbPrioritize, s.prioritize)
	g.POST("/"+VerbBind, s.bind)
	g.POST("/"+VerbPreempt, s.preempt)
	if s.debug {
		g.GET(PathDebugLedger, s.debugLedger)
	}
	if s.profiling {
		g.GET("/debug/pprof/*profile", gin.WrapF(func(w http.ResponseWriter, req *http.Request) {
			switch req.URL.Path {
			case "/debug/pprof/profile":
				pprof.Profile(w, req)
			case "/debug/pprof/trace":
				pprof.Trace(w, req)
			default:
				pprof.Index(w, req)
			}
		}))
	}
	return r
}

// requireClient refuses, with 401 or 403 and the reason, every request
// that does not come from kube-scheduler, and counts it.
func (s *Server) requireClient(c *gin.Context) {
	err := s.auth.Check(c.Request)
	if err == nil {
		c.Next()
		return
	}
	var ae *AuthError
	if !errors.As(err, &ae) {
		ae = &AuthError{Status: http.StatusUnauthorized, Reason: err.Error()}
	}
	s.ext.metrics.refusedRequest(ae.Status)
	// V(1): whoever can reach the port could otherwise fill the log.
	logr.FromContextOrDiscard(c.Request.Context()).V(1).Info("Refused a request without kube-scheduler's certificate",
		"path", c.Request.URL.Path, "remote", c.ClientIP(), "status", ae.Status, "reason", ae.Reason)
	c.String(ae.Status, "%s\n", ae.Reason)
	c.Abort()
}

// contentTypeJSON is what gin's c.JSON writes.
const contentTypeJSON = "application/json; charset=utf-8"

// serveVerb reads a verb's arguments, calls it, and answers: 400 for a
// request the extender cannot read, fail for any other error (each verb
// tells kube-scheduler in its own way), ok for the result.
func serveVerb[T, R any](s *Server, c *gin.Context, verb string, decode func(string, []byte) (*T, error),
	call func(context.Context, *T) (R, error), fail func(error), ok func(R)) {
	args, read := readArgs(s, c, verb, decode)
	if !read {
		return
	}
	res, err := call(c.Request.Context(), args)
	switch {
	case IsRequestError(err):
		s.badRequest(c, err)
	case err != nil:
		fail(err)
	default:
		ok(res)
	}
}

func (s *Server) filter(c *gin.Context) {
	serveVerb(s, c, VerbFilter, decodeExtenderArgs, s.ext.Filter,
		// kube-scheduler reads Error and tries the pod again later.
		func(err error) { c.JSON(http.StatusOK, &extenderv1.ExtenderFilterResult{Error: err.Error()}) },
		func(res *extenderv1.ExtenderFilterResult) {
			if b, ok := encodeFilterResult(res); ok {
				c.Data(http.StatusOK, contentTypeJSON, b)
				return
			}
			c.JSON(http.StatusOK, res)
		})
}

func (s *Server) prioritize(c *gin.Context) {
	serveVerb(s, c, VerbPrioritize, decodeExtenderArgs, s.ext.Prioritize,
		// HostPriorityList has no error field; kube-scheduler scores
		// without this extender when the call fails.
		func(err error) { c.String(statusFor(err), "%v\n", err) },
		func(res extenderv1.HostPriorityList) {
			c.Data(http.StatusOK, contentTypeJSON, encodeHostPriorityList(res))
		})
}

func (s *Server) bind(c *gin.Context) {
	serveVerb(s, c, VerbBind, decodeArgs[extenderv1.ExtenderBindingArgs],
		func(ctx context.Context, args *extenderv1.ExtenderBindingArgs) (struct{}, error) {
			return struct{}{}, s.ext.Bind(ctx, args)
		},
		// kube-scheduler reads Error, forgets the pod's assumed node and
		// tries the pod again.
		func(err error) {
			if errors.Is(err, ErrNotLeader) {
				// Its next request dials again, and so may reach the
				// leader: a Service (or the dev cluster's proxy) picks a
				// replica per connection, and a kept-alive one would
				// bring every retry back here.
				c.Header("Connection", "close")
			}
			c.JSON(http.StatusOK, &extenderv1.ExtenderBindingResult{Error: err.Error()})
		},
		func(struct{}) { c.JSON(http.StatusOK, &extenderv1.ExtenderBindingResult{}) })
}

func (s *Server) preempt(c *gin.Context) {
	serveVerb(s, c, VerbPreempt, decodeArgs[extenderv1.ExtenderPreemptionArgs], s.ext.Preempt,
		func(err error) { c.String(statusFor(err), "%v\n", err) },
		func(res *extenderv1.ExtenderPreemptionResult) { c.JSON(http.StatusOK, res) })
}

func statusFor(err error) int {
	if errors.Is(err, ErrNotSynced) {
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

func (s *Server) badRequest(c *gin.Context, err error) {
	logr.FromContextOrDiscard(c.Request.Context()).V(1).Info("Refused request", "path", c.Request.URL.Path, "err", err.Error())
	c.String(http.StatusBadRequest, "%v\n", err)
}

// readArgs reads a verb's body and decodes it with decode, answering 400 or
// 413 itself when it cannot.
func readArgs[T any](s *Server, c *gin.Context, verb string, decode func(string, []byte) (*T, error)) (*T, bool) {
	body, code, err := s.readBody(c, verb)
	if err == nil {
		var args *T
		args, err = decode(verb, body)
		if err == nil {
			return args, true
		}
		code = http.StatusBadRequest
	}
	if code == http.StatusBadRequest {
		s.badRequest(c, err)
	} else {
		c.String(code, "%v\n", err)
	}
	return nil, false
}

// readBody reads the body; over the limit it answers 413.
func (s *Server) readBody(c *gin.Context, verb string) ([]byte, int, error) {
	body, err := httpserver.ReadBody(c, s.maxBytes)
	var tl *httpserver.TooLargeError
	switch {
	case errors.As(err, &tl):
		return nil, http.StatusRequestEntityTooLarge, fmt.Errorf("read %s request: %w", verb, err)
	case err != nil:
		return nil, http.StatusBadRequest, &RequestError{Verb: verb, Reason: err.Error()}
	}
	return body, http.StatusOK, nil
}

// decodeArgs decodes a verb's JSON body into T: a JSON object, nothing
// after it. Whether the fields make sense is the verb's to say.
func decodeArgs[T any](verb string, body []byte) (*T, error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, &RequestError{Verb: verb, Reason: "empty body; want the JSON object kube-scheduler sends"}
	}
	if body[0] != '{' {
		return nil, &RequestError{Verb: verb, Reason: "body is not a JSON object"}
	}
	out := new(T)
	if err := json.Unmarshal(body, out); err != nil {
		return nil, &RequestError{Verb: verb, Reason: "decode JSON: " + err.Error()}
	}
	return out, nil
}

// ledgerReport is what /debug/ledger answers: the ledger checked against
// DESIGN §3's invariants, and the allocations the world changed under.
type ledgerReport struct {
	Nodes      int      `json:"nodes"`
	Pods       int      `json:"pods"`
	Assumed    int      `json:"assumed"`
	Violations []string `json:"violations"`
	Stranded   []string `json:"stranded"`
}

func (s *Server) debugLedger(c *gin.Context) {
	l := s.ext.Ledger()
	st := l.State()
	rep := ledgerReport{Nodes: len(st.Nodes), Pods: len(st.Pods), Violations: []string{}, Stranded: []string{}}
	for _, p := range st.Pods {
		if p.Assumed {
			rep.Assumed++
		}
	}
	for _, err := range l.CheckInvariants() {
		rep.Violations = append(rep.Violations, err.Error())
	}
	for _, st := range l.Stranded() {
		rep.Stranded = append(rep.Stranded, fmt.Sprintf("%s/%s on %s: %s %s %s", st.Namespace, st.Name, st.Node, st.Reason, st.DeviceUUID, st.Detail))
	}
	c.JSON(http.StatusOK, &rep)
}

// Serve serves h over TLS with cfg (TLSConfig) on l until ctx ends.
func Serve(ctx context.Context, l net.Listener, h http.Handler, cfg *tls.Config) error {
	if cfg == nil {
		return errors.New("serve the scheduler extender: no TLS configuration; the extender serves HTTPS only")
	}
	return httpserver.ServeTLSConfig(ctx, l, h, cfg, "the scheduler extender")
}
