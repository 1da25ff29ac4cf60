package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"
)

// podUIDPattern finds a pod UID in a cgroup path: the kubelet names pod
// cgroups "pod<uid>" (cgroupfs) or "...-pod<uid with _>.slice" (systemd).
var podUIDPattern = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// containerIDPattern is a runtime container ID: 64 hex digits.
var containerIDPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// parseCgroup reads the pod UID and container ID from the content of
// /proc/<pid>/cgroup. It understands cgroup v1 and v2 with the cgroupfs and
// systemd drivers and the containerd, CRI-O and Docker runtimes, e.g.
//
//	0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c..._...slice/cri-containerd-<id>.scope
//	12:memory:/kubepods/besteffort/pod1b2c...-.../<id>
//
// Either result is empty when the process is not in a pod.
func parseCgroup(content string) (types.UID, string) {
	for line := range strings.SplitSeq(content, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		path := parts[2]
		m := podUIDPattern.FindStringSubmatch(path)
		if m == nil {
			continue
		}
		uid := types.UID(strings.ReplaceAll(m[1], "_", "-"))
		last := path[strings.LastIndex(path, "/")+1:]
		last = strings.TrimSuffix(last, ".scope")
		for _, prefix := range []string{"cri-containerd-", "crio-", "docker-", "containerd-"} {
			last = strings.TrimPrefix(last, prefix)
		}
		if containerIDPattern.MatchString(last) {
			return uid, last
		}
		return uid, ""
	}
	return "", ""
}

// processPod finds the pod and container of a host process from
// <procRoot>/<pid>/cgroup. Without hostPID (or the host's /proc mounted as
// procRoot) the agent cannot see pods' processes and this fails.
func processPod(procRoot string, pid int32) (types.UID, string, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(int(pid)), "cgroup"))
	if err != nil {
		return "", "", fmt.Errorf("read cgroup of process %d: %w", pid, err)
	}
	uid, cid := parseCgroup(string(b))
	return uid, cid, nil
}

// sysfsPCIAddress turns NVML's bus ID ("00000000:3B:00.0") into the name of
// the device's directory in sysfs ("0000:3b:00.0").
func sysfsPCIAddress(busID string) string {
	busID = strings.ToLower(strings.TrimSpace(busID))
	domain, rest, ok := strings.Cut(busID, ":")
	if !ok {
		return busID
	}
	if len(domain) > 4 {
		domain = domain[len(domain)-4:]
	}
	return domain + ":" + rest
}

// numaNode reads a PCI device's NUMA node from sysfs; nil when the platform
// does not say (-1) or the file cannot be read.
func numaNode(sysRoot, busID string) *int32 {
	if busID == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(sysRoot, "bus", "pci", "devices", sysfsPCIAddress(busID), "numa_node"))
	if err != nil {
		return nil
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 32)
	if err != nil || n < 0 {
		return nil
	}
	v := int32(n)
	return &v
}

// ErrProcessNotFound says a process to kill does not exist in the agent's
// PID namespace.
var ErrProcessNotFound = errors.New("process not found")

// ErrProcessChanged says the PID of a process to kill no longer names the
// process the watchdog measured: that one exited and the PID went to
// another process, or the process left the pod's container.
var ErrProcessChanged = errors.New("process changed")

// procStat is what /proc/<pid>/stat says about a process that tells it
// from a later process with the same PID.
type procStat struct {
	// State is the one-letter state (R, S, D, Z, ...).
	State byte
	// StartTicks is when the process started, in clock ticks since boot
	// (field 22). Two processes that share a PID over time never share it.
	StartTicks uint64
}

// readProcStat reads <procRoot>/<pid>/stat.
func readProcStat(procRoot string, pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, fmt.Errorf("read stat of process %d: %w", pid, err)
	}
	st, err := parseProcStat(string(b))
	if err != nil {
		return procStat{}, fmt.Errorf("read stat of process %d: %w", pid, err)
	}
	return st, nil
}

