package console

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/dra"
)

// Mode is how the console runs.
type Mode string

// Modes.
const (
	// ModeLocal: on the user's machine with their kubeconfig, on loopback,
	// for them alone (partita console).
	ModeLocal Mode = "local"
	// ModeShared: in the cluster for many users (the chart's Deployment),
	// authenticating each request and acting as its caller by
	// impersonation.
	ModeShared Mode = "shared"
)

//go:embed web
var webFiles embed.FS

// Options configure a Server.
type Options struct {
	Mode Mode
	// PartitaNamespace is where Partita runs: the policy ConfigMaps and
	// their events.
	PartitaNamespace string
	// TopologyKey is the node label that groups the map's nodes.
	TopologyKey string
	// GPUClasses are the DeviceClasses whose devices are GPUs;
	// dra.DefaultGPUClasses when nil.
	GPUClasses dra.GPUClasses
	// Coalesce is how long the builder waits after a change for more
	// before it builds a snapshot.
	Coalesce time.Duration
	// MinBuildInterval is the shortest time between the starts of two
	// snapshots: while changes keep coming (pods being scheduled by the
	// hundred) the console builds at most this often, since each snapshot
	// reads every object; a change after a quiet spell waits Coalesce only.
	MinBuildInterval time.Duration
	// DefaultNamespace is the namespace the forms start in.
	DefaultNamespace string
	Log              logr.Logger
	Clock            clock.Clock
}

// Deps are the Server's collaborators, which differ between the modes.
type Deps struct {
	Source  *Source
	Authn   Authenticator
	Authz   Authorizer
	Clients Clients
	Events  *EventCache
	// History is the console's own samples (nil: none).
	History *History
	// Prometheus, when set, serves utilisation and denials.
	Prometheus *Prometheus
	// Webhook counts denials when there is no Prometheus (nil: none).
	Webhook *WebhookScraper
	// Reader reads what the informers do not hold (the policy reload
	// events), as the console.
	Reader client.Reader
}

// Server is the console: the snapshot builder, and the HTTP handler of the
// pages and the API.
type Server struct {
	opts Options
	deps Deps
	kind *WorkloadKinds
	hub  *Hub

	snap    atomic.Pointer[Snapshot]
	version atomic.Uint64
	// buildLock serialises the builds; lastBuild, which it guards, is
	// when the last one began.
	buildLock sync.Mutex
	lastBuild time.Time

	routes  []route
	openapi []byte
	metrics *Metrics
	// hosts, in local mode, are the Host headers the server answers.
	hosts []string
}

// New returns a Server; Run builds its snapshots and Handler serves it.
func New(opts Options, deps Deps) (*Server, error) {
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Coalesce <= 0 {
		opts.Coalesce = 100 * time.Millisecond
	}
	if opts.MinBuildInterval <= 0 {
		opts.MinBuildInterval = 300 * time.Millisecond
	}
	s := &Server{opts: opts, deps: deps, kind: NewWorkloadKinds(), hub: NewHub(), metrics: NewMetrics()}
	s.routes = s.apiRoutes()
	doc, err := openAPIDocument(s.routes)
	if err != nil {
		return nil, err
	}
	s.openapi = doc
	return s, nil
}

// Snapshot is the latest snapshot, nil before the first. It may be older
// than the informers when no page is open: see current.
func (s *Server) Snapshot() *Snapshot { return s.snap.Load() }

// current is the snapshot for a reader that is not a page's stream (an API
// call, the history's sampler): the latest, rebuilt first when changes
// came since it began, unless it began less than MinBuildInterval ago, so
// that a reader sees the cluster at most that late and many readers
// under churn cost at most one build per interval.
func (s *Server) current(ctx context.Context) *Snapshot {
	if err := s.refresh(ctx, s.opts.MinBuildInterval); err != nil {
		s.opts.Log.Error(err, "Build the console's snapshot")
	}
	return s.Snapshot()
}

// refresh builds a snapshot when changes came since the last one began,
// and that began at least minAge ago.
func (s *Server) refresh(ctx context.Context, minAge time.Duration) error {
	if !s.deps.Source.Pending() {
		return nil
	}
	s.buildLock.Lock()
	defer s.buildLock.Unlock()
	// Another reader may have built while this one waited for the lock.
	if !s.deps.Source.Pending() || (s.snap.Load() != nil && s.opts.Clock.Since(s.lastBuild) < minAge) {
		return nil
	}
	return s.buildLocked(ctx)
}

// sinceLastBuild is how long ago the last build began.
func (s *Server) sinceLastBuild() time.Duration {
	s.buildLock.Lock()
	defer s.buildLock.Unlock()
	return s.opts.Clock.Since(s.lastBuild)
}

