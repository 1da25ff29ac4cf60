package policy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/partita-dev/partita/api/v1alpha1"
	"github.com/partita-dev/partita/internal/partitatest"
)

// testState: team-a (namespace team-a, limit 8) under research (limit 16);
// namespace lent names team-a as its default.
func testState(t testing.TB) State {
	t.Helper()
	st, err := BuildState([]v1alpha1.Queue{
		*partitatest.MakeQueue("research").GPU("8", "16", 1).Obj(),
		*partitatest.MakeQueue("team-a").Parent("research").Namespaces("team-a").GPU("4", "8", 1).Obj(),
	}, []NamespaceInfo{
		{Name: "team-a"},
		{Name: "lent", Labels: map[string]string{v1alpha1.LabelDefaultQueue: "team-a"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func input(ns, queue string, milli int64) *AdmissionInput {
	return &AdmissionInput{
		Operation: "CREATE",
		User:      UserInfo{Username: "alice"},
		Namespace: ns,
		Pod:       PodInfo{Name: "p", Annotations: map[string]string{lastAppliedAnnotation: "{}", "big": strings.Repeat("x", MaxAnnotationValueLen+1), "small": "1"}},
		Request: Request{Dialect: "partita", Queue: queue, GPUMilli: milli, Containers: []ContainerRequest{
			{Name: "main", Count: 1, Milli: milli, MilliPerDevice: milli, GPUMilli: milli},
		}},
	}
}

func newTestEngine(t testing.TB, opts ...Option) *Engine {
	t.Helper()
	e, err := NewEngine(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetState(context.Background(), testState(t)); err != nil {
		t.Fatal(err)
	}
	return e
}

func TestEngineAdmission(t *testing.T) {
	cases := map[string]struct {
		config Config
		in     *AdmissionInput
		want   *AdmissionDecision
	}{
		"allowed": {
			in:   input("team-a", "team-a", 500),
			want: &AdmissionDecision{Deny: []string{}},
		},
		"default queue patched": {
			in:   input("lent", "", 500),
			want: &AdmissionDecision{Deny: []string{}, Patch: Patch{Labels: map[string]string{v1alpha1.LabelQueue: "team-a"}}},
		},
		"over limit": {
			in: input("team-a", "team-a", 9000),
			want: &AdmissionDecision{Deny: []string{
				`the pod asks for 9 GPUs, more than the 8 GPU limit of queue "team-a" and its parents; it could never be admitted: ask for less, or raise the queue's spec.resources.gpu.limit`,
			}},
		},
		"two denials, sorted": {
			config: Config{MaxGPUMilliPerPod: 1000},
			in:     input("other", "team-a", 2000),
			want: &AdmissionDecision{Deny: []string{
				`namespace other may not submit to queue "team-a"; add other to the queue's spec.namespaces or match it with spec.namespaceSelector, or name another queue`,
				`the pod asks for 2 GPUs; this cluster allows at most 1 per pod: split the work across pods, or ask for less`,
			}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newTestEngine(t)
			if err := e.SetConfig(t.Context(), tc.config); err != nil {
				t.Fatal(err)
			}
			got, err := e.Admission(t.Context(), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(AdmissionDecision{}, "Version"), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("Admission() (-want,+got):\n%s", diff)
			}
			if (got.Err() != nil) != (len(tc.want.Deny) > 0) || (got.Err() != nil && !IsDenial(got.Err())) {
				t.Errorf("Err() = %v", got.Err())
			}
		})
	}
}

// TestEngineInputOmitsLargeAnnotations: the input leaves out what a policy
// should not pay for.
func TestEngineInputOmitsLargeAnnotations(t *testing.T) {
	e := newTestEngine(t)
	_, err := e.Load(t.Context(), Bundle{"probe.rego": `package partita.admission
deny contains k if { some k, _ in input.pod.annotations }`}, "test")
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.Admission(t.Context(), input("team-a", "team-a", 500))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"small"}, got.Deny); diff != "" {
		t.Errorf("annotations seen by the policy (-want,+got):\n%s", diff)
	}
}

func TestEngineLoad(t *testing.T) {
	cases := map[string]struct {
		bundle      Bundle
		wantCompile bool
		wantDeny    []string
	}{
		"overlay adds a rule": {
			bundle:   DefaultBundle().Overlay(map[string]string{"site.rego": "package partita.admission\ndeny contains \"site rule\" if input.request.gpuMilli > 100\n"}),
			wantDeny: []string{"site rule"},
		},
		"overlay replaces the default": {
			bundle:   DefaultBundle().Overlay(map[string]string{"admission.rego": "package partita.admission\ndeny contains \"replaced\" if true\n"}),
			wantDeny: []string{"replaced"},
		},
		"empty file removes a module": {
			bundle: DefaultBundle().Overlay(map[string]string{"admission.rego": ""}),
		},
		"parse error": {
			bundle:      Bundle{"bad.rego": "package partita.admission\ndeny contains msg if {"},
			wantCompile: true,
		},
		"unsafe variable": {
			bundle:      Bundle{"bad.rego": "package partita.admission\ndeny contains msg if { x == 1 }"},
			wantCompile: true,
		},
		"type error": {
			bundle:      Bundle{"bad.rego": "package partita.admission\ndeny contains x if x := sprintf(1, 2)"},
			wantCompile: true,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			e := newTestEngine(t, WithMetrics(NewMetrics(reg)))
			before := e.Version()
			if err := e.Check(t.Context(), tc.bundle, "test"); IsCompile(err) != tc.wantCompile {
				t.Fatalf("Check() = %v, want compile error %v", err, tc.wantCompile)
			}
			v, err := e.Load(t.Context(), tc.bundle, "test")
			if IsCompile(err) != tc.wantCompile {
				t.Fatalf("Load() = %v, want compile error %v", err, tc.wantCompile)
			}
			want := tc.bundle.Version()
			if tc.wantCompile {
				want = before
				if got := counterValue(t, reg, "partita_policy_loads_total", loadRefused); got != 1 {
					t.Errorf("refused loads = %v, want 1", got)
				}
			} else if v != want {
				t.Errorf("Load() version = %s, want %s", v, want)
			}
			if e.Version() != want {
				t.Errorf("version in force = %s, want %s", e.Version(), want)
			}
			got, err := e.Admission(t.Context(), input("team-a", "team-a", 500))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantDeny, got.Deny, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("decision after load (-want,+got):\n%s", diff)
			}
		})
	}
}

func TestEngineEvaluationErrors(t *testing.T) {
	cases := map[string]string{
		"deny is not a set of strings": "package partita.admission\ndeny := {1, 2}",
		"patch sets the spec":          "package partita.admission\npatch := {\"spec\": {}}",
		"patch label is not a string":  "package partita.admission\npatch := {\"labels\": {\"a\": 1}}",
		"conflict at runtime":          "package partita.admission\npatch := {\"labels\": {}} if input.namespace\npatch := {\"annotations\": {}} if input.operation",
		"builtin error":                "package partita.admission\ndeny contains \"x\" if to_number(input.namespace) > 1",
		"too slow":                     "package partita.admission\ndeny contains \"slow\" if { some i in numbers.range(1, 100000000); i < 0 }",
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			e := newTestEngine(t, WithMetrics(NewMetrics(reg)), WithEvalTimeout(50*time.Millisecond))
			if _, err := e.Load(t.Context(), Bundle{"x.rego": src}, "test"); err != nil {
				t.Fatal(err)
			}
			_, err := e.Admission(t.Context(), input("team-a", "team-a", 500))
			if !IsEvaluation(err) {
				t.Fatalf("Admission() = %v, want an evaluation error", err)
			}
			if got := counterValue(t, reg, "partita_policy_evaluation_errors_total", ""); got != 1 {
				t.Errorf("evaluation errors = %v, want 1", got)
			}
		})
	}
}

