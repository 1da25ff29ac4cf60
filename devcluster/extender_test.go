package devcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/partita-dev/partita/extender"
)

func TestExtenderReplicaNames(t *testing.T) {
	for i, want := range []string{"extender", "extender-2", "extender-3", "extender-5"} {
		n := []int{1, 2, 3, 5}[i]
		if got := ExtenderReplicaName(n); got != want {
			t.Errorf("ExtenderReplicaName(%d) = %q, want %q", n, got, want)
		}
		if got, ok := extenderReplicaIndex(want); !ok || got != n {
			t.Errorf("extenderReplicaIndex(%q) = %d, %t; want %d", want, got, ok, n)
		}
	}
	for _, name := range []string{ExtenderProxyName, "extender-1", "extender-02", "extender-", "extender-x", "webhook", "agent-2"} {
		if i, ok := extenderReplicaIndex(name); ok {
			t.Errorf("extenderReplicaIndex(%q) = %d, want no replica", name, i)
		}
	}
}

func TestNewExtenderReplicas(t *testing.T) {
	cases := map[string]struct {
		opts    Options
		want    int
		wantErr string
	}{
		"unset is one":      {want: 1},
		"two":               {opts: Options{ExtenderReplicas: 2}, want: 2},
		"the most":          {opts: Options{ExtenderReplicas: MaxExtenderReplicas}, want: MaxExtenderReplicas},
		"too many":          {opts: Options{ExtenderReplicas: MaxExtenderReplicas + 1}, wantErr: "--extender-replicas 6: must be between 1 and 5"},
		"negative":          {opts: Options{ExtenderReplicas: -1}, wantErr: "--extender-replicas -1: must be between 1 and 5"},
		"two in mode chart": {opts: Options{ExtenderReplicas: 2, Mode: ModeChart, RealNode: true}, wantErr: "in mode chart set the chart's extender.replicas"},
		"one in mode chart": {opts: Options{ExtenderReplicas: 1, Mode: ModeChart, RealNode: true}, want: 1},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			opts := tc.opts
			opts.WorkDir, opts.GPUModel = t.TempDir(), DefaultOptions().GPUModel
			c, err := New(opts)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New: %v, want an error saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.opts.ExtenderReplicas != tc.want {
				t.Errorf("ExtenderReplicas %d, want %d", c.opts.ExtenderReplicas, tc.want)
			}
		})
	}
}

