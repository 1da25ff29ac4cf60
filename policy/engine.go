package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
	"github.com/open-policy-agent/opa/v1/util"
	"k8s.io/utils/clock"
)

// SourceDefault is the source of the embedded default bundle.
const SourceDefault = "default"

// engineModule wraps data.partita.admission so that one query returns both
// parts, each with its default when a policy leaves it undefined.
const engineModule = `package partita_engine

decision := {"deny": deny, "patch": patch}

deny := d if {
	d := data.partita.admission.deny
} else := set()

patch := p if {
	p := data.partita.admission.patch
} else := {}

# The workload map: the gang (a list of none or one, as a gang may be
# undefined) and the policy's errors.
workload := {"gang": workload_gang, "errors": workload_errors}

workload_gang := [g] if {
	g := data.partita.workload.gang
} else := []

workload_errors := e if {
	e := data.partita.workload.errors
} else := set()

# The kinds the workload map watches.
workload_kinds := k if {
	k := data.partita.workload.watch
} else := set()
`

const engineModuleName = "partita_engine.rego"

// decisionPoint is one of the policy's decision points (DESIGN §7); each
// has its own prepared query in every policy version.
type decisionPoint int

const (
	// pointAdmission is data.partita.admission, asked by the webhook.
	pointAdmission decisionPoint = iota
	// pointQuota is data.partita.quota, asked by the admitter.
	pointQuota
	// pointWorkload is data.partita.workload, asked by the admitter's
	// workload map for each GPU pod without a pod group of its own.
	pointWorkload
	numPoints
)

// query is the point's query. Quota asks for deny itself, not through
// engineModule: the wrapper would cost a tenth of a quota decision, and an
// undefined deny (a bundle without the package) reads as allowed anyway.
func (d decisionPoint) query() string {
	switch d {
	case pointQuota:
		return "data.partita.quota.deny"
	case pointWorkload:
		return "data.partita_engine.workload"
	}
	return "data.partita_engine.decision"
}

// String is the point's name, the decision label of the evaluation metrics.
func (d decisionPoint) String() string {
	switch d {
	case pointQuota:
		return "quota"
	case pointWorkload:
		return "workload"
	}
	return "admission"
}

// DefaultEvalTimeout bounds one evaluation, well inside the webhook's
// 3-second timeout, so that a runaway policy fails one request rather than
// the API server's call.
const DefaultEvalTimeout = 500 * time.Millisecond

// Config is the operator's settings, at data.partita.config.
type Config struct {
	// MaxGPUMilliPerPod is the most partita.dev/gpu-milli one pod may ask
	// for; 0 means no ceiling.
	MaxGPUMilliPerPod int64 `json:"maxGPUMilliPerPod"`
	// MinGPUMilli is the smallest share of a device a container may ask
	// for, in milli-GPUs; 0 means no minimum.
	MinGPUMilli int64 `json:"minGPUMilli"`
	// RequireQueue refuses GPU pods that name no queue when their
	// namespace has no default queue.
	RequireQueue bool `json:"requireQueue"`
	// Workloads configures the built-in rules of the workload map
	// (data.partita.workload).
	Workloads WorkloadConfig `json:"workloads"`
}

// WorkloadConfig configures the built-in workload rules.
type WorkloadConfig struct {
	// Jobs says which batch/v1 Jobs are gangs: JobsIndexed (the default,
	// when empty), JobsAll or JobsNone.
	Jobs string `json:"jobs,omitempty"`
}

// Values of WorkloadConfig.Jobs.
const (
	// JobsIndexed makes Indexed Jobs with parallelism above 1 gangs.
	JobsIndexed = "indexed"
	// JobsAll makes every Job with parallelism above 1 a gang.
	JobsAll = "all"
	// JobsNone makes no Job a gang.
	JobsNone = "none"
)

