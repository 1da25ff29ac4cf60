package main

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/partita-dev/partita/demo"
	"github.com/partita-dev/partita/devcluster"
	"github.com/partita-dev/partita/devcluster/realnode"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/extender"
)

// devFlags are shared by every `partita dev` subcommand.
type devFlags struct {
	opts devcluster.Options
	// mode is --mode as given; empty keeps the cluster's (host for a new one).
	mode string
	// gpuBackend is --gpu-backend as given; empty keeps the cluster's
	// (extender for a new one).
	gpuBackend string
	// extra are --webhook-flag's and --extender-flag's: more flags for the
	// host webhook and extender.
	extra extraFlags
	// extenderReplicas is --extender-replicas as given; unless given, the
	// cluster's (1 for a new one).
	extenderReplicas int
}

func (f *devFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.opts.Name, "name", f.opts.Name, "name of the dev cluster")
	cmd.PersistentFlags().StringVar(&f.opts.BinDir, "bin-dir", f.opts.BinDir, "directory with the cluster binaries (built by 'make demo-bins'; 'make cluster-bins' adds the real node's and the addons')")
	cmd.PersistentFlags().StringVar(&f.opts.WorkDir, "work-dir", f.opts.WorkDir, "kwokctl work directory for the cluster's files and logs")
}

func (f *devFlags) cluster(cmd *cobra.Command) (*devcluster.Cluster, error) {
	opts := f.opts
	opts.Out = cmd.OutOrStdout()
	bin, err := selfBinary()
	if err != nil {
		return nil, err
	}
	opts.PartitaBinary = bin
	if opts.ImagesDir == "" {
		opts.ImagesDir = defaultImagesDir(bin)
	}
	// --real-node and --mode default to what the cluster has.
	probe, err := devcluster.New(devcluster.Options{Name: opts.Name, WorkDir: opts.WorkDir, GPUModel: opts.GPUModel})
	if err != nil {
		return nil, err
	}
	saved, known := probe.SavedSettings()
	if known && !cmd.Flags().Changed("real-node") {
		opts.RealNode = saved.RealNode
	}
	opts.Mode = devcluster.Mode(f.mode)
	if opts.Mode == "" {
		opts.Mode = saved.Mode
	}
	opts.GPUBackend = saved.GPUBackend
	if f.gpuBackend != "" {
		if opts.GPUBackend, err = dra.ParseBackend(f.gpuBackend); err != nil {
			return nil, fmt.Errorf("--gpu-backend: %w", err)
		}
	}
	if opts.Mode == devcluster.ModeHost {
		// kwokctl's kube-scheduler calls the host extender over mTLS with
		// the certificates devPrepare writes; in mode chart the chart's
		// kube-scheduler and extender have the chart's.
		opts.SchedulerConfig = devSchedulerConfig()
		opts.Prepare = devPrepare
	}
	if len(f.extra.webhook) > 0 && opts.Mode != devcluster.ModeHost {
		return nil, fmt.Errorf("--webhook-flag: the webhook runs on the host in mode host only; in mode %s set the chart's values", opts.Mode)
	}
	if len(f.opts.ChartSet) > 0 && opts.Mode != devcluster.ModeChart {
		return nil, fmt.Errorf("--set: chart values apply in mode chart only (--mode chart --real-node); in mode %s use --extender-flag", opts.Mode)
	}
	for _, kv := range f.opts.ChartSet {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return nil, fmt.Errorf("--set %q: want key=value, as helm's --set (e.g. --set agent.isolation=hami-core)", kv)
		}
	}
	if len(f.extra.extender) > 0 && opts.Mode != devcluster.ModeHost {
		return nil, fmt.Errorf("--extender-flag: the extender runs on the host in mode host only; in mode %s set the chart's values (extender.*)", opts.Mode)
	}
	opts.ExtenderReplicas = saved.ExtenderReplicas
	if cmd.Flags().Changed("extender-replicas") {
		if opts.Mode != devcluster.ModeHost {
			return nil, fmt.Errorf("--extender-replicas: the extender runs on the host in mode host only; in mode %s set the chart's extender.replicas", opts.Mode)
		}
		opts.ExtenderReplicas = f.extenderReplicas
	}
	if opts.HostProcesses, err = devHostProcesses(opts.Mode, opts.GPUBackend, opts.RealNode, f.extra, opts.ExtenderReplicas); err != nil {
		return nil, err
	}
	return devcluster.New(opts)
}

// defaultImagesDir is where `make images` writes the real node's images:
// bin/images beside bin/partita.
func defaultImagesDir(partitaBinary string) string {
	return filepath.Join(filepath.Dir(partitaBinary), "images")
}

func newDevCommand() *cobra.Command {
	f := &devFlags{opts: devcluster.DefaultOptions()}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local cluster with simulated GPU nodes (real Kubernetes components, kwok nodes)",
	}
	f.register(cmd)
	cmd.AddCommand(newDevUpCommand(f), newDevDownCommand(f), newDevStatusCommand(f), newDevKubeconfigCommand(f), newDevDemoCommand(f), newDevExtenderProxyCommand())
	return cmd
}

