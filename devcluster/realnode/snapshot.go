package realnode

import (
	"context"
	"net"
	"os"
	"sort"
)

// HostSnapshot is what the real node may change on a host, in a form two
// moments compare in: the end-to-end tests take one before `dev up` and one
// after `dev down` and want them equal.
type HostSnapshot struct {
	// Mounts are the host's mount points, sorted.
	Mounts []string
	// IPTables is IPTablesRules.
	IPTables string
	// Sysctls are the values of WatchedSysctls.
	Sysctls map[string]string
	// Interfaces are the network interfaces' names, sorted.
	Interfaces []string
	// Paths are those of HostPaths (and RunDir) that exist.
	Paths []string
	// Kubepods are the pods' cgroups that exist.
	Kubepods []string
}

// TakeHostSnapshot reads the host's current state.
func TakeHostSnapshot(ctx context.Context) (HostSnapshot, error) {
	s := HostSnapshot{Sysctls: ReadSysctls(WatchedSysctls), Kubepods: kubepodsCgroups()}
	for _, m := range mounts() {
		s.Mounts = append(s.Mounts, m.point)
	}
	sort.Strings(s.Mounts)
	var err error
	if s.IPTables, err = IPTablesRules(ctx); err != nil {
		return s, err
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return s, err
	}
	for _, i := range ifaces {
		s.Interfaces = append(s.Interfaces, i.Name)
	}
	sort.Strings(s.Interfaces)
	for _, p := range append(append([]string(nil), HostPaths...), RunDir) {
		if _, err := os.Lstat(p); err == nil {
			s.Paths = append(s.Paths, p)
		}
	}
	return s, nil
}

// ProcessesUsing lists the live processes whose command line names a path
// under one of dirs (zombies do not count).
func ProcessesUsing(dirs ...string) []int { return processesUsing(dirs...) }

// KubepodsProcesses lists the processes in the pods' cgroups.
func KubepodsProcesses() []int { return kubepodsProcesses() }