// AdmissionDecision is data.partita.admission's answer for one pod.
type AdmissionDecision struct {
	// Version is the policy version that decided.
	Version string
	// Deny are the deny messages, sorted; empty allows the pod.
	Deny []string
	// Patch are the defaults to write when the pod does not set them.
	Patch Patch
}

// Err returns a *DenialError when the policy denied, else nil.
func (d *AdmissionDecision) Err() error {
	if len(d.Deny) == 0 {
		return nil
	}
	return &DenialError{Version: d.Version, Messages: d.Deny}
}

// Patch are defaults a policy asks the webhook to write.
type Patch struct {
	// Labels to set when the pod does not have them.
	Labels map[string]string
	// Annotations to set when the pod does not have them.
	Annotations map[string]string
}

// Engine evaluates Partita's policy. The compiled policy is swapped
// atomically, so evaluations never wait for a reload; cluster state lives
// in an in-memory store that SetState replaces in one transaction.
type Engine struct {
	store       storage.Store
	current     atomic.Pointer[prepared]
	metrics     *Metrics
	clock       clock.PassiveClock
	evalTimeout time.Duration
	// loadLock serialises Load, so that two reloads never race to swap.
	loadLock sync.Mutex
	// onLoad are called, under loadLock, after a new version is in force.
	onLoad []func(version string)
}

// prepared is one compiled policy version: a query per decision point,
// all on one compiler.
type prepared struct {
	version string
	source  string
	queries [numPoints]rego.PreparedEvalQuery
	// kinds are the workload map's kinds (data.partita.workload.watch),
	// read once per version.
	kinds []WorkloadKind
	// opts say what the modules read of the input.
	opts inputOptions
}

// inputOptions say which costly parts of an input the policy in force
// reads, so that inputs leave out the others.
type inputOptions struct {
	// podSpec: some rule may read input.pod.spec.
	podSpec bool
	// quotaByNumbers: no rule the quota decision evaluates reads which
	// workload asks (input.workload's name or namespace) or calls a
	// non-deterministic built-in, so that two quota questions that differ
	// only in who asks have one answer.
	quotaByNumbers bool
}

// Option configures an Engine.
type Option func(*Engine)

// WithMetrics records the engine's metrics in m.
func WithMetrics(m *Metrics) Option { return func(e *Engine) { e.metrics = m } }

// WithClock sets the clock that times evaluations.
func WithClock(c clock.PassiveClock) Option { return func(e *Engine) { e.clock = c } }

// WithEvalTimeout bounds one evaluation (DefaultEvalTimeout by default).
func WithEvalTimeout(d time.Duration) Option { return func(e *Engine) { e.evalTimeout = d } }

// NewEngine returns an engine running the default bundle, with an empty
// state and the zero Config.
func NewEngine(ctx context.Context, opts ...Option) (*Engine, error) {
	e := &Engine{
		// AST values on read: every evaluation reads the state, and
		// converting it on each read would cost more than the policy.
		store:       inmem.NewWithOpts(inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true)),
		clock:       clock.RealClock{},
		evalTimeout: DefaultEvalTimeout,
	}
	for _, o := range opts {
		o(e)
	}
	root, err := jsonValue(map[string]any{
		"state":  State{Queues: map[string]QueueState{}, Namespaces: map[string]NamespaceState{}},
		"config": Config{},
	})
	if err != nil {
		return nil, err
	}
	if err := storage.WriteOne(ctx, e.store, storage.AddOp, storage.Path{"partita"}, root); err != nil {
		return nil, fmt.Errorf("initialise policy store: %w", err)
	}
	if _, err := e.Load(ctx, DefaultBundle(), SourceDefault); err != nil {
		return nil, err
	}
	return e, nil
}

// Version returns the version of the policy in force.
func (e *Engine) Version() string { return e.current.Load().version }

// Source returns where the policy in force came from.
func (e *Engine) Source() string { return e.current.Load().source }

