package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/partita-dev/partita/policy"
)

func newPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Work with Partita's Rego admission and quota policy",
	}
	cmd.AddCommand(newPolicyTestCommand(), newPolicyDefaultCommand())
	return cmd
}

func newPolicyTestCommand() *cobra.Command {
	opts := policy.TestOptions{WithDefault: true}
	var noDefault bool
	var threshold float64
	cmd := &cobra.Command{
		Use:   "test DIR [DIR...]",
		Short: "Run Rego unit tests (rules named test_*) for custom policies, like opa test",
		Long: `Run the Rego unit tests in DIR (*.rego modules, *.json and *.yaml data) with
OPA's tester. As the webhook does with policy ConfigMaps, the files are laid
over Partita's default bundle: a file named like a default module
(admission.rego, quota.rego) replaces it, other files add to it; --no-default tests the
files alone. See docs/policy.md for the input document and the data.

Exit status: 0 when every test passes (and coverage meets --threshold),
1 otherwise.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Paths = args
			opts.WithDefault = !noDefault
			opts.Out = cmd.OutOrStdout()
			if threshold > 0 {
				opts.Coverage = true
			}
			sum, err := policy.RunTests(cmd.Context(), opts)
			if err != nil {
				return err
			}
			if !sum.OK() {
				return fmt.Errorf("%d of %d Rego tests failed", sum.Failed+sum.Errored, sum.Passed+sum.Failed+sum.Errored+sum.Skipped)
			}
			if threshold > 0 && sum.Coverage < threshold {
				return fmt.Errorf("coverage %.1f%% is below --threshold %.1f%%", sum.Coverage, threshold)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&noDefault, "no-default", false, "test the files alone, without the default bundle")
	fl.StringVarP(&opts.Run, "run", "r", "", "run only tests whose names match this regular expression")
	fl.BoolVarP(&opts.Verbose, "verbose", "v", false, "print every test, not only failures")
	fl.BoolVarP(&opts.Coverage, "coverage", "c", false, "report which policy lines the tests cover")
	fl.Float64Var(&threshold, "threshold", 0, "fail when coverage (percent) is below this (implies --coverage)")
	fl.DurationVar(&opts.Timeout, "timeout", 5*time.Second, "time limit of each test")
	return cmd
}

func newPolicyDefaultCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "default",
		Short: "Print the default policy bundle, a starting point for a policy ConfigMap",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b := policy.DefaultBundle()
			var errs []error
			for _, name := range b.Names() {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "# ---- %s ----\n%s\n", name, b[name])
				errs = append(errs, err)
			}
			return errors.Join(errs...)
		},
	}
}
