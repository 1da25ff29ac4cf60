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

// engineModule wraps the decision point so that one query returns both
// parts, each with its default when a policy leaves it undefined.
const engineModule = `package partita_engine

decision := {"deny": deny, "patch": patch}

deny := d if {
	d := data.partita.admission.deny
} else := set()

patch := p if {
	p := data.partita.admission.patch
} else := {}
`

const (
	engineModuleName = "partita_engine.rego"
	decisionQuery    = "data.partita_engine.decision"
)

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
}

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
}

// prepared is one compiled policy version.
type prepared struct {
	version string
	source  string
	query   rego.PreparedEvalQuery
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
			e.current.Store(&prepared{version: version, source: source, query: cur.query})
			e.metrics.setVersion(version, source)
		}
		return version, nil
	}
	q, err := e.prepare(ctx, b)
	if err != nil {
		e.metrics.load(false)
		return "", &CompileError{Source: source, Err: err}
	}
	e.current.Store(&prepared{version: version, source: source, query: q})
	e.metrics.load(true)
	e.metrics.setVersion(version, source)
	return version, nil
}

// Check compiles b without loading it: a *CompileError says why it would
// be refused.
func (e *Engine) Check(ctx context.Context, b Bundle, source string) error {
	if _, err := e.prepare(ctx, b); err != nil {
		return &CompileError{Source: source, Err: err}
	}
	return nil
}

func (e *Engine) prepare(ctx context.Context, b Bundle) (rego.PreparedEvalQuery, error) {
	opts := []func(*rego.Rego){
		rego.Query(decisionQuery),
		rego.Store(e.store),
		rego.SetRegoVersion(ast.RegoV1),
		// A builtin error (a bad sprintf, a type error) fails the
		// evaluation instead of silently making a deny rule undefined.
		rego.StrictBuiltinErrors(true),
		rego.Module(engineModuleName, engineModule),
	}
	for _, name := range b.Names() {
		if strings.HasSuffix(name, testSuffix) {
			continue
		}
		opts = append(opts, rego.Module(name, b[name]))
	}
	return rego.New(opts...).PrepareForEval(ctx)
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
	p := e.current.Load()
	start := e.clock.Now()
	d, err := e.evaluate(ctx, p, in)
	e.metrics.evaluation(e.clock.Since(start), err)
	if err != nil {
		return nil, &EvaluationError{Version: p.version, Err: err}
	}
	return d, nil
}

func (e *Engine) evaluate(ctx context.Context, p *prepared, in *AdmissionInput) (*AdmissionDecision, error) {
	input, err := in.value()
	if err != nil {
		return nil, fmt.Errorf("build input: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, e.evalTimeout)
	defer cancel()
	rs, err := p.query.Eval(ctx, rego.EvalParsedInput(input))
	if err != nil {
		return nil, err
	}
	if len(rs) != 1 || len(rs[0].Expressions) != 1 {
		return nil, errors.New("decision is undefined")
	}
	obj, ok := rs[0].Expressions[0].Value.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("decision is %T, not an object", rs[0].Expressions[0].Value)
	}
	d := &AdmissionDecision{Version: p.version}
	if d.Deny, err = denyMessages(obj["deny"]); err != nil {
		return nil, err
	}
	if d.Patch, err = patchOf(obj["patch"]); err != nil {
		return nil, err
	}
	return d, nil
}

// denyMessages reads deny: a set (or array) of strings.
func denyMessages(v any) ([]string, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("data.partita.admission.deny is %T, want a set of strings", v)
	}
	out := make([]string, 0, len(arr))
	for _, m := range arr {
		s, ok := m.(string)
		if !ok {
			return nil, fmt.Errorf("data.partita.admission.deny holds %T, want strings", m)
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