// Load compiles b and, if it compiles, makes it the policy in force and
// returns its version. Loading the version already in force only updates
// its source. A policy that does not compile returns a *CompileError and
// leaves the policy in force as it was.
func (e *Engine) Load(ctx context.Context, b Bundle, source string) (string, error) {
	version := b.Version()
	e.loadLock.Lock()
	defer e.loadLock.Unlock()
	if cur := e.current.Load(); cur != nil && cur.version == version {
		if cur.source != source {
			next := *cur
			next.source = source
			e.current.Store(&next)
			e.metrics.setVersion(version, source)
		}
		return version, nil
	}
	p, err := e.prepare(ctx, b)
	if err != nil {
		e.metrics.load(false)
		return "", &CompileError{Source: source, Err: err}
	}
	p.version, p.source = version, source
	e.current.Store(p)
	e.metrics.load(true)
	e.metrics.setVersion(version, source)
	for _, f := range e.onLoad {
		f(version)
	}
	return version, nil
}

// OnLoad calls f with the version each time a new policy version is in
// force (not for the one in force now). f must not call Load.
func (e *Engine) OnLoad(f func(version string)) {
	e.loadLock.Lock()
	defer e.loadLock.Unlock()
	e.onLoad = append(e.onLoad, f)
}

// Check compiles b without loading it: a *CompileError says why it would
// be refused.
func (e *Engine) Check(ctx context.Context, b Bundle, source string) error {
	if _, err := e.prepare(ctx, b); err != nil {
		return &CompileError{Source: source, Err: err}
	}
	return nil
}

// prepare compiles b once and prepares every decision point's query on
// that compiler: a reload costs one compile however many points there are.
func (e *Engine) prepare(ctx context.Context, b Bundle) (*prepared, error) {
	common := []func(*rego.Rego){
		rego.Store(e.store),
		rego.SetRegoVersion(ast.RegoV1),
		// A builtin error (a bad sprintf, a type error) fails the
		// evaluation instead of silently making a deny rule undefined.
		rego.StrictBuiltinErrors(true),
		// No built-in that reaches outside the process (capabilities.go).
		rego.Capabilities(Capabilities()),
	}
	// The first point compiles the modules with the compiler rego
	// configures itself; the hook hands that compiler to the other points,
	// which then compile only their query.
	var compiler *ast.Compiler
	opts := append(slices.Clone(common),
		rego.Query(pointAdmission.query()),
		rego.CompilerHook(func(c *ast.Compiler) { compiler = c }),
		rego.Module(engineModuleName, engineModule),
	)
	for _, name := range b.Names() {
		if strings.HasSuffix(name, testSuffix) {
			continue
		}
		opts = append(opts, rego.Module(name, b[name]))
	}
	p := &prepared{}
	var err error
	if p.queries[pointAdmission], err = rego.New(opts...).PrepareForEval(ctx); err != nil {
		return nil, explainRefused(err)
	}
	for point := pointAdmission + 1; point < numPoints; point++ {
		pointOpts := append(slices.Clone(common), rego.Query(point.query()), rego.Compiler(compiler))
		if p.queries[point], err = rego.New(pointOpts...).PrepareForEval(ctx); err != nil {
			return nil, fmt.Errorf("prepare %s query: %w", point, err)
		}
	}
	p.opts.podSpec = readsPodSpec(compiler)
	quota := quotaRules(compiler)
	p.opts.quotaByNumbers = compiler != nil && !readsInput(quota, "workload", "name") && !readsInput(quota, "workload", "namespace") && !callsNondeterministic(quota)
	kinds, err := workloadKinds(ctx, common, compiler)
	if err != nil {
		return nil, err
	}
	p.kinds = kinds
	return p, nil
}

// readsPodSpec reports whether a module may read input.pod.spec: a
// reference to input, input.pod or input.pod.spec, or to any of them by a
// variable key (input[k], input.pod[k]). The pod spec is the costliest part
// of the admission input (a JSON round trip of the whole spec), and most
// policies never read it.
func readsPodSpec(c *ast.Compiler) bool {
	if c == nil {
		return true
	}
	nodes := make([]any, 0, len(c.Modules))
	for _, m := range c.Modules {
		nodes = append(nodes, m)
	}
	return readsInput(nodes, "pod", "spec")
}

