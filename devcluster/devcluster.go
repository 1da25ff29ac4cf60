// Package devcluster runs Partita's local development cluster: real etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler started by
// `kwokctl --runtime binary` from locally built binaries, plus kwok-simulated
// GPU nodes. It owns the cluster's lifecycle (up, status, down) and nothing
// else; Partita's own processes are added by their callers.
package devcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/dra"
)

// K8sVersion is the Kubernetes release the cluster binaries are built from.
const K8sVersion = "v1.37.2"

// DefaultName is the cluster name used when none is given.
const DefaultName = "partita"

// Binaries the cluster needs in the bin directory.
// helm renders the chart's RBAC for Partita's processes.
var requiredBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kwokctl", "helm"}

// Options configure a dev cluster.
type Options struct {
	// Name of the cluster; clusters with different names run side by side.
	Name string
	// Nodes is the number of simulated GPU nodes.
	Nodes int
	// GPUsPerNode is the number of simulated devices on each node.
	GPUsPerNode int
	// GPUModel is a key of GPUModels.
	GPUModel string
	// BinDir holds the cluster binaries (see CacheDir and `make cluster-bins`).
	BinDir string
	// WorkDir is kwokctl's work directory (KWOK_WORKDIR).
	WorkDir string
	// Disable lists kwokctl components not to start (for tests of failure modes).
	Disable []string
	// SchedulerConfig is a kube-scheduler configuration (YAML content, not a
	// path), optional. It takes the placeholders of HostProcess.Args, so it can
	// name the extender's {port:NAME}. It is used when the cluster is created.
	SchedulerConfig string
	// Prepare, when set, runs at the start of every Up with the cluster's
	// state directory (the {state} placeholder), before any component
	// starts: it writes what SchedulerConfig and HostProcesses name there
	// (certificates). It must be idempotent.
	Prepare func(stateDir string) error
	// PartitaBinary is the partita binary that runs HostProcesses.
	PartitaBinary string
	// HostProcesses are Partita's own processes to run on the host once the
	// cluster is up.
	HostProcesses []HostProcess
	// ExtenderReplicas is how many extender replicas HostProcesses run
	// (mode host; 0 means 1, at most MaxExtenderReplicas), named
	// ExtenderReplicaName(1..n): Up stops those beyond it, and kept by the
	// cluster's settings, so that later commands see them all.
	ExtenderReplicas int
	// RealNode adds the real node (realnode.NodeName: kubelet, containerd,
	// kube-proxy, CoreDNS on this host) beside the simulated ones.
	RealNode bool
	// ChartSet are helm --set values (key=value) for mode chart, applied
	// over ChartValues.
	ChartSet []string
	// Mode says where Partita runs: ModeHost (HostProcesses) or ModeChart
	// (the chart on the real node; HostProcesses then serve the simulated
	// nodes only). Empty means ModeHost.
	Mode Mode
	// ImagesDir holds the real node's image tarballs (make images).
	ImagesDir string
	// Addons are workload controllers to run beside the control plane (a
	// name of Addons each), with their CRDs and webhooks.
	Addons []string
	// AddonsDir holds the built addons (e2e/clusterbins/build.sh).
	AddonsDir string
	// FeatureGates ("Name=true,...") and RuntimeConfig
	// ("group/version=true,...") go to kube-apiserver,
	// kube-controller-manager and kube-scheduler when the cluster is
	// created (kwokctl --kube-feature-gates and --kube-runtime-config).
	FeatureGates, RuntimeConfig string
	// GPUBackend is how GPU pods are placed (dra.BackendExtender when
	// empty): with dra.BackendDRA the cluster gets Partita's DeviceClass,
	// the chart's RBAC for the DRA driver, and the chart (mode chart)
	// gpuBackend dra.
	GPUBackend dra.Backend
	// Out receives progress lines meant for a person.
	Out io.Writer
}

