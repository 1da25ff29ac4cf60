package devcluster

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// stateDir holds Partita's own state for the cluster (ports, rendered
// configuration). It lives beside kwokctl's directory because kwokctl creates
// its own only when the cluster is created, and the scheduler configuration
// must exist before that.
func (c *Cluster) stateDir() string {
	return filepath.Join(c.opts.WorkDir, "partita", c.opts.Name)
}

// ModelFilesDirName is the directory under StateDir that file:// Models
// may name on the simulated nodes: their model caches' --file-roots.
const ModelFilesDirName = "model-files"

// ModelFilesDir is where file:// Models of the simulated nodes live (a
// stand-in for a share every node mounts).
func (c *Cluster) ModelFilesDir() string { return filepath.Join(c.stateDir(), ModelFilesDirName) }

// StateDir is Partita's state directory for the cluster, the {state}
// placeholder of HostProcess.Args (the extender's dev certificates live
// there).
func (c *Cluster) StateDir() string { return c.stateDir() }

var portPlaceholder = regexp.MustCompile(`\{port:([a-z0-9-]+)\}`)

// ports returns the cluster's named loopback ports, choosing and saving a free
// one for each name seen for the first time. A port stays the same for the
// life of the cluster, so a kube-scheduler configured with the extender's
// address keeps reaching it after the extender restarts.
func (c *Cluster) ports(names []string) (map[string]int, error) {
	ports, err := c.savedPorts()
	if err != nil {
		return nil, err
	}
	file := c.portsFile()
	changed := false
	taken := map[int]bool{}
	for _, p := range ports {
		taken[p] = true
	}
	for _, n := range names {
		if _, ok := ports[n]; ok {
			continue
		}
		p, err := freePort(taken)
		if err != nil {
			return nil, err
		}
		ports[n], taken[p] = p, true
		changed = true
	}
	if changed {
		if err := os.MkdirAll(c.stateDir(), 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", c.stateDir(), err)
		}
		b, _ := json.Marshal(ports)
		if err := os.WriteFile(file, b, 0o644); err != nil {
			return nil, fmt.Errorf("write %s: %w", file, err)
		}
	}
	return ports, nil
}

func (c *Cluster) portsFile() string { return filepath.Join(c.stateDir(), "ports.json") }

// savedPorts returns the ports chosen so far, by name, choosing none.
func (c *Cluster) savedPorts() (map[string]int, error) {
	ports := map[string]int{}
	b, err := os.ReadFile(c.portsFile())
	if err != nil {
		return ports, nil
	}
	if err := json.Unmarshal(b, &ports); err != nil {
		return nil, fmt.Errorf("read %s: %w; remove the cluster with 'partita dev down --name %s'", c.portsFile(), err, c.opts.Name)
	}
	return ports, nil
}

// expand replaces {port:NAME}, {kubeconfig}, {dir} and {state} in s.
func (c *Cluster) expand(s string) (string, error) {
	var names []string
	for _, m := range portPlaceholder.FindAllStringSubmatch(s, -1) {
		names = append(names, m[1])
	}
	if len(names) > 0 {
		ports, err := c.ports(names)
		if err != nil {
			return "", err
		}
		s = portPlaceholder.ReplaceAllStringFunc(s, func(m string) string {
			return strconv.Itoa(ports[portPlaceholder.FindStringSubmatch(m)[1]])
		})
	}
	return strings.NewReplacer("{kubeconfig}", c.KubeconfigPath(), "{dir}", c.Dir(), "{state}", c.stateDir(),
		"{gpus}", fmt.Sprintf("%dx%s", c.opts.GPUsPerNode, c.opts.GPUModel)).Replace(s), nil
}

// Port returns the cluster's loopback port of the given name (see ports).
func (c *Cluster) Port(name string) (int, error) {
	p, err := c.ports([]string{name})
	if err != nil {
		return 0, err
	}
	return p[name], nil
}

// freePort picks a loopback port that is free now, is not in taken, and
// lies below the kernel's ephemeral range: a port that bind(:0) hands out
// may be given to an outgoing connection (a client of kube-apiserver)
// before the process it is meant for binds it, which then fails to start.
func freePort(taken map[int]bool) (int, error) {
	const low = 10000
	if high := ephemeralPortsStart(); high > low+1000 {
		for range 500 {
			p := low + rand.IntN(high-low)
			if taken[p] {
				continue
			}
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				continue
			}
			_ = l.Close()
			return p, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralPortsStart is the first port of the kernel's ephemeral range
// (Linux's default when it cannot be read).
func ephemeralPortsStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}
