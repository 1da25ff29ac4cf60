package realnode

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
	"sigs.k8s.io/yaml"
)

func (n *Node) containerdSocket() string { return filepath.Join(n.cfg.RunDir, "containerd.sock") }

// identities are the node's two clients of the API server: kubelet as the
// node (the Node authorizer and NodeRestriction apply to it) and kube-proxy
// as system:kube-proxy (bound to system:node-proxier by Kubernetes).
var identities = map[string]pkix.Name{
	"kubelet":    {CommonName: "system:node:" + NodeName, Organization: []string{"system:nodes"}},
	"kube-proxy": {CommonName: "system:kube-proxy"},
}

// writeFiles writes the node's configuration and client certificates.
func (n *Node) writeFiles() error {
	for _, d := range []string{"pki", "pids", "containerd", "cni/net.d", "cni/ipam", "kubelet/root", "kubelet/pki", "pod-logs", "cdi"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", n.path(d), err)
		}
	}
	for name, subject := range identities {
		if err := n.ensureClientCert(name, subject); err != nil {
			return err
		}
		if err := n.writeKubeconfig(name); err != nil {
			return err
		}
	}
	files := map[string]func() ([]byte, error){
		"containerd/config.toml":        n.containerdConfig,
		"cni/net.d/10-partita.conflist": n.cniConfig,
		"kubelet/config.yaml":           n.kubeletConfig,
		"kube-proxy.yaml":               n.kubeProxyConfig,
	}
	for name, render := range files {
		b, err := render()
		if err != nil {
			return fmt.Errorf("render %s: %w", name, err)
		}
		if err := os.WriteFile(n.path(name), b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", n.path(name), err)
		}
	}
	return nil
}

