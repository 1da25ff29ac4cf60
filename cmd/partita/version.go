package main

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/partita-dev/partita/internal/version"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "partita %s (%s, %s/%s)\n", version.Get(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
			return err
		},
	}
}
