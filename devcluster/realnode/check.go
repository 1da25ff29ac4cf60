package realnode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// Binaries the node runs from the cluster binaries' directory.
var clusterBinaries = []string{"containerd", "containerd-shim-runc-v2", "ctr", "kubelet", "kube-proxy"}

// hostCommand is a program the node needs on PATH and the Debian package
// that has it (hack/real-node-deps.sh installs them).
type hostCommand struct{ name, pkg string }

var hostCommands = []hostCommand{
	{"runc", "runc"},
	{"iptables", "iptables"},
	{"iptables-save", "iptables"},
	{"iptables-restore", "iptables"},
	{"ip6tables", "iptables"},
	{"ip6tables-save", "iptables"},
	{"ip6tables-restore", "iptables"},
	{"conntrack", "conntrack"},
	{"ip", "iproute2"},
}

// cniPlugins are the CNI plugins of the node's network, and where Debian's
// containernetworking-plugins and the upstream tarball put them.
var (
	cniPlugins = []string{"bridge", "host-local", "loopback", "portmap"}
	cniDirs    = []string{"/usr/lib/cni", "/opt/cni/bin"}
)

// HostError lists everything that keeps this host from running the real
// node, each with how to fix it.
type HostError struct {
	// NotRoot is set when the process is not root: nothing else can help.
	NotRoot  bool
	Problems []string
}

func (e *HostError) Error() string {
	return "the real node cannot run on this host:\n  - " + strings.Join(e.Problems, "\n  - ")
}

// IsNotRoot reports whether err says the real node needs root, the one
// thing a test may skip for.
func IsNotRoot(err error) bool {
	var he *HostError
	return errors.As(err, &he) && he.NotRoot
}

// CheckHost reports, all at once, what the real node needs and this host
// lacks: root, Linux with cgroups, the cluster binaries, the Debian
// packages, the CNI plugins and the images.
func CheckHost(binDir, imagesDir string) error {
	return host{goos: runtime.GOOS, euid: os.Geteuid(), lookPath: exec.LookPath, cniDirs: cniDirs, cgroupDir: "/sys/fs/cgroup"}.check(binDir, imagesDir)
}

// host is what CheckHost looks at, apart for tests.
type host struct {
	goos      string
	euid      int
	lookPath  func(string) (string, error)
	cniDirs   []string
	cgroupDir string
}

func (h host) check(binDir, imagesDir string) error {
	e := &HostError{}
	if h.goos != "linux" {
		e.Problems = append(e.Problems, "it needs Linux (this is "+h.goos+")")
		return e
	}
	if h.euid != 0 {
		e.NotRoot = true
		e.Problems = append(e.Problems, "it needs root (kubelet and containerd mount filesystems, create cgroups and change iptables and sysctls): run 'partita dev up --real-node' as root, e.g. with sudo")
	}
	if _, err := os.Stat(h.cgroupDir); err != nil {
		e.Problems = append(e.Problems, "no cgroup filesystem at "+h.cgroupDir)
	}
	var missingBins []string
	for _, b := range clusterBinaries {
		if !executable(filepath.Join(binDir, b)) {
			missingBins = append(missingBins, b)
		}
	}
	if len(missingBins) > 0 {
		e.Problems = append(e.Problems, fmt.Sprintf("missing cluster binaries in %s: %s; build them with 'make real-node-bins' (about 10 minutes the first time; 'make cluster-bins' builds every group the tests use)", binDir, strings.Join(missingBins, ", ")))
	}
	var missingCmds, pkgs []string
	for _, c := range hostCommands {
		if _, err := h.lookPath(c.name); err != nil {
			missingCmds = append(missingCmds, c.name)
			if !slices.Contains(pkgs, c.pkg) {
				pkgs = append(pkgs, c.pkg)
			}
		}
	}
	if findCNIDir(h.cniDirs) == "" {
		missingCmds = append(missingCmds, "the CNI plugins "+strings.Join(cniPlugins, ", ")+" (in "+strings.Join(h.cniDirs, " or ")+")")
		pkgs = append(pkgs, "containernetworking-plugins")
	}
	if len(missingCmds) > 0 {
		e.Problems = append(e.Problems, fmt.Sprintf("missing on this host: %s; install them with 'hack/real-node-deps.sh' (or: apt-get install -y %s)",
			strings.Join(missingCmds, ", "), strings.Join(pkgs, " ")))
	}
	var missingImages []string
	for _, img := range Images {
		if st, err := os.Stat(filepath.Join(imagesDir, img.File)); err != nil || st.IsDir() {
			missingImages = append(missingImages, img.File+" ("+img.Ref+")")
		}
	}
	if len(missingImages) > 0 {
		e.Problems = append(e.Problems, fmt.Sprintf("missing images in %s: %s; build them with 'make images'", imagesDir, strings.Join(missingImages, ", ")))
	}
	if len(e.Problems) > 0 {
		return e
	}
	return nil
}

// cniDir is the first of cniDirs with every CNI plugin, or "".
func cniDir() string { return findCNIDir(cniDirs) }

func findCNIDir(dirs []string) string {
	for _, d := range dirs {
		ok := true
		for _, p := range cniPlugins {
			if !executable(filepath.Join(d, p)) {
				ok = false
				break
			}
		}
		if ok {
			return d
		}
	}
	return ""
}

func executable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}
