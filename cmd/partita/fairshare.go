package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/partita-dev/partita/admission/fairshare"
)

func newFairshareCommand() *cobra.Command {
	var file, output string
	cmd := &cobra.Command{
		Use:   "fairshare -f FILE [-o table|json]",
		Short: "Print each queue's fair share of the cluster for a given demand",
		Long: `Divide a cluster's capacity among a tree of queues for a given demand, the way
KAI-Scheduler does: quotas first, then what is left by priority tier and
over-quota weight, in whole units, then the fractions. FILE (YAML or JSON, "-"
for stdin) lists the capacity, the queues in creation order and the demand
(allocated + pending) of leaf queues:

  capacity: {gpu: 16, cpu: 64, memory: 512Gi}
  queues:
  - {name: org, priority: 100, gpu: {quota: 8, limit: -1, overQuotaWeight: 1}}
  - {name: team-a, parent: org, gpu: {quota: 4, overQuotaWeight: 2}}
  demand: {team-a: {gpu: 10, memory: 64Gi}}

Defaults: priority 100, quota 0, limit -1 (none), overQuotaWeight 1. Amounts
are GPUs, CPU cores and memory bytes, as numbers or quantities (500m, 64Gi).

To ask what the shares would be with a history (time-based fair share, the
extender's --fair-share-usage-weight), add the weight and each queue's usage
as a share of the cluster over the window (Queue status.usage.share):

  usageWeight: 1
  queues:
  - {name: team-a, usage: {gpu: 0.875}}
  - {name: team-b}

See docs/fairshare.md.`,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFairshare(cmd, file, output)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", "", `fair-share file, YAML or JSON; "-" reads stdin`)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	_ = cmd.MarkFlagRequired("file")
	return cmd
}

func runFairshare(cmd *cobra.Command, file, output string) error {
	write := fairshare.WriteTable
	switch output {
	case "table":
	case "json":
		write = fairshare.WriteJSON
	default:
		return fmt.Errorf("unknown output format %q: want table or json", output)
	}
	in, err := loadFairshareFile(cmd.InOrStdin(), file)
	if err != nil {
		return err
	}
	d, err := in.Divide()
	if err != nil {
		return err
	}
	return write(cmd.OutOrStdout(), d)
}

func loadFairshareFile(stdin io.Reader, file string) (fairshare.Input, error) {
	if file == "-" {
		in, err := fairshare.Load(stdin)
		if err != nil {
			return fairshare.Input{}, fmt.Errorf("load stdin: %w", err)
		}
		return in, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return fairshare.Input{}, fmt.Errorf("load fair-share file: %w", err)
	}
	defer func() { _ = f.Close() }()
	in, err := fairshare.Load(f)
	if err != nil {
		return fairshare.Input{}, fmt.Errorf("load %s: %w", file, err)
	}
	return in, nil
}
