package devcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
)

// Status is what `partita dev status` reports.
type Status struct {
	Name       string `json:"name"`
	Exists     bool   `json:"exists"`
	APIServer  string `json:"apiServer"`
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Components maps each component to "running" or "stopped".
	Components map[string]string `json:"components,omitempty"`
	GPUNodes   int               `json:"gpuNodes"`
	ReadyNodes int               `json:"readyNodes"`
	// Mode is where Partita runs (host or chart); RealNode whether the
	// cluster has the real node.
	Mode     Mode `json:"mode,omitempty"`
	RealNode bool `json:"realNode"`
	// Extender is the extender's replicas and Lease in mode host.
	Extender *ExtenderStatus `json:"extender,omitempty"`
}

// Status inspects the cluster without changing it.
func (c *Cluster) Status(ctx context.Context) Status {
	st := Status{Name: c.opts.Name, Exists: c.exists(), APIServer: "absent"}
	if !st.Exists {
		return st
	}
	st.Kubeconfig = c.KubeconfigPath()
	st.Components = c.componentStates()
	saved, _ := c.SavedSettings()
	st.Mode, st.RealNode = saved.Mode, saved.RealNode
	if node := c.RealNode(); node.Exists() {
		st.RealNode = true
		for k, v := range node.Status() {
			st.Components[k] = v
		}
	}
	for _, p := range c.opts.HostProcesses {
		st.Components["partita-"+p.Name] = "stopped"
		if c.hostProcessRunning(p.Name) {
			st.Components["partita-"+p.Name] = "running"
		}
	}
	// Addons started by an earlier `up --addons`, whatever this command
	// names.
	addons, _ := filepath.Glob(filepath.Join(c.Dir(), "partita", "addon-*.pid"))
	for _, f := range addons {
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		st.Components[name] = "stopped"
		if c.hostProcessRunning(name) {
			st.Components[name] = "running"
		}
	}
	apiErr := c.healthy(ctx)
	if st.Mode == ModeHost {
		st.Extender = c.extenderStatus(ctx, apiErr == nil)
	}
	if apiErr != nil {
		st.APIServer = "not answering: " + apiErr.Error()
		return st
	}
	st.APIServer = "ready"
	cs, err := c.Clientset()
	if err != nil {
		return st
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelGPUNode + "=true"})
	if err != nil {
		return st
	}
	st.GPUNodes = len(nodes.Items)
	for i := range nodes.Items {
		if NodeReady(&nodes.Items[i]) {
			st.ReadyNodes++
		}
	}
	return st
}

// componentStates reads kwokctl's pid files and checks each process is alive.
func (c *Cluster) componentStates() map[string]string {
	states := map[string]string{}
	files, _ := filepath.Glob(filepath.Join(c.Dir(), "pids", "*.pid"))
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		states[name] = "stopped"
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err == nil && alive(pid) {
			states[name] = "running"
		}
	}
	return states
}

// ProcessesUsing lists the pids whose command line mentions dir.
func ProcessesUsing(dir string) []int {
	var pids []int
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.Contains(string(cmdline), dir+"/") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killProcessesUsing ends (TERM, then KILL after a grace period) every process
// whose command line mentions dir.
func killProcessesUsing(ctx context.Context, dir string) error {
	pids := ProcessesUsing(dir)
	if len(pids) == 0 {
		return nil
	}
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if len(ProcessesUsing(dir)) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, p := range ProcessesUsing(dir) {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	time.Sleep(200 * time.Millisecond)
	if left := ProcessesUsing(dir); len(left) > 0 {
		return errors.New("processes still running after kill: " + fmt.Sprint(left))
	}
	return nil
}