// CacheDir is Partita's cache root: $PARTITA_CACHE or ~/.cache/partita.
func CacheDir() string {
	if d := os.Getenv("PARTITA_CACHE"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "partita-cache")
	}
	return filepath.Join(home, ".cache", "partita")
}

// DefaultOptions returns the options `partita dev up` uses without flags.
func DefaultOptions() Options {
	return Options{
		Name:        DefaultName,
		Nodes:       4,
		GPUsPerNode: 8,
		GPUModel:    "H100-80GB",
		BinDir:      filepath.Join(CacheDir(), "bin", "k8s-"+K8sVersion),
		AddonsDir:   filepath.Join(CacheDir(), "bin", "addons"),
		WorkDir:     filepath.Join(CacheDir(), "kwok"),
		Mode:        ModeHost,
		Out:         io.Discard,
	}
}

// Cluster is one named dev cluster.
type Cluster struct {
	opts Options
}

// New checks the options and returns the cluster they name.
func New(opts Options) (*Cluster, error) {
	if opts.Name == "" {
		opts.Name = DefaultName
	}
	if !validName(opts.Name) {
		return nil, fmt.Errorf("cluster name %q: use lower-case letters, digits and '-', at most 40 characters", opts.Name)
	}
	if opts.Nodes < 0 || opts.Nodes > 5000 {
		return nil, fmt.Errorf("--nodes %d: must be between 0 and 5000", opts.Nodes)
	}
	if opts.GPUsPerNode < 0 || opts.GPUsPerNode > 64 {
		return nil, fmt.Errorf("--gpus-per-node %d: must be between 0 and 64", opts.GPUsPerNode)
	}
	if _, ok := GPUModels[opts.GPUModel]; !ok {
		return nil, fmt.Errorf("--gpu-model %q: unknown; use one of %s", opts.GPUModel, strings.Join(ModelNames(), ", "))
	}
	switch opts.Mode {
	case "":
		opts.Mode = ModeHost
	case ModeHost:
	case ModeChart:
		if !opts.RealNode {
			return nil, fmt.Errorf("--mode chart runs the chart's containers, which need a real node: add --real-node")
		}
	default:
		return nil, fmt.Errorf("--mode %q: use %s (Partita's processes on the host) or %s (the Helm chart on the real node)", opts.Mode, ModeHost, ModeChart)
	}
	if opts.ExtenderReplicas == 0 {
		opts.ExtenderReplicas = 1
	}
	if err := CheckExtenderReplicas(opts.ExtenderReplicas); err != nil {
		return nil, err
	}
	if opts.ExtenderReplicas > 1 && opts.Mode != ModeHost {
		return nil, fmt.Errorf("--extender-replicas %d: the extender runs on the host in mode host only; in mode %s set the chart's extender.replicas", opts.ExtenderReplicas, opts.Mode)
	}
	for _, kv := range []struct{ flag, value string }{{"--feature-gates", opts.FeatureGates}, {"--runtime-config", opts.RuntimeConfig}} {
		if err := checkKeyValues(kv.value); err != nil {
			return nil, fmt.Errorf("%s %q: %w; write key=value pairs separated by commas, e.g. GenericWorkload=true", kv.flag, kv.value, err)
		}
	}
	if opts.AddonsDir == "" {
		opts.AddonsDir = filepath.Join(filepath.Dir(opts.BinDir), "addons")
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	return &Cluster{opts: opts}, nil
}

// checkKeyValues checks a comma-separated list of key=value pairs.
func checkKeyValues(s string) error {
	if s == "" {
		return nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || v == "" || strings.ContainsAny(kv, " \t") {
			return fmt.Errorf("%q is not key=value", kv)
		}
	}
	return nil
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 40 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		case r == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

// BinDir is the directory of the cluster binaries (kubectl among them).
func (c *Cluster) BinDir() string { return c.opts.BinDir }

// Name returns the cluster's name.
func (c *Cluster) Name() string { return c.opts.Name }

// Dir is the cluster's kwokctl directory (configuration, logs, pids).
func (c *Cluster) Dir() string { return filepath.Join(c.opts.WorkDir, "clusters", c.opts.Name) }

// KubeconfigPath is the path of the cluster's admin kubeconfig.
func (c *Cluster) KubeconfigPath() string { return filepath.Join(c.Dir(), "kubeconfig.yaml") }

// LogsDir holds each component's log file.
func (c *Cluster) LogsDir() string { return filepath.Join(c.Dir(), "logs") }

func (c *Cluster) exists() bool {
	_, err := os.Stat(filepath.Join(c.Dir(), "kwok.yaml"))
	return err == nil
}

func (c *Cluster) printf(format string, args ...any) {
	_, _ = fmt.Fprintf(c.opts.Out, format+"\n", args...)
}

// checkBinaries reports every missing binary at once, with the command that
// builds them.
func (c *Cluster) checkBinaries() error {
	var missing []string
	for _, b := range requiredBinaries {
		st, err := os.Stat(filepath.Join(c.opts.BinDir, b))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing cluster binaries in %s: %s; build them with 'make demo-bins' (10 to 20 minutes on 2 cores the first time; 'make cluster-bins' builds every group the tests use)",
			c.opts.BinDir, strings.Join(missing, ", "))
	}
	return nil
}

// kwokctl runs kwokctl for this cluster and returns its combined output.
func (c *Cluster) kwokctl(ctx context.Context, args ...string) (string, error) {
	args = append([]string{"--name", c.opts.Name}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(c.opts.BinDir, "kwokctl"), args...)
	cmd.Env = append(os.Environ(), "KWOK_WORKDIR="+c.opts.WorkDir)
	// The components must outlive this command; kwokctl detaches them itself.
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("kwokctl %s: %w\n%s", strings.Join(args, " "), err, lastLines(out.String(), 20))
	}
	return out.String(), nil
}

