package realnode

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// hostState is what RunDir/state.json records: which node owns the host's
// real node, and what the host looked like before it started, so that
// Down restores it.
type hostState struct {
	// Cluster and Dir name the owning node (Config.Cluster, Config.Dir).
	Cluster string `json:"cluster"`
	Dir     string `json:"dir"`
	// Sysctls are the values of WatchedSysctls before the node started;
	// a key that did not exist is absent.
	Sysctls map[string]string `json:"sysctls"`
	// CreatedPaths are the host paths of HostPaths that did not exist
	// before the node started.
	CreatedPaths []string  `json:"createdPaths"`
	Since        time.Time `json:"since"`
}

// WatchedSysctls are the kernel settings kubelet (vm.*, kernel.*),
// kube-proxy (route_localnet, conntrack) and the CNI bridge (forwarding)
// may change; Down puts back the values they had before.
var WatchedSysctls = []string{
	"vm.overcommit_memory",
	"vm.panic_on_oom",
	"kernel.panic",
	"kernel.panic_on_oops",
	"kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes",
	"net.ipv4.ip_forward",
	"net.ipv4.conf.all.forwarding",
	"net.ipv4.conf.default.forwarding",
	"net.ipv4.conf.all.route_localnet",
	"net.ipv6.conf.all.forwarding",
	"net.bridge.bridge-nf-call-iptables",
	"net.bridge.bridge-nf-call-ip6tables",
	"net.netfilter.nf_conntrack_max",
	"net.netfilter.nf_conntrack_tcp_timeout_established",
	"net.netfilter.nf_conntrack_tcp_timeout_close_wait",
	"net.netfilter.nf_conntrack_tcp_be_liberal",
}

// HostPaths are the directories outside the node's own that containerd,
// the CNI plugins and kubelet create at fixed paths (shim sockets, the CNI
// cache, kubelet's device-plugin socket directory, log symlinks) and the
// parent of RunDir; Down removes those that did not exist before.
var HostPaths = []string{
	"/run/partita",
	"/run/containerd",
	"/run/nri",
	"/var/run/netns",
	"/var/lib/cni",
	"/var/lib/kubelet",
	"/var/log/containers",
	"/var/log/pods",
}

// Ports the node's processes listen on, fixed by the kubelet and kube-proxy
// configuration.
var nodePorts = map[int]string{10250: "kubelet", 10248: "kubelet healthz", 10249: "kube-proxy metrics", 10256: "kube-proxy healthz"}

func (n *Node) statePath() string { return filepath.Join(n.cfg.RunDir, "state.json") }

func (n *Node) readState() (*hostState, error) {
	b, err := os.ReadFile(n.statePath())
	if err != nil {
		return nil, err
	}
	var st hostState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("read %s: %w", n.statePath(), err)
	}
	return &st, nil
}

// claimHost makes this node the host's real node. The first time it
// records the host's sysctls and paths; a node of another cluster that
// still runs is refused, one whose cluster is gone is cleaned up first.
func (n *Node) claimHost(ctx context.Context) error {
	st, err := n.readState()
	switch {
	case err == nil && st.Dir == n.cfg.Dir:
		return nil
	case err == nil:
		if _, derr := os.Stat(st.Dir); derr == nil && len(nodeProcesses(st.Dir, n.cfg.RunDir)) > 0 {
			return fmt.Errorf("cluster %q already runs this host's real node (one per host: kubelet's ports, iptables and cgroups are the host's); stop it with 'partita dev down --name %s'", st.Cluster, st.Cluster)
		}
		n.printf("Cleaning up the real node that cluster %q left behind", st.Cluster)
		other := New(Config{Cluster: st.Cluster, Dir: st.Dir, RunDir: n.cfg.RunDir, Out: n.cfg.Out})
		if err := other.cleanup(ctx, st); err != nil {
			return fmt.Errorf("clean up the real node of cluster %q: %w", st.Cluster, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	if err := foreignNode(); err != nil {
		return err
	}
	st = &hostState{Cluster: n.cfg.Cluster, Dir: n.cfg.Dir, Sysctls: ReadSysctls(WatchedSysctls), Since: time.Now().UTC()}
	for _, p := range HostPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			st.CreatedPaths = append(st.CreatedPaths, p)
		}
	}
	if err := os.MkdirAll(n.cfg.RunDir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", n.cfg.RunDir, err)
	}
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(n.statePath(), b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", n.statePath(), err)
	}
	return nil
}

// foreignNode reports a kubelet or network of someone else's on this host,
// which the real node would fight with (and whose state Down would remove).
func foreignNode() error {
	var problems []string
	for _, d := range kubepodsCgroups() {
		problems = append(problems, "the cgroup "+d+" exists: another kubelet runs (or ran) here (a dev cluster's whose state in "+RunDir+" is gone? 'partita dev down --name <it>' removes it)")
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", Bridge)); err == nil {
		problems = append(problems, "the network interface "+Bridge+" exists (remove a leftover with 'ip link delete "+Bridge+"')")
	}
	for port, what := range nodePorts {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			problems = append(problems, fmt.Sprintf("port %d (%s) is in use", port, what))
			continue
		}
		_ = l.Close()
	}
	if len(problems) > 0 {
		return &HostError{Problems: append(problems, "the real node needs a host without another Kubernetes node; stop it, or run the real node elsewhere")}
	}
	return nil
}

