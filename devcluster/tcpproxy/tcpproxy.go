// Package tcpproxy is the dev cluster's layer-4 forwarder: it takes TCP
// connections on one address and splices each to one of several backends,
// as a Service would, without terminating TLS, so that the client and the
// backend authenticate each other end to end (kube-scheduler's client
// certificate reaches the extender untouched).
//
// Each connection goes to the first backend that accepts it, in order of
// what a Probe last said of them (Preferred, then Ready, then NotReady, each
// in the order given): a backend that refuses is skipped, and one that is
// not ready is tried only when no ready one accepts. It is small and
// dev-only; nothing in go.mod offers a forwarder with readiness.
package tcpproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// State is what a probe found a backend to be.
type State int

const (
	// NotReady backends are tried only after every other.
	NotReady State = iota
	// Ready backends take connections.
	Ready
	// Preferred backends take connections before ready ones (the
	// extender's leader, the only replica that binds).
	Preferred
)

func (s State) String() string {
	switch s {
	case Ready:
		return "Ready"
	case Preferred:
		return "Preferred"
	default:
		return "NotReady"
	}
}

// Probe says what a backend (host:port) is now. It must return within the
// context's deadline.
type Probe func(ctx context.Context, backend string) State

// Option configures a Proxy.
type Option func(*Proxy)

// WithProbe polls every backend with probe every interval. Without it
// every backend is NotReady and connections try them in order. A single
// backend is never probed: there is nothing to choose.
func WithProbe(probe Probe, interval time.Duration) Option {
	return func(p *Proxy) { p.probe, p.interval = probe, interval }
}

// WithClock sets the clock of the probe loop (tests).
func WithClock(c clock.WithTicker) Option { return func(p *Proxy) { p.clock = c } }

// WithLogger sets the logger.
func WithLogger(l logr.Logger) Option { return func(p *Proxy) { p.log = l } }

// WithDialTimeout bounds each connection attempt to a backend.
func WithDialTimeout(d time.Duration) Option { return func(p *Proxy) { p.dialTimeout = d } }

// Proxy forwards connections to backends.
type Proxy struct {
	backends    []string
	probe       Probe
	interval    time.Duration
	clock       clock.WithTicker
	log         logr.Logger
	dialTimeout time.Duration

	lock   sync.Mutex
	states map[string]State
	// conns are the open client and backend connections, closed when
	// Serve's context ends.
	conns map[net.Conn]struct{}
}

// New returns a proxy to backends (host:port each, at least one).
func New(backends []string, opts ...Option) (*Proxy, error) {
	if len(backends) == 0 {
		return nil, errors.New("create proxy: no backends")
	}
	for _, b := range backends {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return nil, fmt.Errorf("create proxy: backend %q: %w", b, err)
		}
	}
	p := &Proxy{
		backends:    slices.Clone(backends),
		clock:       clock.RealClock{},
		log:         logr.Discard(),
		dialTimeout: 2 * time.Second,
		states:      map[string]State{},
		conns:       map[net.Conn]struct{}{},
	}
	for _, o := range opts {
		o(p)
	}
	if p.probe != nil && p.interval <= 0 {
		return nil, fmt.Errorf("create proxy: probe interval %s: want a positive duration", p.interval)
	}
	return p, nil
}

// States returns what the last probes found, by backend.
func (p *Proxy) States() map[string]State {
	p.lock.Lock()
	defer p.lock.Unlock()
	out := make(map[string]State, len(p.backends))
	for _, b := range p.backends {
		out[b] = p.states[b]
	}
	return out
}

// order lists the backends to try for a new connection.
func (p *Proxy) order() []string {
	p.lock.Lock()
	defer p.lock.Unlock()
	out := slices.Clone(p.backends)
	// Stable: backends in the same state keep the order they were given, so
	// that connections stick to one replica as a kept-alive connection
	// through a Service would.
	slices.SortStableFunc(out, func(a, b string) int { return int(p.states[b]) - int(p.states[a]) })
	return out
}

