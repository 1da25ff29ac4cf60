package policy

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
)

// coalescer runs a function after it is triggered, at most once per
// interval: every trigger in between folds into one run. This is how
// informer events become batches.
type coalescer struct {
	ch       chan struct{}
	interval time.Duration
	clock    clock.Clock
}

func newCoalescer(interval time.Duration, c clock.Clock) *coalescer {
	return &coalescer{ch: make(chan struct{}, 1), interval: interval, clock: c}
}

// trigger asks for a run; it never blocks.
func (c *coalescer) trigger() {
	select {
	case c.ch <- struct{}{}:
	default:
	}
}

// run calls fn once at the start and then after each trigger, waiting
// interval first so that a burst of triggers makes one call. A failed call
// is retried after interval. It returns when ctx ends.
func (c *coalescer) run(ctx context.Context, what string, fn func(context.Context) error) {
	log := logr.FromContextOrDiscard(ctx)
	c.trigger()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.ch:
		}
		select {
		case <-ctx.Done():
			return
		case <-c.clock.After(c.interval):
		}
		if err := fn(ctx); err != nil {
			log.Error(err, "Failed, will retry", "what", what, "retryAfter", c.interval)
			c.trigger()
		}
	}
}