func TestEngineStateWrites(t *testing.T) {
	e := newTestEngine(t)
	if _, err := e.Load(t.Context(), Bundle{"q.rego": `package partita.admission
deny contains q if some q, _ in data.partita.state.queues`}, "test"); err != nil {
		t.Fatal(err)
	}
	got, err := e.Admission(t.Context(), input("team-a", "team-a", 500))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"research", "team-a"}, got.Deny); diff != "" {
		t.Errorf("queues seen (-want,+got):\n%s", diff)
	}
	if err := e.SetState(t.Context(), State{Queues: map[string]QueueState{"solo": {}}, Namespaces: map[string]NamespaceState{}}); err != nil {
		t.Fatal(err)
	}
	got, err = e.Admission(t.Context(), input("team-a", "team-a", 500))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"solo"}, got.Deny); diff != "" {
		t.Errorf("queues seen after SetState (-want,+got):\n%s", diff)
	}
}

// counterValue reads one series of a registered counter; label is the value
// of its only label, "" for none.
func counterValue(t testing.TB, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestEngineInputPodSpec: a rule on the pod's spec sees it in the shape of
// the Kubernetes API (the example of docs/policy.md).
func TestEngineInputPodSpec(t *testing.T) {
	e := newTestEngine(t)
	_, err := e.Load(t.Context(), DefaultBundle().Overlay(map[string]string{"spec.rego": `package partita.admission

deny contains msg if {
	some i, c in input.pod.spec.containers
	not c.securityContext.runAsNonRoot
	msg := sprintf("GPU containers run as non-root: set spec.containers[%d].securityContext.runAsNonRoot (%s)", [i, c.name])
}

deny contains msg if {
	some v in input.pod.spec.volumes
	v.hostPath
	msg := sprintf("GPU pods mount no hostPath; volume %s mounts %s", [v.name, v.hostPath.path])
}
`}), "test")
	if err != nil {
		t.Fatal(err)
	}
	in := input("team-a", "team-a", 500)
	in.Pod.Spec = partitatest.MakePod("p", "team-a").Container("main").Container("sidecar").
		HostPath("data", "/data").Obj().Spec.DeepCopy()
	nonRoot := true
	in.Pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsNonRoot: &nonRoot}
	got, err := e.Admission(t.Context(), in)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"GPU containers run as non-root: set spec.containers[1].securityContext.runAsNonRoot (sidecar)",
		"GPU pods mount no hostPath; volume data mounts /data",
	}
	if diff := cmp.Diff(want, got.Deny); diff != "" {
		t.Errorf("denials (-want,+got):\n%s", diff)
	}
}

