// Package httpserver holds the HTTP plumbing that Partita's servers (the
// webhook and the scheduler extender) share: a gin engine with an access log
// through logr, panic recovery, health, readiness and metrics endpoints; a
// body reader that refuses oversized requests before reading them; and a
// server that serves plain HTTP or TLS with a certificate read at each
// handshake, until its context ends.
package httpserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// Paths every server answers.
const (
	PathHealthz = "/healthz"
	PathReadyz  = "/readyz"
	PathMetrics = "/metrics"
)

// EngineOptions configure NewEngine.
type EngineOptions struct {
	// Log receives the access log and reaches handlers through each
	// request's context.
	Log logr.Logger
	// AccessLogV is the verbosity of the access log lines.
	AccessLogV int
	// Clock times requests; nil means the real clock.
	Clock clock.PassiveClock
	// Ready makes /readyz answer 503 with the reason while it returns an
	// error; nil means always ready.
	Ready func() error
	// Metrics, when set, is served at /metrics.
	Metrics http.Handler
}

// NewEngine returns a gin engine with the access log, panic recovery,
// /healthz, /readyz and (when set) /metrics. gin's mode is process-wide;
// cmd/partita sets release mode once at start.
func NewEngine(o EngineOptions) *gin.Engine {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	r := gin.New()
	r.Use(accessLog(o), gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, err any) {
		logr.FromContextOrDiscard(c.Request.Context()).Error(fmt.Errorf("panic: %v", err), "Recovered from a panic", "path", c.Request.URL.Path)
		c.AbortWithStatus(http.StatusInternalServerError)
	}))
	r.GET(PathHealthz, func(c *gin.Context) { c.String(http.StatusOK, "ok\n") })
	r.GET(PathReadyz, func(c *gin.Context) {
		if o.Ready != nil {
			if err := o.Ready(); err != nil {
				c.String(http.StatusServiceUnavailable, "not ready: %v\n", err)
				return
			}
		}
		c.String(http.StatusOK, "ok\n")
	})
	if o.Metrics != nil {
		r.GET(PathMetrics, gin.WrapH(o.Metrics))
	}
	return r
}

// accessLog puts the logger into each request's context and logs the
// request when it is done.
func accessLog(o EngineOptions) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := o.Clock.Now()
		c.Request = c.Request.WithContext(logr.NewContext(c.Request.Context(), o.Log))
		c.Next()
		if log := o.Log.V(o.AccessLogV); log.Enabled() {
			log.Info("Served request", "method", c.Request.Method, "path", c.Request.URL.Path,
				"status", c.Writer.Status(), "bytes", c.Writer.Size(), "latency", o.Clock.Since(start), "remote", c.ClientIP())
		}
	}
}

// TooLargeError is a request body over the limit; servers answer 413.
type TooLargeError struct {
	// Length is the declared length, 0 when unknown.
	Length int64
	// Limit is the most accepted.
	Limit int64
}

// Error implements error.
func (e *TooLargeError) Error() string {
	if e.Length > 0 {
		return fmt.Sprintf("request body of %d bytes is over the limit of %d bytes (--max-request-bytes)", e.Length, e.Limit)
	}
	return fmt.Sprintf("request body is over the limit of %d bytes (--max-request-bytes)", e.Limit)
}

// ReadBody reads a request's body, at most limit bytes: a body that says
// it is longer is refused before it is read, one that turns out longer is
// cut off, both with a *TooLargeError, so memory stays bounded whatever a
// client sends.
func ReadBody(c *gin.Context, limit int64) ([]byte, error) {
	r := c.Request
	if r.ContentLength > limit {
		return nil, &TooLargeError{Length: r.ContentLength, Limit: limit}
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	if _, err := buf.ReadFrom(http.MaxBytesReader(c.Writer, r.Body, limit)); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return nil, &TooLargeError{Limit: limit}
		}
		return nil, fmt.Errorf("read body: %w", err)
	}
	return buf.Bytes(), nil
}

// Serve serves h on l until ctx ends: over TLS when getCertificate is set
// (it is asked at each handshake, so a renewed certificate is served
// without a restart), else plain HTTP. what names the server in logs and
// errors.
func Serve(ctx context.Context, l net.Listener, h http.Handler, getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), what string) error {
	var cfg *tls.Config
	if getCertificate != nil {
		cfg = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: getCertificate}
	}
	return ServeTLSConfig(ctx, l, h, cfg, what)
}

// ServeTLSConfig serves h on l until ctx ends, over TLS with cfg (which
// must give the serving certificate, directly or through
// GetConfigForClient), or plain HTTP when cfg is nil.
func ServeTLSConfig(ctx context.Context, l net.Listener, h http.Handler, cfg *tls.Config, what string) error {
	logger := logr.FromContextOrDiscard(ctx)
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          log.New(logWriter{logger.V(3)}, "", 0),
		TLSConfig:         cfg,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	logger.Info("Serving "+what, "addr", l.Addr().String(), "tls", cfg != nil)
	var err error
	if cfg != nil {
		err = srv.ServeTLS(l, "", "")
	} else {
		err = srv.Serve(l)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s on %s: %w", what, l.Addr(), err)
	}
	<-done
	return nil
}

// logWriter sends net/http's own error log (TLS handshake failures) to logr.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.log.Info("HTTP server error", "msg", string(bytes.TrimSpace(p)))
	return len(p), nil
}
