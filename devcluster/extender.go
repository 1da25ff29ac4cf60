package devcluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/extender"
)

// The extender's replicas in mode host (Options.ExtenderReplicas): host
// processes named ExtenderReplicaName(1..n), each on its own loopback port
// ({port:NAME}) with its own log, electing their leader with the Lease
// PartitaNamespace/extender.DefaultLeaseName; kube-scheduler calls them
// through the host process ExtenderProxyName.
const (
	// ExtenderName is the host process of the first extender replica, the
	// only one by default.
	ExtenderName = "extender"
	// ExtenderProxyName is the host process kube-scheduler calls the
	// extender through: `partita dev extender-proxy`, which forwards each
	// connection to a replica, the leader first.
	ExtenderProxyName = "extender-proxy"
	// MaxExtenderReplicas is the most replicas dev up runs.
	MaxExtenderReplicas = 5
)

// ExtenderReplicaName is the host process name of the i-th extender
// replica, from 1: "extender", then "extender-2", "extender-3", ...
func ExtenderReplicaName(i int) string {
	if i <= 1 {
		return ExtenderName
	}
	return ExtenderName + "-" + strconv.Itoa(i)
}

// CheckExtenderReplicas refuses a number of extender replicas dev up does
// not run.
func CheckExtenderReplicas(n int) error {
	if n < 1 || n > MaxExtenderReplicas {
		return fmt.Errorf("--extender-replicas %d: must be between 1 and %d", n, MaxExtenderReplicas)
	}
	return nil
}

// extenderReplicaIndex is the inverse of ExtenderReplicaName; false for
// any other name (the proxy's among them).
func extenderReplicaIndex(name string) (int, bool) {
	if name == ExtenderName {
		return 1, true
	}
	rest, ok := strings.CutPrefix(name, ExtenderName+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 2 || strconv.Itoa(i) != rest {
		return 0, false
	}
	return i, true
}

// ExtenderReplica is one extender host process as it is now.
type ExtenderReplica struct {
	// Name is its host process name (ExtenderReplicaName).
	Name string `json:"name"`
	// PID is its process id from its pid file; 0 when it has none.
	PID int `json:"pid,omitempty"`
	// Port is its loopback port (HTTPS).
	Port int `json:"port"`
	// Running: the process is alive.
	Running bool `json:"running"`
	// Ready: its /readyz answers 200 (its informers have synced).
	Ready bool `json:"ready"`
	// Leader: the replica itself says it leads, binding and running the
	// admission loop (its extender.LeaderMetric gauge is 1). A killed
	// leader's Lease names it until the Lease expires; this does not.
	Leader bool `json:"leader"`
}

// ExtenderStatus is what `dev status` shows of the extender in mode host.
type ExtenderStatus struct {
	// Proxy is the address kube-scheduler calls (the proxy's).
	Proxy    string            `json:"proxy"`
	Replicas []ExtenderReplica `json:"replicas"`
	// LeaseHolder is the identity in the Lease (<replica name>_<random>
	// when the replicas are more than one), LeaseRenewed when its holder
	// last renewed it; empty when nobody holds it (or the API server does
	// not answer).
	LeaseHolder  string     `json:"leaseHolder,omitempty"`
	LeaseRenewed *time.Time `json:"leaseRenewed,omitempty"`
}

// extenderReplicaCount is how many extender replicas the cluster was last
// brought up with.
func (c *Cluster) extenderReplicaCount() int {
	saved, _ := c.SavedSettings()
	return saved.ExtenderReplicas
}

// ExtenderReplicas lists the extender's replicas in mode host, each with
// its pid and port, whether it runs, is ready, and leads. A test kills
// the leader with KillHostProcess(r.Name, syscall.SIGKILL) and waits for
// another with WaitExtenderLeader.
func (c *Cluster) ExtenderReplicas(ctx context.Context) ([]ExtenderReplica, error) {
	if !c.exists() {
		return nil, fmt.Errorf("cluster %q does not exist: run 'partita dev up --name %s'", c.opts.Name, c.opts.Name)
	}
	if saved, _ := c.SavedSettings(); saved.Mode != ModeHost {
		return nil, fmt.Errorf("cluster %q runs Partita in mode %s: the extender's replicas are the chart's pods, not host processes", c.opts.Name, saved.Mode)
	}
	n := c.extenderReplicaCount()
	names := make([]string, n)
	for i := range names {
		names[i] = ExtenderReplicaName(i + 1)
	}
	// Read only: a replica that never started has no port yet (0).
	ports, err := c.savedPorts()
	if err != nil {
		return nil, err
	}
	hc := insecureHTTPClient()
	defer hc.CloseIdleConnections()
	out := make([]ExtenderReplica, n)
	var wg sync.WaitGroup
	for i, name := range names {
		r := ExtenderReplica{Name: name, Port: ports[name]}
		r.PID, _ = c.HostProcessPID(name)
		r.Running = r.PID > 0 && alive(r.PID)
		out[i] = r
		if r.Running && r.Port > 0 {
			wg.Go(func() {
				out[i].Ready, out[i].Leader, _ = ProbeExtender(ctx, hc, net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)))
			})
		}
	}
	wg.Wait()
	return out, nil
}