func addNodeFlags(cmd *cobra.Command, f *devFlags) {
	cmd.Flags().IntVar(&f.opts.Nodes, "nodes", f.opts.Nodes, "number of simulated GPU nodes")
	cmd.Flags().IntVar(&f.opts.GPUsPerNode, "gpus-per-node", f.opts.GPUsPerNode, "simulated GPUs on each node")
	cmd.Flags().StringVar(&f.opts.GPUModel, "gpu-model", f.opts.GPUModel, "simulated GPU model: "+strings.Join(devcluster.ModelNames(), ", "))
	cmd.Flags().StringSliceVar(&f.opts.Disable, "disable", nil, "cluster components not to start (kube-scheduler, kube-controller-manager); for trying failure modes")
	_ = cmd.Flags().MarkHidden("disable")
	cmd.Flags().StringArrayVar(&f.extra.extender, "extender-flag", nil, "a flag for the extender and its admission loop (mode host), added to its command line when it starts; e.g. --extender-flag=--fair-share-usage-weight=1 (repeat for more)")
	cmd.Flags().StringArrayVar(&f.opts.ChartSet, "set", nil, "a chart value for mode chart, as helm's --set key=value (e.g. --set agent.isolation=hami-core; repeat for more), over dev up's own; a later up without it installs without it")
	cmd.Flags().StringArrayVar(&f.extra.webhook, "webhook-flag", nil, "a flag for the webhook (mode host), added to its command line when it starts; e.g. --webhook-flag=--admission-gate=false to measure what the admission loop costs")
	_ = cmd.Flags().MarkHidden("webhook-flag")
}

func newDevUpCommand(f *devFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create (or repair) the dev cluster and its simulated GPU nodes",
		Long: `Create (or repair) the dev cluster: a control plane, simulated GPU nodes (kwok)
and Partita, and the Partita console (partita console in local mode, in the
background until 'partita dev down'), whose URL it prints last.

--real-node adds real-node-0, a real kubelet with containerd, CNI, kube-proxy
and CoreDNS on this host, whose pods really run (needs root, the packages of
hack/real-node-deps.sh and the images of 'make images'; docs/real-node.md).
--mode chart installs Partita from its Helm chart onto the real node
(release partita in partita-system) instead of running it as host processes.
Both are kept by later runs of up and end with 'partita dev down'.

--addons runs workload controllers beside the control plane: the real
controllers of ` + strings.Join(devcluster.AddonNames(), ", ") + `, built from their releases by
'make addon-bins' (about 3 minutes each the first time), with their CRDs (and webhooks, served on loopback with a
self-signed certificate). Addons can be added to a running cluster.

--extender-replicas 2 (up to ` + fmt.Sprint(devcluster.MaxExtenderReplicas) + `, mode host) runs the extender as
replicas extender, extender-2, ..., each with its own port and log, electing
their leader with a short Lease (6s); kube-scheduler calls them through
extender-proxy, a TCP forwarder that prefers the leader. Later runs of up
keep the number unless given another, starting or stopping replicas; dev
status says which replica leads.

--feature-gates and --runtime-config go to kube-apiserver,
kube-controller-manager and kube-scheduler when the cluster is created, e.g.
the native Workload API of Kubernetes 1.37:

  partita dev up --name wl --feature-gates GenericWorkload=true,WorkloadWithJob=true --runtime-config scheduling.k8s.io/v1beta1=true`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.cluster(cmd)
			if err != nil {
				return err
			}
			if err := c.Up(cmd.Context()); err != nil {
				return err
			}
			url, err := devConsoleURL(c)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "Console: %s\n", url)
			return err
		},
	}
	addNodeFlags(cmd, f)
	cmd.Flags().BoolVar(&f.opts.RealNode, "real-node", false, "add the real node "+realnode.NodeName+" (kubelet, containerd, kube-proxy, CoreDNS on this host; needs root)")
	cmd.Flags().StringVar(&f.mode, "mode", "", "where Partita runs: host (processes on the host) or chart (the Helm chart on the real node); default: the cluster's, host for a new one")
	cmd.Flags().StringVar(&f.gpuBackend, "gpu-backend", "", "how GPU pods are placed: extender (partita.dev/gpu-milli and Partita's scheduler extender) or dra (the GPUs as DRA devices of "+dra.DriverName+", placed by kube-scheduler's DRA plugin); default: the cluster's, extender for a new one")
	cmd.Flags().IntVar(&f.extenderReplicas, "extender-replicas", 1, fmt.Sprintf("extender replicas to run on the host (mode host, 1 to %d), electing a leader; kube-scheduler calls them through a proxy; default: the cluster's, 1 for a new one", devcluster.MaxExtenderReplicas))
	cmd.Flags().StringVar(&f.opts.ImagesDir, "images-dir", "", "directory with the real node's image tarballs (default: images/ beside the partita binary, where 'make images' writes them)")
	addClusterFlags(cmd, f)
	return cmd
}

