package tcpproxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	clocktesting "k8s.io/utils/clock/testing"
)

// backend is a TCP server for the tests: it writes its name on every
// connection, then echoes what it reads until the client half-closes, then
// closes.
type backend struct {
	name  string
	l     net.Listener
	wg    sync.WaitGroup
	lock  sync.Mutex
	conns []net.Conn
}

func startBackend(t *testing.T, name string) *backend {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{name: name, l: l}
	b.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			b.lock.Lock()
			b.conns = append(b.conns, c)
			b.lock.Unlock()
			b.wg.Go(func() {
				defer func() { _ = c.Close() }()
				if _, err := io.WriteString(c, name+"\n"); err != nil {
					return
				}
				_, _ = io.Copy(c, c)
			})
		}
	})
	t.Cleanup(func() { b.stop() })
	return b
}

func (b *backend) addr() string { return b.l.Addr().String() }

// stop closes the listener and every connection, as a killed process's
// would be.
func (b *backend) stop() {
	_ = b.l.Close()
	b.lock.Lock()
	for _, c := range b.conns {
		_ = c.Close()
	}
	b.lock.Unlock()
	b.wg.Wait()
}

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// serve runs p on a loopback listener until the test ends, and returns its
// address and a function that stops it and returns Serve's error.
func serve(t *testing.T, p *Proxy) (string, func() error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, l) }()
	stopped := false
	var serr error
	stop := func() error {
		if !stopped {
			cancel()
			select {
			case serr = <-done:
			case <-time.After(5 * time.Second):
				serr = errors.New("Serve did not return 5s after its context ended")
			}
			stopped = true
		}
		return serr
	}
	t.Cleanup(func() { _ = stop() })
	return l.Addr().String(), stop
}

// connect dials the proxy and reads the name the backend greets with.
func connect(t *testing.T, addr string) (*net.TCPConn, *bufio.Reader, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	name, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read the backend's greeting through the proxy: %v", err)
	}
	return c.(*net.TCPConn), r, name[:len(name)-1]
}

