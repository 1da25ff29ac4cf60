// Package realnode runs the dev cluster's real node, real-node-0: containerd
// with runc and the CNI bridge, kubelet and kube-proxy as processes on this
// host, joined to the cluster's API server, and CoreDNS as a pod on it. It
// loads the images `make images` builds into the node's containerd, so
// pods really start without a registry.
//
// A real node changes the host: sysctls (kubelet's and kube-proxy's),
// iptables rules, mounts, cgroups, a network bridge and a few directories.
// The package records what the host looked like before in a state file
// under RunDir and Down undoes all of it, even after a kill -9 of kubelet
// or containerd. Only one real node runs on a host at a time.
//
// It imports nothing of Partita's; package devcluster drives it.
package realnode

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
)

// NodeName is the real node's name.
const NodeName = "real-node-0"

// The node's networks. ServiceCIDR must be the API server's
// --service-cluster-ip-range (package devcluster sets it).
const (
	ServiceCIDR = "10.0.0.0/24"
	// APIServiceIP is the kubernetes Service's ClusterIP, which the API
	// server's certificate names for in-cluster clients.
	APIServiceIP = "10.0.0.1"
	// ClusterDNS is kube-dns's ClusterIP, the pods' nameserver.
	ClusterDNS = "10.0.0.10"
	// PodCIDR is the CNI bridge's subnet on the node.
	PodCIDR = "10.244.0.0/24"
	// Bridge is the CNI bridge's interface.
	Bridge = "partita0"
	// ClusterDomain is the DNS domain of Services.
	ClusterDomain = "cluster.local"
)

// RunDir holds the host-wide state of the real node (which cluster owns
// it, what the host looked like before) and containerd's sockets, whose
// paths must stay short.
const RunDir = "/run/partita/real-node"

// Config says where the node's parts are and how it joins the cluster.
type Config struct {
	// Cluster is the dev cluster's name (shown to a person).
	Cluster string
	// Dir is the node's own directory: configuration, certificates, the
	// state of containerd and kubelet. It is removed by the caller.
	Dir string
	// LogsDir receives containerd.log, kubelet.log and kube-proxy.log.
	LogsDir string
	// BinDir holds containerd, containerd-shim-runc-v2, ctr, kubelet and
	// kube-proxy (make cluster-bins).
	BinDir string
	// ImagesDir holds the image tarballs of Images (make images).
	ImagesDir string
	// Server is the API server's URL as host processes reach it.
	Server string
	// CACert and CAKey are the cluster CA's files; the CA signs the node's
	// client certificates and kubelet trusts it for the API server's.
	CACert, CAKey string
	// Labels are the Node's labels (kubelet --node-labels).
	Labels map[string]string
	// Apply creates or updates the objects of a manifest (CoreDNS's).
	Apply func(ctx context.Context, manifest []byte) error
	// RunDir overrides RunDir (tests).
	RunDir string
	// Out receives progress lines meant for a person.
	Out io.Writer
}

// Node is the real node of one dev cluster.
type Node struct {
	cfg Config
	// exits records how the components this Node started ended (by
	// name), while this process runs: waitFor says it when one dies.
	exits sync.Map
}

// New returns the node the configuration describes.
func New(cfg Config) *Node {
	if cfg.RunDir == "" {
		cfg.RunDir = RunDir
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	return &Node{cfg: cfg}
}

func (n *Node) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(n.cfg.Out, format+"\n", args...)
}

func (n *Node) path(elem ...string) string {
	return filepath.Join(append([]string{n.cfg.Dir}, elem...)...)
}

// Exists reports whether the node was set up (its directory exists).
func (n *Node) Exists() bool {
	_, err := os.Stat(n.cfg.Dir)
	return err == nil
}

// The node's processes, in start order.
var components = []string{"containerd", "kubelet", "kube-proxy"}

// Status maps each of the node's processes to running or stopped.
func (n *Node) Status() map[string]string {
	st := map[string]string{}
	for _, c := range components {
		st[NodeName+"/"+c] = "stopped"
		if n.running(c) {
			st[NodeName+"/"+c] = "running"
		}
	}
	return st
}

// Up starts the node, or checks and repairs one that runs: containerd, the
// images, kubelet, kube-proxy, then CoreDNS. Running it twice is harmless.
func (n *Node) Up(ctx context.Context, cs kubernetes.Interface) error {
	start := time.Now()
	if err := CheckHost(n.cfg.BinDir, n.cfg.ImagesDir); err != nil {
		return err
	}
	if err := n.claimHost(ctx); err != nil {
		return err
	}
	if err := enableBridgeNetfilter(); err != nil {
		return err
	}
	if err := n.writeFiles(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	if err := n.loadImages(ctx); err != nil {
		return err
	}
	if err := n.startKubelet(ctx); err != nil {
		return err
	}
	if err := n.startKubeProxy(ctx); err != nil {
		return err
	}
	if err := waitNodeReady(ctx, cs, 90*time.Second, n.logPath("kubelet")); err != nil {
		return err
	}
	if err := n.ensureCoreDNS(ctx, cs); err != nil {
		return err
	}
	n.printf("Real node %s is up (containerd, kubelet, kube-proxy, CoreDNS) in %.1fs", NodeName, time.Since(start).Seconds())
	return nil
}

func (n *Node) logPath(component string) string {
	return filepath.Join(n.cfg.LogsDir, component+".log")
}

// describeLog returns the last lines of a component's log, for errors.
func describeLog(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log at " + path + ")"
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return path + ":\n" + strings.Join(all, "\n")
}