// Up creates the cluster, or checks and repairs one that exists, and makes
// sure it has its simulated GPU nodes. Running it twice is harmless.
func (c *Cluster) Up(ctx context.Context) error {
	if err := c.checkBinaries(); err != nil {
		return err
	}
	if c.opts.RealNode {
		// Before anything is created: say everything the host lacks.
		if err := realnode.CheckHost(c.opts.BinDir, c.opts.ImagesDir); err != nil {
			return err
		}
	}
	if err := c.checkSettings(); err != nil {
		return err
	}
	if err := c.checkAddons(); err != nil {
		return err
	}
	start := time.Now()
	if c.opts.Prepare != nil {
		if err := os.MkdirAll(c.stateDir(), 0o755); err != nil {
			return fmt.Errorf("create %s: %w", c.stateDir(), err)
		}
		if err := c.opts.Prepare(c.stateDir()); err != nil {
			return fmt.Errorf("prepare cluster %q: %w", c.opts.Name, err)
		}
	}
	if c.exists() {
		if err := c.healthy(ctx); err != nil {
			c.printf("Cluster %q exists but does not answer (%v); starting its components again", c.opts.Name, err)
			if _, err := c.kwokctl(ctx, "start", "cluster", "--timeout", "60s", "--wait", "60s"); err != nil {
				return fmt.Errorf("cluster %q is half started and did not recover: %w\nremove it with 'partita dev down --name %s', then run 'partita dev up --name %s' again; component logs are in %s",
					c.opts.Name, err, c.opts.Name, c.opts.Name, c.LogsDir())
			}
		} else {
			c.printf("Cluster %q is already running", c.opts.Name)
		}
		if err := c.checkCreatedWith(); err != nil {
			return err
		}
		if err := c.checkWebhookClientAuth(); err != nil {
			return err
		}
		if err := c.checkSchedulerReachesReplicas(); err != nil {
			return err
		}
	} else {
		c.printf("Creating cluster %q (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)", c.opts.Name)
		config, err := c.writeKwokctlConfig()
		if err != nil {
			return err
		}
		args := []string{"--config", config, "create", "cluster",
			"--runtime", "binary",
			"--kubeconfig", "",
			"--timeout", "120s",
			"--wait", "60s",
			"--etcd-binary", filepath.Join(c.opts.BinDir, "etcd"),
			"--kube-apiserver-binary", filepath.Join(c.opts.BinDir, "kube-apiserver"),
			"--kube-controller-manager-binary", filepath.Join(c.opts.BinDir, "kube-controller-manager"),
			"--kube-scheduler-binary", filepath.Join(c.opts.BinDir, "kube-scheduler"),
			"--kwok-controller-binary", filepath.Join(c.opts.BinDir, "kwok"),
		}
		if c.opts.SchedulerConfig != "" {
			path, err := c.writeSchedulerConfig()
			if err != nil {
				return err
			}
			args = append(args, "--kube-scheduler-config", path)
		}
		for _, d := range c.opts.Disable {
			args = append(args, "--disable", d)
		}
		if c.opts.FeatureGates != "" {
			args = append(args, "--kube-feature-gates", c.opts.FeatureGates)
		}
		if c.opts.RuntimeConfig != "" {
			args = append(args, "--kube-runtime-config", c.opts.RuntimeConfig)
		}
		if out, err := c.kwokctl(ctx, args...); err != nil {
			hint := "component logs are in " + c.LogsDir()
			if strings.Contains(out, "address already in use") {
				hint = "a port it needs is busy: stop what holds it, or run 'partita dev down' for a cluster left behind; " + hint
			}
			// Never leave a half-created cluster behind: the next `up` would find it.
			if _, derr := c.kwokctl(context.WithoutCancel(ctx), "delete", "cluster"); derr != nil {
				hint += "; cleaning up also failed, run 'partita dev down --name " + c.opts.Name + "'"
			}
			return fmt.Errorf("create cluster %q: %w\n%s", c.opts.Name, err, hint)
		}
		if err := c.recordCreatedWith(); err != nil {
			return err
		}
	}
	if err := c.healthy(ctx); err != nil {
		return fmt.Errorf("cluster %q started but its API server does not answer: %w; component logs are in %s", c.opts.Name, err, c.LogsDir())
	}
	cfg, err := c.RESTConfig()
	if err != nil {
		return err
	}
	if err := InstallCRDs(ctx, cfg); err != nil {
		return err
	}
	// In mode chart the chart renders the DeviceClass.
	if c.DRA() && c.opts.Mode != ModeChart {
		if err := ensureDeviceClasses(ctx, cfg); err != nil {
			return err
		}
	}
	// In mode chart the chart creates the default queue (helm would refuse
	// to adopt one made here).
	if c.opts.Mode != ModeChart {
		if err := c.ensureDefaultQueue(ctx, cfg); err != nil {
			return err
		}
	}
	for _, name := range c.opts.Addons {
		// Before Partita's processes start, so that the extender's first
		// discovery finds the addons' kinds.
		a, _ := addon(name)
		if err := c.installAddonCRDs(ctx, cfg, a); err != nil {
			return err
		}
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	if err := ensureGPUNodes(ctx, cs, c.opts); err != nil {
		return err
	}
	if err := waitNodesReady(ctx, cs, c.opts.Nodes, 60*time.Second); err != nil {
		return err
	}
	if err := c.saveSettings(); err != nil {
		return fmt.Errorf("save the cluster's settings: %w", err)
	}
	if c.opts.RealNode {
		if err := c.upRealNode(ctx); err != nil {
			return err
		}
	}
	if c.opts.Mode == ModeChart {
		if err := c.installChart(ctx); err != nil {
			return err
		}
	}
	if len(c.opts.HostProcesses) > 0 {
		// In mode chart the chart has made the ServiceAccounts and RBAC.
		if err := c.ensureIdentities(ctx, cfg, c.opts.HostProcesses, c.opts.Mode == ModeHost); err != nil {
			return err
		}
		if err := c.startHostProcesses(ctx, c.opts.PartitaBinary, c.opts.HostProcesses); err != nil {
			return err
		}
		if c.opts.Mode == ModeHost {
			if err := c.stopExtraExtenderReplicas(ctx); err != nil {
				return err
			}
		}
	}
	if err := c.startAddons(ctx, cfg); err != nil {
		return err
	}
	extra := ""
	if c.opts.RealNode {
		extra = " and the real node " + realnode.NodeName
	}
	c.printf("Cluster %q is up with %d simulated GPU nodes (%d x %s each)%s, Partita in mode %s with the %s GPU backend, in %.1fs",
		c.opts.Name, c.opts.Nodes, c.opts.GPUsPerNode, c.opts.GPUModel, extra, c.opts.Mode, c.Backend(), time.Since(start).Seconds())
	c.printf("Kubeconfig: %s", c.KubeconfigPath())
	return nil
}

// Backend is the cluster's GPU backend.
func (c *Cluster) Backend() dra.Backend {
	if c.opts.GPUBackend == "" {
		return dra.BackendExtender
	}
	return c.opts.GPUBackend
}

// DRA reports whether the cluster's GPUs are DRA devices.
func (c *Cluster) DRA() bool { return c.Backend() == dra.BackendDRA }

// ensureDeviceClasses applies Partita's DeviceClasses.
func ensureDeviceClasses(ctx context.Context, cfg *rest.Config) error {
	var manifest []byte
	for _, dc := range dra.DeviceClasses() {
		b, err := yaml.Marshal(dc)
		if err != nil {
			return fmt.Errorf("encode DeviceClass: %w", err)
		}
		manifest = append(append(manifest, "---\n"...), b...)
	}
	if err := Apply(ctx, cfg, manifest); err != nil {
		return fmt.Errorf("apply Partita's DeviceClasses: %w", err)
	}
	return nil
}

// Down stops every component and removes the cluster's files. It succeeds when
// the cluster does not exist.
func (c *Cluster) Down(ctx context.Context) error {
	var errs []error
	// The real node first: it holds mounts in the cluster's directories
	// and changed the host.
	if err := c.downRealNode(ctx); err != nil {
		if len(realnode.MountsUnder(c.realNodeDir())) > 0 {
			return err
		}
		errs = append(errs, err)
	}
	if c.exists() {
		if _, err := c.kwokctl(ctx, "delete", "cluster"); err != nil {
			errs = append(errs, err)
		}
	}
	// kwokctl tracks its components by pid files; anything still running with
	// this cluster's directory on its command line is a leftover: end it.
	for _, d := range []string{c.Dir(), c.stateDir()} {
		if err := killProcessesUsing(ctx, d); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range []string{c.Dir(), c.stateDir()} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// writeSchedulerConfig renders the scheduler configuration into the state
// directory and returns its path.
func (c *Cluster) writeSchedulerConfig() (string, error) {
	content, err := c.expand(c.opts.SchedulerConfig)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(c.stateDir(), 0o755); err != nil {
		return "", fmt.Errorf("create %s: %w", c.stateDir(), err)
	}
	path := filepath.Join(c.stateDir(), "kube-scheduler-config.yaml")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		return "", fmt.Errorf("write scheduler configuration: %w", err)
	}
	return path, nil
}

// RESTConfig returns a client configuration for the cluster's admin user.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	if !c.exists() {
		return nil, fmt.Errorf("cluster %q does not exist: run 'partita dev up --name %s'", c.opts.Name, c.opts.Name)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.KubeconfigPath())
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig of cluster %q: %w", c.opts.Name, err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	return cfg, nil
}

// Clientset returns a typed client for the cluster.
func (c *Cluster) Clientset() (kubernetes.Interface, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create client for cluster %q: %w", c.opts.Name, err)
	}
	return cs, nil
}

func (c *Cluster) healthy(ctx context.Context) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("readyz: %w", err)
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return fmt.Errorf("readyz: %s", body)
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