// parseProcStat reads the state and start time from the content of
// /proc/<pid>/stat: "pid (comm) state ppid ...", where comm may itself
// hold spaces and parentheses, so the fields are counted from the last ')'.
func parseProcStat(content string) (procStat, error) {
	i := strings.LastIndexByte(content, ')')
	if i < 0 {
		return procStat{}, errors.New("no command name in stat")
	}
	// After ") " come fields 3 (state) onwards; start time is field 22.
	f := strings.Fields(content[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("stat has %d fields after the command name, want at least 20", len(f))
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("start time %q: %w", f[19], err)
	}
	return procStat{State: f[0][0], StartTicks: start}, nil
}

// readCmdline reads <procRoot>/<pid>/cmdline as its arguments.
func readCmdline(procRoot string, pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, fmt.Errorf("read command line of process %d: %w", pid, err)
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
}

// processStartTicks reads a process's start time, 0 when it cannot be read
// (the process exited, or the agent cannot see the host's processes).
func processStartTicks(procRoot string, pid int32) uint64 {
	st, err := readProcStat(procRoot, int(pid))
	if err != nil {
		return 0
	}
	return st.StartTicks
}

// verifyProcess checks that the PID of p still names the process the
// watchdog measured, as <procRoot> shows it now: it runs (not a zombie),
// started at the same tick (the PID was not reused), and is in the same pod
// and container (its cgroup did not change). The watchdog runs it just
// before SIGKILL, so that a PID freed since the NVML snapshot and taken by
// another process, perhaps another tenant's, is never signalled.
func verifyProcess(procRoot string, p Process) error {
	st, err := readProcStat(procRoot, int(p.PID))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("kill process %d: %w (it exited, or the agent needs hostPID: true to end pods' processes)", p.PID, ErrProcessNotFound)
	case err != nil:
		return fmt.Errorf("kill process %d: %w", p.PID, err)
	case st.State == 'Z' || st.State == 'X':
		return fmt.Errorf("kill process %d: %w (it already exited)", p.PID, ErrProcessNotFound)
	case p.StartTicks == 0:
		return fmt.Errorf("kill process %d: %w: its start time was not known when it was measured, so its PID cannot be told from a reused one", p.PID, ErrProcessChanged)
	case st.StartTicks != p.StartTicks:
		return fmt.Errorf("kill process %d: %w: the PID now names a process started at tick %d, not the measured one (tick %d)", p.PID, ErrProcessChanged, st.StartTicks, p.StartTicks)
	}
	uid, cid, err := processPod(procRoot, p.PID)
	if err != nil {
		return fmt.Errorf("kill process %d: %w", p.PID, err)
	}
	if uid != p.PodUID || (p.ContainerID != "" && cid != p.ContainerID) {
		return fmt.Errorf("kill process %d: %w: it is now in pod %q container %q, not pod %q container %q", p.PID, ErrProcessChanged, uid, cid, p.PodUID, p.ContainerID)
	}
	return nil
}

// killHostProcess ends p with SIGKILL after verifyProcess confirms, as the
// agent's own /proc (procRoot) shows it, that its PID still names the
// measured process. The PID is pinned first with a pidfd, so that the
// process checked is the one signalled: if it exits after the check, the
// signal fails rather than reach whoever takes the PID next. GPU PIDs are
// host PIDs, so the agent must run with hostPID: true for this to reach a
// pod's process; without it, the PID names nothing (or another process) in
// the agent's namespace and the check refuses.
func killHostProcess(_ context.Context, procRoot string, p Process) error {
	if p.PID <= 1 {
		return fmt.Errorf("kill process %d: refusing to signal PID %d", p.PID, p.PID)
	}
	fd, err := unix.PidfdOpen(int(p.PID), 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("kill process %d: %w (it exited, or the agent needs hostPID: true to end pods' processes)", p.PID, ErrProcessNotFound)
	case errors.Is(err, unix.ENOSYS):
		fd = -1 // before Linux 5.3: check, then kill by PID
	case err != nil:
		return fmt.Errorf("kill process %d: pin its PID: %w", p.PID, err)
	default:
		defer func() { _ = unix.Close(fd) }()
	}
	if err := verifyProcess(procRoot, p); err != nil {
		return err
	}
	if fd >= 0 {
		err = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
	} else {
		err = unix.Kill(int(p.PID), unix.SIGKILL)
	}
	switch {
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("kill process %d: %w (it exited)", p.PID, ErrProcessNotFound)
	case err != nil:
		return fmt.Errorf("kill process %d: %w", p.PID, err)
	}
	return nil
}