// Run starts the informers, then builds a snapshot after each batch of
// changes while a page is open (and samples the history) until ctx ends.
// With no page open it builds only when read (current): a snapshot reads
// every object, which under churn (pods scheduled by the hundred) costs
// the console more than everything else it does, and nobody would see
// it. It returns once the informers fail, or nil when ctx ends; ready is
// closed after the first snapshot.
func (s *Server) Run(ctx context.Context, ready chan<- struct{}) error {
	if err := s.deps.Source.Start(ctx); err != nil {
		return err
	}
	log := s.opts.Log
	s.buildLock.Lock()
	err := s.buildLocked(ctx)
	s.buildLock.Unlock()
	if err != nil {
		return err
	}
	if ready != nil {
		close(ready)
	}
	if s.deps.History != nil {
		go s.deps.History.Run(ctx, func() *Snapshot { return s.current(ctx) }, s.opts.Clock.Now)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.deps.Source.Changes():
		}
		if s.hub.Subscribers() == 0 {
			// The change stays pending in the Source until a page opens
			// (its stream starts from current) or something reads.
			continue
		}
		// More changes usually follow one (a pod's bind, then its status):
		// one snapshot for the batch, and under churn one per
		// MinBuildInterval.
		wait := buildWait(s.opts.Coalesce, s.opts.MinBuildInterval, s.sinceLastBuild())
		select {
		case <-ctx.Done():
			return nil
		case <-s.opts.Clock.After(wait):
		}
		if err := s.refresh(ctx, 0); err != nil {
			log.Error(err, "Build the console's snapshot")
		}
	}
}

// buildWait is how long the builder waits after a change before it
// builds: coalesce, and more when the last snapshot began less than
// minInterval ago.
func buildWait(coalesce, minInterval, sinceLast time.Duration) time.Duration {
	return max(coalesce, minInterval-sinceLast)
}

// buildLocked builds a snapshot of the informers and publishes it; the
// caller holds buildLock.
func (s *Server) buildLocked(ctx context.Context) error {
	s.lastBuild = s.opts.Clock.Now()
	changedAt := s.deps.Source.Take()
	l, err := s.deps.Source.Lists(ctx)
	if err != nil {
		// The changes stay pending for the next build: a reader whose
		// request was cancelled must not leave the snapshot stale.
		s.deps.Source.Untake(changedAt)
		return err
	}
	now := s.opts.Clock.Now()
	if changedAt.IsZero() {
		changedAt = now
	}
	start := time.Now()
	snap := Build(l, BuildOptions{TopologyKey: s.opts.TopologyKey, Kinds: s.kind, GPUClasses: s.opts.GPUClasses}, s.version.Add(1), now, changedAt)
	s.metrics.built(time.Since(start))
	s.snap.Store(snap)
	s.hub.Publish()
	return nil
}

// pagePaths are the pages' paths: each serves index.html, whose script
// draws the page the path names.
func pagePaths() []string {
	return []string{"/{$}", "/queues", "/workloads", "/workloads/{kind}/{namespace}/{name}", "/pods/{namespace}/{name}", "/utilization", "/policy", "/models"}
}

// Handler serves the pages, the static files and the API. In local mode
// listen is the listener, whose address the Host header must name.
func (s *Server) Handler(listen net.Addr) http.Handler {
	if s.opts.Mode == ModeLocal && listen != nil {
		s.hosts = loopbackHosts(listen)
	}
	mux := http.NewServeMux()
	static, _ := fs.Sub(webFiles, "web")
	index, _ := fs.ReadFile(static, "index.html")
	for _, p := range pagePaths() {
		mux.HandleFunc("GET "+p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Cache-Control", "no-cache")
			_, _ = w.Write(index)
		})
	}
	files := http.StripPrefix("/static/", http.FileServerFS(static))
	mux.HandleFunc("GET /static/", func(w http.ResponseWriter, r *http.Request) {
		// Files only: no directory listings.
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.Snapshot() == nil {
			http.Error(w, "not ready: the informers have not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	for _, rt := range s.routes {
		mux.Handle(rt.method+" "+rt.path, s.apiHandler(rt))
	}
	// Metrics: open in shared mode, as every component's are; behind the
	// token in local mode, where only the console's user may read them.
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if s.opts.Mode == ModeLocal {
			if _, err := s.deps.Authn.Authenticate(r); err != nil {
				writeError(w, r, err)
				return
			}
		}
		s.metrics.handler().ServeHTTP(w, r)
	})
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, errorf(http.StatusNotFound, "NotFound", "no API operation %s %s: see /api/v1/openapi.json", r.Method, r.URL.Path))
	})
	// Writes from a browser must come from the console's own pages:
	// Sec-Fetch-Site or Origin must say same-origin. Requests without
	// those headers (scripts, curl) pass; they cannot carry a browser's
	// credentials.
	cop := http.NewCrossOriginProtection()
	return s.securityHeaders(s.checkHost(cop.Handler(mux)))
}

