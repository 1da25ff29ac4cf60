package policy

import (
	"strings"
	"testing"
)

// minRegoCoverage is the least line coverage of the default bundle its Rego
// tests must reach.
const minRegoCoverage = 95.0

// TestDefaultBundleRego runs the Rego unit tests of the default bundle
// (policy/rego/*_test.rego) with OPA's tester and reports their coverage of
// the policy.
func TestDefaultBundleRego(t *testing.T) {
	var out strings.Builder
	sum, err := runBundleTests(t.Context(), defaultBundleWithTests(), "policy/rego/", TestOptions{Coverage: true, Verbose: testing.Verbose(), Out: &out})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if !sum.OK() {
		t.Fatalf("Rego tests failed: %d failed, %d errors", sum.Failed, sum.Errored)
	}
	t.Logf("Rego coverage of the default bundle: %.1f%% (%d tests)", sum.Coverage, sum.Passed)
	if sum.Coverage < minRegoCoverage {
		t.Errorf("coverage %.1f%% is below %.0f%%; not covered: %v", sum.Coverage, minRegoCoverage, sum.NotCovered)
	}
}