// addClusterFlags are the flags of what a cluster runs besides its nodes.
func addClusterFlags(cmd *cobra.Command, f *devFlags) {
	var addons []string
	for _, a := range devcluster.Addons() {
		addons = append(addons, a.Name+" ("+a.Kinds+", "+a.Version+")")
	}
	cmd.Flags().StringSliceVar(&f.opts.Addons, "addons", nil, "workload controllers to run, comma-separated: "+strings.Join(addons, ", "))
	cmd.Flags().StringVar(&f.opts.FeatureGates, "feature-gates", "", "Kubernetes feature gates for the control plane, set when the cluster is created (Name=true,...)")
	cmd.Flags().StringVar(&f.opts.RuntimeConfig, "runtime-config", "", "kube-apiserver --runtime-config, set when the cluster is created (group/version=true,...)")
}

func newDevDownCommand(f *devFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop every process of the dev cluster and delete its files",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.cluster(cmd)
			if err != nil {
				return err
			}
			if err := c.Down(cmd.Context()); err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "Cluster %q is down\n", c.Name())
			return err
		},
	}
}

func newDevKubeconfigCommand(f *devFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "kubeconfig",
		Short: "Print the path of the dev cluster's kubeconfig (export KUBECONFIG=$(partita dev kubeconfig))",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.cluster(cmd)
			if err != nil {
				return err
			}
			if st := c.Status(cmd.Context()); !st.Exists {
				return fmt.Errorf("cluster %q does not exist: run 'partita dev up --name %s'", c.Name(), c.Name())
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), c.KubeconfigPath())
			return err
		},
	}
}

func newDevStatusCommand(f *devFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show whether the dev cluster runs, its components and nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.cluster(cmd)
			if err != nil {
				return err
			}
			st := c.Status(cmd.Context())
			out := cmd.OutOrStdout()
			if output == "json" {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			consoleURL := ""
			if st.Components["partita-"+devConsole.Name] == "running" {
				consoleURL, _ = devConsoleURL(c)
			}
			return writeDevStatus(out, st, consoleURL)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

// writeDevStatus writes `dev status` for a person: the cluster, then its
// extender replicas with the one that leads, then every component.
func writeDevStatus(out io.Writer, st devcluster.Status, consoleURL string) error {
	if !st.Exists {
		_, err := fmt.Fprintf(out, "Cluster %q does not exist; create it with 'partita dev up'\n", st.Name)
		return err
	}
	fmt.Fprintf(out, "Cluster:     %s\n", st.Name)
	fmt.Fprintf(out, "API server:  %s\n", st.APIServer)
	fmt.Fprintf(out, "Kubeconfig:  %s\n", st.Kubeconfig)
	fmt.Fprintf(out, "GPU nodes:   %d (%d ready)\n", st.GPUNodes, st.ReadyNodes)
	fmt.Fprintf(out, "Partita:     mode %s\n", st.Mode)
	if st.RealNode {
		fmt.Fprintf(out, "Real node:   %s\n", realnode.NodeName)
	}
	if consoleURL != "" {
		fmt.Fprintf(out, "Console:     %s\n", consoleURL)
	}
	if e := st.Extender; e != nil {
		proxy := ""
		if e.Proxy != "" {
			proxy = ", kube-scheduler calls them through " + e.Proxy
		}
		fmt.Fprintf(out, "Extender:    %d %s%s\n", len(e.Replicas), plural(len(e.Replicas), "replica", "replicas"), proxy)
		for _, r := range e.Replicas {
			state := "stopped"
			switch {
			case r.Running && r.Leader:
				state = "leader"
			case r.Running && r.Ready:
				state = "follower"
			case r.Running:
				state = "not ready"
			}
			pid := "-"
			if r.PID > 0 {
				pid = strconv.Itoa(r.PID)
			}
			fmt.Fprintf(out, "  %-12s %-10s pid %-8s 127.0.0.1:%d\n", r.Name, state, pid, r.Port)
		}
		if e.LeaseHolder != "" {
			renewed := ""
			if e.LeaseRenewed != nil {
				renewed = ", renewed " + e.LeaseRenewed.Local().Format(time.TimeOnly)
			}
			fmt.Fprintf(out, "  Lease %s/%s held by %s%s\n", devcluster.PartitaNamespace, extender.DefaultLeaseName, e.LeaseHolder, renewed)
		}
	}
	names := make([]string, 0, len(st.Components))
	for n := range st.Components {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(out, "  %-26s %s\n", n, st.Components[n])
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func newDevDemoCommand(f *devFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Bring the dev cluster up and show what Partita does, step by step",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.cluster(cmd)
			if err != nil {
				return err
			}
			bin, err := selfBinary()
			if err != nil {
				return err
			}
			return demo.Run(cmd.Context(), c, demo.Options{Out: cmd.OutOrStdout(), PartitaBinary: bin,
				ConsoleURL: func() (string, error) { return devConsoleURL(c) }})
		},
	}
	addNodeFlags(cmd, f)
	addClusterFlags(cmd, f)
	return cmd
}
