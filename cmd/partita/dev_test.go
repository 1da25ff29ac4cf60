package main

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/devcluster/tcpproxy"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/extender"
)

func processNames(procs []devcluster.HostProcess) []string {
	out := make([]string, len(procs))
	for i, p := range procs {
		out[i] = p.Name
	}
	return out
}

func byName(t *testing.T, procs []devcluster.HostProcess, name string) devcluster.HostProcess {
	t.Helper()
	for _, p := range procs {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no host process %s in %v", name, processNames(procs))
	return devcluster.HostProcess{}
}

// argValue is the value after flag in args ("" when absent).
func argValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// TestDevExtenderReplicas: one replica is the extender as it always was
// (name, port, log, Lease timings), behind the proxy; more are named
// extender-2, ... on ports of their own, each naming itself in the Lease
// with the short timings, --extender-flag's last on every command line,
// and the proxy tries them in order.
func TestDevExtenderReplicas(t *testing.T) {
	extra := extraFlags{extender: []string{"--fair-share-usage-weight=1"}}
	one, err := devHostProcesses(devcluster.ModeHost, dra.BackendExtender, false, extra, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := processNames(one), []string{"agent", "webhook", "extender", "extender-proxy", "console", "model-cache"}; !slices.Equal(got, want) {
		t.Errorf("processes %v, want %v", got, want)
	}
	ext := byName(t, one, "extender")
	if got := argValue(ext.Args, "--addr"); got != "127.0.0.1:{port:extender}" {
		t.Errorf("--addr %q, want the port it always had", got)
	}
	for _, a := range ext.Args {
		if strings.HasPrefix(a, "--leader-election-lease-duration") || a == "--replica-name" {
			t.Errorf("a single extender gets %s; want the Lease as it always was", a)
		}
	}
	if ext.Args[len(ext.Args)-1] != "--fair-share-usage-weight=1" {
		t.Errorf("--extender-flag is not last: %v", ext.Args)
	}

	three, err := devHostProcesses(devcluster.ModeHost, dra.BackendExtender, false, extra, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := processNames(three), []string{"agent", "webhook", "extender", "extender-2", "extender-3", "extender-proxy", "console", "model-cache"}; !slices.Equal(got, want) {
		t.Errorf("processes %v, want %v", got, want)
	}
	for _, name := range []string{"extender", "extender-2", "extender-3"} {
		r := byName(t, three, name)
		if got, want := argValue(r.Args, "--addr"), "127.0.0.1:{port:"+name+"}"; got != want {
			t.Errorf("%s: --addr %q, want %q", name, got, want)
		}
		if got, want := r.ReadyURL, "https://127.0.0.1:{port:"+name+"}/readyz"; got != want {
			t.Errorf("%s: ready URL %q, want %q", name, got, want)
		}
		if got := argValue(r.Args, "--replica-name"); got != name {
			t.Errorf("%s: --replica-name %q", name, got)
		}
		for _, f := range devLeaderElectionFlags {
			if !slices.Contains(r.Args, f) {
				t.Errorf("%s lacks %s", name, f)
			}
		}
		if r.Args[len(r.Args)-1] != "--fair-share-usage-weight=1" {
			t.Errorf("%s: --extender-flag is not last: %v", name, r.Args)
		}
		if r.ServiceAccount != extenderSA {
			t.Errorf("%s runs as %q, want %q", name, r.ServiceAccount, extenderSA)
		}
	}
	proxy := byName(t, three, devcluster.ExtenderProxyName)
	var backends []string
	for i, a := range proxy.Args {
		if a == "--backend" {
			backends = append(backends, proxy.Args[i+1])
		}
	}
	if want := []string{"127.0.0.1:{port:extender}", "127.0.0.1:{port:extender-2}", "127.0.0.1:{port:extender-3}"}; !slices.Equal(backends, want) {
		t.Errorf("proxy backends %v, want %v", backends, want)
	}
	if got := argValue(proxy.Args, "--listen"); got != "127.0.0.1:{port:extender-proxy}" {
		t.Errorf("proxy listens on %q", got)
	}
	// dev down stops what names the cluster's directories.
	if got := argValue(proxy.Args, "--probe-ca-file"); !strings.HasPrefix(got, "{state}/") {
		t.Errorf("the proxy's command line names no cluster directory (--probe-ca-file %q): dev down would not find it", got)
	}

	chart, err := devHostProcesses(devcluster.ModeChart, dra.BackendExtender, true, extraFlags{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := processNames(chart), []string{"agent", "console"}; !slices.Equal(got, want) {
		t.Errorf("mode chart: processes %v, want %v", got, want)
	}
	for _, n := range []int{0, devcluster.MaxExtenderReplicas + 1} {
		if _, err := devHostProcesses(devcluster.ModeHost, dra.BackendExtender, false, extraFlags{}, n); err == nil {
			t.Errorf("%d replicas accepted", n)
		}
	}
}

// TestDevUpExtenderReplicasFlag: dev up checks --extender-replicas before
// it looks for the cluster binaries.
func TestDevUpExtenderReplicasFlag(t *testing.T) {
	cases := map[string]struct {
		args []string
		want string
	}{
		"two":           {args: []string{"--extender-replicas", "2"}, want: "missing cluster binaries"},
		"zero":          {args: []string{"--extender-replicas", "0"}, want: "--extender-replicas 0: must be between 1 and 5"},
		"six":           {args: []string{"--extender-replicas=6"}, want: "--extender-replicas 6: must be between 1 and 5"},
		"in mode chart": {args: []string{"--extender-replicas", "2", "--mode", "chart", "--real-node"}, want: "--extender-replicas: the extender runs on the host in mode host only; in mode chart set the chart's extender.replicas"},
		// --set passes chart values; they mean nothing in mode host.
		"chart values in mode chart": {args: []string{"--mode", "chart", "--real-node", "--set", "agent.isolation=hami-core", "--set", "agent.enforce=kill"}, want: "missing cluster binaries"},
		"chart values in mode host":  {args: []string{"--set", "agent.isolation=hami-core"}, want: "--set: chart values apply in mode chart only"},
		"a value without a key":      {args: []string{"--mode", "chart", "--real-node", "--set", "=mps"}, want: `--set "=mps": want key=value`},
		"a value without =":          {args: []string{"--mode", "chart", "--real-node", "--set", "agent.isolation"}, want: `--set "agent.isolation": want key=value`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			cmd := newRootCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetArgs(append([]string{"dev", "up", "--name", "flags", "--work-dir", dir, "--bin-dir", dir}, tc.args...))
			if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("dev up %v: %v, want an error saying %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestDevExtenderProxyFlags(t *testing.T) {
	for name, args := range map[string][]string{
		"no backend":  {"--listen", "127.0.0.1:0"},
		"no listen":   {"--backend", "127.0.0.1:1"},
		"no interval": {"--listen", "127.0.0.1:0", "--backend", "127.0.0.1:1", "--probe-interval", "0s"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := newRootCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetArgs(append([]string{"dev", "extender-proxy"}, args...))
			if err := cmd.Execute(); err == nil {
				t.Errorf("dev extender-proxy %v ran", args)
			}
		})
	}
}

// TestWriteDevStatus: every replica is listed with its state, pid and
// port, the leader marked, then the Lease's holder.
func TestWriteDevStatus(t *testing.T) {
	renewed := time.Date(2026, 5, 4, 10, 11, 12, 0, time.UTC)
	st := devcluster.Status{Name: "reps", Exists: true, APIServer: "ready", Mode: devcluster.ModeHost,
		Components: map[string]string{"partita-extender": "running", "partita-extender-2": "running", "partita-extender-3": "stopped"},
		Extender: &devcluster.ExtenderStatus{
			Proxy: "127.0.0.1:40000",
			Replicas: []devcluster.ExtenderReplica{
				{Name: "extender", PID: 101, Port: 40001, Running: true, Ready: true},
				{Name: "extender-2", PID: 102, Port: 40002, Running: true, Ready: true, Leader: true},
				{Name: "extender-3", PID: 103, Port: 40003},
				{Name: "extender-4", Port: 40004},
			},
			LeaseHolder: "extender-2_5f0c", LeaseRenewed: &renewed,
		}}
	var out bytes.Buffer
	if err := writeDevStatus(&out, st, ""); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Extender:    4 replicas, kube-scheduler calls them through 127.0.0.1:40000\n",
		"  extender     follower   pid 101      127.0.0.1:40001\n",
		"  extender-2   leader     pid 102      127.0.0.1:40002\n",
		"  extender-3   stopped    pid 103      127.0.0.1:40003\n",
		"  extender-4   stopped    pid -        127.0.0.1:40004\n",
		"  Lease partita-system/partita-extender held by extender-2_5f0c, renewed " + renewed.Local().Format(time.TimeOnly) + "\n",
		"  partita-extender-2         running\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}

// replicaServer is an extender replica as the proxy sees it: /readyz,
// the leader gauge on /metrics, and /who, which says which one answered.
func replicaServer(t *testing.T, name string, ready, leader bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			if !ready {
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		case "/metrics":
			v := 0
			if leader {
				v = 1
			}
			fmt.Fprintf(w, "%s %d\n", extender.LeaderMetric, v)
		case "/who":
			fmt.Fprint(w, name)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func serverCAFile(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestExtenderProbe(t *testing.T) {
	cases := map[string]struct {
		ready, leader bool
		want          tcpproxy.State
	}{
		"leader":           {ready: true, leader: true, want: tcpproxy.Preferred},
		"follower":         {ready: true, want: tcpproxy.Ready},
		"not ready leader": {leader: true, want: tcpproxy.NotReady},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv := replicaServer(t, name, tc.ready, tc.leader)
			addr := strings.TrimPrefix(srv.URL, "https://")
			if got := extenderProbe(serverCAFile(t, srv))(t.Context(), addr); got != tc.want {
				t.Errorf("with the CA: %s, want %s", got, tc.want)
			}
			if got := extenderProbe("")(t.Context(), addr); got != tc.want {
				t.Errorf("unverified: %s, want %s", got, tc.want)
			}
		})
	}
	srv := replicaServer(t, "x", true, true)
	addr := strings.TrimPrefix(srv.URL, "https://")
	if got := extenderProbe(filepath.Join(t.TempDir(), "missing.crt"))(t.Context(), addr); got != tcpproxy.NotReady {
		t.Errorf("without its CA file: %s, want NotReady", got)
	}
}

// TestDevExtenderProxyReachesTheLeader runs the proxy as dev up does: a
// client's TLS goes through it to the replica that leads, listed second.
func TestDevExtenderProxyReachesTheLeader(t *testing.T) {
	follower, leader := replicaServer(t, "follower", true, false), replicaServer(t, "leader", true, true)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	listen := l.Addr().String()
	_ = l.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- runDevExtenderProxy(ctx, &devProxyFlags{listen: listen, probeInterval: 50 * time.Millisecond,
			backends: []string{strings.TrimPrefix(follower.URL, "https://"), strings.TrimPrefix(leader.URL, "https://")}})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	// The leader's own certificate, through the proxy: TLS is end to end.
	hc := leader.Client()
	hc.Transport.(*http.Transport).DisableKeepAlives = true
	deadline := time.Now().Add(5 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := hc.Get("https://" + listen + "/who")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if last = string(b); last == "leader" {
				return
			}
		} else {
			last = err.Error()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("through the proxy: %q, want the leader", last)
}