// securityHeaders keeps the pages from being framed or from loading
// anything but the console's own files.
func (s *Server) securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		if s.opts.Mode == ModeShared {
			h.Set("Strict-Transport-Security", "max-age=31536000")
		}
		next.ServeHTTP(w, r)
	})
}

// checkHost refuses, in local mode, a Host header other than the console's
// own loopback address: a web page whose name a DNS rebinding points at
// 127.0.0.1 must not reach it.
func (s *Server) checkHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(s.hosts) > 0 && !slices.Contains(s.hosts, strings.ToLower(r.Host)) {
			writeError(w, r, errorf(http.StatusMisdirectedRequest, "MisdirectedRequest",
				"this console answers only for %s (Host %q): open the URL it printed", strings.Join(s.hosts, ", "), r.Host))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// call is one API request being answered.
type call struct {
	s    *Server
	r    *http.Request
	w    http.ResponseWriter
	user UserInfo
	snap *Snapshot
	view *Viewer
}

func (c *call) ctx() context.Context { return c.r.Context() }

// viewer is what the caller may see of the call's snapshot.
func (c *call) viewer() (Viewer, error) {
	if c.view == nil {
		v, err := viewer(c.ctx(), c.s.deps.Authz, c.user, c.snap, c.s.opts.PartitaNamespace)
		if err != nil {
			return Viewer{}, err
		}
		c.view = &v
	}
	return *c.view, nil
}

// allowed asks whether the caller may do a.
func (c *call) allowed(a Attributes) (bool, error) {
	return c.s.deps.Authz.Allowed(c.ctx(), c.user, a)
}

func (s *Server) apiHandler(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rt.id == "openapi" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(s.openapi)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		u, err := s.deps.Authn.Authenticate(r)
		if err != nil {
			if errors.Is(err, ErrUnauthenticated) && s.opts.Mode == ModeShared {
				w.Header().Set("WWW-Authenticate", `Bearer realm="partita-console"`)
			}
			writeError(w, r, err)
			return
		}
		snap := s.current(r.Context())
		if snap == nil {
			writeError(w, r, errorf(http.StatusServiceUnavailable, "ServiceUnavailable", "the console is still reading the cluster; try again in a moment"))
			return
		}
		c := &call{s: s, r: r, w: w, user: u, snap: snap}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody+1)
		if !rt.stream {
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(30 * time.Second))
		}
		out, err := rt.handle(c)
		code := rt.status
		if code == 0 {
			code = http.StatusOK
		}
		if err != nil {
			code = errorBody(err).Code
		}
		s.metrics.request(rt.id, code)
		if rt.stream {
			if err != nil {
				writeError(w, r, err)
			}
			return
		}
		if err != nil {
			s.opts.Log.V(2).Info("API request failed", "method", r.Method, "path", r.URL.Path, "user", u.Name, "err", err.Error())
			writeError(w, r, err)
			return
		}
		status := rt.status
		if status == 0 {
			status = http.StatusOK
		}
		writeJSON(w, r, status, out)
	})
}

func writeError(w http.ResponseWriter, r *http.Request, err error) {
	b := errorBody(err)
	writeJSON(w, r, b.Code, APIError{Error: b})
}

// writeJSON writes v, gzipped when the client takes it and it is large
// (the map of a big cluster shrinks tenfold).
func writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		http.Error(w, "encode the answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if buf.Len() > 4096 && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		w.WriteHeader(status)
		gz, _ := gzip.NewWriterLevel(w, gzip.BestSpeed)
		_, _ = gz.Write(buf.Bytes())
		_ = gz.Close()
		return
	}
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// Serve serves h on l until ctx ends, over TLS when tlsConfig is set. The
// write timeout is left to each handler: the event stream lasts as long
// as the page.
func Serve(ctx context.Context, l net.Listener, h http.Handler, tlsConfig *tls.Config, logger logr.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		TLSConfig:         tlsConfig,
		ErrorLog:          log.New(logWriter{logger.V(3)}, "", 0),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	var err error
	if tlsConfig != nil {
		err = srv.ServeTLS(l, "", "")
	} else {
		err = srv.Serve(l)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve the console on %s: %w", l.Addr(), err)
	}
	<-done
	return nil
}

// logWriter sends net/http's own error log to logr.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info("HTTP server error", "msg", string(bytes.TrimSpace(p)))
	return len(p), nil
}
