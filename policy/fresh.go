package policy

import (
	"context"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// FreshDenials decides pods and PodGroups with an Engine, and decides a
// denial once more on state read from the API server (StateSync.ReadThrough)
// before it stands. An allowed request costs nothing more; a denial costs
// at most one shared live read of queues and namespaces, and only an
// answer that changes with the fresher state differs.
type FreshDenials struct {
	engine *Engine
	state  *StateSync
	clock  clock.PassiveClock
}

// NewFreshDenials wraps engine; state must have a live reader
// (WithLiveReader) for denials to be read through.
func NewFreshDenials(engine *Engine, state *StateSync, c clock.PassiveClock) *FreshDenials {
	return &FreshDenials{engine: engine, state: state, clock: c}
}

// Admission decides one pod (Engine.Admission).
func (f *FreshDenials) Admission(ctx context.Context, in *AdmissionInput) (*AdmissionDecision, error) {
	return decideFresh(ctx, f, func(ctx context.Context) (*AdmissionDecision, error) { return f.engine.Admission(ctx, in) })
}

// PodGroupAdmission decides one PodGroup (Engine.PodGroupAdmission).
func (f *FreshDenials) PodGroupAdmission(ctx context.Context, in *PodGroupAdmissionInput) (*AdmissionDecision, error) {
	return decideFresh(ctx, f, func(ctx context.Context) (*AdmissionDecision, error) { return f.engine.PodGroupAdmission(ctx, in) })
}

func decideFresh(ctx context.Context, f *FreshDenials, decide func(context.Context) (*AdmissionDecision, error)) (*AdmissionDecision, error) {
	arrived := f.clock.Now()
	d, err := decide(ctx)
	if err != nil || len(d.Deny) == 0 {
		return d, err
	}
	if err := f.state.ReadThrough(ctx, arrived); err != nil {
		// The denial stands on the cached state; the caller may retry.
		logr.FromContextOrDiscard(ctx).Error(err, "Could not read the policy state through before a denial; denying on the cached state", "deny", d.Deny)
		return d, nil
	}
	return decide(ctx)
}