// quotaRules are the rules the quota decision may evaluate: those of
// package partita.quota and every rule they depend on. Other decisions'
// inputs have other shapes (the workload map's has its own
// input.workload), so only these say what the quota policy reads.
func quotaRules(c *ast.Compiler) []any {
	if c == nil {
		return nil
	}
	var out []any
	seen := map[*ast.Rule]bool{}
	queue := c.GetRulesWithPrefix(ast.MustParseRef("data.partita.quota"))
	for len(queue) > 0 {
		r := queue[0]
		queue = queue[1:]
		if seen[r] {
			continue
		}
		seen[r] = true
		out = append(out, r)
		for dep := range c.Graph.Dependencies(r) {
			if d, ok := dep.(*ast.Rule); ok {
				queue = append(queue, d)
			}
		}
	}
	return out
}

// readsInput reports whether nodes (modules or rules) may read
// input.<path...>: a reference to it, to any document above it (input,
// input.pod), or to any of them by a variable key (input[k], input.pod[k]).
func readsInput(nodes []any, path ...string) bool {
	key := func(r ast.Ref, i int) bool {
		if len(r) <= i+1 {
			return true
		}
		s, ok := r[i+1].Value.(ast.String)
		return !ok || string(s) == path[i]
	}
	found := false
	for _, m := range nodes {
		ast.WalkRefs(m, func(r ast.Ref) bool {
			if !found && r[0].Equal(ast.InputRootDocument) {
				found = true
				for i := range path {
					found = found && key(r, i)
				}
			}
			return found
		})
		if found {
			return true
		}
	}
	return false
}

// callsNondeterministic reports whether nodes (modules or rules) call a
// built-in whose answer may change between two calls with the same
// arguments (time.now_ns, rand.intn, uuid.rfc4122, ...).
func callsNondeterministic(nodes []any) bool {
	found := false
	check := func(op ast.Ref) {
		if b, ok := ast.BuiltinMap[op.String()]; ok && b.Nondeterministic {
			found = true
		}
	}
	for _, m := range nodes {
		ast.WalkExprs(m, func(e *ast.Expr) bool {
			if e.IsCall() {
				check(e.Operator())
			}
			return found
		})
		ast.WalkTerms(m, func(t *ast.Term) bool {
			if call, ok := t.Value.(ast.Call); ok && len(call) > 0 {
				if ref, ok := call[0].Value.(ast.Ref); ok {
					check(ref)
				}
			}
			return found
		})
		if found {
			return true
		}
	}
	return false
}

// SetConfig replaces data.partita.config.
func (e *Engine) SetConfig(ctx context.Context, c Config) error {
	v, err := jsonValue(c)
	if err != nil {
		return err
	}
	if err := storage.WriteOne(ctx, e.store, storage.AddOp, storage.Path{"partita", "config"}, v); err != nil {
		return fmt.Errorf("write policy config: %w", err)
	}
	return nil
}

// SetState replaces data.partita.state in one transaction: evaluations see
// the old state or the new one, never a mix.
func (e *Engine) SetState(ctx context.Context, st State) error {
	v, err := jsonValue(st)
	if err != nil {
		return err
	}
	if err := storage.WriteOne(ctx, e.store, storage.AddOp, storage.Path{"partita", "state"}, v); err != nil {
		return fmt.Errorf("write policy state: %w", err)
	}
	e.metrics.stateWritten(st)
	return nil
}

// Admission evaluates data.partita.admission for one pod. A failed
// evaluation returns an *EvaluationError; a denial is a decision with Deny
// set (see AdmissionDecision.Err).
func (e *Engine) Admission(ctx context.Context, in *AdmissionInput) (*AdmissionDecision, error) {
	return decide(ctx, e, pointAdmission, in, readAdmission)
}

