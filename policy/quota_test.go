package policy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
)

// quotaQueue is a queue named name with a GPU limit and usage in
// milli-GPUs.
func quotaQueue(name string, limit, allocated int64) QuotaQueue {
	return QuotaQueue{Name: name, Priority: 100, GPU: QuotaResource{QuotaMilli: 4000, LimitMilli: limit, AllocatedMilli: allocated, FairShareMilli: 4000}}
}

// quotaInput is a gang of milli milli-GPUs for queue team-a, under the
// given ancestors, parent first.
func quotaInput(milli int64, queue QuotaQueue, ancestors ...QuotaQueue) *QuotaInput {
	return &QuotaInput{
		Workload: QuotaWorkload{Namespace: "team-a", Name: "train-1", Kind: QuotaKindPodGroup, Queue: queue.Name,
			Members: 2, GPUMilli: milli, Priority: 100},
		Queue:     queue,
		Ancestors: ancestors,
		Cluster:   QuotaCluster{GPUMilli: 32000},
	}
}

// siteQuotaRule is docs/policy.md's example cap: 8 GPUs a workload,
// whatever its queue.
const siteQuotaRule = `package partita.quota

deny contains msg if {
  input.workload.gpuMilli > 8000
  msg := sprintf("%s %s/%s asks for more than 8 GPUs; this cluster admits at most 8 per workload",
    [input.workload.kind, input.workload.namespace, input.workload.name])
}
`

// borrowRule is docs/policy.md's example: only priority 1000 or more may
// take a queue beyond its quota.
const borrowRule = `package partita.quota

deny contains msg if {
  input.queue.gpu.quotaMilli >= 0
  input.queue.gpu.allocatedMilli + input.workload.gpuMilli > input.queue.gpu.quotaMilli
  input.workload.priority < 1000
  msg := sprintf("queue %s would go over its quota; only workloads of priority 1000 or more may borrow",
    [input.queue.name])
}
`