// TestQuotaByNumbers: quota answers are shared between workloads only
// for policies that cannot tell them apart and always answer alike.
func TestQuotaByNumbers(t *testing.T) {
	cases := map[string]struct {
		rule, lib string
		want      bool
	}{
		"the default policy":                 {want: true},
		"a name read in another package":     {rule: `deny contains "x" if data.partita.lib.vip`, lib: `vip if input.workload.name == "ceo"`, want: false},
		"the workload map's input.workload":  {lib: `kind := input.workload.metadata.name`, want: true},
		"input.workload.name":                {rule: `deny contains "x" if startswith(input.workload.name, "big-")`, want: false},
		"input.workload.namespace":           {rule: `deny contains "x" if input.workload.namespace == "guests"`, want: false},
		"input.workload whole":               {rule: `deny contains "x" if { w := input.workload; w.gpuMilli > 8000 }`, want: false},
		"input.workload[k]":                  {rule: `deny contains k if { some k, v in input.workload; v == "guests" }`, want: false},
		"input whole":                        {rule: `deny contains "x" if { walk(input, [p, v]); v == "guests" }`, want: false},
		"numbers only":                       {rule: `deny contains "x" if input.workload.gpuMilli > input.queue.gpu.quotaMilli * 2`, want: true},
		"kind and priority":                  {rule: `deny contains "x" if { input.workload.kind == "Pod"; input.workload.priority < 0 }`, want: true},
		"the clock":                          {rule: `deny contains "x" if time.weekday(time.now_ns()) == "Sunday"`, want: false},
		"a random number in a function":      {rule: "lucky(n) := rand.intn(\"q\", n)\n\ndeny contains \"x\" if lucky(10) == 3", want: false},
		"a deterministic built-in (sprintf)": {rule: `deny contains sprintf("%d", [input.workload.members]) if input.workload.members > 64`, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := prepareProbe(t, map[string]string{"partita.quota": tc.rule, "partita.lib": tc.lib})
			if p.opts.quotaByNumbers != tc.want {
				t.Errorf("answers by numbers = %v, want %v", p.opts.quotaByNumbers, tc.want)
			}
		})
	}
}

// prepareProbe prepares the default bundle with, for each package, a
// module of rules (none for "").
func prepareProbe(t *testing.T, rules map[string]string) *prepared {
	t.Helper()
	b := DefaultBundle()
	for pkg, rule := range rules {
		if rule != "" {
			b = b.Overlay(map[string]string{"probe-" + pkg + ".rego": "package " + pkg + "\n\n" + rule + "\n"})
		}
	}
	p, err := newTestEngine(t).prepare(t.Context(), b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestReadsPodSpec: the spec goes into the input only for policies that
// may read it, however they reach it.
func TestReadsPodSpec(t *testing.T) {
	cases := map[string]struct {
		rule string
		want bool
	}{
		"the default policy":         {want: false},
		"input.pod.spec":             {rule: `deny contains "x" if input.pod.spec.hostPID`, want: true},
		"input.pod by a variable":    {rule: `deny contains "x" if { p := input.pod; p.spec.hostPID }`, want: true},
		"input.pod[k]":               {rule: `deny contains k if { some k, _ in input.pod; k == "spec" }`, want: true},
		"input whole":                {rule: `deny contains "x" if { walk(input, [p, v]); v == "privileged" }`, want: true},
		"input.pod.labels only":      {rule: `deny contains "x" if input.pod.labels.x`, want: false},
		"input.request only":         {rule: `deny contains "x" if input.request.gpuMilli > 1`, want: false},
		"input[k] with a computed k": {rule: `deny contains "x" if { k := "pod"; input[k].spec.hostPID }`, want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := prepareProbe(t, map[string]string{"partita.admission": tc.rule})
			if p.opts.podSpec != tc.want {
				t.Errorf("reads the pod spec = %v, want %v", p.opts.podSpec, tc.want)
			}
		})
	}
}
