package policy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/cover"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/tester"
	"github.com/open-policy-agent/opa/v1/topdown"
)

// TestOptions configure RunTests.
type TestOptions struct {
	// Paths are files and directories to load: *.rego modules (tests are
	// rules named test_*) and *.json / *.yaml data, as `opa test` loads them.
	Paths []string
	// WithDefault adds the default bundle's modules, except those a loaded
	// file of the same base name replaces, as the engine overlays a
	// ConfigMap policy on the default bundle.
	WithDefault bool
	// Run runs only the tests whose names match this regular expression.
	Run string
	// Verbose prints every test, not only failures.
	Verbose bool
	// Coverage measures which lines of the policy (not the tests) ran.
	Coverage bool
	// Timeout bounds each test (5s when 0).
	Timeout time.Duration
	// Out receives the report.
	Out io.Writer
}

// TestSummary counts a test run's results.
type TestSummary struct {
	// Passed, Failed, Errored and Skipped count tests.
	Passed, Failed, Errored, Skipped int
	// Coverage is the percentage of policy lines that ran, -1 when not
	// measured.
	Coverage float64
	// NotCovered lists policy lines that never ran, as file:first-last.
	NotCovered []string
}

// OK reports whether at least one test ran and none failed or errored.
func (s *TestSummary) OK() bool {
	return s.Failed == 0 && s.Errored == 0 && s.Passed > 0
}

// ErrNoTests says a test run found no tests.
var ErrNoTests = errors.New("no Rego tests found (tests are rules named test_*)")

// RunTests runs the Rego unit tests in opts.Paths with OPA's tester, like
// `opa test`, and prints a report to opts.Out. The returned error is for
// a run that could not start (a file that does not parse, a compile
// error) or ErrNoTests; failed tests are counted in the summary.
func RunTests(ctx context.Context, opts TestOptions) (*TestSummary, error) {
	modules, store, err := tester.LoadWithRegoVersion(opts.Paths, nil, ast.RegoV1)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", strings.Join(opts.Paths, " "), err)
	}
	if opts.WithDefault {
		replaced := map[string]bool{}
		for name := range modules {
			replaced[filepath.Base(name)] = true
		}
		def, err := parseBundle(DefaultBundle(), "default/")
		if err != nil {
			return nil, err
		}
		for name, m := range def {
			if !replaced[filepath.Base(name)] {
				modules[name] = m
			}
		}
	}
	return runTests(ctx, modules, store, opts)
}

// runBundleTests runs the tests of an in-memory bundle (the embedded
// default bundle in go test), with modules named prefix+file.
func runBundleTests(ctx context.Context, b Bundle, prefix string, opts TestOptions) (*TestSummary, error) {
	modules, err := parseBundle(b, prefix)
	if err != nil {
		return nil, err
	}
	return runTests(ctx, modules, inmem.New(), opts)
}

func parseBundle(b Bundle, prefix string) (map[string]*ast.Module, error) {
	out := make(map[string]*ast.Module, len(b))
	for _, name := range b.Names() {
		m, err := ast.ParseModuleWithOpts(prefix+name, b[name], ast.ParserOptions{RegoVersion: ast.RegoV1})
		if err != nil {
			return nil, fmt.Errorf("parse %s%s: %w", prefix, name, err)
		}
		out[prefix+name] = m
	}
	return out, nil
}

func runTests(ctx context.Context, modules map[string]*ast.Module, store storage.Store, opts TestOptions) (*TestSummary, error) {
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	var cov *cover.Cover
	var tracer topdown.QueryTracer
	if opts.Coverage {
		cov = cover.New()
		tracer = cov
	}
	sum := &TestSummary{Coverage: -1}
	var failures []*tester.Result
	err := storage.Txn(ctx, store, storage.TransactionParams{}, func(txn storage.Transaction) error {
		runner := tester.NewRunner().
			SetCompiler(ast.NewCompiler().WithEnablePrintStatements(true).WithCapabilities(Capabilities())).
			SetStore(store).
			SetDefaultRegoVersion(ast.RegoV1).
			CapturePrintOutput(true).
			SetCoverageQueryTracer(tracer).
			SetModules(modules).
			SetTimeout(timeout).
			Filter(opts.Run)
		ch, err := runner.RunTests(ctx, txn)
		if err != nil {
			return fmt.Errorf("compile tests: %w", explainRefused(err))
		}
		for r := range ch {
			switch {
			case r.Error != nil:
				sum.Errored++
				failures = append(failures, r)
			case r.Skip:
				sum.Skipped++
			case r.Fail:
				sum.Failed++
				failures = append(failures, r)
			default:
				sum.Passed++
			}
			if opts.Verbose || !r.Pass() {
				fmt.Fprintf(out, "%s: %s\n", r.Location, strings.TrimSpace(r.String()))
				if len(r.Output) > 0 {
					fmt.Fprintf(out, "  output: %s\n", strings.TrimSpace(string(r.Output)))
				}
				if r.Error != nil {
					fmt.Fprintf(out, "  error: %v\n", r.Error)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if sum.Passed+sum.Failed+sum.Errored+sum.Skipped == 0 {
		return sum, ErrNoTests
	}
	if cov != nil {
		sum.Coverage, sum.NotCovered = policyCoverage(cov.Report(modules))
	}
	fmt.Fprintf(out, "PASS: %d/%d", sum.Passed, sum.Passed+sum.Failed+sum.Errored+sum.Skipped)
	if sum.Failed > 0 {
		fmt.Fprintf(out, "  FAIL: %d", sum.Failed)
	}
	if sum.Errored > 0 {
		fmt.Fprintf(out, "  ERROR: %d", sum.Errored)
	}
	if sum.Skipped > 0 {
		fmt.Fprintf(out, "  SKIPPED: %d", sum.Skipped)
	}
	fmt.Fprintln(out)
	if sum.Coverage >= 0 {
		fmt.Fprintf(out, "Coverage of the policy (test files excluded): %.1f%%\n", sum.Coverage)
		for _, nc := range sum.NotCovered {
			fmt.Fprintf(out, "  not covered: %s\n", nc)
		}
	}
	return sum, nil
}

// policyCoverage is the coverage of the policy files alone: a test file
// covers itself and would inflate the figure.
func policyCoverage(r cover.Report) (float64, []string) {
	var covered, notCovered int
	var missing []string
	for _, file := range slices.Sorted(maps.Keys(r.Files)) {
		if strings.HasSuffix(file, testSuffix) {
			continue
		}
		fr := r.Files[file]
		covered += fr.CoveredLines
		notCovered += fr.NotCoveredLines
		for _, rg := range fr.NotCovered {
			missing = append(missing, fmt.Sprintf("%s:%d-%d", file, rg.Start.Row, rg.End.Row))
		}
	}
	if covered+notCovered == 0 {
		return 100, nil
	}
	return 100 * float64(covered) / float64(covered+notCovered), missing
}