// Serve accepts connections on l until ctx ends, then closes l and every
// connection it forwards and returns once their goroutines have ended. It
// returns nil when ctx ended, else the accept error.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		_ = l.Close()
		p.closeAll()
		wg.Wait()
	}()
	if p.probe != nil && len(p.backends) > 1 {
		wg.Go(func() { p.probeLoop(ctx) })
	}
	// Accept blocks; closing the listener is what ends it.
	wg.Go(func() {
		<-ctx.Done()
		_ = l.Close()
	})
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept on %s: %w", l.Addr(), err)
		}
		if !p.track(conn) {
			_ = conn.Close()
			continue
		}
		wg.Go(func() { p.forward(ctx, conn) })
	}
}

// track adds c to the open connections; false once Serve is closing.
func (p *Proxy) track(c net.Conn) bool {
	p.lock.Lock()
	defer p.lock.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.lock.Lock()
	defer p.lock.Unlock()
	delete(p.conns, c)
}

// closeAll closes every open connection and refuses new ones.
func (p *Proxy) closeAll() {
	p.lock.Lock()
	conns := p.conns
	p.conns = nil
	p.lock.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}

// forward connects client to the first backend that accepts and copies
// both ways until both directions end: two goroutines per connection, this
// one and one copy.
func (p *Proxy) forward(ctx context.Context, client net.Conn) {
	defer func() {
		_ = client.Close()
		p.untrack(client)
	}()
	backend, addr := p.dial(ctx)
	if backend == nil {
		p.log.V(1).Info("Closed a connection: no backend accepted it", "client", client.RemoteAddr().String(), "backends", p.backends)
		return
	}
	defer func() {
		_ = backend.Close()
		p.untrack(backend)
	}()
	if !p.track(backend) {
		return
	}
	p.log.V(4).Info("Forwarding a connection", "client", client.RemoteAddr().String(), "backend", addr)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pipe(backend, client)
	}()
	pipe(client, backend)
	<-done
}

// pipe copies from src to dst until src ends, then passes the end on:
// a half-close (FIN) when src ended cleanly, so a peer still writing can
// finish, or a full close of both when it failed, which also ends the
// copy the other way.
func pipe(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
	}
	_ = dst.Close()
	_ = src.Close()
}

// dial returns a connection to the first backend, in order, that accepts
// one, or nil when none does.
func (p *Proxy) dial(ctx context.Context) (net.Conn, string) {
	d := net.Dialer{Timeout: p.dialTimeout, KeepAlive: 30 * time.Second}
	for _, b := range p.order() {
		c, err := d.DialContext(ctx, "tcp", b)
		if err == nil {
			return c, b
		}
		if ctx.Err() != nil {
			return nil, ""
		}
		p.log.V(2).Info("Skipped a backend that refused a connection", "backend", b, "err", err.Error())
	}
	return nil, ""
}

// probeLoop probes every backend now and then every interval until ctx
// ends.
func (p *Proxy) probeLoop(ctx context.Context) {
	t := p.clock.NewTicker(p.interval)
	defer t.Stop()
	for {
		p.probeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// probeAll probes every backend at once, each within one interval, and
// records what they are.
func (p *Proxy) probeAll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, p.interval)
	defer cancel()
	got := make([]State, len(p.backends))
	var wg sync.WaitGroup
	for i, b := range p.backends {
		wg.Go(func() { got[i] = p.probe(ctx, b) })
	}
	wg.Wait()
	if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return // stopping: what the probes saw is the shutdown
	}
	p.lock.Lock()
	defer p.lock.Unlock()
	for i, b := range p.backends {
		if was, ok := p.states[b]; !ok || was != got[i] {
			p.log.Info("Backend changed state", "backend", b, "state", got[i].String())
		}
		p.states[b] = got[i]
	}
}
