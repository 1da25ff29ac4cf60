package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRunTests runs an operator's policy directory as `partita policy test`
// does.
func TestRunTests(t *testing.T) {
	site := `package partita.admission

deny contains "GPU pods need an owner label" if not input.pod.labels.owner
`
	siteTest := `package partita.site_test

import data.partita.admission

test_owner_required if {
	"GPU pods need an owner label" in admission.deny with input as {"namespace": "x", "pod": {"labels": {}}, "request": {"queue": "", "gpuMilli": 500, "minMember": 0, "containers": []}}
		with data.partita.state as {"queues": {}, "namespaces": {}}
		with data.partita.config as {}
}

test_default_rules_still_apply if {
	some msg in admission.deny with input as {"namespace": "x", "pod": {"labels": {"owner": "me"}}, "request": {"queue": "nope", "gpuMilli": 500, "minMember": 0, "containers": []}}
		with data.partita.state as {"queues": {}, "namespaces": {}}
		with data.partita.config as {}
	startswith(msg, "queue \"nope\"")
}
`
	rule := `package partita.workload.custom

rules contains g if {
	run := input.pod.labels["example.com/run"]
	g := {"name": sprintf("run-%s", [run]), "minMember": 2}
}

disabled contains "jobset.x-k8s.io/JobSet"
`
	ruleTest := `package partita.workload.custom_test

import data.partita.workload

test_runs_are_gangs if {
	g := workload.gang with input as {"pod": {"labels": {"example.com/run": "a"}}, "chain": []}
	g.name == "run-a"
}

test_jobsets_are_not if {
	js := {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "x", "labels": {}, "annotations": {},
		"spec": {"replicatedJobs": [{"replicas": 2, "template": {"spec": {"parallelism": 2, "template": {"gpu": true}}}}]}}
	not workload.gang with input as {"pod": {"labels": {}}, "chain": [js], "owner": js}
}

test_indexed_jobs_still_are if {
	j := {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "labels": {}, "annotations": {},
		"spec": {"parallelism": 2, "completionMode": "Indexed"}}
	workload.gang.minMember == 2 with input as {"pod": {"labels": {}}, "chain": [j], "owner": j}
}
`
	failing := `package partita.fail_test

test_fails if { 1 == 2 }
`
	cases := map[string]struct {
		files       map[string]string
		opts        TestOptions
		want        TestSummary
		wantErr     bool
		wantInOut   string
		wantNoTests bool
	}{
		"site policy over the default bundle": {
			files: map[string]string{"site.rego": site, "site_test.rego": siteTest},
			opts:  TestOptions{WithDefault: true, Coverage: true},
			want:  TestSummary{Passed: 2},
		},
		"workload rules over the default bundle": {
			files: map[string]string{"workload_runs.rego": rule, "workload_runs_test.rego": ruleTest},
			opts:  TestOptions{WithDefault: true},
			want:  TestSummary{Passed: 3, Coverage: -1},
		},
		"without the default bundle its rules are gone": {
			files: map[string]string{"site.rego": site, "site_test.rego": siteTest},
			opts:  TestOptions{},
			want:  TestSummary{Passed: 1, Failed: 1, Coverage: -1},
		},
		"a failing test is reported": {
			files:     map[string]string{"fail_test.rego": failing},
			want:      TestSummary{Failed: 1, Coverage: -1},
			wantInOut: "test_fails: FAIL",
		},
		"filter": {
			files: map[string]string{"site.rego": site, "site_test.rego": siteTest},
			opts:  TestOptions{WithDefault: true, Run: "owner"},
			want:  TestSummary{Passed: 1, Coverage: -1},
		},
		"no tests": {
			files:       map[string]string{"site.rego": site},
			wantNoTests: true,
		},
		"does not parse": {
			files:   map[string]string{"site.rego": "package x\nallow if {"},
			wantErr: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			for f, src := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var out strings.Builder
			opts := tc.opts
			opts.Paths, opts.Out = []string{dir}, &out
			got, err := RunTests(t.Context(), opts)
			switch {
			case tc.wantNoTests:
				if !errors.Is(err, ErrNoTests) {
					t.Fatalf("RunTests() = %v, want ErrNoTests", err)
				}
				return
			case tc.wantErr:
				if err == nil {
					t.Fatal("RunTests() succeeded, want an error")
				}
				return
			case err != nil:
				t.Fatalf("RunTests(): %v\n%s", err, out.String())
			}
			if tc.opts.Coverage && got.Coverage <= 0 {
				t.Errorf("coverage = %v, want a measurement", got.Coverage)
			}
			got.Coverage, got.NotCovered = tc.want.Coverage, nil
			if diff := cmp.Diff(&tc.want, got); diff != "" {
				t.Errorf("RunTests() (-want,+got):\n%s\n%s", diff, out.String())
			}
			if !strings.Contains(out.String(), tc.wantInOut) {
				t.Errorf("output lacks %q:\n%s", tc.wantInOut, out.String())
			}
		})
	}
}
