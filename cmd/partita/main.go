// Command partita is Partita's one binary: each role (webhook, extender,
// agent) and each tool (dev cluster, policy tests, fair share) is a
// subcommand. This package holds flags and wiring only.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := commandFor(os.Args[0]).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "partita",
		Short: "Partita: GPU fractions, queues and gangs on any Kubernetes cluster",
		Long: `Partita shares GPUs between pods (fractions or GPU memory), admits distributed
jobs all-or-nothing, and divides a cluster's GPUs between teams' queues, on the
stock kube-scheduler.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCommand(), newDevCommand(), newFairshareCommand(), newAgentCommand(), newMPSKeeperCommand(), newModelCacheCommand(), newInterposerCommand(), newWebhookCommand(), newPolicyCommand(), newExtenderCommand(), newCtlCommand("ctl"), newConsoleCommand(nil))
	return root
}