// policyInput is the input document of a decision point.
type policyInput interface {
	// value builds the input as an AST value, so that evaluation needs no
	// JSON round trip.
	value(opts inputOptions) (ast.Value, error)
}

// decide evaluates one decision point of the policy in force on in, and
// read turns the query's value (defined false when undefined) into the
// decision. Every decision point goes
// through here, so each is bounded by the evaluation timeout, timed,
// counted when it fails, and fails with an *EvaluationError in the same way.
func decide[D any](ctx context.Context, e *Engine, point decisionPoint, in policyInput, read func(version string, v any, defined bool) (D, error)) (D, error) {
	p := e.current.Load()
	start := e.clock.Now()
	d, err := evaluate(ctx, e.evalTimeout, p, point, in, read)
	e.metrics.evaluation(point, e.clock.Since(start), err)
	if err != nil {
		var zero D
		return zero, &EvaluationError{Version: p.version, Err: err}
	}
	return d, nil
}

func evaluate[D any](ctx context.Context, timeout time.Duration, p *prepared, point decisionPoint, in policyInput, read func(version string, v any, defined bool) (D, error)) (D, error) {
	var zero D
	input, err := in.value(p.opts)
	if err != nil {
		return zero, fmt.Errorf("build input: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rs, err := p.queries[point].Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return zero, err
	}
	switch {
	case len(rs) == 0:
		// Undefined: read decides whether that is a decision.
		return read(p.version, nil, false)
	case len(rs) != 1 || len(rs[0].Expressions) != 1:
		return zero, fmt.Errorf("decision has %d results, want one", len(rs))
	}
	return read(p.version, rs[0].Expressions[0].Value, true)
}

// readAdmission reads data.partita_engine.decision.
func readAdmission(version string, v any, defined bool) (*AdmissionDecision, error) {
	if !defined {
		// engineModule defines the decision whatever the policy says.
		return nil, errors.New("decision is undefined")
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("decision is %T, not an object", v)
	}
	d := &AdmissionDecision{Version: version}
	var err error
	if d.Deny, err = denyMessages("data.partita.admission.deny", obj["deny"]); err != nil {
		return nil, err
	}
	if d.Patch, err = patchOf(obj["patch"]); err != nil {
		return nil, err
	}
	return d, nil
}

// denyMessages reads a deny rule (ref names it in errors): a set (or
// array) of strings.
func denyMessages(ref string, v any) ([]string, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s is %T, want a set of strings", ref, v)
	}
	out := make([]string, 0, len(arr))
	for _, m := range arr {
		s, ok := m.(string)
		if !ok {
			return nil, fmt.Errorf("%s holds %T, want strings", ref, m)
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// patchOf reads patch: {"labels": {k: v}, "annotations": {k: v}}.
func patchOf(v any) (Patch, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return Patch{}, fmt.Errorf("data.partita.admission.patch is %T, want an object", v)
	}
	var p Patch
	for k, sub := range obj {
		m, err := stringMap(sub)
		if err != nil {
			return Patch{}, fmt.Errorf("data.partita.admission.patch.%s: %w", k, err)
		}
		switch k {
		case "labels":
			p.Labels = m
		case "annotations":
			p.Annotations = m
		default:
			return Patch{}, fmt.Errorf("data.partita.admission.patch has %q; it may set only labels and annotations", k)
		}
	}
	return p, nil
}

func stringMap(v any) (map[string]string, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("is %T, want an object of strings", v)
	}
	out := make(map[string]string, len(obj))
	for k, x := range obj {
		s, ok := x.(string)
		if !ok {
			return nil, fmt.Errorf("%q is %T, want a string", k, x)
		}
		out[k] = s
	}
	return out, nil
}

// jsonValue turns v into the plain JSON values the store holds.
func jsonValue(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode policy data: %w", err)
	}
	var out any
	if err := util.UnmarshalJSON(b, &out); err != nil {
		return nil, fmt.Errorf("decode policy data: %w", err)
	}
	return out, nil
}
