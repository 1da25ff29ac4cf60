package devcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// HostProcess is one of Partita's own processes that the dev cluster runs on
// the host (the agent, the webhook, the extender). Its command line names the
// cluster's kubeconfig, so `down` finds and stops it with the components.
type HostProcess struct {
	// Name identifies the process in pid and log file names ("agent").
	Name string
	// Args are the partita arguments. Placeholders: {kubeconfig} (the
	// ServiceAccount's kubeconfig, or the admin's without one), {dir} (kwokctl's cluster directory), {state} (Partita's
	// state directory for the cluster), {gpus} (the simulated devices of a
	// node, "8xH100-80GB") and {port:NAME} (a loopback port chosen once per
	// cluster and name, stable across restarts).
	Args []string
	// ReadyURL, when set, is polled (plain HTTP or HTTPS without verification)
	// until it answers 200. It takes the same placeholders.
	ReadyURL string
	// Binary, when set, runs instead of the partita binary (an addon's
	// controller).
	Binary string
	// ServiceAccount, when set, is the chart's ServiceAccount (in
	// PartitaNamespace) the process runs as: {kubeconfig} then names a
	// kubeconfig with that ServiceAccount's token instead of the admin's.
	ServiceAccount string
}

func (c *Cluster) pidFile(name string) string {
	return filepath.Join(c.Dir(), "partita", name+".pid")
}

// HostProcessLog is the log file of a host process.
func (c *Cluster) HostProcessLog(name string) string {
	return filepath.Join(c.LogsDir(), "partita-"+name+".log")
}

// hostProcessRunning reports whether the named process runs, by its pid file.
func (c *Cluster) hostProcessRunning(name string) bool {
	pid, err := c.HostProcessPID(name)
	return err == nil && alive(pid)
}

// HostProcessPID returns the pid of the named host process (e.g.
// "extender-2") from its pid file, whether or not it still runs.
func (c *Cluster) HostProcessPID(name string) (int, error) {
	b, err := os.ReadFile(c.pidFile(name))
	if err != nil {
		return 0, fmt.Errorf("read the pid file of %s: %w", name, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s: %q is not a pid", c.pidFile(name), b)
	}
	return pid, nil
}

// KillHostProcess sends sig to the named host process, for tests of
// failures (syscall.SIGKILL: no chance to give up its Lease). The process
// stays down until the next dev up, which starts it again.
func (c *Cluster) KillHostProcess(name string, sig syscall.Signal) error {
	pid, err := c.HostProcessPID(name)
	if err != nil {
		return err
	}
	if !alive(pid) {
		return fmt.Errorf("kill %s (pid %d): it does not run", name, pid)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("kill %s (pid %d) with %s: %w", name, pid, sig, err)
	}
	return nil
}

// alive reports whether pid runs; an exited process that its parent has not
// reaped yet (a zombie) does not count.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// argsFile keeps the command line a host process was started with, so that
// dev up can tell when it asks for another (dev up --extender-flag).
func (c *Cluster) argsFile(name string) string {
	return filepath.Join(c.Dir(), "partita", name+".args")
}

// startHostProcesses starts each process that is not already running, in its
// own session so it outlives the `partita dev up` that started it. A
// running process whose command line differs from the one asked for now
// (other --extender-flag's) is stopped and started with the new one; one
// started before command lines were kept is left running.
func (c *Cluster) startHostProcesses(ctx context.Context, bin string, procs []HostProcess) error {
	if err := os.MkdirAll(filepath.Join(c.Dir(), "partita"), 0o755); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Join(c.Dir(), "partita"), err)
	}
	for _, p := range procs {
		args := make([]string, len(p.Args))
		for i, a := range p.Args {
			if p.ServiceAccount != "" {
				a = strings.ReplaceAll(a, "{kubeconfig}", c.ServiceAccountKubeconfig(p.ServiceAccount))
			}
			var err error
			if args[i], err = c.expand(a); err != nil {
				return err
			}
		}
		exe := bin
		if p.Binary != "" {
			exe = p.Binary
		}
		cmdline := strings.Join(append([]string{exe}, args...), "\x00")
		if c.hostProcessRunning(p.Name) {
			before, err := os.ReadFile(c.argsFile(p.Name))
			if err != nil || string(before) == cmdline {
				continue
			}
			c.printf("Restarting %s: its command line changed", processTitle(p))
			if err := c.stopHostProcess(ctx, p.Name); err != nil {
				return err
			}
		}
		readyURL, err := c.expand(p.ReadyURL)
		if err != nil {
			return err
		}
		logf, err := os.OpenFile(c.HostProcessLog(p.Name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("open log of %s: %w", p.Name, err)
		}
		cmd := exec.Command(exe, args...) //nolint:gosec // our own binary (or an addon we built) with our own arguments
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		err = cmd.Start()
		_ = logf.Close()
		if err != nil {
			return fmt.Errorf("start partita %s: %w", p.Name, err)
		}
		if err := os.WriteFile(c.pidFile(p.Name), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			return fmt.Errorf("write pid file of %s: %w", p.Name, err)
		}
		if err := os.WriteFile(c.argsFile(p.Name), []byte(cmdline), 0o644); err != nil {
			return fmt.Errorf("write the command line of %s: %w", p.Name, err)
		}
		go func() { _ = cmd.Wait() }() // reap it if it exits while we run
		c.printf("Started %s (pid %d, log %s)", processTitle(p), cmd.Process.Pid, c.HostProcessLog(p.Name))
		if readyURL != "" {
			if err := waitHTTPReady(ctx, readyURL, 60*time.Second); err != nil {
				return fmt.Errorf("%s did not become ready: %w; see %s", processTitle(p), err, c.HostProcessLog(p.Name))
			}
		}
	}
	return nil
}

// stopHostProcess ends a host process by its pid file: TERM, then KILL
// after 15 seconds.
func (c *Cluster) stopHostProcess(ctx context.Context, name string) error {
	pid, err := c.HostProcessPID(name)
	if err != nil || !alive(pid) {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(15 * time.Second)
	for alive(pid) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if alive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		time.Sleep(200 * time.Millisecond)
	}
	if alive(pid) {
		return fmt.Errorf("stop %s (pid %d): still running after KILL", name, pid)
	}
	return nil
}

// processTitle names a host process in messages.
func processTitle(p HostProcess) string {
	if p.Binary != "" {
		return p.Name
	}
	return "partita " + p.Name
}

func waitHTTPReady(ctx context.Context, url string, timeout time.Duration) error {
	client := insecureHTTPClient()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("build request for %s: %w", url, err)
		}
		resp, err := client.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("%s answered %s", url, resp.Status)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	if last == nil {
		last = errors.New("no answer")
	}
	return fmt.Errorf("%s not ready after %s: %w", url, timeout, last)
}

// insecureHTTPClient checks readiness of our own loopback servers, whose
// certificates are self-signed for the dev cluster.
func insecureHTTPClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // loopback readiness probe of our own process
	return &http.Client{Transport: tr, Timeout: 2 * time.Second}
}