// ensureClientCert writes a client certificate for subject signed by the
// cluster CA, unless a valid one is there.
func (n *Node) ensureClientCert(name string, subject pkix.Name) error {
	certPath, keyPath := n.path("pki", name+".crt"), n.path("pki", name+".key")
	caPEM, err := os.ReadFile(n.cfg.CACert)
	if err != nil {
		return fmt.Errorf("read the cluster CA: %w", err)
	}
	cas, err := certutil.ParseCertsPEM(caPEM)
	if err != nil {
		return fmt.Errorf("parse the cluster CA %s: %w", n.cfg.CACert, err)
	}
	ca := cas[0]
	if b, err := os.ReadFile(certPath); err == nil {
		if certs, err := certutil.ParseCertsPEM(b); err == nil && certs[0].CheckSignatureFrom(ca) == nil && time.Now().Add(24*time.Hour).Before(certs[0].NotAfter) {
			if _, err := os.Stat(keyPath); err == nil {
				return nil
			}
		}
	}
	caKeyPEM, err := os.ReadFile(n.cfg.CAKey)
	if err != nil {
		return fmt.Errorf("read the cluster CA's key: %w", err)
	}
	caKey, err := keyutil.ParsePrivateKeyPEM(caKeyPEM)
	if err != nil {
		return fmt.Errorf("parse the cluster CA's key %s: %w", n.cfg.CAKey, err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: subject,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return fmt.Errorf("sign the certificate of %s: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func (n *Node) kubeconfigPath(name string) string { return n.path(name + ".kubeconfig") }

func (n *Node) writeKubeconfig(name string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["dev"] = &clientcmdapi.Cluster{Server: n.cfg.Server, CertificateAuthority: n.cfg.CACert}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{ClientCertificate: n.path("pki", name+".crt"), ClientKey: n.path("pki", name+".key")}
	kc.Contexts["dev"] = &clientcmdapi.Context{Cluster: "dev", AuthInfo: name}
	kc.CurrentContext = "dev"
	if err := clientcmd.WriteToFile(*kc, n.kubeconfigPath(name)); err != nil {
		return fmt.Errorf("write the kubeconfig of %s: %w", name, err)
	}
	return nil
}

// tomlString quotes s for TOML: a JSON string is a TOML basic string.
func tomlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// containerdConfig is containerd's configuration: everything under the
// node's directory (sockets under RunDir), CDI specs from the node's own
// directory (CDIDir, where the DRA kubelet plugin writes; nothing of the
// host's /etc/cdi or /var/run/cdi), the CRI plugin with the CNI bridge, the local pause image pinned, and no host configuration
// imported. restrict_oom_score_adj: without CAP_SYS_RESOURCE (VMs, nested
// containers) runc cannot lower a container's OOM score below
// containerd's own.
func (n *Node) containerdConfig() ([]byte, error) {
	dir := cniDir()
	if dir == "" {
		return nil, errors.New("no CNI plugins found")
	}
	q := tomlString
	return []byte(fmt.Sprintf(`# Written by partita dev up --real-node; rewritten on every up.
version = 4
root = %s
state = %s
imports = []

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = %s
  [plugins.'io.containerd.server.v1.ttrpc']
    address = %s
  [plugins.'io.containerd.server.v1.debug']
    address = ""
  [plugins.'io.containerd.server.v1.metrics']
    address = ""

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %s

  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = [%s]
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%s]
      conf_dir = %s
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      Root = %s

  # NRI on, for Partita's agent (its NRI plugin sets each GPU container's
  # devices and limits); the socket and plugin directories are the node's
  # own, so no plugin of the host's is started or let in.
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = %s
    plugin_path = %s
    plugin_config_path = %s
    plugin_registration_timeout = "5s"
    plugin_request_timeout = "2s"
    disable_connections = false
    # A container that names a required plugin (the webhook names
    # Partita's for every GPU container) is not created without it: no
    # GPU container starts while the agent is down.
    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = true
`, q(n.path("containerd", "root")), q(n.path("containerd", "state")),
		q(n.containerdSocket()), q(n.containerdSocket()+".ttrpc"),
		q(ImagePause.Ref), q(n.CDIDir()), q(dir), q(n.path("cni", "net.d")), q(n.path("containerd", "runc")),
		q(n.NRISocket()), q(n.path("nri", "plugins")), q(n.path("nri", "conf.d")))), nil
}

// NRISocket is where the node's containerd serves NRI plugins.
func (n *Node) NRISocket() string { return n.path("nri", "nri.sock") }

// CDIDir is the directory containerd reads CDI specs from: the node's own,
// which dev down removes with the rest.
func (n *Node) CDIDir() string { return n.path("cdi") }

// InterposerDir is where the chart installs the node's hami-core
// interposer (agent.interposer.hostDir): under the node's directory, so
// that dev down removes it with the rest.
func (n *Node) InterposerDir() string { return n.path("interposer") }

// KubeletRootDir is kubelet's --root-dir, under which DRA and CSI kubelet
// plugins register (plugins_registry/) and keep their sockets (plugins/).
func (n *Node) KubeletRootDir() string { return n.path("kubelet", "root") }

// ModelCacheDir holds the model cache's entries and state on the node.
func (n *Node) ModelCacheDir() string { return n.path("models") }

// ModelFilesDir is the node's directory that file:// Models may name.
func (n *Node) ModelFilesDir() string { return n.path("model-files") }

// shareKubeletRoot makes the kubelet's root directory a shared mount, as
// it is on a systemd host: a CSI plugin's mounts into pods' volumes
// (Bidirectional propagation) must reach the host, and a container runtime
// refuses Bidirectional from a private mount. The node's cleanup unmounts
// it with everything under the node's directory.
func (n *Node) shareKubeletRoot() error {
	root := n.KubeletRootDir()
	if err := os.MkdirAll(root, 0o750); err != nil {
		return err
	}
	if err := os.MkdirAll(n.ModelFilesDir(), 0o755); err != nil {
		return err
	}
	if !slices.Contains(MountsUnder(root), root) {
		if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s onto itself: %w", root, err)
		}
	}
	if err := unix.Mount("", root, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s a shared mount: %w", root, err)
	}
	return nil
}

// cniConfig is the node's network: a bridge with host-local addresses from
// PodCIDR, masquerade for traffic that leaves it, hairpin so that a pod
// reaches itself through a Service, and host ports.
func (n *Node) cniConfig() ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "partita",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": Bridge, "isGateway": true, "ipMasq": true, "hairpinMode": true,
				"ipam": map[string]any{
					"type": "host-local", "dataDir": n.path("cni", "ipam"),
					"ranges": []any{[]any{map[string]any{"subnet": PodCIDR}}},
					"routes": []any{map[string]any{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]any{"portMappings": true}},
			map[string]any{"type": "loopback"},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeletConfig is kubelet's configuration. cgroup v1 must be allowed
// explicitly since 1.35, the cgroupfs driver (no systemd here), no swap
// check, image garbage collection off (the images are imported, never
// pulled back), webhook authentication and authorization for the API
// server's calls (logs, exec, port-forward) and the cluster's DNS.
func (n *Node) kubeletConfig() ([]byte, error) {
	cfg := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"failSwapOn":               false,
		"containerRuntimeEndpoint": "unix://" + n.containerdSocket(),
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": n.cfg.CACert},
		},
		"authorization":               map[string]any{"mode": "Webhook"},
		"clusterDomain":               ClusterDomain,
		"clusterDNS":                  []string{ClusterDNS},
		"resolvConf":                  hostResolvConf(),
		"podLogsDir":                  n.path("pod-logs"),
		"staticPodPath":               "",
		"address":                     "0.0.0.0",
		"port":                        10250,
		"healthzBindAddress":          "127.0.0.1",
		"healthzPort":                 10248,
		"readOnlyPort":                0,
		"serializeImagePulls":         false,
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard":                map[string]string{"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
		// Secret and ConfigMap volumes follow their objects within seconds
		// (the webhook's rotated certificate, the policy ConfigMaps).
		"syncFrequency":      "10s",
		"rotateCertificates": false,
	}
	return yaml.Marshal(cfg)
}

// hostResolvConf is the resolv.conf that pods with dnsPolicy Default (and
// CoreDNS's upstream) get: the host's, or systemd-resolved's upstream list
// when the host's points at its loopback stub (CoreDNS would loop).
func hostResolvConf() string {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err == nil && strings.Contains(string(b), "nameserver 127.0.0.53") {
		if _, err := os.Stat("/run/systemd/resolve/resolv.conf"); err == nil {
			return "/run/systemd/resolve/resolv.conf"
		}
	}
	return "/etc/resolv.conf"
}

// kubeProxyConfig is kube-proxy's configuration: iptables mode, and no
// conntrack sysctl changes (the zero values leave them alone).
func (n *Node) kubeProxyConfig() ([]byte, error) {
	cfg := map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"clientConnection":   map[string]any{"kubeconfig": n.kubeconfigPath("kube-proxy")},
		"hostnameOverride":   NodeName,
		"mode":               "iptables",
		"clusterCIDR":        PodCIDR,
		"bindAddress":        "0.0.0.0",
		"healthzBindAddress": "127.0.0.1:10256",
		"metricsBindAddress": "127.0.0.1:10249",
		"nodePortAddresses":  []string{"primary"},
		"conntrack": map[string]any{
			"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
		},
	}
	return yaml.Marshal(cfg)
}

// labelsFlag renders --node-labels.
func labelsFlag(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}

// startContainerd starts containerd and waits until it answers.
func (n *Node) startContainerd(ctx context.Context) error {
	env := []string{"PATH=" + n.cfg.BinDir + ":" + os.Getenv("PATH")}
	if err := n.start("containerd", filepath.Join(n.cfg.BinDir, "containerd"), []string{"--config", n.path("containerd", "config.toml")}, env); err != nil {
		return err
	}
	return n.waitFor(ctx, "containerd", 30*time.Second, func(ctx context.Context) error {
		_, err := n.ctr(ctx, "version")
		return err
	})
}

// ctr runs ctr against the node's containerd, in the CRI's namespace.
func (n *Node) ctr(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	args = append([]string{"--address", n.containerdSocket(), "--namespace", "k8s.io"}, args...)
	out, err := execOutput(ctx, filepath.Join(n.cfg.BinDir, "ctr"), args...)
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out))
	}
	return out, nil
}