// TestSettingsKeepExtenderReplicas: the count is saved with the settings,
// and a cluster saved before it existed runs one.
func TestSettingsKeepExtenderReplicas(t *testing.T) {
	c := testCluster(t, Options{Name: "reps", ExtenderReplicas: 3})
	if err := c.saveSettings(); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.SavedSettings(); got.ExtenderReplicas != 3 {
		t.Errorf("saved %d replicas, want 3", got.ExtenderReplicas)
	}
	if err := os.WriteFile(c.settingsPath(), []byte(`{"realNode":false,"mode":"host"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, ok := c.SavedSettings(); !ok || got.ExtenderReplicas != 1 {
		t.Errorf("older settings: %d replicas (ok %t), want 1", got.ExtenderReplicas, ok)
	}
}

// metricsServer is an extender's /readyz and /metrics as the probes see
// them.
func metricsServer(t *testing.T, ready bool, leader string) *httptest.Server {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			if !ready {
				http.Error(w, "not ready: the GPU ledger has not synced", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		case "/metrics":
			fmt.Fprintf(w, "# HELP %s 1 on the leader.\n# TYPE %[1]s gauge\n", extender.LeaderMetric)
			if leader != "" {
				fmt.Fprintf(w, "%s %s\n", extender.LeaderMetric, leader)
			}
			fmt.Fprintln(w, "partita_extender_pending_binds 0")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func hostPort(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

func TestProbeExtender(t *testing.T) {
	cases := map[string]struct {
		ready                 bool
		gauge                 string
		wantReady, wantLeader bool
		wantErr               bool
	}{
		"leader":           {ready: true, gauge: "1", wantReady: true, wantLeader: true},
		"follower":         {ready: true, gauge: "0", wantReady: true},
		"not ready leader": {gauge: "1", wantLeader: true},
		"no gauge":         {ready: true, wantReady: true, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv := metricsServer(t, tc.ready, tc.gauge)
			ready, leader, err := ProbeExtender(t.Context(), insecureHTTPClient(), hostPort(t, srv))
			if ready != tc.wantReady || leader != tc.wantLeader || (err != nil) != tc.wantErr {
				t.Errorf("ready %t, leader %t, err %v; want %t, %t, error %t", ready, leader, err, tc.wantReady, tc.wantLeader, tc.wantErr)
			}
		})
	}
	t.Run("nothing listens", func(t *testing.T) {
		srv := metricsServer(t, true, "1")
		addr := hostPort(t, srv)
		srv.Close()
		if ready, leader, err := ProbeExtender(t.Context(), insecureHTTPClient(), addr); ready || leader || err == nil {
			t.Errorf("ready %t, leader %t, err %v; want neither, and an error", ready, leader, err)
		}
	})
}

func TestLeaderGauge(t *testing.T) {
	for in, want := range map[string]bool{
		"partita_extender_leader 1\n": true,
		"partita_extender_leader 0\n": false,
		"# TYPE partita_extender_leader gauge\nx 1\npartita_extender_leader 1e+00\n": true,
		"partita_extender_leader_total 1\npartita_extender_leader 0":                 false,
	} {
		got, err := leaderGauge(bufio.NewScanner(strings.NewReader(in)))
		if err != nil || got != want {
			t.Errorf("leaderGauge(%q) = %t, %v; want %t", in, got, err, want)
		}
	}
}

// fakeReplicaCluster is a cluster that exists (its kwokctl file), runs n
// replicas by its settings, with the given ports and pids.
func fakeReplicaCluster(t *testing.T, n int, ports map[string]int, pids map[string]int) *Cluster {
	t.Helper()
	c := testCluster(t, Options{Name: "reps", ExtenderReplicas: n})
	for _, d := range []string{c.Dir(), filepath.Join(c.Dir(), "partita"), c.stateDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(c.Dir(), "kwok.yaml"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.saveSettings(); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ports)
	if err := os.WriteFile(c.portsFile(), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, pid := range pids {
		if err := os.WriteFile(c.pidFile(name), []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// deadPID is the pid of a process that has ended.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// TestExtenderReplicas: every replica the settings name is listed, with
// its pid and port; the one whose gauge says so leads; a dead one is
// neither ready nor leader.
func TestExtenderReplicas(t *testing.T) {
	follower, leader := metricsServer(t, true, "0"), metricsServer(t, true, "1")
	port := func(srv *httptest.Server) int {
		_, p, _ := strings.Cut(hostPort(t, srv), ":")
		n, _ := strconv.Atoi(p)
		return n
	}
	self, dead := os.Getpid(), deadPID(t)
	c := fakeReplicaCluster(t, 3,
		map[string]int{"extender": port(follower), "extender-2": port(leader), "extender-3": 1, ExtenderProxyName: 2},
		map[string]int{"extender": self, "extender-2": self, "extender-3": dead})
	got, err := c.ExtenderReplicas(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := []ExtenderReplica{
		{Name: "extender", PID: self, Port: port(follower), Running: true, Ready: true},
		{Name: "extender-2", PID: self, Port: port(leader), Running: true, Ready: true, Leader: true},
		{Name: "extender-3", PID: dead, Port: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("replicas (-want,+got):\n%s", diff)
	}
	r, err := c.WaitExtenderLeader(t.Context())
	if err != nil || r.Name != "extender-2" {
		t.Errorf("WaitExtenderLeader: %v, %v; want extender-2", r.Name, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 600*time.Millisecond)
	defer cancel()
	if r, err := c.WaitExtenderLeader(ctx, "extender-2"); err == nil {
		t.Errorf("WaitExtenderLeader but extender-2: %s, want a timeout", r.Name)
	}
	st := c.extenderStatus(t.Context(), false)
	if st == nil || st.Proxy != "127.0.0.1:2" || len(st.Replicas) != 3 {
		t.Errorf("status: %+v, want 3 replicas behind 127.0.0.1:2", st)
	}
}

// TestStopExtraExtenderReplicas: replicas beyond the count are stopped and
// their pid files removed; the others and the proxy are left alone.
func TestStopExtraExtenderReplicas(t *testing.T) {
	start := func() *exec.Cmd {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	keep, extra, proxy := start(), start(), start()
	c := fakeReplicaCluster(t, 2, map[string]int{}, map[string]int{
		"extender-2": keep.Process.Pid, "extender-3": extra.Process.Pid, ExtenderProxyName: proxy.Process.Pid})
	if err := c.stopExtraExtenderReplicas(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !c.hostProcessRunning("extender-2") || !c.hostProcessRunning(ExtenderProxyName) {
		t.Error("stopped a replica within the count, or the proxy")
	}
	if alive(extra.Process.Pid) {
		t.Error("extender-3 still runs")
	}
	if _, err := os.Stat(c.pidFile("extender-3")); !os.IsNotExist(err) {
		t.Errorf("extender-3's pid file: %v, want it removed", err)
	}
}

func TestKillHostProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	c := fakeReplicaCluster(t, 1, map[string]int{}, map[string]int{"extender": cmd.Process.Pid})
	if pid, err := c.HostProcessPID("extender"); err != nil || pid != cmd.Process.Pid {
		t.Fatalf("HostProcessPID: %d, %v; want %d", pid, err, cmd.Process.Pid)
	}
	if err := c.KillHostProcess("extender", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the process ended with %v, want SIGKILL", err)
	}
	if err := c.KillHostProcess("extender", syscall.SIGKILL); err == nil || !strings.Contains(err.Error(), "it does not run") {
		t.Errorf("killing it again: %v, want an error saying it does not run", err)
	}
	if err := c.KillHostProcess("webhook", syscall.SIGKILL); err == nil {
		t.Error("killed a process without a pid file")
	}
}

// TestSchedulerReachesReplicas: more than one replica needs kube-scheduler
// configured with the proxy's address, which only a new cluster has.
func TestSchedulerReachesReplicas(t *testing.T) {
	for name, tc := range map[string]struct {
		replicas int
		url      string
		wantErr  bool
	}{
		"through the proxy":     {replicas: 2, url: "https://127.0.0.1:4242"},
		"straight to the first": {replicas: 2, url: "https://127.0.0.1:4141", wantErr: true},
		"one, straight is fine": {replicas: 1, url: "https://127.0.0.1:4141"},
	} {
		t.Run(name, func(t *testing.T) {
			c := fakeReplicaCluster(t, tc.replicas, map[string]int{ExtenderName: 4141, ExtenderProxyName: 4242}, nil)
			c.opts.SchedulerConfig = `urlPrefix: "https://127.0.0.1:{port:extender-proxy}"`
			if err := os.WriteFile(filepath.Join(c.stateDir(), "kube-scheduler-config.yaml"), []byte(`urlPrefix: "`+tc.url+`"`), 0o644); err != nil {
				t.Fatal(err)
			}
			err := c.checkSchedulerReachesReplicas()
			if (err != nil) != tc.wantErr {
				t.Errorf("checkSchedulerReachesReplicas: %v, want error %t", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "partita dev down --name reps") {
				t.Errorf("the error does not say what to do: %v", err)
			}
		})
	}
}
