package fetch

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"k8s.io/utils/clock"
)

// ExponentialBackoff returns a backoff func: base×2^attempt capped at max, with
// the upper half jittered so that many workers that failed together do not
// retry together. rnd returns a value in [0, 1); nil means math/rand/v2.
func ExponentialBackoff(base, max time.Duration, rnd func() float64) func(attempt int) time.Duration {
	if rnd == nil {
		rnd = rand.Float64
	}
	return func(attempt int) time.Duration {
		d := base
		for i := 0; i < attempt && d < max; i++ {
			d *= 2
		}
		d = min(d, max)
		return d/2 + time.Duration(rnd()*float64(d/2))
	}
}

// retry calls op until it succeeds, fails permanently, ctx ends or attempts
// run out, sleeping backoff(attempt) on clk between tries.
func retry(ctx context.Context, clk clock.Clock, attempts int, backoff func(int) time.Duration, op func() error) error {
	var err error
	for attempt := 0; ; attempt++ {
		if err = op(); err == nil {
			return nil
		}
		if IsPermanent(err) || errors.Is(err, ErrRangeIgnored) || ctx.Err() != nil || attempt+1 >= attempts {
			return err
		}
		select {
		case <-clk.After(backoff(attempt)):
		case <-ctx.Done():
			return err
		}
	}
}
