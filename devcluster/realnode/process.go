package realnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func (n *Node) pidFile(component string) string { return n.path("pids", component+".pid") }

// pid is the component's pid from its pid file, 0 without one or when
// that pid is no longer the component (a pid file left by a reboot may name
// another process since): its command line must name the node's directory.
func (n *Node) pid(component string) int {
	b, err := os.ReadFile(n.pidFile(component))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || !strings.Contains(string(cmdline), n.cfg.Dir+"/") {
		return 0
	}
	return pid
}

func (n *Node) running(component string) bool {
	pid := n.pid(component)
	return pid > 0 && alive(pid)
}

// start runs a component detached from this process (its own session, so
// it outlives `partita dev up`), with its output appended to its log.
func (n *Node) start(component, bin string, args []string, env []string) error {
	if n.running(component) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(n.pidFile(component)), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(n.cfg.LogsDir, 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(n.logPath(component), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log of %s: %w", component, err)
	}
	defer func() { _ = logf.Close() }()
	cmd := exec.Command(bin, args...) //nolint:gosec // the cluster binaries with our own arguments
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = n.cfg.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", component, err)
	}
	if err := os.WriteFile(n.pidFile(component), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return fmt.Errorf("write pid file of %s: %w", component, err)
	}
	// Right after the start, /proc/<pid>/cmdline may still read empty (seen
	// in about one read in seven immediately after exec), and pid() would
	// take the new process for another one: wait until it names the node.
	for deadline := time.Now().Add(2 * time.Second); n.pid(component) != cmd.Process.Pid && alive(cmd.Process.Pid) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	n.exits.Delete(component)
	go func() { // reap it if it exits while we run, and keep how
		err := cmd.Wait()
		if err == nil {
			err = errors.New("exit status 0")
		}
		n.exits.Store(component, err)
	}()
	n.printf("Started %s on %s (pid %d, log %s)", component, NodeName, cmd.Process.Pid, n.logPath(component))
	return nil
}

// waitFor polls check until it succeeds; when the timeout passes or the
// component exits, the error carries the end of its log.
func (n *Node) waitFor(ctx context.Context, component string, timeout time.Duration, check func(context.Context) error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		if !n.running(component) {
			how := ""
			// The reaper may still be at it: give it a moment to say.
			for range 10 {
				if e, ok := n.exits.Load(component); ok {
					how = " (" + e.(error).Error() + ")"
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if how == "" {
				how = " (no exit seen: its pid file names no process of this node)"
			}
			return fmt.Errorf("%s exited%s: %w\n%s", component, how, last, describeLog(n.logPath(component), 20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s: %w\n%s", component, timeout, last, describeLog(n.logPath(component), 20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
