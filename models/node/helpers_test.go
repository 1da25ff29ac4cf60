package node

import (
	"context"
	"errors"
	"testing"
	"time"
)

func contextWithDeadline(t *testing.T, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(t.Context(), d)
}

func asStill(err error, out **StillFetchingError) bool { return errors.As(err, out) }
