package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/partita-dev/partita/internal/demo"
	"github.com/partita-dev/partita/internal/devcluster"
)

// devFlags are shared by every `partita dev` subcommand.
type devFlags struct {
	opts devcluster.Options
}

func (f *devFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.opts.Name, "name", f.opts.Name, "name of the dev cluster")
	cmd.PersistentFlags().StringVar(&f.opts.BinDir, "bin-dir", f.opts.BinDir, "directory with the cluster binaries (built by 'make cluster-bins')")
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
	opts.SchedulerConfig = devSchedulerConfig()
	opts.Prepare = devPrepare
	if opts.HostProcesses, err = devHostProcesses(); err != nil {
		return nil, err
	}
	return devcluster.New(opts)
}

func newDevCommand() *cobra.Command {
	f := &devFlags{opts: devcluster.DefaultOptions()}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a local cluster with simulated GPU nodes (real Kubernetes components, kwok nodes)",
	}
	f.register(cmd)
	cmd.AddCommand(newDevUpCommand(f), newDevDownCommand(f), newDevStatusCommand(f), newDevKubeconfigCommand(f), newDevDemoCommand(f))
	return cmd
}

func addNodeFlags(cmd *cobra.Command, f *devFlags) {
	cmd.Flags().IntVar(&f.opts.Nodes, "nodes", f.opts.Nodes, "number of simulated GPU nodes")
	cmd.Flags().IntVar(&f.opts.GPUsPerNode, "gpus-per-node", f.opts.GPUsPerNode, "simulated GPUs on each node")
	cmd.Flags().StringVar(&f.opts.GPUModel, "gpu-model", f.opts.GPUModel, "simulated GPU model: "+strings.Join(devcluster.ModelNames(), ", "))
	cmd.Flags().StringSliceVar(&f.opts.Disable, "disable", nil, "cluster components not to start (kube-scheduler, kube-controller-manager); for trying failure modes")
	_ = cmd.Flags().MarkHidden("disable")
}

func newDevUpCommand(f *devFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Create (or repair) the dev cluster and its simulated GPU nodes",
		Long: `Create (or repair) the dev cluster and its simulated GPU nodes.

--addons runs workload controllers beside the control plane: the real
controllers of ` + strings.Join(devcluster.AddonNames(), ", ") + `, built from their releases by
'make cluster-bins', with their CRDs (and webhooks, served on loopback with a
self-signed certificate). Addons can be added to a running cluster.

--feature-gates and --runtime-config go to kube-apiserver,
kube-controller-manager and kube-scheduler when the cluster is created, e.g.
the native Workload API of Kubernetes 1.37:

  partita dev up --name wl --feature-gates GenericWorkload=true,WorkloadWithJob=true       --runtime-config scheduling.k8s.io/v1beta1=true`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := f.cluster(cmd)
			if err != nil {
				return err
			}
			return c.Up(cmd.Context())
		},
	}
	addNodeFlags(cmd, f)
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
			if !st.Exists {
				_, err := fmt.Fprintf(out, "Cluster %q does not exist; create it with 'partita dev up'\n", st.Name)
				return err
			}
			fmt.Fprintf(out, "Cluster:     %s\n", st.Name)
			fmt.Fprintf(out, "API server:  %s\n", st.APIServer)
			fmt.Fprintf(out, "Kubeconfig:  %s\n", st.Kubeconfig)
			fmt.Fprintf(out, "GPU nodes:   %d (%d ready)\n", st.GPUNodes, st.ReadyNodes)
			names := make([]string, 0, len(st.Components))
			for n := range st.Components {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				fmt.Fprintf(out, "  %-26s %s\n", n, st.Components[n])
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
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
			return demo.Run(cmd.Context(), c, demo.Options{Out: cmd.OutOrStdout(), PartitaBinary: bin})
		},
	}
	addNodeFlags(cmd, f)
	addClusterFlags(cmd, f)
	return cmd
}