// WaitExtenderLeader polls the replicas until one that runs, is ready and
// is not named in except leads, and returns it; it gives up when ctx ends.
// After killing the leader, WaitExtenderLeader(ctx, killed.Name) waits for
// its successor (about the dev cluster's Lease duration, 6 seconds, at
// most 8).
func (c *Cluster) WaitExtenderLeader(ctx context.Context, except ...string) (ExtenderReplica, error) {
	var last []ExtenderReplica
	for {
		reps, err := c.ExtenderReplicas(ctx)
		if err != nil {
			return ExtenderReplica{}, err
		}
		last = reps
		for _, r := range reps {
			if r.Running && r.Ready && r.Leader && !slices.Contains(except, r.Name) {
				return r, nil
			}
		}
		select {
		case <-ctx.Done():
			return ExtenderReplica{}, fmt.Errorf("wait for an extender leader other than %v: %w; replicas: %+v", except, ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// ProbeExtender asks the extender at addr (host:port, HTTPS, hc's TLS
// settings) whether it is ready (/readyz answers 200) and whether it leads
// (extender.LeaderMetric is 1 on its /metrics, which need no client
// certificate). err says why it could not tell.
func ProbeExtender(ctx context.Context, hc *http.Client, addr string) (ready, leader bool, err error) {
	get := func(path string, read func(*http.Response) error) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+path, nil)
		if err != nil {
			return fmt.Errorf("build request for %s: %w", path, err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("GET %s: %w", path, err)
		}
		defer func() { _ = resp.Body.Close() }()
		return read(resp)
	}
	if err := get("/readyz", func(resp *http.Response) error {
		ready = resp.StatusCode == http.StatusOK
		return nil
	}); err != nil {
		return false, false, err
	}
	if err := get("/metrics", func(resp *http.Response) error {
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /metrics: %s", resp.Status)
		}
		var rerr error
		leader, rerr = leaderGauge(bufio.NewScanner(resp.Body))
		return rerr
	}); err != nil {
		return ready, false, err
	}
	return ready, leader, nil
}

// leaderGauge reads extender.LeaderMetric from a Prometheus text
// exposition: true when it is 1.
func leaderGauge(sc *bufio.Scanner) (bool, error) {
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == extender.LeaderMetric {
			v, err := strconv.ParseFloat(f[1], 64)
			return err == nil && v == 1, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("read metrics: %w", err)
	}
	return false, fmt.Errorf("no %s in the metrics", extender.LeaderMetric)
}

// extenderStatus is the extender's part of Status (mode host): the
// replicas and, when the API server answers, the Lease.
func (c *Cluster) extenderStatus(ctx context.Context, apiReady bool) *ExtenderStatus {
	reps, err := c.ExtenderReplicas(ctx)
	if err != nil {
		return nil
	}
	st := &ExtenderStatus{Replicas: reps}
	if ports, err := c.savedPorts(); err == nil && ports[ExtenderProxyName] > 0 {
		st.Proxy = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[ExtenderProxyName]))
	}
	if !apiReady {
		return st
	}
	cs, err := c.Clientset()
	if err != nil {
		return st
	}
	lease, err := cs.CoordinationV1().Leases(PartitaNamespace).Get(ctx, extender.DefaultLeaseName, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			st.LeaseHolder = "unknown: " + err.Error()
		}
		return st
	}
	if h := lease.Spec.HolderIdentity; h != nil {
		st.LeaseHolder = *h
	}
	if r := lease.Spec.RenewTime; r != nil && st.LeaseHolder != "" {
		t := r.Time
		st.LeaseRenewed = &t
	}
	return st
}

// stopExtraExtenderReplicas stops the replicas beyond the cluster's count
// (dev up with a lower --extender-replicas), after the proxy has been
// restarted without them, and forgets their pid files.
func (c *Cluster) stopExtraExtenderReplicas(ctx context.Context) error {
	files, _ := filepath.Glob(filepath.Join(c.Dir(), "partita", ExtenderName+"-*.pid"))
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		i, ok := extenderReplicaIndex(name)
		if !ok || i <= c.opts.ExtenderReplicas {
			continue
		}
		running := c.hostProcessRunning(name)
		if err := c.stopHostProcess(ctx, name); err != nil {
			return err
		}
		for _, f := range []string{c.pidFile(name), c.argsFile(name)} {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("remove %s: %w", f, err)
			}
		}
		if running {
			c.printf("Stopped partita %s: the cluster now runs %d extender replicas", name, c.opts.ExtenderReplicas)
		}
	}
	return nil
}

// checkSchedulerReachesReplicas refuses more than one extender replica on
// a cluster whose kube-scheduler, configured when the cluster was created,
// calls one extender directly rather than through the proxy (a cluster
// created before the proxy existed).
func (c *Cluster) checkSchedulerReachesReplicas() error {
	if c.opts.SchedulerConfig == "" || c.opts.ExtenderReplicas <= 1 {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(c.stateDir(), "kube-scheduler-config.yaml"))
	if err != nil {
		return fmt.Errorf("read cluster %q's scheduler configuration: %w", c.opts.Name, err)
	}
	port, err := c.Port(ExtenderProxyName)
	if err != nil {
		return err
	}
	if !strings.Contains(string(b), "127.0.0.1:"+strconv.Itoa(port)) {
		return fmt.Errorf("cluster %q's kube-scheduler calls the extender directly, not through the proxy that reaches every replica: "+
			"its configuration is set when a cluster is created; run 'partita dev down --name %s' and 'partita dev up --name %s --extender-replicas %d'",
			c.opts.Name, c.opts.Name, c.opts.Name, c.opts.ExtenderReplicas)
	}
	return nil
}
