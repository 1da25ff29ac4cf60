package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

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

// killHostProcess ends a process with SIGKILL. GPU PIDs are host PIDs, so
// the agent must run with hostPID: true for this to reach a pod's process.
func killHostProcess(_ context.Context, pid int32) error {
	if pid <= 1 {
		return fmt.Errorf("kill process %d: refusing to signal PID %d", pid, pid)
	}
	if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill process %d: %w (the agent needs hostPID: true to end pods' processes)", pid, ErrProcessNotFound)
		}
		return fmt.Errorf("kill process %d: %w", pid, err)
	}
	return nil
}