// loadImages imports every image tarball into containerd (kubelet then
// finds them present and pulls nothing). A rebuilt image replaces the old
// one under its name; running containers keep theirs.
func (n *Node) loadImages(ctx context.Context) error {
	start := time.Now()
	for _, img := range Images {
		if _, err := n.ctr(ctx, "images", "import", "--local", filepath.Join(n.cfg.ImagesDir, img.File)); err != nil {
			return fmt.Errorf("load image %s: %w", img.Ref, err)
		}
	}
	n.printf("Loaded %d images into %s from %s in %.1fs", len(Images), NodeName, n.cfg.ImagesDir, time.Since(start).Seconds())
	return nil
}

func (n *Node) startKubelet(ctx context.Context) error {
	ip, err := nodeIP()
	if err != nil {
		return err
	}
	if err := n.shareKubeletRoot(); err != nil {
		return err
	}
	args := []string{
		"--config", n.path("kubelet", "config.yaml"),
		"--kubeconfig", n.kubeconfigPath("kubelet"),
		"--root-dir", n.path("kubelet", "root"),
		"--cert-dir", n.path("kubelet", "pki"),
		"--hostname-override", NodeName,
		"--node-ip", ip,
	}
	if len(n.cfg.Labels) > 0 {
		args = append(args, "--node-labels", labelsFlag(n.cfg.Labels))
	}
	if err := n.start("kubelet", filepath.Join(n.cfg.BinDir, "kubelet"), args, nil); err != nil {
		return err
	}
	return n.waitFor(ctx, "kubelet", 60*time.Second, func(ctx context.Context) error {
		return httpOK(ctx, "http://127.0.0.1:10248/healthz")
	})
}

func (n *Node) startKubeProxy(ctx context.Context) error {
	if err := n.start("kube-proxy", filepath.Join(n.cfg.BinDir, "kube-proxy"), []string{"--config", n.path("kube-proxy.yaml")}, nil); err != nil {
		return err
	}
	return n.waitFor(ctx, "kube-proxy", 60*time.Second, func(ctx context.Context) error {
		return httpOK(ctx, "http://127.0.0.1:10256/healthz")
	})
}
