package realnode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Down stops the node and undoes every change it made to the host: it
// ends kubelet, kube-proxy, containerd, the shims and every container,
// unmounts what they mounted, removes their iptables rules, the CNI bridge
// and the pods' cgroups, restores the sysctls and removes the host
// directories they created. It works whatever is left running or already
// dead (a kill -9 of kubelet or containerd included), and succeeds when the
// node was never started.
func (n *Node) Down(ctx context.Context) error {
	st, err := n.readState()
	switch {
	case err == nil && st.Dir != n.cfg.Dir:
		// The host's real node is another cluster's: end only what runs
		// from this node's directory.
		return n.stopAndUnmount(ctx, false)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return err
	case err != nil:
		st = nil
		if !n.Exists() {
			return nil
		}
	}
	return n.cleanup(ctx, st)
}

// cleanup is Down for the node that owns the host (st may be nil when the
// state file was lost).
func (n *Node) cleanup(ctx context.Context, st *hostState) error {
	var errs []error
	if err := n.stopAndUnmount(ctx, true); err != nil {
		errs = append(errs, err)
	}
	if err := removeIPTablesRules(ctx); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", Bridge)); err == nil {
		if out, err := exec.CommandContext(ctx, "ip", "link", "delete", Bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete the bridge %s: %w: %s", Bridge, err, out))
		}
	}
	if err := removeKubepodsCgroups(); err != nil {
		errs = append(errs, err)
	}
	if st != nil {
		if err := restoreSysctls(st.Sysctls); err != nil {
			errs = append(errs, err)
		}
		// Deepest first: /run/partita after /run/partita/real-node's files.
		created := append([]string(nil), st.CreatedPaths...)
		sort.Sort(sort.Reverse(sort.StringSlice(created)))
		for _, p := range created {
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
			}
		}
	}
	if err := os.RemoveAll(n.cfg.RunDir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", n.cfg.RunDir, err))
	}
	return errors.Join(errs...)
}

// stopAndUnmount ends the node's processes (and with all, every process in
// the pods' cgroups), then unmounts everything under the node's directory.
func (n *Node) stopAndUnmount(ctx context.Context, all bool) error {
	var errs []error
	// kubelet first, so it restarts nothing; then kube-proxy and
	// containerd. A graceful stop where they still run.
	for _, c := range []string{"kubelet", "kube-proxy", "containerd"} {
		if pid := n.pid(c); pid > 0 && alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	waitGone(ctx, 5*time.Second, func() []int {
		var left []int
		for _, c := range []string{"kubelet", "kube-proxy", "containerd"} {
			if pid := n.pid(c); pid > 0 && alive(pid) {
				left = append(left, pid)
			}
		}
		return left
	})
	// Then everything: the shims (their command line names containerd's
	// socket under RunDir), the containers (by cgroup), and whatever else
	// names the node's directory.
	dirs := []string{n.cfg.Dir}
	if all {
		dirs = append(dirs, n.cfg.RunDir)
	}
	victims := func() []int {
		pids := nodeProcesses(dirs...)
		if all {
			pids = append(pids, kubepodsProcesses()...)
		}
		return pids
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		left := victims()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("processes of the real node still run after SIGKILL: %v", left))
			break
		}
		for _, p := range left {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, d := range dirs {
		if err := unmountUnder(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func waitGone(ctx context.Context, timeout time.Duration, left func() []int) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && len(left()) > 0 {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// alive reports whether pid runs; a zombie does not count.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// nodePrograms are the programs of the node's own processes.
var nodePrograms = map[string]bool{"containerd": true, "containerd-shim-runc-v2": true, "kubelet": true, "kube-proxy": true, "runc": true}

// nodeProcesses are the processes of processesUsing that run one of
// nodePrograms: a shell or an editor that merely names the node's
// directory is left alone.
func nodeProcesses(dirs ...string) []int {
	var pids []int
	for _, pid := range processesUsing(dirs...) {
		exe, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "exe"))
		if err != nil {
			continue
		}
		if nodePrograms[filepath.Base(strings.TrimSuffix(exe, " (deleted)"))] {
			pids = append(pids, pid)
		}
	}
	return pids
}

// processesUsing lists the live processes whose command line mentions one
// of dirs (as a path: dir followed by a slash), never this process.
func processesUsing(dirs ...string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, d := range dirs {
			if bytes.Contains(cmdline, []byte(d+"/")) && alive(pid) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// cgroupRoots are the cgroup hierarchies' mount points (v1: one per
// controller; v2: one), from /proc/self/mountinfo.
func cgroupRoots() []string {
	var roots []string
	for _, m := range mounts() {
		if m.fsType == "cgroup" || m.fsType == "cgroup2" {
			roots = append(roots, m.point)
		}
	}
	return roots
}

// kubepodsCgroups are the pods' cgroups kubelet made (cgroupfs driver,
// cgroup root /), in every hierarchy.
func kubepodsCgroups() []string {
	var out []string
	for _, r := range cgroupRoots() {
		d := filepath.Join(r, "kubepods")
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			out = append(out, d)
		}
	}
	return out
}

// kubepodsProcesses are the processes in any pod's cgroup: the containers.
func kubepodsProcesses() []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range kubepodsCgroups() {
		_ = filepath.WalkDir(d, func(path string, de os.DirEntry, err error) error {
			if err != nil || de.IsDir() || de.Name() != "cgroup.procs" {
				return nil //nolint:nilerr // a cgroup removed while walking
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return nil //nolint:nilerr // as above
			}
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] && pid != os.Getpid() {
					seen[pid] = true
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	return pids
}

// removeKubepodsCgroups removes the pods' cgroups, deepest first (a cgroup
// directory goes with rmdir once it has no process and no child).
func removeKubepodsCgroups() error {
	var errs []error
	for _, d := range kubepodsCgroups() {
		var dirs []string
		_ = filepath.WalkDir(d, func(path string, de os.DirEntry, err error) error {
			if err == nil && de.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, c := range dirs {
			if err := unix.Rmdir(c); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", c, err))
			}
		}
	}
	return errors.Join(errs...)
}

type mount struct{ point, fsType string }

// mounts reads /proc/self/mountinfo.
func mounts() []mount {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer func() { _ = f.Close() }()
	return parseMountinfo(f)
}

func parseMountinfo(r io.Reader) []mount {
	var out []mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		if len(fields) < 7 {
			continue
		}
		m := mount{point: unescapeMount(fields[4])}
		for i := 6; i < len(fields)-1; i++ {
			if fields[i] == "-" {
				m.fsType = fields[i+1]
				break
			}
		}
		out = append(out, m)
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// MountsUnder lists the mount points at or below dir, deepest first.
func MountsUnder(dir string) []string {
	var out []string
	for _, m := range mounts() {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// unmountUnder detaches every mount at or below dir, deepest first, until
// none is left (a mount can hide another at the same point).
func unmountUnder(dir string) error {
	for range 10 {
		points := MountsUnder(dir)
		if len(points) == 0 {
			return nil
		}
		for _, p := range points {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", p, err)
			}
		}
	}
	if left := MountsUnder(dir); len(left) > 0 {
		return fmt.Errorf("still mounted under %s: %v", dir, left)
	}
	return nil
}