// enableBridgeNetfilter makes bridged traffic pass iptables, which
// kube-proxy needs when a pod reaches a Service whose endpoint is on the
// same bridge (the reply must be un-NATed): the chart's kube-scheduler
// calls the extender that way. Down restores the values (WatchedSysctls).
func enableBridgeNetfilter() error {
	key := "net.bridge.bridge-nf-call-iptables"
	if _, err := os.Stat(sysctlPath(key)); err != nil {
		return &HostError{Problems: []string{"the kernel's bridge netfilter is off (no /proc/sys/net/bridge): load it with 'modprobe br_netfilter'"}}
	}
	for _, k := range []string{key, "net.bridge.bridge-nf-call-ip6tables"} {
		if b, err := os.ReadFile(sysctlPath(k)); err == nil && strings.TrimSpace(string(b)) != "1" {
			if err := os.WriteFile(sysctlPath(k), []byte("1"), 0o644); err != nil {
				return fmt.Errorf("set sysctl %s=1: %w", k, err)
			}
		}
	}
	return nil
}

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

// ReadSysctls returns the current value of each key that exists.
func ReadSysctls(keys []string) map[string]string {
	out := map[string]string{}
	for _, k := range keys {
		b, err := os.ReadFile(sysctlPath(k))
		if err == nil {
			out[k] = strings.TrimSpace(string(b))
		}
	}
	return out
}

// restoreSysctls writes back each recorded value that changed, in
// WatchedSysctls order (ip_forward before the per-interface forwarding
// keys it also sets).
func restoreSysctls(want map[string]string) error {
	var errs []error
	for _, k := range WatchedSysctls {
		v, ok := want[k]
		if !ok {
			continue
		}
		cur, err := os.ReadFile(sysctlPath(k))
		if err != nil || strings.TrimSpace(string(cur)) == v {
			continue
		}
		if err := os.WriteFile(sysctlPath(k), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", k, v, err))
		}
	}
	return errors.Join(errs...)
}

// nodeIP is the address kubelet reports and the API server reaches it at:
// the IPv4 address of the interface of the default route, else the first
// global IPv4 address of an interface that is up (never the CNI bridge).
func nodeIP() (string, error) {
	if iface := defaultRouteInterface(); iface != "" && iface != Bridge {
		if ip := firstIPv4(iface); ip != "" {
			return ip, nil
		}
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list network interfaces: %w", err)
	}
	for _, i := range ifaces {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || i.Name == Bridge || strings.HasPrefix(i.Name, "veth") {
			continue
		}
		if ip := firstIPv4(i.Name); ip != "" {
			return ip, nil
		}
	}
	return "", errors.New("this host has no IPv4 address besides loopback: pods reach the API server and the API server reaches kubelet through one")
}

func defaultRouteInterface() string {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 2 && fields[1] == "00000000" && fields[0] != "Iface" {
			return fields[0]
		}
	}
	return ""
}

func firstIPv4(name string) string {
	i, err := net.InterfaceByName(name)
	if err != nil {
		return ""
	}
	addrs, err := i.Addrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
			return ipn.IP.String()
		}
	}
	return ""
}

// HostIP is this host's address that pods on the real node and host
// processes both reach (the node's address).
func HostIP() (string, error) { return nodeIP() }