// configMapBundle is the bundle the ConfigMapLoader would load from one
// policy ConfigMap holding files.
func configMapBundle(t testing.TB, files map[string]string) Bundle {
	t.Helper()
	b, _, err := overlay([]corev1.ConfigMap{*policyConfigMap("site", files)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEngineQuota(t *testing.T) {
	cases := map[string]struct {
		// bundle is loaded before the decision; nil keeps the default.
		bundle Bundle
		in     *QuotaInput
		want   *QuotaDecision
	}{
		"under limit": {
			in:   quotaInput(2000, quotaQueue("team-a", 8000, 3000), quotaQueue("research", 16000, 3000)),
			want: &QuotaDecision{Allowed: true},
		},
		"exactly at limit": {
			in:   quotaInput(1000, quotaQueue("team-a", 4000, 3000)),
			want: &QuotaDecision{Allowed: true},
		},
		"queue full": {
			in:   quotaInput(1000, quotaQueue("team-a", 4000, 4000)),
			want: &QuotaDecision{Reasons: []string{"queue team-a is at its limit: 4 of 4 GPUs"}},
		},
		"over limit with some room": {
			in:   quotaInput(2000, quotaQueue("team-a", 4000, 3000)),
			want: &QuotaDecision{Reasons: []string{"queue team-a is at its limit: 3 of 4 GPUs, and the workload needs 2"}},
		},
		"fractions": {
			in:   quotaInput(1500, quotaQueue("team-a", 4500, 3250)),
			want: &QuotaDecision{Reasons: []string{"queue team-a is at its limit: 3.25 of 4.5 GPUs, and the workload needs 1.5"}},
		},
		"limit -1 is none": {
			in:   quotaInput(64000, quotaQueue("team-a", -1, 100000), quotaQueue("research", -1, 100000)),
			want: &QuotaDecision{Allowed: true},
		},
		"limit 0 admits nothing": {
			in:   quotaInput(100, quotaQueue("team-a", 0, 0)),
			want: &QuotaDecision{Reasons: []string{"queue team-a is at its limit: 0 of 0 GPUs"}},
		},
		"parent at its limit": {
			in:   quotaInput(1000, quotaQueue("team-a", -1, 2000), quotaQueue("research", 8000, 8000)),
			want: &QuotaDecision{Reasons: []string{"queue research (parent of team-a) is at its limit: 8 of 8 GPUs"}},
		},
		"parent with some room": {
			in:   quotaInput(2000, quotaQueue("team-a", -1, 2000), quotaQueue("research", 8000, 7000)),
			want: &QuotaDecision{Reasons: []string{"queue research (parent of team-a) is at its limit: 7 of 8 GPUs, and the workload needs 2"}},
		},
		"several ancestors, one over": {
			in: quotaInput(2000, quotaQueue("team-a", 8000, 1000),
				quotaQueue("research", 16000, 9000), quotaQueue("org", 10000, 9000), quotaQueue("root", -1, 20000)),
			want: &QuotaDecision{Reasons: []string{"queue org (ancestor of team-a) is at its limit: 9 of 10 GPUs, and the workload needs 2"}},
		},
		"queue and parent over, sorted": {
			in:   quotaInput(2000, quotaQueue("team-a", 2000, 1000), quotaQueue("research", 4000, 4000)),
			want: &QuotaDecision{Reasons: []string{"queue research (parent of team-a) is at its limit: 4 of 4 GPUs", "queue team-a is at its limit: 1 of 2 GPUs, and the workload needs 2"}},
		},
		"override adds a rule, the default rules stay": {
			bundle: configMapBundle(t, map[string]string{"site-quota.rego": siteQuotaRule}),
			in:     quotaInput(9000, quotaQueue("team-a", 8000, 0)),
			want: &QuotaDecision{Reasons: []string{
				"PodGroup team-a/train-1 asks for more than 8 GPUs; this cluster admits at most 8 per workload",
				"queue team-a is at its limit: 0 of 8 GPUs, and the workload needs 9",
			}},
		},
		"override adds a rule that allows": {
			bundle: configMapBundle(t, map[string]string{"site-quota.rego": siteQuotaRule}),
			in:     quotaInput(2000, quotaQueue("team-a", 8000, 0)),
			want:   &QuotaDecision{Allowed: true},
		},
		"docs example: borrowing needs priority": {
			bundle: configMapBundle(t, map[string]string{"site-quota.rego": borrowRule}),
			in:     quotaInput(2000, quotaQueue("team-a", 8000, 3000)),
			want:   &QuotaDecision{Reasons: []string{"queue team-a would go over its quota; only workloads of priority 1000 or more may borrow"}},
		},
		"override of admission.rego keeps the default quota": {
			bundle: configMapBundle(t, map[string]string{"admission.rego": "package partita.admission\n"}),
			in:     quotaInput(1000, quotaQueue("team-a", 4000, 4000)),
			want:   &QuotaDecision{Reasons: []string{"queue team-a is at its limit: 4 of 4 GPUs"}},
		},
		"override replaces quota.rego": {
			bundle: configMapBundle(t, map[string]string{"quota.rego": siteQuotaRule}),
			in:     quotaInput(1000, quotaQueue("team-a", 4000, 4000)),
			want:   &QuotaDecision{Allowed: true},
		},
		"override removes quota.rego: no quota rules": {
			bundle: configMapBundle(t, map[string]string{"quota.rego": ""}),
			in:     quotaInput(1000, quotaQueue("team-a", 4000, 4000)),
			want:   &QuotaDecision{Allowed: true},
		},
		"bundle without a quota package allows": {
			bundle: Bundle{"admission.rego": "package partita.admission\ndeny contains \"no\" if true\n"},
			in:     quotaInput(1000, quotaQueue("team-a", 4000, 4000)),
			want:   &QuotaDecision{Allowed: true},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t)
			want := e.Version()
			if tc.bundle != nil {
				var err error
				if want, err = e.Load(t.Context(), tc.bundle, "test"); err != nil {
					t.Fatal(err)
				}
			}
			got, err := e.Quota(t.Context(), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(QuotaDecision{}, "Version"), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Quota() (-want,+got):\n%s", diff)
			}
			if got.Version != want {
				t.Errorf("Quota() version = %s, want %s", got.Version, want)
			}
		})
	}
}

func TestEngineQuotaEvaluationErrors(t *testing.T) {
	cases := map[string]string{
		"deny is not a set of strings": "package partita.quota\ndeny := {1, 2}",
		"deny is not a set":            "package partita.quota\ndeny := \"no\"",
		"deny is null":                 "package partita.quota\ndeny := null",
		"builtin error":                "package partita.quota\ndeny contains \"x\" if to_number(input.queue.name) > 1",
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			e := newTestEngine(t, WithMetrics(NewMetrics(reg)))
			if _, err := e.Load(t.Context(), Bundle{"quota.rego": src}, "test"); err != nil {
				t.Fatal(err)
			}
			_, err := e.Quota(t.Context(), quotaInput(1000, quotaQueue("team-a", 4000, 0)))
			if !IsEvaluation(err) {
				t.Fatalf("Quota() = %v, want an evaluation error", err)
			}
			if got := counterValue(t, reg, "partita_policy_evaluation_errors_total", pointQuota.String()); got != 1 {
				t.Errorf("quota evaluation errors = %v, want 1", got)
			}
			// The webhook's decision point is unaffected.
			if _, err := e.Admission(t.Context(), input("team-a", "team-a", 500)); err != nil {
				t.Errorf("Admission() = %v", err)
			}
		})
	}
}

// TestQuotaInputValue: the AST input the engine builds is the input's JSON
// document, so the Go types' JSON names are the names docs/policy.md and
// the policy use.
func TestQuotaInputValue(t *testing.T) {
	cases := map[string]*QuotaInput{
		"top-level queue": quotaInput(1000, quotaQueue("team-a", -1, 0)),
		"nested queue": quotaInput(8000, quotaQueue("team-a", 8000, 3000),
			quotaQueue("research", 16000, 9000), quotaQueue("org", -1, 9000)),
	}
	cases["top-level queue"].Ancestors = []QuotaQueue{}
	for name, in := range cases {
		t.Run(name, func(t *testing.T) {
			doc, err := jsonValue(in)
			if err != nil {
				t.Fatal(err)
			}
			want, err := ast.InterfaceToValue(doc)
			if err != nil {
				t.Fatal(err)
			}
			got, err := in.value(inputOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if want.Compare(got) != 0 {
				t.Errorf("value() = %v, want %v", got, want)
			}
		})
	}
}
