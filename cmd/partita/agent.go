package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/internal/version"
	"github.com/partita-dev/partita/nodeagent"
	partitanri "github.com/partita-dev/partita/nodeagent/nri"
)

// agentFlags are the flags of `partita agent`.
type agentFlags struct {
	kubeconfig        string
	nodeName          string
	mode              string
	enforce           string
	simulate          string
	simulateNodes     string
	simulateUsage     float64
	simulateResources string
	once              bool
	print             bool
	healthAddr        string
	syncInterval      time.Duration
	watchdogInterval  time.Duration
	heartbeatInterval time.Duration
	reportInterval    time.Duration
	workers           int
	qps               float32
	burst             int
	ignoredXIDs       []uint
	nvmlLibrary       string
	procRoot          string
	sysRoot           string
	mpsControl        string
	mpsDir            string
	mpsDaemons        string
	stateDir          string
	gpuBackend        string
	kubeletDir        string
	cdiDir            string
	nri               string
	nriSocket         string
	cgroupRoot        string
	interposerDir     string
	devRoot           string
	verbosity         int
}

// --nri values.
const (
	nriAuto = "auto"
	nriOn   = "on"
	nriOff  = "off"
)

func newAgentCommand() *cobra.Command {
	f := &agentFlags{}
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: discover GPUs, publish the GPUNode and capacity, apply slices, watch usage",
		Long: `The node agent discovers the node's GPUs with NVML, publishes them as the node's
GPUNode and as partita.dev/gpu-milli capacity, applies each bound pod's slice for
the node's isolation mode, and watches that pods stay inside their slices.

With --simulate it invents the devices instead (no GPU needed); with
--simulate-nodes one process serves every node a label selector matches, each with
simulated devices from its GPU Feature Discovery labels. --once --print prints the
discovered inventory as JSON and exits, without a cluster.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runAgent(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means $KUBECONFIG, ~/.kube/config or the in-cluster config")
	fl.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "the node this agent serves (default $NODE_NAME, else the host name)")
	fl.StringVar(&f.mode, "mode", "", "isolation mode: time-slicing, mps or hami-core; empty follows each GPUNode's spec.isolation (time-slicing by default)")
	fl.StringVar(&f.enforce, "enforce", string(nodeagent.EnforceReport), "what the watchdog does about a slice over its memory limit: off (measure), report (event and metric) or kill (end the process; needs hostPID)")
	fl.StringVar(&f.simulate, "simulate", "", "simulate the devices instead of reading NVML, e.g. 8xH100-80GB; with --simulate-nodes, the devices of nodes without GPU Feature Discovery labels")
	fl.StringVar(&f.simulateNodes, "simulate-nodes", "", "fleet mode: serve every node this label selector matches with simulated devices (default selector "+v1alpha1.LabelGPUNode+"=true; give a value with --simulate-nodes=SELECTOR)")
	fl.Lookup("simulate-nodes").NoOptDefVal = v1alpha1.LabelGPUNode + "=true"
	fl.StringVar(&f.simulateResources, "simulate-node-resources", "", "with --simulate-nodes: the pods, cpu and memory (e.g. pods=110,cpu=64,memory=512Gi) a served node gets as capacity and allocatable where its status has none, in the write of its GPU capacity: a kwok node has no kubelet to report them")
	fl.Float64Var(&f.simulateUsage, "simulate-usage", 0.5, "share (0 to 1) of its slice that a simulated pod's process uses, unless the pod's "+nodeagent.AnnotationSimulateMemoryUsedPrefix+"<container> annotation says otherwise")
	fl.BoolVar(&f.once, "once", false, "discover the GPUs once, print them and exit, without a cluster; with --mode mps, also start, check and stop an MPS control daemon per device")
	fl.BoolVar(&f.print, "print", false, "with --once, print the inventory as JSON (else one summary line)")
	fl.StringVar(&f.healthAddr, "health-addr", ":8081", "address of the /metrics, /healthz and /readyz endpoints")
	fl.DurationVar(&f.syncInterval, "sync-interval", 10*time.Second, "how often each node's GPUs and slices are checked (writes happen only on change)")
	fl.DurationVar(&f.watchdogInterval, "watchdog-interval", time.Second, "with --enforce=kill, how often a node with memory-limited slices is checked instead of --sync-interval: the longest an over-limit process runs before the watchdog ends it (plus a tenth for jitter and one NVML read); checks that change nothing write nothing")
	fl.DurationVar(&f.heartbeatInterval, "heartbeat-interval", time.Minute, "the longest a GPUNode's status goes unwritten; usage figures alone are written this often")
	fl.DurationVar(&f.reportInterval, "overuse-report-interval", 5*time.Minute, "how often an ongoing overuse is reported again")
	fl.IntVar(&f.workers, "workers", 4, "nodes synced at once (fleet mode)")
	fl.Float32Var(&f.qps, "kube-api-qps", 20, "the most API requests per second, sustained")
	fl.IntVar(&f.burst, "kube-api-burst", 40, "the most API requests in a burst")
	defaultXIDs := []uint{}
	for _, x := range nodeagent.DefaultIgnoredXIDs() {
		defaultXIDs = append(defaultXIDs, uint(x))
	}
	fl.UintSliceVar(&f.ignoredXIDs, "ignored-xids", defaultXIDs, "XID errors that do not make a device unhealthy")
	fl.StringVar(&f.nvmlLibrary, "nvml-library", "", "NVML library to load (default libnvidia-ml.so.1 from the loader path)")
	fl.StringVar(&f.procRoot, "proc-root", "/proc", "the host's /proc, to map GPU processes to pods (run with hostPID: true)")
	fl.StringVar(&f.sysRoot, "sys-root", "/sys", "the host's /sys, to read each device's NUMA node")
	fl.StringVar(&f.mpsControl, "mps-control", "nvidia-cuda-mps-control", "the MPS control program (mps mode)")
	fl.StringVar(&f.mpsDir, "mps-dir", "/run/partita/mps", "directory of the MPS daemons' pipe and log directories, one per device UUID (mps mode)")
	fl.StringVar(&f.mpsDaemons, "mps-daemons", mpsDaemonsAgent, "who runs the MPS control daemons (mps mode): agent (this process starts them in their own session; they outlive it, and the next agent adopts them) or keeper (a 'partita mps-keeper' process on the node runs them; the agent hands it the devices through --state-dir)")
	fl.StringVar(&f.stateDir, "state-dir", nodeagent.DefaultStateDir, "directory that keeps what must outlive the agent on the node: the MPS daemons it runs and the GPU faults it found (a hostPath in the chart); empty keeps nothing")
	fl.StringVar(&f.gpuBackend, "gpu-backend", string(dra.BackendExtender), "how GPU pods are placed: extender (publish partita.dev/gpu-milli capacity) or dra (publish each GPU as a DRA device of "+dra.DriverName+" for kube-scheduler; a single-node agent also serves as the DRA kubelet plugin that prepares claims)")
	fl.StringVar(&f.kubeletDir, "kubelet-dir", dra.DefaultKubeletDir, "the kubelet's root directory, where the DRA kubelet plugin registers (plugins_registry/) and keeps its socket (plugins/"+dra.DriverName+"/) (dra backend)")
	fl.StringVar(&f.cdiDir, "cdi-dir", dra.DefaultCDIDir, "directory the container runtime reads CDI specs from, where the DRA kubelet plugin writes one per prepared claim (dra backend)")
	fl.StringVar(&f.nri, "nri", nriAuto, "serve as the container runtime's NRI plugin, which sets each GPU container's devices, limit env, mounts and dmem limit at creation from its allocation, overriding the pod spec: auto (when --nri-socket exists, else the webhook's pod-spec env alone), on (fail without it) or off")
	fl.StringVar(&f.nriSocket, "nri-socket", partitanri.DefaultSocketPath, "the container runtime's NRI socket (containerd 2 and CRI-O serve one when NRI is enabled)")
	fl.StringVar(&f.cgroupRoot, "cgroup-root", nodeagent.DefaultCgroupRoot, "the host's cgroup v2 root, where dmem.capacity lists the GPU memory regions the kernel can cap")
	fl.StringVar(&f.interposerDir, "interposer-dir", nodeagent.DefaultInterposerDir, "host directory of the hami-core interposer (libvgpu.so and ld.so.preload); the NRI plugin binds it into hami-core slices when it is installed")
	fl.StringVar(&f.devRoot, "dev-root", nodeagent.DefaultDevRoot, "the host's /dev, where the NRI plugin reads the GPUs' device nodes")
	fl.IntVarP(&f.verbosity, "v", "v", 0, "log verbosity (2 logs every published change)")
	return cmd
}

// useNRI decides from --nri whether the agent serves as the runtime's NRI
// plugin: auto when the socket is there.
func useNRI(mode, socket string, dra, fleet bool) (bool, error) {
	switch mode {
	case nriOff:
		return false, nil
	case nriAuto:
		return !dra && !fleet && partitanri.SocketExists(socket), nil
	case nriOn:
		switch {
		case dra:
			return false, errors.New("--nri on: the dra backend applies slices through CDI; use --nri off or auto")
		case fleet:
			return false, errors.New("--nri on: a fleet of simulated nodes has no container runtime; use --nri off or auto")
		case !partitanri.SocketExists(socket):
			return false, fmt.Errorf("--nri on: no NRI socket at %s: enable NRI in the container runtime, or use --nri auto", socket)
		}
		return true, nil
	}
	return false, fmt.Errorf("--nri %q: want auto, on or off", mode)
}

func runAgent(cmd *cobra.Command, f *agentFlags) error {
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(f.verbosity), textlogger.Output(cmd.ErrOrStderr())))
	klog.SetLogger(log)
	ctrllog.SetLogger(log)
	ctx := logr.NewContext(cmd.Context(), log)

	mode := v1alpha1.IsolationMode(f.mode)
	switch mode {
	case "", v1alpha1.IsolationTimeSlicing, v1alpha1.IsolationMPS, v1alpha1.IsolationHAMiCore:
	default:
		return fmt.Errorf("--mode %q: want time-slicing, mps or hami-core", f.mode)
	}
	enforce, err := nodeagent.ParseEnforceMode(f.enforce)
	if err != nil {
		return fmt.Errorf("--enforce: %w", err)
	}
	backendKind, err := dra.ParseBackend(f.gpuBackend)
	if err != nil {
		return fmt.Errorf("--gpu-backend: %w", err)
	}
	if f.simulateUsage < 0 || f.simulateUsage > 1 {
		return fmt.Errorf("--simulate-usage %v: want a share from 0 to 1", f.simulateUsage)
	}
	var spec *nodeagent.SimSpec
	if f.simulate != "" {
		s, err := nodeagent.ParseSimSpec(f.simulate)
		if err != nil {
			return fmt.Errorf("--simulate: %w", err)
		}
		spec = &s
	}
	switch f.mpsDaemons {
	case mpsDaemonsAgent, mpsDaemonsKeeper:
	default:
		return fmt.Errorf("--mps-daemons %q: want %s or %s", f.mpsDaemons, mpsDaemonsAgent, mpsDaemonsKeeper)
	}
	if f.mpsDaemons == mpsDaemonsKeeper && f.stateDir == "" {
		return fmt.Errorf("--mps-daemons %s hands the daemons over through --state-dir: set it to the keeper's", mpsDaemonsKeeper)
	}
	metrics := nodeagent.NewMetrics()
	opts := nodeagent.Options{
		Mode:                  mode,
		Enforce:               enforce,
		SyncInterval:          f.syncInterval,
		WatchdogInterval:      f.watchdogInterval,
		HeartbeatInterval:     f.heartbeatInterval,
		OveruseReportInterval: f.reportInterval,
		Workers:               f.workers,
		SimulatedUsage:        f.simulateUsage,
		MPS: nodeagent.MPSConfig{ControlPath: f.mpsControl, Dir: f.mpsDir, StateDir: f.stateDir,
			Keeper: f.mpsDaemons == mpsDaemonsKeeper},
		Version: version.Get(),
		Metrics: metrics,
		Enforcement: nodeagent.EnforcementConfig{
			CgroupRoot: f.cgroupRoot, InterposerDir: f.interposerDir, DevRoot: f.devRoot,
		},
	}
	nri, err := useNRI(f.nri, f.nriSocket, backendKind == dra.BackendDRA, f.simulateNodes != "")
	if err != nil {
		return err
	}
	if nri {
		opts.Enforcement.ContainerPath = v1alpha1.ContainerPathNRI
	}
	var backend nodeagent.Backend
	backendName := "simulated"
	if f.simulateNodes != "" {
		if f.once {
			return errors.New("--once reads one node: use it with --simulate or on a GPU node, not with --simulate-nodes")
		}
		if opts.NodeSelector, err = labels.Parse(f.simulateNodes); err != nil {
			return fmt.Errorf("--simulate-nodes: %w", err)
		}
		if opts.NodeResources, err = nodeagent.ParseNodeResources(f.simulateResources); err != nil {
			return fmt.Errorf("--simulate-node-resources: %w", err)
		}
		opts.Backends = nodeagent.SimulatedBackends(spec)
	} else {
		if f.simulateResources != "" {
			return errors.New("--simulate-node-resources fills in the status of simulated nodes: use it with --simulate-nodes")
		}
		if f.nodeName == "" {
			if f.nodeName, err = os.Hostname(); err != nil {
				return fmt.Errorf("find the node name (set --node-name): %w", err)
			}
		}
		opts.NodeName = f.nodeName
		if spec != nil {
			backend = nodeagent.NewSimulated(f.nodeName, *spec)
		} else {
			xids := make([]uint64, len(f.ignoredXIDs))
			for i, x := range f.ignoredXIDs {
				xids[i] = uint64(x)
			}
			nv := nodeagent.NewNVML(nodeagent.NVMLConfig{
				LibraryPath: f.nvmlLibrary,
				IgnoredXIDs: xids,
				ProcRoot:    f.procRoot,
				SysRoot:     f.sysRoot,
				StateDir:    f.stateDir,
				OnError:     metrics.NVMLError,
			})
			defer nv.Close()
			backend, backendName = nv, "nvml"
		}
		opts.Backends = nodeagent.StaticBackend(backend)
	}

	if f.once {
		inv, err := nodeagent.Discover(ctx, f.nodeName, backendName, backend)
		if err != nil {
			return err
		}
		out := cmd.OutOrStdout()
		if f.print {
			enc := json.NewEncoder(out)
			enc.SetIndent("", "  ")
			if err := enc.Encode(inv); err != nil {
				return err
			}
		} else {
			healthy := 0
			for _, d := range inv.Devices {
				if d.Health == v1alpha1.DeviceHealthy {
					healthy++
				}
			}
			if _, err := fmt.Fprintf(out, "%s: %d devices (%s backend), %d healthy, partita.dev/gpu-milli %d\n", inv.Node, len(inv.Devices), inv.Backend, healthy, inv.CapacityMilli); err != nil {
				return err
			}
		}
		if mode != v1alpha1.IsolationMPS {
			return nil
		}
		// mps mode: start and stop a daemon per device, as the agent would.
		mps := opts.MPS
		if spec != nil {
			mps.Runner = nodeagent.NewSimulatedRunner()
		}
		if err := nodeagent.TryMPS(ctx, mps, inv, 3*time.Second); err != nil {
			return err
		}
		_, err = fmt.Fprintf(cmd.ErrOrStderr(), "MPS: started, checked and stopped a control daemon on each of %d devices\n", len(inv.Devices))
		return err
	}

	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = f.qps, f.burst
	cfg.UserAgent = "partita-agent/" + version.Get()
	if backendKind == dra.BackendDRA {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("create client: %w", err)
		}
		if f.simulateNodes != "" {
			// Simulated nodes have no kubelet: their slices are published
			// from here, and their claims are never prepared (kwok runs
			// no container).
			pub := dra.NewPublisher(cs)
			defer pub.Stop()
			opts.Slices = pub
		} else {
			plugin, err := dra.StartPlugin(ctx, cs, dra.PluginOptions{NodeName: f.nodeName, KubeletDir: f.kubeletDir, CDIDir: f.cdiDir, MPSDir: f.mpsDir, InterposerDir: f.interposerDir})
			if err != nil {
				return err
			}
			defer plugin.Stop()
			opts.Slices = plugin
		}
	}
	agent, err := nodeagent.New(cfg, opts)
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return nodeagent.Serve(gctx, f.healthAddr, nodeagent.Handler(metrics, agent.Ready)) })
	g.Go(func() error { return agent.Run(gctx) })
	if nri {
		plugin, err := partitanri.New(partitanri.Options{NodeName: f.nodeName, SocketPath: f.nriSocket, Pods: agent, Facts: agent, MPS: agent, Log: log.WithName("nri")})
		if err != nil {
			return err
		}
		log.Info("Serving as the container runtime's NRI plugin", "socket", f.nriSocket)
		g.Go(func() error { return plugin.Run(gctx) })
	} else {
		log.Info("Not serving as an NRI plugin: the pod spec's env reaches containers", "nri", f.nri, "socket", f.nriSocket)
	}
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// --mps-daemons values.
const (
	mpsDaemonsAgent  = "agent"
	mpsDaemonsKeeper = "keeper"
)

// keeperFlags are the flags of `partita mps-keeper`.
type keeperFlags struct {
	nodeName   string
	stateDir   string
	mpsControl string
	mpsDir     string
	healthAddr string
	verbosity  int
}

func newMPSKeeperCommand() *cobra.Command {
	f := &keeperFlags{}
	cmd := &cobra.Command{
		Use:   "mps-keeper",
		Short: "Keep a node's MPS control daemons running for the agent, across agent restarts and upgrades",
		Long: `The MPS keeper runs the MPS control daemons of a node in mps mode, one per
shared device, as the agent asks through --state-dir (mps-targets.json): it starts
them, sets their default limits, starts again one that exits, and ends those no
device needs any more. It needs no API access.

It exists so that the daemons, and the workloads that are their clients,
outlive the agent: a container runtime ends every process of a container when
the container stops, so daemons the agent started itself would end with every
agent upgrade or OOM kill. The chart runs the keeper in a DaemonSet of its own
with updateStrategy OnDelete, and the agent with --mps-daemons=keeper. When the
keeper stops it leaves the daemons running and recorded; a new keeper adopts
the ones still alive.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runMPSKeeper(cmd, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "the node this keeper serves (default $NODE_NAME, else the host name)")
	fl.StringVar(&f.stateDir, "state-dir", nodeagent.DefaultStateDir, "the agent's --state-dir, shared with it")
	fl.StringVar(&f.mpsControl, "mps-control", "nvidia-cuda-mps-control", "the MPS control program")
	fl.StringVar(&f.mpsDir, "mps-dir", "/run/partita/mps", "directory of the MPS daemons' pipe and log directories, one per device UUID (the agent's and the webhook's --mps-dir)")
	fl.StringVar(&f.healthAddr, "health-addr", ":8082", "address of the /metrics, /healthz and /readyz endpoints")
	fl.IntVarP(&f.verbosity, "v", "v", 0, "log verbosity (2 logs every daemon started, adopted or ended)")
	return cmd
}

func runMPSKeeper(cmd *cobra.Command, f *keeperFlags) error {
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(f.verbosity), textlogger.Output(cmd.ErrOrStderr())))
	klog.SetLogger(log)
	ctx := logr.NewContext(cmd.Context(), log)
	if f.nodeName == "" {
		var err error
		if f.nodeName, err = os.Hostname(); err != nil {
			return fmt.Errorf("find the node name (set --node-name): %w", err)
		}
	}
	metrics := nodeagent.NewMetrics()
	k, err := nodeagent.NewMPSKeeper(nodeagent.KeeperOptions{
		Node:    f.nodeName,
		MPS:     nodeagent.MPSConfig{ControlPath: f.mpsControl, Dir: f.mpsDir, StateDir: f.stateDir},
		Metrics: metrics,
	})
	if err != nil {
		return err
	}
	log.Info("Keeping MPS control daemons", "node", f.nodeName, "stateDir", f.stateDir, "mpsDir", f.mpsDir)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return nodeagent.Serve(gctx, f.healthAddr, nodeagent.Handler(metrics, k.Ready)) })
	g.Go(func() error { return k.Run(gctx) })
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