func newProxy(t *testing.T, backends []string, opts ...Option) *Proxy {
	t.Helper()
	p, err := New(backends, append([]Option{WithLogger(testr.New(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// waitFor polls cond until it holds, for at most 5 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNewRefuses(t *testing.T) {
	cases := map[string]struct {
		backends []string
		opts     []Option
	}{
		"no backends":       {},
		"not host:port":     {backends: []string{"127.0.0.1"}},
		"no probe interval": {backends: []string{"127.0.0.1:1"}, opts: []Option{WithProbe(func(context.Context, string) State { return Ready }, 0)}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := New(tc.backends, tc.opts...); err == nil {
				t.Error("New accepted it")
			}
		})
	}
}

// TestForwardsBothWays: bytes go to the backend and back unchanged, and a
// half-close reaches the backend, whose answer still comes back before
// its close does.
func TestForwardsBothWays(t *testing.T) {
	b := startBackend(t, "a")
	addr, _ := serve(t, newProxy(t, []string{b.addr()}))
	c, r, name := connect(t, addr)
	if name != "a" {
		t.Fatalf("greeted by %q, want a", name)
	}
	msg := make([]byte, 256<<10) // larger than a socket buffer
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	go func() {
		_, _ = c.Write(msg)
		_ = c.CloseWrite()
	}()
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read the echo: %v", err)
	}
	if string(got) != string(msg) {
		t.Errorf("echoed %d bytes, want the %d sent, unchanged", len(got), len(msg))
	}
}

// TestSkipsADeadBackend: a backend that refuses connections is skipped,
// with or without probes.
func TestSkipsADeadBackend(t *testing.T) {
	b := startBackend(t, "alive")
	addr, _ := serve(t, newProxy(t, []string{deadAddr(t), b.addr()}))
	for range 3 {
		if _, _, name := connect(t, addr); name != "alive" {
			t.Errorf("greeted by %q, want alive", name)
		}
	}
}

// TestPrefersReadyThenPreferredBackends: connections go to the preferred
// backend, else to a ready one, and to a not-ready one only when nothing
// else accepts; probes run again on every tick of the clock.
func TestPrefersReadyThenPreferredBackends(t *testing.T) {
	first, second := startBackend(t, "first"), startBackend(t, "second")
	var lock sync.Mutex
	states := map[string]State{first.addr(): NotReady, second.addr(): Ready}
	set := func(addr string, s State) {
		lock.Lock()
		defer lock.Unlock()
		states[addr] = s
	}
	probe := func(_ context.Context, addr string) State {
		lock.Lock()
		defer lock.Unlock()
		return states[addr]
	}
	clk := clocktesting.NewFakeClock(time.Now())
	p := newProxy(t, []string{first.addr(), second.addr()}, WithProbe(probe, time.Second), WithClock(clk))
	addr, _ := serve(t, p)
	probed := func(want map[string]State) func() bool {
		return func() bool {
			got := p.States()
			for k, v := range want {
				if got[k] != v {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, "the first probes", probed(map[string]State{first.addr(): NotReady, second.addr(): Ready}))
	if _, _, name := connect(t, addr); name != "second" {
		t.Errorf("with first not ready: greeted by %q, want second", name)
	}

	set(first.addr(), Preferred)
	waitFor(t, "the probe loop's ticker", clk.HasWaiters)
	clk.Step(time.Second)
	waitFor(t, "the second probes", probed(map[string]State{first.addr(): Preferred}))
	if _, _, name := connect(t, addr); name != "first" {
		t.Errorf("with first preferred: greeted by %q, want first", name)
	}

	// Not ready, but the only one that accepts.
	set(first.addr(), NotReady)
	clk.Step(time.Second)
	waitFor(t, "the third probes", probed(map[string]State{first.addr(): NotReady}))
	second.stop()
	if _, _, name := connect(t, addr); name != "first" {
		t.Errorf("with second gone: greeted by %q, want first", name)
	}
}

// TestClosesBothSides: when the backend closes, the client sees the end
// of the stream; when the client closes, the backend does.
func TestClosesBothSides(t *testing.T) {
	t.Run("backend closes", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		go func() {
			c, err := l.Accept()
			if err == nil {
				_, _ = io.WriteString(c, "bye\n")
				_ = c.Close()
			}
		}()
		addr, _ := serve(t, newProxy(t, []string{l.Addr().String()}))
		c, r, _ := connect(t, addr)
		if _, err := r.ReadByte(); !errors.Is(err, io.EOF) {
			t.Errorf("read after the backend closed: %v, want EOF", err)
		}
		_ = c.Close()
	})
	t.Run("client closes", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		ended := make(chan error, 1)
		go func() {
			c, err := l.Accept()
			if err != nil {
				ended <- err
				return
			}
			defer func() { _ = c.Close() }()
			_, _ = io.WriteString(c, "hi\n")
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Read(make([]byte, 1))
			ended <- err
		}()
		addr, _ := serve(t, newProxy(t, []string{l.Addr().String()}))
		c, _, _ := connect(t, addr)
		_ = c.Close()
		if err := <-ended; !errors.Is(err, io.EOF) {
			t.Errorf("backend's read after the client closed: %v, want EOF", err)
		}
	})
}

// TestGoroutinesPerConnection: each connection costs a fixed number of
// goroutines, all gone once it closes.
func TestGoroutinesPerConnection(t *testing.T) {
	b := startBackend(t, "a")
	base := runtime.NumGoroutine()
	addr, _ := serve(t, newProxy(t, []string{b.addr()}))
	// Serve itself and the goroutine that closes its listener.
	const serving = 2
	const n = 20
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i], _, _ = connect(t, addr)
	}
	// Two for the proxy, one for the test's backend.
	if got := runtime.NumGoroutine() - base - serving; got > 3*n {
		t.Errorf("%d goroutines for %d connections, want at most %d", got, n, 3*n)
	}
	for _, c := range conns {
		_ = c.Close()
	}
	waitFor(t, "every connection's goroutines to end", func() bool { return runtime.NumGoroutine() <= base+serving })
}

// TestStopsWithItsContext: when the context ends, Serve closes the
// listener and every open connection and returns nil.
func TestStopsWithItsContext(t *testing.T) {
	b := startBackend(t, "a")
	p := newProxy(t, []string{b.addr(), b.addr()},
		WithProbe(func(context.Context, string) State { return Ready }, time.Second), WithClock(clocktesting.NewFakeClock(time.Now())))
	addr, stop := serve(t, p)
	c, r, _ := connect(t, addr)
	if err := stop(); err != nil {
		t.Fatalf("Serve: %v, want nil", err)
	}
	if _, err := r.ReadByte(); err == nil {
		t.Error("an open connection still reads after Serve returned")
	}
	_ = c.Close()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		_ = c.Close()
		t.Error("the listener still accepts after Serve returned")
	}
}
