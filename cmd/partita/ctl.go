package main

import (
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/partita-dev/partita/ctl"
	"github.com/partita-dev/partita/dra"
	"github.com/partita-dev/partita/gpu"
	"github.com/partita-dev/partita/report"
)

// kubectlPluginName is the name under which the binary acts as the kubectl
// plugin: kubectl runs `kubectl-partita` for `kubectl partita`.
const kubectlPluginName = "kubectl-partita"

// commandFor returns the command tree for the name the binary was run as:
// the ctl command alone for kubectl-partita, else the whole of partita.
func commandFor(argv0 string) *cobra.Command {
	base := strings.TrimSuffix(filepath.Base(argv0), ".exe")
	if base == kubectlPluginName {
		cmd := newCtlCommand("partita")
		// cobra's plugin support: help and usage say "kubectl partita".
		cmd.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl partita"}
		return cmd
	}
	return newRootCommand()
}

func newCtlCommand(use string) *cobra.Command {
	conn := ctl.NewConnection()
	var output string
	cmd := &cobra.Command{
		Use:   use,
		Short: "Show GPU slices, queues, and why a pod waits (also: kubectl partita)",
		Long: `Views of what Partita did, from the cluster in your kubeconfig:

  nodes      each GPU node's devices with their slices, health and free capacity
             (--topology NAME: grouped by the levels of a Topology)
  queues     the queue tree with quota, limit, allocation, fair share and pods
  why POD    why a pod waits: gates, gang, queue limit, fair share, events, fit
  models     the Models of a namespace: where each is held or fetched, who uses
             it (models NAME: each node's copy and progress)
  console    the web console (map, queues, workloads) on 127.0.0.1, as you

The same binary is the kubectl plugin: installed (or linked) as kubectl-partita
on your PATH, 'kubectl partita nodes' runs 'partita ctl nodes'. See docs/ctl.md.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	conn.AddFlags(cmd.PersistentFlags())
	cmd.PersistentFlags().StringVarP(&output, "output", "o", "table", "output format: table or json")

	var topology string
	nodes := &cobra.Command{
		Use:   "nodes",
		Short: "Each GPU node's devices, their slices and free capacity",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, c, err := ctlSetup(conn, output)
			if err != nil {
				return err
			}
			return ctl.RunNodesByTopology(cmd.Context(), c, cmd.OutOrStdout(), o, topology)
		},
	}
	nodes.Flags().StringVar(&topology, "topology", "", "group the nodes by the levels of this Topology (kubectl get topologies), each domain with its nodes' GPUs")
	queues := &cobra.Command{
		Use:   "queues",
		Short: "The queue tree: quota, limit, allocated, fair share, pending, pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, c, err := ctlSetup(conn, output)
			if err != nil {
				return err
			}
			return ctl.RunQueues(cmd.Context(), c, cmd.OutOrStdout(), o)
		},
	}
	var whyOpts report.WhyOptions
	why := &cobra.Command{
		Use:   "why POD",
		Short: "Why a pod waits, in plain words and numbers (namespace from -n)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, c, err := ctlSetup(conn, output)
			if err != nil {
				return err
			}
			ns, err := conn.Namespace()
			if err != nil {
				return err
			}
			return ctl.RunWhyWithOptions(cmd.Context(), c, cmd.OutOrStdout(), ns, strings.TrimPrefix(args[0], "pod/"), o, time.Now(), whyOpts)
		},
	}
	why.Flags().StringSliceVar((*[]string)(&whyOpts.GPUClasses), "gpu-device-classes", dra.DefaultGPUClasses, "DeviceClasses whose devices are GPUs, for pods that ask through ResourceClaims (set it to the extender's --gpu-device-classes, chart value gpuDeviceClasses)")
	why.Flags().DurationVar(&whyOpts.AgentHeartbeatTimeout, "agent-heartbeat-timeout", gpu.DefaultAgentHeartbeatTimeout, "call a node's agent silent once its GPUNode heartbeat is this old (set it to the extender's --agent-heartbeat-timeout)")
	var allNamespaces bool
	models := &cobra.Command{
		Use:   "models [NAME]",
		Short: "Models: where each is held or fetched, and the pods that use it (namespace from -n)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o, c, err := ctlSetup(conn, output)
			if err != nil {
				return err
			}
			ns := ""
			if !allNamespaces {
				if ns, err = conn.Namespace(); err != nil {
					return err
				}
			}
			name := ""
			if len(args) == 1 {
				name = strings.TrimPrefix(args[0], "model/")
			}
			return ctl.RunModels(cmd.Context(), c, cmd.OutOrStdout(), ns, name, o)
		},
	}
	models.Flags().BoolVarP(&allNamespaces, "all-namespaces", "A", false, "the Models of every namespace")
	cmd.AddCommand(nodes, queues, why, models, newConsoleCommand(conn))
	return cmd
}

func ctlSetup(conn *ctl.Connection, output string) (ctl.Output, client.Client, error) {
	o, err := ctl.ParseOutput(output)
	if err != nil {
		return "", nil, err
	}
	c, err := conn.Client()
	if err != nil {
		return "", nil, err
	}
	return o, c, nil
}
